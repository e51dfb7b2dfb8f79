"""Settling many traces at once with numpy: the same results as ``summarize_trace``.

``summarize_trace`` (per trace, over SpanRecords) is the reference; this module computes
the identical summaries and contributions for a whole batch of traces with array
operations, because settling is on the ingest path and a per-span Python loop there costs
more than receiving the span did. ``tests/ingest/test_settle_fast.py`` checks that both
agree on random traces.

The row layout is in ``settle_rows``, the convention rollups (per span and per batch) in
``settle_conventions``, the batch's calls in ``settle_calls``; their public names are
importable from here as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import orjson

from ..core.spans import KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, KIND_SERVER, STATUS_ERROR, SpanRecord
from .settle_calls import _batch_calls
# Also re-exported: callers import the convention names and the row layout from here.
from .settle_conventions import (CACHE_GROUP_KEY, CACHE_MAX_TAGS, CACHE_TAG_MAX_LEN, CACHE_UNTAGGED_KIND,
                                 CACHE_UNTAGGED_MAX_LEN, CONVENTION_KEYS, LAYER_KEY, MAX_BATCH_SIZE, _batch_sizes,
                                 _convention_parts, _factorize_rows, cache_contributions, cache_hit_value,
                                 convention_columns, convention_contributions)
from .settle_rows import (ATTRS, BATCH, DUR, GRAPH, INSTANCE, KIND, LAYER, LINKS, NAME, NS_PER_MINUTE, PARENT,
                          RESOURCE, ROW, SERVICE, SID, SIGNALS, STAGE, START, STATUS, TID, factorize)
from .signals import span_signals, trace_input_type
from .trace_pairs import _text_value, token_entries
from .trace_signals import LEGACY_SIGNAL_KEYS, LEGACY_SIGNAL_NEEDLES


@dataclass
class BatchSummary:
    trace_ids: list[str]
    root_service: list[str | None]
    root_name: list[str | None]
    start_ns: np.ndarray
    duration_ns: np.ndarray
    span_count: np.ndarray
    error: np.ndarray
    input_type: list[str]
    # Contributions, one entry each: trace index, series key index, minute, value, error.
    c_trace: np.ndarray
    c_key: np.ndarray
    c_minute: np.ndarray
    c_value: np.ndarray
    c_err: np.ndarray
    keys: list[tuple[str, ...]]  # series keys, indexed by c_key
    # Calls (spans with a pair), one entry each: trace index, pair series key index, the
    # span's row id for ``pair_calls`` (-1 when the rows carry none, or the call is no
    # CLIENT span's), start, duration (a hand-off's: from the producer's start).
    call_trace: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    call_key: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    call_row: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    call_start: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    call_dur: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Spans whose stage settling corrected (a transport span under a model call, see
    # ``traces.resolve_stages``): trace index, row id, the stage counted. Only rows with an
    # id whose loaded stage differs.
    restage_trace: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    restage_row: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    restage_stage: list = field(default_factory=list)
    # Row ids of CLIENT spans that make no call because their stage was inherited or they
    # wrap a model call of their own service (their ``pair_calls`` row, if an earlier settle
    # wrote one, is stale): trace index, row id.
    uncalled_trace: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    uncalled_row: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Links of CONSUMER spans that found no PRODUCER (trace index, (trace id, span id), the
    # consumer's start), and the PRODUCER spans of the batch (trace index, span id).
    wait_trace: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    wait_target: list = field(default_factory=list)
    wait_start: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    producer_trace: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    producer_sid: list = field(default_factory=list)


def _union_lengths(group: np.ndarray, s: np.ndarray, e: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group, the length of the union of intervals [s, e) (e >= s), all values >= 0."""
    out = np.zeros(n_groups, dtype=np.int64)
    if len(group) == 0:
        return out
    order = np.lexsort((s, group))
    g, s, e = group[order], s[order], e[order]
    # Running max of the end within each group: offset groups so one accumulate never
    # carries a value across a group boundary (every group's base exceeds all before it).
    span = int(e.max()) + 1
    base = g.astype(np.int64) * span
    acc = np.maximum.accumulate(base + e)
    prev = np.empty_like(acc)
    prev[0] = -1
    prev[1:] = acc[:-1]
    prev_end = np.where(prev >= base, prev - base, -1)
    covered = np.clip(e - np.maximum(s, prev_end), 0, None)
    np.add.at(out, g, covered)
    return out


