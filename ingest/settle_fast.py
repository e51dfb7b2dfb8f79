"""Settling many traces at once with numpy: the same results as ``summarize_trace``.

``summarize_trace`` (per trace, over SpanRecords) is the reference; this module computes
the identical summaries and contributions for a whole batch of traces with array
operations, because settling is on the ingest path and a per-span Python loop there costs
more than receiving the span did. ``tests/ingest/test_settle_fast.py`` checks that both
agree on random traces.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import orjson

from .records import KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, KIND_SERVER, STATUS_ERROR, SpanRecord
from .signals import span_signals, trace_input_type
from .traces import (LEGACY_SIGNAL_KEYS, LEGACY_SIGNAL_NEEDLES, _text_value, address_callee, link_targets,
                     token_entries)

NS_PER_MINUTE = 60_000_000_000

# Row layout handed in by the loader. BATCH and GRAPH are ``batch.size`` and
# ``gpu.cuda_graph`` as the database extracts them (``convention_columns`` says what they
# hold), so spans that carry only those never have their attributes parsed in Python.
# RESOURCE is the resource JSON of cache lookups (spans mentioning ``"cache.name"``), ''
# for the others. ROW (optional) is the span's ``spans.id``, for the ``pair_calls`` rows;
# LAYER (optional) its ``mm.layer`` when that is a string (the ``layer`` series).
# SIGNALS (optional) is ``spans.signals`` (JSON text or None), LINKS (optional) the links
# JSON of CONSUMER spans (None for the others: only hand-offs read them).
TID, SID, PARENT, SERVICE, NAME, KIND, STAGE, START, DUR, STATUS, ATTRS, INSTANCE, BATCH, GRAPH, RESOURCE, ROW, \
    LAYER, SIGNALS, LINKS = range(19)

# Convention rollups (docs/design.md "Span conventions"), what the attribute-based detectors read:
#
# * ``cache`` (service, name = cache.name, caller = tag key, callee = tag value): a lookup
#   per tag of a span carrying ``cache.name`` and a ``cache.hit`` that says hit or miss
#   (``cache_hit_value``, the cache page's rule; other spans are no lookups); its duration;
#   error = a miss. Tags: string attributes outside ``cache.*`` with a non-empty key, a
#   non-empty value of at most CACHE_TAG_MAX_LEN characters, the first CACHE_MAX_TAGS keys
#   in key order (the settler also caps the values a tag key gets series for:
#   ``settle.CACHE_TAG_VALUES``; later values share the key's overflow series, callee '').
#   Plus one TOTAL entry per lookup (caller '' and callee ''), so hit rates per cache come
#   from rollups too (``queries.cache_rates``).
# * ``cache_untagged`` (service, name = cache.name, caller = JSON list of keys): a lookup
#   per span above that the cache page would put in a group (``group_by`` = one of those
#   keys) no tag series shows: a span attribute with a value that is no tag (a number, a
#   boolean, '', a long string, past the first CACHE_MAX_TAGS) or, where the span lacks the
#   key, a resource attribute. Only keys a breakdown can name (``CACHE_GROUP_KEY``, outside
#   ``cache.*``); "*" when the list would be longer than CACHE_UNTAGGED_MAX_LEN. The cache
#   page answers ``group_by`` = key from the ``cache`` rollups only when no such lookup is in
#   the window, so its answers are exactly the raw spans' (the detectors never read it).
# * ``batch`` (service): a span carrying a numeric ``batch.size``; the size; error = size 1.
# * ``cuda`` (service, name, callee = fallback | captured): a span carrying
#   ``gpu.cuda_graph``; its duration; error = a fallback.
# * ``sync`` (service = the fusion span's): a trace with a fusion-stage SERVER/CONSUMER span
#   and encoder-stage SERVER/CONSUMER spans in two or more services; the spread between the
#   first and last encoder service to finish; minute = the first encoder start's.
# * ``inst`` (service, name = service.instance.id): a trace's first SERVER/CONSUMER span on
#   each instance; its duration (new instances are found from these).
# * ``layer`` (service, name, stage, input type, callee = the layer): a span whose
#   ``mm.layer`` is a string (ViT patch_embed / attention / mlp); its duration; error = its
#   status. The Stages page's layer breakdown reads these instead of raw spans.
LAYER_KEY = "mm.layer"
CONVENTION_KEYS = ("cache.name", "batch.size", "gpu.cuda_graph")
CACHE_MAX_TAGS = 8
CACHE_TAG_MAX_LEN = 64
CACHE_UNTAGGED_KIND = "cache_untagged"
CACHE_UNTAGGED_MAX_LEN = 2048
# An attribute key a cache breakdown can group by (``queries.valid_group_by``): 1-128
# letters, digits and ``_ . : / -`` (OpenTelemetry keys and label names), whole string.
CACHE_GROUP_KEY = re.compile(r"[A-Za-z0-9_.:/\-]{1,128}")
MAX_BATCH_SIZE = 1 << 40


def cache_hit_value(value) -> bool | None:
    """``cache.hit`` as sent: a boolean, or a string/number from sources without booleans
    (Cloud Trace labels). None when it says neither hit nor miss (such a span is no lookup,
    on the cache page and in the rollups alike)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0 if math.isfinite(value) else None
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "1", "hit", "yes"):
            return True
        if v in ("false", "0", "miss", "no"):
            return False
    return None


