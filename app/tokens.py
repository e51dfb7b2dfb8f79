"""Token usage of model calls: the other half of multimodal latency.

The settler stores a ``tokens`` rollup series per model call and token key (ingest/settle.py:
service, name = model, input type, caller = provider, callee = the key: ``text`` / ``image`` /
``audio`` / ``video`` / ``total`` input tokens, ``output``); each entry's value is the call's
token count, so a series' ``sum_ns`` is a token sum and its ``count`` the calls that reported
that key. Queries here read those rollups (``input_type_tokens``, ``model_tokens``) and a
bounded sample of raw model-call spans (``sample_model_calls``) for the drilldown's latency
against input tokens; the shaping functions are pure and tested without a database.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import orjson
from sqlalchemy import and_, or_, select

from ..core.series import SeriesKind
from ..core.spans import KIND_CONSUMER, KIND_SERVER
from ..ingest.traces import TOKEN_KEYS
from ..models import PairCall, Series, Span, Trace
from ..models.dialect import contains_text_in
from ..models.reader import Filters, RollupGroup, RollupQuery, StoreReader
from .params import Window

# Component ids of the token panels (the overview's table, the drilldown's scatter).
OV_TOKENS = "overview-tokens"
OV_TOKENS_TABLE = "overview-tokens-table"
DD_TOKENS = "drilldown-tokens"
DD_TOKENS_NOTE = "drilldown-tokens-note"

MODALITIES = ("text", "image", "audio", "video")
INPUT_KEYS = TOKEN_KEYS  # the modalities, then "total"
OUTPUT_KEY = "output"
SAMPLE_LIMIT = 2000  # model-call spans the drilldown's scatter reads at most
SAMPLE_SLICES = 20  # the window is read in this many time slices, so the sample spans it
PENDING_SCAN_TRACES = 5000  # unsettled traces read when the rollups rule the settled ones out
IMAGE_NOTE = ("Image tokens drive encoder and prefill time: at the same input size, calls "
              "with image tokens take longer.")

# ------------------------------------------------------------------------------------------
# Rollups
# ------------------------------------------------------------------------------------------


def token_groups(reader: StoreReader, window: Window, filters: Filters, dims: tuple[str, ...]) -> list[RollupGroup]:
    """The window's ``tokens`` rollups merged per ``dims`` (series dimensions); ``filters``:
    ``service`` (the calling service) and ``input_type`` narrow them, the others do not apply."""
    f = Filters(service=filters.service, input_type=filters.input_type)
    return reader.rollups.merged(RollupQuery(SeriesKind.TOKENS, window.start_ns, window.end_ns, f, dims))


def per_request(sums: Mapping[str, int], traces: int) -> dict | None:
    """Pure: ``{"input": {<modality>: mean}, "output": mean}`` for ``traces`` requests whose
    model calls reported token sums ``sums`` (token key -> sum); None when nothing was
    reported (or there are no traces).

    ``input`` holds a mean per modality the usage names (``text``, ``image``, ``audio``,
    ``video``); a ``"total"`` entry appears only when no call in the group reported any
    modality (usage from instrumentations that give a total only, such as OpenInference
    without prompt details): a total beside modalities would read as one more modality.
    ``output`` is None when no call reported output tokens. Means are over every request of
    the input type, calls that failed before reporting usage included, rounded to 0.01."""
    if traces <= 0 or not sums:
        return None
    modal = {k: sums[k] for k in MODALITIES if k in sums}
    if not modal and "total" in sums:
        modal = {"total": sums["total"]}
    out = sums.get(OUTPUT_KEY)
    if not modal and out is None:
        return None
    return {"input": {k: round(v / traces, 2) for k, v in modal.items()},
            "output": None if out is None else round(out / traces, 2)}


def input_type_tokens(reader: StoreReader, window: Window, filters: Filters = Filters()) -> dict[str, dict[str, int]]:
    """input type -> token key -> tokens reported in the window (``tokens`` rollups)."""
    out: dict[str, dict[str, int]] = {}
    for g in token_groups(reader, window, filters, ("input_type", "callee")):
        if g.count > 0:
            out.setdefault(g.key[0], {})[g.key[1]] = g.sum_ns
    return out


def model_table(groups: Iterable[tuple[str, str, str, int, int]]) -> list[dict]:
    """Pure: per (input type, model), from ``(input type, model, token key, calls, tokens)``
    rows: ``calls`` (the model calls that reported usage: the most calls any one key was
    reported by), ``input`` (modality -> mean tokens a call, per ``per_request``'s rule for
    ``total``) and ``output`` (mean output tokens a call, None when none were reported).
    Rows in input-type order, then by model."""
    cells: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
    for it, model, key, count, total in groups:
        if count > 0:
            cells.setdefault((it, model), {})[key] = (count, total)
    order = {t: i for i, t in enumerate(("text", "image", "multi_image", "audio", "video", "unknown"))}
    rows = []
    for (it, model), keys in sorted(cells.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0])):
        calls = max(c for c, _ in keys.values())
        shaped = per_request({k: s for k, (_, s) in keys.items()}, calls)
        if shaped is None:
            continue
        rows.append({"input_type": it, "model": model, "calls": calls, **shaped})
    return rows


def model_tokens(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """``model_table`` of the window: tokens per model call, per input type and model."""
    groups = token_groups(reader, window, filters, ("input_type", "name", "callee"))
    return model_table((g.key[0], g.key[1], g.key[2], g.count, g.sum_ns) for g in groups)


def fmt_tokens(n: float | None) -> str:
    """Token counts for people: thousands separators, one decimal below 10."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return "—"
    return f"{n:.1f}" if abs(n) < 10 and n != int(n) else f"{n:,.0f}"


