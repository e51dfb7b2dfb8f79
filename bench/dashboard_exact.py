"""Exact answers from the raw spans (part of ``dashboard_bench.py``, not a script): pandas over
the rows the settler reads, by its rules, and how far our answers are from those."""

from __future__ import annotations

import json
import math
from typing import Callable

HOUR_NS = 3_600_000_000_000
PCT = {"pairs": (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99)),
       "input_types": (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99)),
       "stages": (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99))}
KEYS = {"pairs": ("caller", "callee"), "input_types": ("input_type",), "stages": ("input_type", "stage"),
        "cache": ("cache", "group")}
PCT["cache"] = (("hit_rate", None),)  # compared as the percentiles are: relative error, and counts
CACHE_GROUP_BY = "user_tier"  # the Cache page's group in every window (Subject.group_by)


def _quantile_rows(df, keys: tuple[str, ...], kind: str, extra: Callable | None = None) -> dict[tuple, dict]:
    g = df.groupby(list(keys), sort=False)["duration_ns"]
    qs = [q for _, q in PCT[kind]]
    quant = g.quantile(qs)
    counts = g.size()
    out: dict[tuple, dict] = {}
    for key, n in counts.items():
        key = key if isinstance(key, tuple) else (key,)
        row = {"count": int(n)}
        for name, qv in PCT[kind]:
            row[name] = float(quant.loc[(*key, qv)]) / 1e6
        out[key] = row
    if extra is not None:
        extra(out)
    return out