def _batch_size(value) -> float | None:
    """A numeric ``batch.size`` (numbers, or numeric strings as sent by some exporters)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        return None
    return float(value)


def convention_columns(attrs: dict) -> tuple:
    """Pure: the BATCH and GRAPH row values for a span's attributes, as the loader's SQL
    extracts them: ``batch.size`` when it is a JSON number or string (booleans and others
    are None); ``gpu.cuda_graph`` when present and not null (any type)."""
    size = attrs.get("batch.size")
    if isinstance(size, bool) or not isinstance(size, (int, float, str)):
        size = None
    return size, attrs.get("gpu.cuda_graph")


def _groupable(value) -> bool:
    """A value the cache page turns into a group (not None, not an object or a list)."""
    return value is not None and not isinstance(value, (dict, list))


def cache_contributions(service: str, start_ns: int, duration_ns: int, attrs: dict,
                        resource: dict | None = None) -> list[tuple[tuple[str, ...], int, int, int]]:
    """Pure: the ``cache`` and ``cache_untagged`` contributions of one span (its resource
    attributes: ``resource``), as (series key, minute, value, error)."""
    cache = attrs.get("cache.name")
    if cache is None or isinstance(cache, (dict, list)):
        return []
    hit = cache_hit_value(attrs.get("cache.hit"))
    if hit is None:
        return []
    minute = start_ns // NS_PER_MINUTE
    miss = int(not hit)
    name = str(cache)
    tags = sorted((k, v) for k, v in attrs.items()
                  if isinstance(v, str) and v and k and len(v) <= CACHE_TAG_MAX_LEN and not k.startswith("cache."))
    del tags[CACHE_MAX_TAGS:]
    out = [(("cache", service, name, "", "", "", ""), minute, duration_ns, miss)]
    out.extend((("cache", service, name, "", "", k, v), minute, duration_ns, miss) for k, v in tags)
    tagged = {k for k, _ in tags}
    untagged = {k for k, v in attrs.items() if k not in tagged and _groupable(v) and not k.startswith("cache.")
                and CACHE_GROUP_KEY.fullmatch(k)}
    if resource:
        untagged.update(k for k, v in resource.items() if attrs.get(k) is None and _groupable(v)
                        and not k.startswith("cache.") and CACHE_GROUP_KEY.fullmatch(k))
    if untagged:
        keys = orjson.dumps(sorted(untagged)).decode()
        out.append(((CACHE_UNTAGGED_KIND, service, name, "", "", keys if len(keys) <= CACHE_UNTAGGED_MAX_LEN else "*",
                     ""), minute, duration_ns, miss))
    return out


def convention_contributions(service: str, name: str, start_ns: int, duration_ns: int,
                             attrs: dict, resource: dict | None = None) -> list[tuple[tuple[str, ...], int, int, int]]:
    """Pure: the ``cache``/``cache_untagged``/``batch``/``cuda`` contributions of one span,
    as (series key, minute, value, error)."""
    out = cache_contributions(service, start_ns, duration_ns, attrs, resource)
    minute = start_ns // NS_PER_MINUTE
    get = attrs.get
    size = _batch_size(get("batch.size"))
    if size is not None:
        out.append((("batch", service, "", "", "", "", ""), minute,
                    int(round(min(max(size, 0.0), MAX_BATCH_SIZE))), int(size == 1)))
    graph = get("gpu.cuda_graph")
    if graph is not None:
        fb = graph == "fallback"
        out.append((("cuda", service, name, "", "", "", "fallback" if fb else "captured"), minute, duration_ns,
                    int(fb)))
    return out


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
    import pandas as pd  # heavy: only a settling pass needs it, not the receivers

    n = len(rows)
    cols = list(zip(*rows)) if n else [()] * 19
    t_codes, t_uniques = pd.factorize(pd.Series(cols[TID], dtype=object), sort=False)
    n_tr = len(t_uniques)
    t_codes = t_codes.astype(np.int64)
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
        first = pd.Series(order).groupby(t_codes[order]).first()
        root_of[first.index.to_numpy()] = first.to_numpy()
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
        for i in [i for i, raw in enumerate(sig_raw) if raw]:
            sig = orjson.loads(sig_raw[i])
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
    root_rows = set(root_of[root_of >= 0].tolist())
    per_trace: dict[int, list[dict]] = {}
    for i in sorted(sig_of):
        if i not in root_rows:
            per_trace.setdefault(int(t_codes[i]), []).append(sig_of[i])
    input_type = []
    for t, r in enumerate(root_of.tolist()):
        sigs = per_trace.get(t, [])
        if r >= 0 and r in sig_of:
            sigs = [sig_of[r]] + sigs
        input_type.append(trace_input_type(sigs) if sigs else "unknown")

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
    call_i: list[int] = []
    call_pair: list[tuple[str, str, str, str]] = []  # (caller, callee, model, calling stage)
    stage_col = cols[STAGE]
    call_st: list[int] = []
    call_du: list[int] = []
    call_er: list[int] = []

    def callee_ladder(i: int, provider: str) -> str | None:
        kids = child_servers.get(i, ())
        other = [k for k in kids if services[k] != services[i]]
        if other:
            return services[min(other, key=lambda k: (start[k], k))]
        callee = provider or address_callee(attrs(i))
        if not callee and kids:
            callee = services[i]
        return callee

    model_rows = sorted(i for i, sig in sig_of.items()
                        if sig.get("call") and kind[i] != KIND_SERVER and kind[i] != KIND_CONSUMER)
    outer = _outer_model_rows(model_rows, parent_idx, services, t_codes)
    for i in model_rows:
        if i in outer:
            continue
        sig = sig_of[i]
        callee = callee_ladder(i, _text_value(sig, "provider"))
        if callee:
            call_i.append(i)
            call_pair.append((services[i], callee, _text_value(sig, "model"), stage_col[i] or "other"))
            call_st.append(int(start[i]))
            call_du.append(int(dur[i]))
            call_er.append(int(status[i] == STATUS_ERROR))
    model_set = set(model_rows)
    uncalled: list[int] = []
    for i in np.flatnonzero(kind == KIND_CLIENT).tolist():
        if i in model_set:
            if i in outer:  # wraps the call's inner span: no call (an earlier row is stale)
                uncalled.append(i)
            continue
        if i in inherited:
            uncalled.append(i)
            continue
        callee = callee_ladder(i, "")
        if callee:
            call_i.append(i)
            call_pair.append((services[i], callee, "", stage_col[i] or "other"))
            call_st.append(int(start[i]))
            call_du.append(int(dur[i]))
            call_er.append(int(status[i] == STATUS_ERROR))
    consumers = np.flatnonzero(kind == KIND_CONSUMER)
    if len(consumers):
        links_raw = cols[LINKS] if len(cols) > LINKS else None
        code_of: dict[str, int] | None = None
        for i in consumers.tolist():
            if i in model_set:
                continue
            p = int(parent_idx[i])
            prod: tuple | None = None  # (service, start, status, stage)
            if p >= 0 and kind[p] == KIND_PRODUCER:
                prod = (services[p], int(start[p]), int(status[p]), stage_col[p] or "other")
            elif links_raw is not None and links_raw[i]:
                if code_of is None:
                    code_of = {tid: c for c, tid in enumerate(t_uniques)}
                best = None
                my_tid = cols[TID][i]
                for tid, sid in link_targets(orjson.loads(links_raw[i])):
                    if tid == my_tid and sid == sids[i]:
                        continue
                    code = code_of.get(tid)
                    j = index.get((code, sid)) if code is not None else None
                    if j is not None:
                        # another trace's producer counts with its stored stage, as the
                        # reference path sees it (that trace's own correction is its business)
                        j_stage = stage_col[j] if t_codes[j] == t_codes[i] else stages_in[j]
                        cand = (services[j], int(start[j]), int(status[j]), j_stage or "other") \
                            if kind[j] == KIND_PRODUCER else None
                    else:
                        rec = linked.get((tid, sid)) if linked else None
                        cand = (rec.service, rec.start_ns, rec.status, rec.stage or "other") \
                            if rec is not None and rec.kind == KIND_PRODUCER else None
                    if cand is not None and (best is None or (cand[1], tid, sid) < best[0]):
                        best = ((cand[1], tid, sid), cand)
                if best is not None:
                    prod = best[1]
            if prod is not None:
                call_i.append(i)
                call_pair.append((prod[0], services[i], "", prod[3]))
                call_st.append(prod[1])
                call_du.append(max(0, int(end[i]) - prod[1]))
                call_er.append(int(prod[2] == STATUS_ERROR or status[i] == STATUS_ERROR))

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
    # op: (service, name, stage, input type) per span
    if n:
        # Combine per-column codes into one integer key, then unique the combinations.
        combo = np.zeros(n, dtype=np.int64)
        decoders = []
        for values in (services, cols[NAME], cols[STAGE]):
            codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
            combo = combo * len(uniques) + codes
            decoders.append(uniques)
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
        st_codes, st_uniques = pd.factorize(pd.Series(cols[STAGE], dtype=object).fillna("other"))
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

    # Convention rollups. cache: per span carrying ``cache.name`` (its string attributes are
    # the tags, so those spans are parsed, and their resource); batch and cuda: from the
    # extracted columns.
    needle = _CACHE_NEEDLE
    conv_t, conv_k, conv_m, conv_v, conv_e = [], [], [], [], []
    for i in [i for i, raw in enumerate(cols[ATTRS]) if raw and needle in raw]:
        res_raw = rows[i][RESOURCE]
        res = orjson.loads(res_raw) if res_raw and res_raw != "{}" else None
        for key, minute, value, err in cache_contributions(services[i], int(start[i]), int(dur[i]), attrs(i),
                                                           res if isinstance(res, dict) else None):
            conv_t.append(int(t_codes[i]))
            conv_k.append(key_id(key))
            conv_m.append(minute)
            conv_v.append(value)
            conv_e.append(err)
    if conv_t:
        for parts, vals in ((parts_t, conv_t), (parts_k, conv_k), (parts_m, conv_m), (parts_v, conv_v),
                            (parts_e, conv_e)):
            parts.append(np.array(vals, dtype=np.int64))
    if n:
        _batch_and_cuda(cols, t_codes, start, dur, key_id, (parts_t, parts_k, parts_m, parts_v, parts_e))
    server = (kind == KIND_SERVER) | (kind == KIND_CONSUMER)
    stages = np.asarray(cols[STAGE], dtype=object)
    # sync: per trace, the spread of encoder services' last ends (traces with a fusion span).
    enc = np.flatnonzero(server & (stages == "encoder"))
    fus = np.flatnonzero(server & (stages == "fusion"))
    if len(enc) and len(fus):
        fus = fus[np.lexsort((fus, start[fus]))]
        fusion_service: dict[int, str] = {}
        for i in fus.tolist():
            fusion_service.setdefault(int(t_codes[i]), services[i])
        enc = enc[np.isin(t_codes[enc], np.fromiter(fusion_service, dtype=np.int64, count=len(fusion_service)))]
        if len(enc):
            e = pd.DataFrame({"t": t_codes[enc], "s": [services[i] for i in enc.tolist()], "end": end[enc],
                              "start": start[enc]})
            per_service = e.groupby(["t", "s"], sort=False).agg(end=("end", "max"), start=("start", "min"))
            per = per_service.groupby(level="t", sort=True).agg(n=("end", "size"), first=("end", "min"),
                                                                last=("end", "max"), start=("start", "min"))
            per = per[per["n"] >= 2]
            if len(per):
                tt = per.index.to_numpy(dtype=np.int64)
                parts_t.append(tt)
                parts_k.append(np.array([key_id(("sync", fusion_service[t], "", "", "", "", ""))
                                         for t in tt.tolist()], dtype=np.int64))
                parts_m.append(per["start"].to_numpy(dtype=np.int64) // NS_PER_MINUTE)
                parts_v.append((per["last"] - per["first"]).to_numpy(dtype=np.int64))
                parts_e.append(np.zeros(len(per), dtype=np.int64))
    # inst: a trace's first SERVER/CONSUMER span on each (service, instance).
    instances = cols[INSTANCE]
    inst_arr = np.asarray(instances, dtype=object)
    srv = np.flatnonzero(server & (inst_arr != None) & (inst_arr != ""))  # noqa: E711 - elementwise
    if len(srv):
        srv = srv[np.lexsort((srv, start[srv], t_codes[srv]))]
        sv_codes, sv_names = pd.factorize(pd.Series(np.asarray(services, dtype=object)[srv], dtype=object))
        in_codes, in_names = pd.factorize(pd.Series(inst_arr[srv], dtype=object))
        combo = sv_codes.astype(np.int64) * len(in_names) + in_codes
        first = ~pd.DataFrame({"t": t_codes[srv], "c": combo}).duplicated().to_numpy()
        idx = srv[first]
        cells, inv = np.unique(combo[first], return_inverse=True)
        cell_key = np.array([key_id(("inst", sv_names[c // len(in_names)], in_names[c % len(in_names)],
                                     "", "", "", "")) for c in cells.tolist()], dtype=np.int64)
        parts_t.append(t_codes[idx])
        parts_k.append(cell_key[inv])
        parts_m.append(start[idx] // NS_PER_MINUTE)
        parts_v.append(dur[idx])
        parts_e.append(np.zeros(len(idx), dtype=np.int64))

    def cat(parts):
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    return BatchSummary(
        trace_ids=list(t_uniques), root_service=root_service, root_name=root_name,
        start_ns=tr_start, duration_ns=tr_dur, span_count=span_count, error=error, input_type=input_type,
        c_trace=cat(parts_t), c_key=cat(parts_k), c_minute=cat(parts_m), c_value=cat(parts_v),
        c_err=cat(parts_e), keys=keys, **calls,
    )


def _outer_model_rows(model_rows: list[int], parent_idx: np.ndarray, services: Sequence[str],
                      t_codes: np.ndarray) -> set[int]:
    """Rows of model calls that wrap another model call of their own service
    (``traces._outer_model_calls``): walked up from each model call of a trace with two or
    more, through ancestors of its service."""
    if len(model_rows) < 2:
        return set()
    per_trace: dict[int, int] = {}
    traces = t_codes[model_rows].tolist()
    for t in traces:
        per_trace[t] = per_trace.get(t, 0) + 1
    outer: set[int] = set()
    if max(per_trace.values()) < 2:
        return outer
    is_model = set(model_rows)
    for i, t in zip(model_rows, traces):
        if per_trace[t] < 2:
            continue
        seen = {i}
        p = int(parent_idx[i])
        while p >= 0 and p not in seen and services[p] == services[i]:
            if p in is_model:
                outer.add(p)
            seen.add(p)
            p = int(parent_idx[p])
    return outer


def _batch_sizes(values: Sequence) -> np.ndarray:
    """``_batch_size`` of each extracted BATCH value (NaN: none); numbers in bulk, strings
    (PostgreSQL's ``->>`` gives every value as text) one by one."""
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if v is not None:
            if type(v) is float or type(v) is int:
                out[i] = v
            else:
                size = _batch_size(v)
                if size is not None:
                    out[i] = size
    out[~np.isfinite(out)] = np.nan
    return out


def _factorize_rows(*columns) -> tuple[np.ndarray, list[tuple]]:
    """Codes of the rows of several equally long columns and their distinct value tuples,
    in order of first appearance: what ``pd.factorize(pd.MultiIndex.from_arrays(columns))``
    gives, without the MultiIndex (5x slower: most of a settle batch's convention work when
    every span carries ``gpu.cuda_graph``). Each column is factorized alone and the codes
    combined into one integer a row (None is a value, as it is in a MultiIndex)."""
    import pandas as pd  # heavy: only a settling pass needs it, not the receivers

    combined = np.zeros(len(columns[0]), dtype=np.int64)
    uniques = []
    for col in columns:
        codes, uniq = pd.factorize(np.asarray(col), use_na_sentinel=False)
        combined = combined * len(uniq) + codes
        uniques.append(uniq)
    codes, seen = pd.factorize(combined)
    rows = []
    for c in seen.tolist():
        values = []
        for uniq in reversed(uniques):
            c, r = divmod(c, len(uniq))
            values.append(uniq[r])
        rows.append(tuple(reversed(values)))
    return codes, rows


def _batch_and_cuda(cols, t_codes: np.ndarray, start: np.ndarray, dur: np.ndarray, key_id, parts) -> None:
    """Append the ``batch`` and ``cuda`` contributions (see ``convention_contributions``) of
    every span with an extracted BATCH or GRAPH value to ``parts``."""
    import pandas as pd  # heavy: only a settling pass needs it, not the receivers
    parts_t, parts_k, parts_m, parts_v, parts_e = parts
    services = np.asarray(cols[SERVICE], dtype=object)
    batch_raw = cols[BATCH]
    has = np.fromiter((v is not None for v in batch_raw), dtype=bool, count=len(batch_raw))
    if has.any():
        idx = np.flatnonzero(has)
        sizes = _batch_sizes([batch_raw[i] for i in idx.tolist()])
        ok = ~np.isnan(sizes)
        idx, sizes = idx[ok], sizes[ok]
        if len(idx):
            codes, names = pd.factorize(pd.Series(services[idx], dtype=object))
            keys = np.array([key_id(("batch", sv, "", "", "", "", "")) for sv in names], dtype=np.int64)
            parts_t.append(t_codes[idx])
            parts_k.append(keys[codes])
            parts_m.append(start[idx] // NS_PER_MINUTE)
            parts_v.append(np.round(np.clip(sizes, 0.0, MAX_BATCH_SIZE)).astype(np.int64))
            parts_e.append((sizes == 1).astype(np.int64))
    graph_raw = cols[GRAPH]
    has = np.fromiter((v is not None for v in graph_raw), dtype=bool, count=len(graph_raw))
    if has.any():
        idx = np.flatnonzero(has)
        fb = np.fromiter((graph_raw[i] == "fallback" for i in idx.tolist()), dtype=bool, count=len(idx))
        names = np.asarray(cols[NAME], dtype=object)[idx]
        codes, uniques = _factorize_rows(services[idx], names, fb)
        keys = np.array([key_id(("cuda", sv, nm, "", "", "", "fallback" if f else "captured"))
                         for sv, nm, f in uniques], dtype=np.int64)
        parts_t.append(t_codes[idx])
        parts_k.append(keys[codes])
        parts_m.append(start[idx] // NS_PER_MINUTE)
        parts_v.append(dur[idx])
        parts_e.append(fb.astype(np.int64))


_IT_INDEX: dict[str, int] = {}
_CACHE_NEEDLE = '"cache.name"'