def summarize_rows(rows: Sequence[tuple], linked: Mapping[tuple[str, str], SpanRecord] | None = None) -> BatchSummary:
    """Summaries of every trace in ``rows`` (spans of whole traces, unique span ids).

    ``linked``: spans outside the batch that CONSUMER spans' links point at, keyed
    (trace_id, span_id) (``settle.load_link_targets``); a link into the batch is resolved in it."""
    n = len(rows)
    cols = list(zip(*rows)) if n else [()] * 19
    t_codes, t_uniques = factorize(cols[TID])
    n_tr = len(t_uniques)
    start = np.fromiter(cols[START], dtype=np.int64, count=n)
    dur = np.clip(np.fromiter(cols[DUR], dtype=np.int64, count=n), 0, None)
    end = start + dur
    kind = np.fromiter(cols[KIND], dtype=np.int64, count=n)
    status = np.fromiter(cols[STATUS], dtype=np.int64, count=n)
    sids = cols[SID]
    parents = cols[PARENT]

    # Parent index within the batch (-1: none, or not stored).
    index = {(t, sid): i for i, (t, sid) in enumerate(zip(t_codes.tolist(), sids))}
    parent_idx = np.fromiter(
        (index.get((t, p), -1) if p else -1 for t, p in zip(t_codes.tolist(), parents)),
        dtype=np.int64, count=n)
    parent_idx[parent_idx == np.arange(n)] = -1  # a span is not its own child

    # Self time: duration minus the union of children's intervals clipped to the span.
    has_parent = parent_idx >= 0
    ci = np.flatnonzero(has_parent)
    pi = parent_idx[ci]
    cs = np.maximum(start[ci], start[pi])
    ce = np.minimum(end[ci], end[pi])
    keep = ce > cs
    ci, pi, cs, ce = ci[keep], pi[keep], cs[keep], ce[keep]
    if len(ci):
        t0 = start[pi]  # relative times keep the group offsets inside int64
        covered = _union_lengths(pi, cs - t0, ce - t0, n)
    else:
        covered = np.zeros(n, dtype=np.int64)
    self_ns = dur - covered

    # Roots: no parent id at all; the earliest start wins (first in row order on ties).
    is_root = np.fromiter((not p for p in parents), dtype=bool, count=n)
    root_of = np.full(n_tr, -1, dtype=np.int64)
    ridx = np.flatnonzero(is_root)
    if len(ridx):
        order = ridx[np.lexsort((ridx, start[ridx]))]
        # first occurrence per trace in (start, row) order
        traces, first = np.unique(t_codes[order], return_index=True)
        root_of[traces] = order[first]
    t_min = np.full(n_tr, np.iinfo(np.int64).max)
    np.minimum.at(t_min, t_codes, start)
    t_max = np.zeros(n_tr, dtype=np.int64)
    np.maximum.at(t_max, t_codes, end)
    has_root = root_of >= 0
    tr_start = np.where(has_root, start[np.maximum(root_of, 0)], t_min)
    tr_dur = np.where(has_root, dur[np.maximum(root_of, 0)], t_max - t_min)
    span_count = np.bincount(t_codes, minlength=n_tr)
    error = np.bincount(t_codes, weights=(status == STATUS_ERROR), minlength=n_tr) > 0

    attrs_cache: dict[int, dict] = {}

    def attrs(i: int) -> dict:
        a = attrs_cache.get(i)
        if a is None:
            raw = rows[i][ATTRS]
            a = attrs_cache[i] = orjson.loads(raw) if raw and raw != "{}" else {}
        return a

    # Signals: the stored ones parsed (a few spans a trace); a span with none whose
    # attributes carry a key span_signals reads (stored before the column existed) has
    # them read now, as ``traces.signals_of`` does.
    services = cols[SERVICE]
    stages_in = cols[STAGE]
    sig_of: dict[int, dict] = {}
    sig_raw = cols[SIGNALS] if len(cols) > SIGNALS else None
    if sig_raw is not None:
        # Spans of one kind often store the same text: each distinct text is parsed once and
        # its dict shared (nothing below changes a span's signals).
        parsed: dict[str, object] = {}
        for i, raw in enumerate(sig_raw):
            if raw:
                sig = parsed.get(raw)
                if sig is None:
                    sig = parsed[raw] = orjson.loads(raw)
                if sig and isinstance(sig, dict):
                    sig_of[i] = sig
    for i in [i for i, raw in enumerate(cols[ATTRS])
              if raw and (sig_raw is None or not sig_raw[i]) and any(nd in raw for nd in LEGACY_SIGNAL_NEEDLES)]:
        if any(k.startswith(LEGACY_SIGNAL_KEYS) for k in attrs(i)):
            r = rows[i]
            sig = span_signals(SpanRecord(r[TID], r[SID], r[PARENT], r[SERVICE], r[NAME], r[KIND], r[START],
                                          r[START] + max(r[DUR], 0), r[STATUS], "", attrs(i), {}, [], "", "",
                                          r[STAGE]))
            if sig:
                sig_of[i] = sig

    # Input type: the root's signals first, then the trace's others in row (start) order.
    # A repeat of a signals dict changes nothing (each rule takes the first, a max or a
    # union), so a trace's distinct ones are classified, once per distinct list a batch.
    root_rows = set(root_of[root_of >= 0].tolist())
    t_list = t_codes.tolist()
    per_trace: dict[int, dict[int, dict]] = {}
    for i in sorted(sig_of):
        if i not in root_rows:
            sig = sig_of[i]
            per_trace.setdefault(t_list[i], {}).setdefault(id(sig), sig)
    input_type = []
    classified: dict[tuple[int, ...], str] = {}
    for t, r in enumerate(root_of.tolist()):
        distinct = per_trace.get(t, {})
        if r >= 0 and r in sig_of:
            distinct = {id(sig_of[r]): sig_of[r], **distinct}
        if not distinct:
            input_type.append("unknown")
            continue
        key = tuple(distinct)
        it = classified.get(key)
        if it is None:
            it = classified[key] = trace_input_type(list(distinct.values()))
        input_type.append(it)

    child_servers: dict[int, list[int]] = {}
    for i in np.flatnonzero(((kind == KIND_SERVER) | (kind == KIND_CONSUMER)) & has_parent).tolist():
        child_servers.setdefault(int(parent_idx[i]), []).append(i)

    # Stages (traces.resolve_stages): a span whose signals carry ``inh`` takes its parent's
    # stage under a model call of its own service, with no callee span below it.
    inherited: set[int] = set()
    restage: list[tuple[int, str | None]] = []
    stage_eff = None
    for i, sig in sig_of.items():
        fallback = sig.get("inh")
        if not fallback:
            continue
        p = int(parent_idx[i])
        new = fallback
        if p >= 0 and services[p] == services[i] and i not in child_servers:
            psig = sig_of.get(p)
            if psig and psig.get("call"):  # as stages.apply_parent_stages: one level
                new = psig.get("inh") or stages_in[p] or fallback
                inherited.add(i)
        if new != stages_in[i]:
            if stage_eff is None:
                stage_eff = list(stages_in)
            stage_eff[i] = new
            restage.append((i, new))
    if stage_eff is not None:
        cols[STAGE] = stage_eff

    # Calls (traces.trace_calls): model calls (any kind), CLIENT spans, CONSUMER hand-offs.
    call_i, call_pair, call_st, call_du, call_er, model_rows, outer, uncalled, waits = _batch_calls(
        cols, linked, t_codes, t_uniques, index, parent_idx, kind, start, dur, end, status, sig_of, child_servers,
        inherited, stages_in, attrs)

    # Contributions.
    it_codes = np.array([_IT_INDEX.setdefault(t, len(_IT_INDEX)) for t in input_type], dtype=np.int64) \
        if n_tr else np.zeros(0, dtype=np.int64)
    it_names = {v: k for k, v in _IT_INDEX.items()}
    root_service = [services[r] if r >= 0 else None for r in root_of.tolist()]
    root_name = [cols[NAME][r] if r >= 0 else None for r in root_of.tolist()]
    tr_minute = tr_start // NS_PER_MINUTE

    keys: list[tuple[str, ...]] = []
    key_index: dict[tuple[str, ...], int] = {}

    def key_id(k: tuple[str, ...]) -> int:
        j = key_index.get(k)
        if j is None:
            j = key_index[k] = len(keys)
            keys.append(k)
        return j

    parts_t, parts_k, parts_m, parts_v, parts_e = [], [], [], [], []
    service_codes = None
    # op: (service, name, stage, input type) per span
    if n:
        # Combine per-column codes into one integer key, then unique the combinations.
        combo = np.zeros(n, dtype=np.int64)
        decoders = []
        for values in (services, cols[NAME], cols[STAGE]):
            codes, uniques = factorize(values)
            combo = combo * len(uniques) + codes
            decoders.append(uniques)
            if values is services:
                service_codes = (codes, uniques)
        combo = combo * max(len(_IT_INDEX), 1) + it_codes[t_codes]
        uniq, op_codes = np.unique(combo, return_inverse=True)
        op_key = np.empty(len(uniq), dtype=np.int64)
        n_it = max(len(_IT_INDEX), 1)
        for j, c in enumerate(uniq.tolist()):
            c, it = divmod(c, n_it)
            c, st = divmod(c, len(decoders[2]))
            sv, nm = divmod(c, len(decoders[1]))
            op_key[j] = key_id(("op", decoders[0][sv], decoders[1][nm], decoders[2][st] or "other",
                                it_names[it], "", ""))
        parts_t.append(t_codes)
        parts_k.append(op_key[op_codes])
        parts_m.append(start // NS_PER_MINUTE)
        parts_v.append(dur)
        parts_e.append((status == STATUS_ERROR).astype(np.int64))
        if len(cols) > LAYER:  # layer: the op's key with the layer as callee
            layers = cols[LAYER]
            idx = np.flatnonzero(np.fromiter((v is not None for v in layers), dtype=bool, count=n))
            if len(idx):
                codes, uniques = _factorize_rows(op_codes[idx], np.asarray(layers, dtype=object)[idx])
                lkeys = np.array([key_id(("layer",) + keys[op_key[oc]][1:6] + (lv,)) for oc, lv in uniques],
                                 dtype=np.int64)
                parts_t.append(t_codes[idx])
                parts_k.append(lkeys[codes])
                parts_m.append(start[idx] // NS_PER_MINUTE)
                parts_v.append(dur[idx])
                parts_e.append((status[idx] == STATUS_ERROR).astype(np.int64))
    # pair: (model, input type, caller, callee) per call; a call's row is its span's (a
    # hand-off's: the consumer's)
    calls = {}
    if call_i:
        idx = np.array(call_i, dtype=np.int64)
        pair_keys = np.array([key_id(("pair", "", model, stage, input_type[t_codes[i]], caller, callee))
                              for i, (caller, callee, model, stage) in zip(call_i, call_pair)], dtype=np.int64)
        c_start = np.array(call_st, dtype=np.int64)
        c_dur = np.array(call_du, dtype=np.int64)
        parts_t.append(t_codes[idx])
        parts_k.append(pair_keys)
        parts_m.append(c_start // NS_PER_MINUTE)
        parts_v.append(c_dur)
        parts_e.append(np.array(call_er, dtype=np.int64))
        row_ids = np.asarray(cols[ROW], dtype=np.int64)[idx] if len(cols) > ROW else np.full(len(idx), -1)
        # pair_calls holds the calls of CLIENT spans only (their own start and duration): the
        # exemplar search answers windows it does not cover from CLIENT spans, and must
        # give the same answers. Hand-offs and model calls of other kinds have no row (-1).
        row_ids[kind[idx] != KIND_CLIENT] = -1
        calls = dict(call_trace=t_codes[idx], call_key=pair_keys, call_start=c_start, call_dur=c_dur,
                     call_row=row_ids)
    if len(cols) > ROW:
        row_col = cols[ROW]
        if restage:
            calls.update(restage_trace=np.array([t_codes[i] for i, _ in restage], dtype=np.int64),
                         restage_row=np.array([row_col[i] for i, _ in restage], dtype=np.int64),
                         restage_stage=[st for _, st in restage])
        if uncalled:
            calls.update(uncalled_trace=t_codes[np.array(uncalled, dtype=np.int64)],
                         uncalled_row=np.array([row_col[i] for i in uncalled], dtype=np.int64))
    # Hand-offs across traces: what this batch's consumers wait for, and what it produces.
    if waits:
        calls.update(wait_trace=np.array([t_codes[i] for i, _, _ in waits], dtype=np.int64),
                     wait_target=[(tid, sid) for _, tid, sid in waits],
                     wait_start=np.array([start[i] for i, _, _ in waits], dtype=np.int64))
    producers = np.flatnonzero(kind == KIND_PRODUCER)
    if len(producers):
        calls.update(producer_trace=t_codes[producers], producer_sid=[sids[i] for i in producers.tolist()])
    # tokens: (service, model, input type, provider, token key) per counted model call and
    # key its usage carries (traces.model_call_spans, traces.token_entries)
    tok_t, tok_k, tok_m, tok_v = [], [], [], []
    for i in model_rows:
        sig = sig_of[i]
        if "tok" not in sig or i in outer:
            continue
        t = int(t_codes[i])
        minute = int(start[i]) // NS_PER_MINUTE
        head = ("tokens", services[i], _text_value(sig, "model"), "", input_type[t], _text_value(sig, "provider"))
        for key, value in token_entries(sig):
            tok_t.append(t)
            tok_k.append(key_id(head + (key,)))
            tok_m.append(minute)
            tok_v.append(value)
    if tok_t:
        parts_t.append(np.array(tok_t, dtype=np.int64))
        parts_k.append(np.array(tok_k, dtype=np.int64))
        parts_m.append(np.array(tok_m, dtype=np.int64))
        parts_v.append(np.array(tok_v, dtype=np.int64))
        parts_e.append(np.zeros(len(tok_t), dtype=np.int64))
    # trace: (root service, input type) per trace
    if n_tr:
        parts_t.append(np.arange(n_tr, dtype=np.int64))
        parts_k.append(np.array([key_id(("trace", root_service[t] or "", "", "", input_type[t], "", ""))
                                 for t in range(n_tr)], dtype=np.int64))
        parts_m.append(tr_minute)
        parts_v.append(tr_dur)
        parts_e.append(error.astype(np.int64))
    # tstage: (root service, stage, input type) per trace and stage present
    if n:
        st_codes, st_uniques = factorize(["other" if v is None else v for v in cols[STAGE]])
        cell = t_codes * len(st_uniques) + st_codes
        cells, inv = np.unique(cell, return_inverse=True)
        sums = np.zeros(len(cells), dtype=np.int64)
        np.add.at(sums, inv, self_ns)
        c_t = cells // len(st_uniques)
        c_s = cells % len(st_uniques)
        parts_t.append(c_t)
        parts_k.append(np.array([key_id(("tstage", root_service[t] or "", "", st_uniques[s] or "other",
                                         input_type[t], "", ""))
                                 for t, s in zip(c_t.tolist(), c_s.tolist())], dtype=np.int64))
        parts_m.append(tr_minute[c_t])
        parts_v.append(sums)
        parts_e.append(np.zeros(len(cells), dtype=np.int64))

    # Convention rollups: cache, batch, cuda, sync, inst.
    _convention_parts(rows, cols, t_codes, start, dur, end, kind, attrs, key_id,
                      (parts_t, parts_k, parts_m, parts_v, parts_e), service_codes)

    def cat(parts):
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    return BatchSummary(
        trace_ids=list(t_uniques), root_service=root_service, root_name=root_name,
        start_ns=tr_start, duration_ns=tr_dur, span_count=span_count, error=error, input_type=input_type,
        c_trace=cat(parts_t), c_key=cat(parts_k), c_minute=cat(parts_m), c_value=cat(parts_v),
        c_err=cat(parts_e), keys=keys, **calls,
    )


_IT_INDEX: dict[str, int] = {}