def _loads(text):
    """A JSON column's value (None for NULL, '' or junk; pandas reads NULL as NaN)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def span_signals_of(signals: str | None, attributes: str | None) -> dict | None:
    """A span's signals as settling reads them: the stored ones, else (a span stored before
    signals were) those its attributes give (``ingest.traces.signals_of``)."""
    from modalscope.core.spans import SpanRecord
    from modalscope.ingest.traces import legacy_signals

    sig = _loads(signals)
    if sig:
        return sig if isinstance(sig, dict) else None
    attrs = _loads(attributes)
    if not isinstance(attrs, dict) or not attrs:
        return None
    return legacy_signals(SpanRecord("", "", None, "", "", 0, 0, 0, attributes=attrs))


def input_type_from_signals(root: dict | None, others: list[tuple[int, str, dict | None]]) -> str:
    """A trace's input type from its spans' signals (docs/design.md "Input types", the settler's
    ``signals.trace_input_type``): the root's signals first, then the other spans' by start
    (then span id, the settler's row order). ``others``: (start, span id, signals)."""
    from modalscope.ingest.signals import trace_input_type

    ordered = [sig for _, _, sig in sorted(others, key=lambda e: (e[0], e[1]))]
    return trace_input_type(([root] if root is not None else []) + ordered)


# Spans whose attributes settling reads again when they have no stored signals
# (ingest.traces.LEGACY_SIGNAL_NEEDLES): only these rows' attributes are read.
_LEGACY_LIKE = " OR ".join("attributes LIKE '%\"" + k.replace("_", "!_") + "%' ESCAPE '!'"
                           for k in ("mm.input_type", "mm.image_count", "mm.audio_count", "mm.video_count",
                                     "mm.prompt_chars", "gen_ai.", "openinference.", "llm."))


def _raw_traces(conn, traces_sql: str, params: dict):
    """trace_id -> (start_ns, duration_ns, input type) from the raw spans of the traces that
    ``traces_sql`` (a SELECT of trace ids) names: the root (no parent; the earliest if several)
    gives start and duration, a trace without one its spans' extent; the input type from every
    span's signals (``input_type_from_signals``)."""
    import pandas as pd
    from sqlalchemy import text

    spans = pd.read_sql(text(
        "SELECT trace_id, span_id, parent_span_id, start_ns, duration_ns, signals, "
        f"CASE WHEN signals IS NULL AND ({_LEGACY_LIKE}) THEN attributes ELSE NULL END AS attributes "
        f"FROM spans WHERE trace_id IN ({traces_sql})"), conn, params=params)
    spans["is_root"] = spans["parent_span_id"].isna() | (spans["parent_span_id"] == "")
    spans["end_ns"] = spans["start_ns"] + spans["duration_ns"]
    roots = spans[spans["is_root"]].sort_values(["trace_id", "start_ns", "span_id"]).drop_duplicates("trace_id")
    extent = spans.groupby("trace_id").agg(first=("start_ns", "min"), last=("end_ns", "max"))
    said = spans[spans["signals"].notna() | spans["attributes"].notna()]
    sigs: dict[str, list[tuple[int, str, dict | None]]] = {}
    for tid, sid, start, signals, attributes in said[["trace_id", "span_id", "start_ns", "signals",
                                                      "attributes"]].itertuples(index=False):
        sig = span_signals_of(signals, attributes)
        if sig:
            sigs.setdefault(tid, []).append((start, sid, sig))
    out = {}
    root_of = {r.trace_id: r for r in roots.itertuples(index=False)}
    for tid, first, last in extent.itertuples():
        root = root_of.get(tid)
        start, duration = (root.start_ns, root.duration_ns) if root is not None else (first, max(0, last - first))
        mine = sigs.get(tid, [])
        root_sig = next((sig for _, sid, sig in mine if sid == root.span_id), None) if root is not None else None
        others = [e for e in mine if root is None or e[1] != root.span_id]
        out[tid] = (start, duration, input_type_from_signals(root_sig, others))
    return out


def exact_input_types(engine, window) -> dict[tuple, dict]:
    """Per input type, trace latency percentiles from the raw spans (not the traces table)."""
    import pandas as pd

    # Traces belong to a window by their root's start (a root-less trace by its first span:
    # it is found through any span starting in the window, then filtered by its start).
    params = {"a": window.start_ns, "b": window.end_ns}
    with engine.connect() as conn:
        facts = _raw_traces(conn, "SELECT trace_id FROM spans WHERE start_ns >= :a AND start_ns < :b", params)
    df = pd.DataFrame([(it, d) for s, d, it in facts.values() if window.start_ns <= s < window.end_ns],
                      columns=["input_type", "duration_ns"])
    return _quantile_rows(df, KEYS["input_types"], "input_types")


def exact_stages(engine, window) -> dict[tuple, dict]:
    """Per input type and stage, span latency percentiles; a span's input type is its trace's,
    from that trace's raw spans."""
    import pandas as pd
    from sqlalchemy import text

    params = {"a": window.start_ns, "b": window.end_ns}
    with engine.connect() as conn:
        df = pd.read_sql(text("SELECT trace_id, stage, duration_ns FROM spans WHERE start_ns >= :a AND start_ns < :b"),
                         conn, params=params)
        facts = _raw_traces(conn, "SELECT trace_id FROM spans WHERE start_ns >= :a AND start_ns < :b", params)
    df["input_type"] = df["trace_id"].map({t: f[2] for t, f in facts.items()}).fillna("unknown")
    df["stage"] = df["stage"].fillna("other").replace("", "other")
    return _quantile_rows(df, KEYS["stages"], "stages")


# A consumer starts after its producer, give or take clock skew and the time in the queue:
# consumers linked to a producer in the window are looked for this far around it.
HANDOFF_SLACK_NS = HOUR_NS


def _text_value(sig: dict | None, key: str) -> str:
    value = (sig or {}).get(key)
    return "" if value is None or isinstance(value, (dict, list, bool)) else str(value).strip()


def exact_pairs(engine, window) -> dict[tuple, dict]:
    """Per (caller, callee), the calls starting in the window (docs/design.md "Service pairs",
    as ``ingest.traces.trace_calls`` makes them): a model call (signals ``call``, any kind but
    SERVER/CONSUMER) or a CLIENT span names its callee by its earliest SERVER/CONSUMER child
    in another service, else (a model call) its provider, else its address
    (``traces.address_callee``), else its own service when a child is in it; a transport
    span that took its stage from a model-call parent of its service, with no such child,
    makes none. A CONSUMER span's hand-off from its PRODUCER parent, else from the earliest
    PRODUCER its links name, runs from the producer's start to the consumer's end."""
    import pandas as pd
    from sqlalchemy import bindparam, text

    from modalscope.ingest.traces import address_callee

    a, b = window.start_ns, window.end_ns
    sql = text(
        "SELECT c.trace_id AS trace_id, c.span_id AS span_id, c.parent_span_id AS parent_span_id, "
        "c.service AS caller, c.kind AS kind, c.duration_ns AS duration_ns, c.status AS status, "
        "c.signals AS signals, k.service AS child_service, k.start_ns AS child_start, "
        "CASE WHEN k.service IS NULL OR k.service = c.service OR c.signals IS NULL THEN c.attributes END AS attributes "
        "FROM spans c LEFT JOIN spans k ON k.trace_id = c.trace_id AND k.parent_span_id = c.span_id "
        "AND k.kind IN (2, 5) AND k.span_id <> c.span_id "
        "WHERE c.start_ns >= :a AND c.start_ns < :b AND (c.kind = 3 OR (c.kind NOT IN (2, 5) AND "
        f"(c.signals LIKE '%\"call\"%' OR (c.signals IS NULL AND ({_LEGACY_LIKE.replace('attributes', 'c.attributes')})))))")
    with engine.connect() as conn:
        df = pd.read_sql(sql, conn, params={"a": a, "b": b})
        heirs = df[df["signals"].str.contains('"inh"', regex=False, na=False)]
        parents = {}
        keys = sorted({(t, p) for t, p in heirs[["trace_id", "parent_span_id"]].itertuples(index=False) if p})
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            tids = sorted({t for t, _ in chunk})
            rows = conn.execute(text(
                "SELECT trace_id, span_id, service, signals, attributes FROM spans "
                "WHERE trace_id IN :t AND span_id IN :s").bindparams(bindparam("t", expanding=True),
                                                                     bindparam("s", expanding=True)),
                {"t": tids, "s": sorted({p for _, p in chunk})}).all()
            for tid, sid, service, signals, attributes in rows:
                parents[(tid, sid)] = (service, span_signals_of(signals, attributes))
        handoffs = _handoffs(conn, a, b)
    ids = ["trace_id", "span_id"]
    calls = []
    for (tid, sid), g in df.groupby(ids, sort=False):
        first = g.iloc[0]
        caller, kind = first["caller"], int(first["kind"])
        sig = span_signals_of(first["signals"], g["attributes"].dropna().iloc[0] if g["attributes"].notna().any()
                              else None)
        model_call = bool(sig and sig.get("call")) and kind not in (2, 5)
        kids = g[g["child_service"].notna()]
        if not model_call:
            if kind != 3:
                continue
            if sig and sig.get("inh") and kids.empty and first["parent_span_id"]:
                parent = parents.get((tid, first["parent_span_id"]))
                if parent is not None and parent[0] == caller and parent[1] and parent[1].get("call"):
                    continue  # its time is the model call's
        other = kids[kids["child_service"] != caller].sort_values("child_start", kind="stable")
        if len(other):
            callee = other.iloc[0]["child_service"]
        else:
            attrs = _loads(g["attributes"].dropna().iloc[0]) if g["attributes"].notna().any() else None
            callee = (_text_value(sig, "provider") if model_call else "") or \
                address_callee(attrs if isinstance(attrs, dict) else {})
            if not callee and len(kids):
                callee = caller
        if callee:
            calls.append((caller, callee, int(first["duration_ns"]), int(first["status"])))
    calls.extend(handoffs)
    m = pd.DataFrame(calls, columns=["caller", "callee", "duration_ns", "status"])

    def errors(out):
        err = (m["status"] == 2).groupby([m["caller"], m["callee"]]).mean()
        for key, v in err.items():
            out[key]["error_rate"] = float(v)

    return _quantile_rows(m, KEYS["pairs"], "pairs", errors)


def _handoffs(conn, a: int, b: int) -> list[tuple[str, str, int, int]]:
    """(producer's service, consumer's service, producer start to consumer end, 2 when
    either failed) of the hand-offs whose producer starts in [a, b)."""
    from sqlalchemy import bindparam, text

    from modalscope.ingest.traces import link_targets

    consumers = conn.execute(text(
        "SELECT c.trace_id, c.span_id, c.service, c.start_ns + c.duration_ns, c.status, c.links, "
        "p.kind, p.service, p.start_ns, p.status "
        "FROM spans c LEFT JOIN spans p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id "
        "WHERE c.kind = 5 AND c.start_ns >= :lo AND c.start_ns < :hi"),
        {"lo": a - HANDOFF_SLACK_NS, "hi": b + HANDOFF_SLACK_NS}).all()
    out = []
    wanted: dict[tuple, list] = {}
    for tid, sid, service, end, status, links, pkind, pservice, pstart, pstatus in consumers:
        if pkind == 4:
            if a <= pstart < b:
                out.append((pservice, service, max(0, end - pstart), 2 if 2 in (pstatus, status) else 0))
            continue
        targets = [(t, s) for t, s in link_targets(_loads(links)) if (t, s) != (tid, sid)]
        if targets:
            wanted[(tid, sid)] = [service, end, status, targets]
    keys = sorted({t for v in wanted.values() for t in v[3]})
    found = {}
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        stmt = text("SELECT trace_id, span_id, kind, service, start_ns, status FROM spans "
                    "WHERE trace_id IN :t AND span_id IN :s").bindparams(bindparam("t", expanding=True),
                                                                         bindparam("s", expanding=True))
        for tid, sid, kind, service, start, status in conn.execute(
                stmt, {"t": sorted({t for t, _ in chunk}), "s": sorted({s for _, s in chunk})}):
            found[(tid, sid)] = (kind, service, start, status)
    for service, end, status, targets in wanted.values():
        best = None
        for t, s in targets:
            p = found.get((t, s))
            if p is not None and p[0] == 4 and (best is None or (p[2], t, s) < best[0]):
                best = ((p[2], t, s), p)
        if best is not None and a <= best[1][2] < b:
            _, pservice, pstart, pstatus = best[1]
            out.append((pservice, service, max(0, end - pstart), 2 if 2 in (pstatus, status) else 0))
    return out


def _cache_hit(value) -> bool | None:
    """``cache.hit`` re-stated from docs/design.md: a boolean, or from sources without booleans a
    number (non-zero: hit) or one of true/1/hit/yes, false/0/miss/no; anything else is no
    lookup."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0 if math.isfinite(value) else None
    if isinstance(value, str):
        v = value.strip().lower()
        return True if v in ("true", "1", "hit", "yes") else False if v in ("false", "0", "miss", "no") else None
    return None


def _cache_group(attrs: dict, resource: str | None) -> str | None:
    """The lookup's ``CACHE_GROUP_BY``: the span attribute, else the resource attribute, as text."""
    value = attrs.get(CACHE_GROUP_BY)
    if value is None and resource:
        res = json.loads(resource)
        value = res.get(CACHE_GROUP_BY) if isinstance(res, dict) else None
    if value is None or isinstance(value, (dict, list)):
        return None
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def exact_cache(engine, window) -> dict[tuple, dict]:
    """Per cache and ``CACHE_GROUP_BY`` value, lookups and hit rate from the raw spans."""
    import pandas as pd
    from sqlalchemy import text

    with engine.connect() as conn:
        df = pd.read_sql(text("SELECT attributes, resource FROM spans WHERE start_ns >= :a AND start_ns < :b "
                              "AND attributes LIKE '%\"cache.name\"%'"), conn,
                         params={"a": window.start_ns, "b": window.end_ns})
    rows = []
    for attributes, resource in df.itertuples(index=False):
        attrs = json.loads(attributes)
        cache, hit = attrs.get("cache.name"), _cache_hit(attrs.get("cache.hit"))
        if cache is None or isinstance(cache, (dict, list)) or hit is None:
            continue
        rows.append((str(cache), _cache_group(attrs, resource), hit))
    lookups = pd.DataFrame(rows, columns=["cache", "group", "hit"])
    g = lookups.groupby(["cache", "group"], dropna=False)["hit"].agg(["size", "sum"])
    return {(cache, None if pd.isna(group) else group): {"count": int(n), "hit_rate": float(hits) / n}
            for (cache, group), (n, hits) in g.iterrows()}


def cache_rows(rows: list[dict]) -> list[dict]:
    """The cache view's rows with their lookups as ``count`` (``compare_rows``)."""
    return [{**r, "count": r["hits"] + r["misses"]} for r in rows]


EXACT = {"pairs": exact_pairs, "input_types": exact_input_types, "stages": exact_stages, "cache": exact_cache}


def compare_rows(kind: str, ours: list[dict], exact: dict[tuple, dict]) -> dict:
    """Largest relative error of our percentiles against the exact ones, and count agreement."""
    worst = None
    max_err = 0.0
    count_mismatch = []
    seen = set()
    for r in ours:
        key = tuple(r[k] for k in KEYS[kind])
        seen.add(key)
        ex = exact.get(key)
        if ex is None:
            count_mismatch.append({"group": key, "ours": r["count"], "exact": 0})
            continue
        if r["count"] != ex["count"]:
            count_mismatch.append({"group": key, "ours": r["count"], "exact": ex["count"]})
        for name, _ in PCT[kind]:
            mine, true = r.get(name), ex[name]
            if mine is None or true <= 0:
                continue
            err = abs(mine - true) / true
            if worst is None or err > max_err:
                max_err = err
                worst = {"group": list(key), "percentile": name, "ours_ms": mine, "exact_ms": round(true, 4),
                         "count": ex["count"]}
    for key, ex in exact.items():
        if key not in seen:
            count_mismatch.append({"group": key, "ours": 0, "exact": ex["count"]})
    return {"groups": len(exact), "max_rel_err": max_err, "worst": worst,
            "count_mismatches": [{**c, "group": list(c["group"])} for c in count_mismatch]}
