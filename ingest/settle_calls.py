"""The calls of a batch of span rows: ``traces.trace_calls`` with array operations, as part
of ``settle_fast.summarize_rows``."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import orjson

from ..core.spans import KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, KIND_SERVER, STATUS_ERROR, SpanRecord
from .settle_rows import LINKS, SERVICE, SID, STAGE, TID
from .trace_pairs import _text_value, address_callee, link_targets

# A consumer span of a batch names one link a message; waiting on more of them than this
# only re-settles its trace more often.
MAX_WAITS_PER_SPAN = 8


def _batch_calls(cols: list, linked: Mapping[tuple[str, str], SpanRecord] | None, t_codes: np.ndarray,
                 t_uniques: Sequence[str], index: dict[tuple[int, str], int], parent_idx: np.ndarray,
                 kind: np.ndarray, start: np.ndarray, dur: np.ndarray, end: np.ndarray, status: np.ndarray,
                 sig_of: dict[int, dict], child_servers: dict[int, list[int]], inherited: set[int],
                 stages_in: Sequence[str | None], attrs: Callable[[int], dict]) -> tuple:
    """The calls of the spans in ``cols`` (stages as counted; ``stages_in``: as loaded), in
    the names of ``summarize_rows``: (call rows, their (caller, callee, model, calling
    stage), starts, durations, errors, model-call rows, the outer ones among them, CLIENT rows
    that make no call, (row, trace id, span id) of the links of CONSUMER rows that found no
    PRODUCER, to spans not stored yet)."""
    services = cols[SERVICE]
    sids = cols[SID]
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
    waits: list[tuple[int, str, str]] = []
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
                missing: list[tuple[str, str]] = []
                my_tid = cols[TID][i]
                for tid, sid in link_targets(orjson.loads(links_raw[i])):
                    if tid == my_tid and sid == sids[i]:
                        continue
                    code = code_of.get(tid)
                    j = index.get((code, sid)) if code is not None else None
                    if j is None and not (linked and (tid, sid) in linked):
                        missing.append((tid, sid))
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
                else:  # wait for a linked span not stored yet (ids of another shape never come)
                    waits.extend((i, tid, sid) for tid, sid in missing[:MAX_WAITS_PER_SPAN]
                                 if len(tid) <= 32 and len(sid) <= 16)
            if prod is not None:
                call_i.append(i)
                call_pair.append((prod[0], services[i], "", prod[3]))
                call_st.append(prod[1])
                call_du.append(max(0, int(end[i]) - prod[1]))
                call_er.append(int(prod[2] == STATUS_ERROR or status[i] == STATUS_ERROR))
    return call_i, call_pair, call_st, call_du, call_er, model_rows, outer, uncalled, waits


def _outer_model_rows(model_rows: list[int], parent_idx: np.ndarray, services: Sequence[str],
                      t_codes: np.ndarray) -> set[int]:
    """Rows of model calls that wrap another model call of their own service
    (``trace_pairs._outer_model_calls``): walked up from each model call of a trace with two or
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
