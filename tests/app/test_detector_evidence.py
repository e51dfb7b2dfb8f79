"""The band break needs evidence and ends when its signal returns, on traffic no fixture was
tuned to: a small generator (not the demo) of heavy-tailed calls, written through the real
path (``write_spans`` + ``settle``) and judged by ``findings.find``, over several seeds with
random service names, rates and tails."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import numpy as np
import pytest

from modalscope.app import detectors as d
from modalscope.app import findings
from modalscope.app.params import Window, parse_time
from modalscope.core.spans import KIND_CLIENT, KIND_SERVER, SpanRecord
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models.reader import StoreReader
from tests.factories import rules

MIN = d.NS_MIN
MS = 1_000_000
TH = d.Thresholds()
BLOCK = TH.block_minutes
STEP_MINUTES = 20
# A break ends at most this long after its step: the calm stretch the detector waits for
# (two blocks) and a block of slack for a noisy tail.
END_BOUND = (d.BAND_CALM_BLOCKS + 1) * BLOCK * MIN


@dataclass
class Traffic:
    """One generated store's plan: where the data begins, the stepped and the quiet pair,
    and the step (minutes from the data's start)."""

    seed: int
    start_ns: int
    minutes: int
    stepped: tuple[str, str]
    quiet: tuple[str, str]
    step: tuple[int, int]
    early: tuple[int, int]


def _name(rng: random.Random) -> str:
    return rng.choice(["api", "edge", "store", "rank", "embed", "asr", "ocr"]) + "-" + \
        "".join(rng.choice(string.ascii_lowercase) for _ in range(5))


def generate(seed: int) -> tuple[Traffic, list[SpanRecord]]:
    """Traces of a root SERVER span calling two uninstrumented callees (CLIENT spans named
    by ``peer.service``). Each pair's latencies are lognormal with a large sigma (a heavy
    tail); the stepped pair's calls stall for 20 minutes (a share of them waits several
    times its usual P99, as under contention), and also in a burst in the data's first
    minutes, before any baseline exists. Rates, medians, tails, stall sizes, the step's
    minute and the names all come from the seed."""
    rng = random.Random(seed)
    caller, stepped, quiet = _name(rng), _name(rng), _name(rng)
    while len({caller, stepped, quiet}) < 3:
        quiet = _name(rng)
    minutes = rng.randint(130, 160)
    step_at = rng.randint(75, minutes - STEP_MINUTES - 30)
    early = (rng.randint(1, 5), rng.randint(12, 20))
    rate = rng.randint(30, 80)  # traces a minute
    tails = {p: (rng.uniform(15, 200), rng.uniform(1.0, 1.6)) for p in (stepped, quiet)}  # median ms, sigma
    med, sigma = tails[stepped]
    p99 = med * np.exp(2.326 * sigma)
    share, stall = rng.uniform(0.04, 0.07), rng.uniform(4, 8) * p99
    base = (29_100_000 + rng.randint(0, 100_000)) * MIN
    spans: list[SpanRecord] = []
    for m in range(minutes):
        stalled = step_at <= m < step_at + STEP_MINUTES or early[0] <= m < early[1]
        for _ in range(rate):
            t = base + m * MIN + rng.randrange(MIN - 2_000 * MS)
            tid = f"{rng.getrandbits(128):032x}"
            root = f"{rng.getrandbits(64) | 1:016x}"
            res = {"service.name": caller}
            at, end = t + MS, t + MS
            calls = []
            for callee in (stepped, quiet):
                mu, sg = tails[callee]
                ms = mu * float(np.exp(sg * rng.gauss(0, 1)))
                if callee == stepped and stalled and rng.random() < share:
                    ms += stall * rng.uniform(0.8, 1.2)
                ms = min(ms, 600_000.0)
                calls.append(SpanRecord(tid, f"{rng.getrandbits(64) | 1:016x}", root, caller, f"call {callee}",
                                        KIND_CLIENT, at, at + int(ms * MS), 0,
                                        attributes={"peer.service": callee}, resource=res))
                end = max(end, at + int(ms * MS))
            spans.append(SpanRecord(tid, root, None, caller, "GET /work", KIND_SERVER, t, end + MS, 0, resource=res))
            spans.extend(calls)
    rules().tag(spans)
    return Traffic(seed, base, minutes, (caller, stepped), (caller, quiet), (step_at, step_at + STEP_MINUTES),
                   early), spans


def _store(engine, spans: list[SpanRecord]) -> StoreReader:
    write_spans(engine, spans)
    settle(engine, force=True)
    return StoreReader(engine)


def _minutes(tr: Traffic, f: dict) -> tuple[float, float]:
    """A finding's start and end, in minutes from the data's start."""
    return ((parse_time(f.start, "start") - tr.start_ns) / MIN, (parse_time(f.end, "end") - tr.start_ns) / MIN)


SEEDS = (101, 202, 303, 404)


def _backends_and_seeds(seeds: tuple[int, ...]):
    """Every seed on SQLite, the first on PostgreSQL too: the seeds vary the traffic the
    detector judges, and one of them is enough to show PostgreSQL's rollups give it the same."""
    return pytest.mark.parametrize(("db_url", "seed"), [("sqlite", s) for s in seeds] + [("postgresql", seeds[0])],
                                   indirect=["db_url"])


@_backends_and_seeds(SEEDS)
def test_band_break_over_a_step_of_heavy_tailed_traffic(engine, seed):
    tr, spans = generate(seed)
    reader = _store(engine, spans)
    # The window begins with the data: its look-back before holds nothing to compare with.
    window = Window(tr.start_ns, tr.start_ns + (tr.minutes + 1) * MIN)
    found = [f for f in findings.find(reader, window, th=TH, exemplars=False) if f.kind == "p99_band_break"]
    spans_of = {tr.stepped: [], tr.quiet: []}
    for f in found:
        s, e = _minutes(tr, f)
        assert s >= d.BAND_BASELINE_DATA_MINUTES, (seed, f.subject, s, e)  # not in the first 30 minutes
        assert f.evidence["baseline_data_minutes"] >= d.BAND_BASELINE_DATA_MINUTES
        spans_of[(f.subject.caller, f.subject.callee)].append((s, e))
    assert spans_of[tr.quiet] == [], (seed, spans_of)  # no step: no break, heavy tail or not
    got = spans_of[tr.stepped]
    step0, step1 = tr.step
    assert got, (seed, tr.step)
    # Every break of the stepped pair lies over its step, the first begins with it (to two
    # blocks: a weak start shows a block late, a noisy block before it may join), and the
    # last ends within END_BOUND of the step's end: the tail's noise does not hold it open.
    assert all(s >= step0 - 2 * BLOCK and e <= step1 + END_BOUND / MIN for s, e in got), (seed, tr.step, got)
    assert abs(got[0][0] - step0) <= 2 * BLOCK, (seed, tr.step, got)
    covered = sum(max(0.0, min(e, step1) - max(s, step0)) for s, e in got)
    assert covered >= STEP_MINUTES / 2, (seed, tr.step, got)


@_backends_and_seeds(SEEDS[:2])
def test_no_band_break_in_a_pairs_first_half_hour_whatever_the_window(engine, seed):
    """The generated data stall in their first minutes too: windows that begin at, before
    or inside those minutes all find nothing there."""
    tr, spans = generate(seed)
    reader = _store(engine, spans)
    for start_min, end_min in ((-90, 40), (0, 30), (2, 45), (10, 35)):
        window = Window(tr.start_ns + start_min * MIN, tr.start_ns + end_min * MIN)
        found = [f for f in findings.find(reader, window, th=TH, exemplars=False) if f.kind == "p99_band_break"]
        assert found == [], (seed, start_min, end_min, found)
