"""Convention rollups: the series the attribute-based detectors read.

Per span (``convention_contributions``: the reference, and what the detectors compute from
raw spans) and for a whole batch of rows (``_convention_parts``, part of
``settle_fast.summarize_rows``). Settling does without pandas (``settle_rows.factorize``),
so neither a receiver nor a settler process loads it.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np
import orjson

from .records import KIND_CONSUMER, KIND_SERVER
from .settle_rows import (ATTRS, BATCH, GRAPH, INSTANCE, NAME, NS_PER_MINUTE, RESOURCE, SERVICE, STAGE, factorize,
                          factorize_ints, first_of_each)

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

def _batch_sizes(values: Sequence) -> np.ndarray:
    """``_batch_size`` of each extracted BATCH value (NaN: none); numbers in bulk, strings
    (PostgreSQL's ``->>`` gives every value as text) one by one."""
    kinds = set(map(type, values))
    if kinds <= {int, float}:  # numbers only (SQLite gives JSON numbers as such): in bulk
        out = np.array(values, dtype=np.float64)
        out[~np.isfinite(out)] = np.nan
        return out
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
    gives, without pandas. Each column is factorized alone and the codes combined into one
    integer a row (None is a value, as it is in a MultiIndex)."""
    combined = np.zeros(len(columns[0]), dtype=np.int64)
    uniques = []
    for col in columns:
        col = np.asarray(col)
        codes, uniq = factorize_ints(col) if col.dtype.kind in "iub" else factorize(col.tolist())
        combined = combined * len(uniq) + codes
        uniques.append(uniq)
    codes, seen = factorize_ints(combined)
    rows = []
    for c in seen.tolist():
        values = []
        for uniq in reversed(uniques):
            c, r = divmod(c, len(uniq))
            values.append(uniq[r])
        rows.append(tuple(reversed(values)))
    return codes, rows


def _batch_and_cuda(cols, t_codes: np.ndarray, start: np.ndarray, dur: np.ndarray, key_id, parts,
                    service_codes: tuple[np.ndarray, list]) -> None:
    """Append the ``batch`` and ``cuda`` contributions (see ``convention_contributions``) of
    every span with an extracted BATCH or GRAPH value to ``parts``; ``service_codes``: the
    SERVICE column's ``factorize`` (subsets are factorized from its codes, as integers)."""
    parts_t, parts_k, parts_m, parts_v, parts_e = parts
    svc_codes, svc_names = service_codes
    batch_raw = cols[BATCH]
    has = np.fromiter((v is not None for v in batch_raw), dtype=bool, count=len(batch_raw))
    if has.any():
        idx = np.flatnonzero(has)
        sizes = _batch_sizes([batch_raw[i] for i in idx.tolist()])
        ok = ~np.isnan(sizes)
        idx, sizes = idx[ok], sizes[ok]
        if len(idx):
            codes, first = factorize_ints(svc_codes[idx])
            keys = np.array([key_id(("batch", svc_names[sv], "", "", "", "", "")) for sv in first.tolist()],
                            dtype=np.int64)
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
        codes, uniques = _factorize_rows(svc_codes[idx], names, fb)
        keys = np.array([key_id(("cuda", svc_names[sv], nm, "", "", "", "fallback" if f else "captured"))
                         for sv, nm, f in uniques], dtype=np.int64)
        parts_t.append(t_codes[idx])
        parts_k.append(keys[codes])
        parts_m.append(start[idx] // NS_PER_MINUTE)
        parts_v.append(dur[idx])
        parts_e.append(fb.astype(np.int64))


_CACHE_NEEDLE = '"cache.name"'


def _convention_parts(rows: Sequence[tuple], cols: list, t_codes: np.ndarray, start: np.ndarray, dur: np.ndarray,
                      end: np.ndarray, kind: np.ndarray, attrs, key_id, parts,
                      service_codes: tuple[np.ndarray, list] | None = None) -> None:
    """Append the ``cache``/``cache_untagged``, ``batch``, ``cuda``, ``sync`` and ``inst``
    contributions of the spans in ``rows`` (columns ``cols``, stages as counted) to
    ``parts``; ``attrs(i)`` gives row i's parsed attributes; ``service_codes``: the SERVICE
    column's ``factorize``, when the caller has it."""

    n = len(rows)
    services = cols[SERVICE]
    parts_t, parts_k, parts_m, parts_v, parts_e = parts
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
        for part, vals in ((parts_t, conv_t), (parts_k, conv_k), (parts_m, conv_m), (parts_v, conv_v),
                           (parts_e, conv_e)):
            part.append(np.array(vals, dtype=np.int64))
    if n:
        _batch_and_cuda(cols, t_codes, start, dur, key_id, (parts_t, parts_k, parts_m, parts_v, parts_e),
                        service_codes or factorize(services))
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
            # per (trace, encoder service): its last end and first start; then per trace
            # with two encoder services or more: the spread of those ends
            s_codes, s_names = factorize([services[i] for i in enc.tolist()])
            cell, cell_of = np.unique(t_codes[enc] * len(s_names) + s_codes, return_inverse=True)
            cell_of = cell_of.reshape(-1)
            cell_end = np.full(len(cell), np.iinfo(np.int64).min)
            np.maximum.at(cell_end, cell_of, end[enc])
            cell_start = np.full(len(cell), np.iinfo(np.int64).max)
            np.minimum.at(cell_start, cell_of, start[enc])
            tt, t_of, n_services = np.unique(cell // len(s_names), return_inverse=True, return_counts=True)
            t_of = t_of.reshape(-1)
            first = np.full(len(tt), np.iinfo(np.int64).max)
            np.minimum.at(first, t_of, cell_end)
            last = np.full(len(tt), np.iinfo(np.int64).min)
            np.maximum.at(last, t_of, cell_end)
            t_start = np.full(len(tt), np.iinfo(np.int64).max)
            np.minimum.at(t_start, t_of, cell_start)
            spread = n_services >= 2
            if spread.any():
                tt = tt[spread].astype(np.int64)
                parts_t.append(tt)
                parts_k.append(np.array([key_id(("sync", fusion_service[t], "", "", "", "", ""))
                                         for t in tt.tolist()], dtype=np.int64))
                parts_m.append(t_start[spread] // NS_PER_MINUTE)
                parts_v.append(last[spread] - first[spread])
                parts_e.append(np.zeros(len(tt), dtype=np.int64))
    # inst: a trace's first SERVER/CONSUMER span on each (service, instance).
    instances = cols[INSTANCE]
    inst_arr = np.asarray(instances, dtype=object)
    srv = np.flatnonzero(server & (inst_arr != None) & (inst_arr != ""))  # noqa: E711 - elementwise
    if len(srv):
        srv = srv[np.lexsort((srv, start[srv], t_codes[srv]))]
        sv_codes, sv_names = factorize(np.asarray(services, dtype=object)[srv].tolist())
        in_codes, in_names = factorize(inst_arr[srv].tolist())
        combo = sv_codes * len(in_names) + in_codes
        first = first_of_each(t_codes[srv] * (len(sv_names) * len(in_names)) + combo)
        idx = srv[first]
        cells, inv = np.unique(combo[first], return_inverse=True)
        cell_key = np.array([key_id(("inst", sv_names[c // len(in_names)], in_names[c % len(in_names)],
                                     "", "", "", "")) for c in cells.tolist()], dtype=np.int64)
        parts_t.append(t_codes[idx])
        parts_k.append(cell_key[inv])
        parts_m.append(start[idx] // NS_PER_MINUTE)
        parts_v.append(dur[idx])
        parts_e.append(np.zeros(len(idx), dtype=np.int64))