def table_columns(rows: Sequence[dict]) -> list[tuple[str, str]]:
    """The overview table's (key, header) columns: input keys shown only when some row has them."""
    present = {k for r in rows for k in r["input"]}
    cols = [("input_type", "input type"), ("model", "model"), ("calls", "calls")]
    cols += [(f"in_{k}", f"{k} in" if k != "total" else "input (total)") for k in INPUT_KEYS if k in present]
    return cols + [("output", "output")]


def table_cells(row: dict) -> dict[str, str]:
    """One ``model_table`` row as the overview shows it (mean tokens a call)."""
    cells = {"input_type": row["input_type"], "model": row["model"] or "—", "calls": f"{row['calls']:,}",
             "output": fmt_tokens(row["output"])}
    for k in INPUT_KEYS:
        cells[f"in_{k}"] = fmt_tokens(row["input"].get(k))
    return cells


# ------------------------------------------------------------------------------------------
# Raw model-call spans for the drilldown
# ------------------------------------------------------------------------------------------


def _slices(start_ns: int, end_ns: int, n: int) -> list[tuple[int, int]]:
    n = max(1, min(n, end_ns - start_ns))
    edges = [start_ns + (end_ns - start_ns) * i // n for i in range(n + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def sample_model_calls(reader: StoreReader, window: Window, filters: Filters = Filters(), *,
                       model: str | None = None, limit: int = SAMPLE_LIMIT,
                       slices: int = SAMPLE_SLICES) -> list[dict]:
    """Up to ``limit`` model-call spans with token usage starting in the window, the first
    ``limit / slices`` of each of ``slices`` equal time slices (so the sample covers the
    window; each slice is one walk of the ``start_ns`` index that stops at its quota).

    A row: ``trace_id``, ``span_id``, ``parent_span_id``, ``service``, ``name``,
    ``start_ns``, ``duration_ns``, ``signals`` (parsed). Spans of kind SERVER/CONSUMER are
    the serving side, not calls; a model call wrapping another sampled one is left out
    (``drop_wrappers``).
    ``filters``: ``service`` (the calling service or the call's callee), ``caller`` (the
    calling service), ``callee`` (the pair a settled CLIENT call counts in, else the
    provider), ``stage`` (the span's) and ``input_type`` (its trace's, once settled);
    ``model`` the requested model.
    """
    if window.end_ns <= window.start_ns or limit <= 0:
        return []
    model = model or getattr(filters, "model", None)  # the drilldown's model facet, where Filters has it
    per_slice = max(1, -(-limit // max(1, slices)))
    # When the rollups show no settled model call of the selection, only unsettled traces
    # can hold one: read those by trace instead of walking every span of the window.
    pending_only = no_settled_model_calls(reader, window, filters)
    out: list[dict] = []
    with reader.engine.connect() as conn:
        dialect = conn.dialect.name
        pair_callee = (select(Series.callee).join(PairCall, PairCall.series_id == Series.id)
                       .where(PairCall.span_row == Span.id).scalar_subquery())
        conds = [contains_text_in(dialect, Span.signals, '"tok"'), Span.kind.notin_((KIND_SERVER, KIND_CONSUMER))]
        if filters.service:
            conds.append(or_(Span.service == filters.service, pair_callee == filters.service))
        if filters.caller:
            conds.append(Span.service == filters.caller)
        if filters.callee:
            provider = '"provider":' + orjson.dumps(filters.callee.lower()).decode()
            conds.append(or_(pair_callee == filters.callee,
                             and_(pair_callee.is_(None), contains_text_in(dialect, Span.signals, provider))))
        if filters.stage:
            conds.append(Span.stage == filters.stage)
        if model:
            conds.append(contains_text_in(dialect, Span.signals, '"model":' + orjson.dumps(model).decode()))
        if filters.input_type:
            conds.append(select(Trace.input_type).where(Trace.trace_id == Span.trace_id).scalar_subquery()
                         == filters.input_type)
        cols = (Span.trace_id, Span.span_id, Span.parent_span_id, Span.service, Span.name, Span.start_ns,
                Span.duration_ns, Span.signals, pair_callee.label("pair_callee"))
        if pending_only:  # by trace id (the (trace_id, span_id) index), a few hundred at a time
            pending = list(conn.execute(select(Trace.trace_id).where(Trace.pending.is_(True))
                                        .limit(PENDING_SCAN_TRACES)).scalars())
            statements = [select(*cols).where(Span.trace_id.in_(pending[i : i + 500]), *conds)
                          for i in range(0, len(pending), 500)]
        else:
            statements = [select(*cols).where(Span.start_ns >= a, Span.start_ns < b, *conds)
                          .order_by(Span.start_ns).limit(per_slice)
                          for a, b in _slices(window.start_ns, window.end_ns, slices)]
        for stmt in statements:
            if len(out) >= limit:
                break
            for r in conn.execute(stmt):
                if not window.start_ns <= r.start_ns < window.end_ns:
                    continue
                sig = _parsed(r.signals)
                if sig is None or not sig.get("call"):
                    continue
                if filters.callee and r.pair_callee is None and sig.get("provider") != filters.callee.lower():
                    continue
                if model and sig.get("model") != model:
                    continue
                out.append({"trace_id": r.trace_id, "span_id": r.span_id, "parent_span_id": r.parent_span_id,
                            "service": r.service, "name": r.name, "start_ns": r.start_ns,
                            "duration_ns": r.duration_ns, "signals": sig})
    if pending_only:
        out.sort(key=lambda r: r["start_ns"])
    return drop_wrappers(out[:limit])


def no_settled_model_calls(reader: StoreReader, window: Window, filters: Filters) -> bool:
    """Whether the rollups prove that no settled trace holds a model call with token usage
    that ``sample_model_calls`` would take for a ``caller`` or ``service`` selection: the
    calling service has no ``tokens`` series in the window, and no call into the service or
    pair names a model. Unknown models (a ``tokens`` series without a name) prove nothing."""
    svc = filters.caller or filters.service
    if not svc:
        return False
    counted = reader.rollups.series_in_window(SeriesKind.TOKENS, window.start_ns, window.end_ns,
                                              ("service", "name", "caller"))
    if any(not name for _, name, _ in counted):
        return False
    modelled = {(caller, callee) for caller, callee, name in reader.rollups.series_in_window(
        SeriesKind.PAIR, window.start_ns, window.end_ns, ("caller", "callee", "name")) if name}
    if filters.caller:
        own = [provider for service, _, provider in counted if service == filters.caller]
        if filters.callee:  # the pair a call counts in, else its provider
            return filters.callee not in own and (filters.caller, filters.callee) not in modelled
        return not own
    return (not any(service == svc or provider == svc for service, _, provider in counted)
            and not any(callee == svc for _, callee in modelled))


def drop_wrappers(rows: list[dict]) -> list[dict]:
    """Pure: the rows without model calls that wrap another sampled row of their trace and
    service (two instrumentations of one call, ``traces.trace_calls``): parents are
    followed through the sampled rows only, so a wrapper whose inner span fell outside the
    sample stays."""
    by_id = {(r["trace_id"], r["span_id"]): r for r in rows}
    outer: set[tuple[str, str]] = set()
    for r in rows:
        seen = {r["span_id"]}
        pid = r.get("parent_span_id")
        while pid and pid not in seen:
            parent = by_id.get((r["trace_id"], pid))
            if parent is None or parent["service"] != r["service"]:
                break
            outer.add((r["trace_id"], pid))
            seen.add(pid)
            pid = parent.get("parent_span_id")
    return [r for r in rows if (r["trace_id"], r["span_id"]) not in outer] if outer else rows


def _parsed(raw: str | None) -> dict | None:
    if not raw:
        return None
    try:
        sig = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return sig if isinstance(sig, dict) else None


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def scatter_points(rows: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Pure: one point per sampled model call with input tokens: ``x`` input tokens (the
    usage's total, else the sum of its modalities), ``y`` duration in ms, ``image`` whether
    it had image tokens, ``image_tokens``, ``model``, ``trace_id``, ``span_id``."""
    points = []
    for r in rows:
        sig = r.get("signals") or {}
        tok = sig.get("tok") if isinstance(sig, dict) else None
        tok_in = tok.get("in") if isinstance(tok, dict) else None
        if not isinstance(tok_in, dict):
            continue
        total = _count(tok_in.get("total"))
        if total is None:
            parts = [_count(tok_in.get(k)) for k in MODALITIES]
            if all(p is None for p in parts):
                continue
            total = sum(p for p in parts if p is not None)
        image = _count(tok_in.get("image")) or 0
        model = sig.get("model")
        points.append({"x": total, "y": round(max(int(r["duration_ns"]), 0) / 1e6, 3), "image": image > 0,
                       "image_tokens": image, "model": model if isinstance(model, str) else "",
                       "trace_id": r["trace_id"], "span_id": r["span_id"]})
    return points
