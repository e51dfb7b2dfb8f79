"""Table panels as rows of plain text: one line of span text a cell, at most ``MAX_TEXT``
characters, control and bidi-override characters replaced (HTML escaping is the embed
template's job; an image draws the cells through ``figures.plot_text``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ...core.findings import Finding
from .. import figures
from .. import state as st
from ..units import evidence_items, fmt_count, fmt_ms, fmt_num, fmt_pct


MAX_TEXT = 200  # characters of span text a table cell shows


@dataclass
class Table:
    columns: list[tuple[str, str]]  # (key, header)
    rows: list[dict[str, str]]
    row_classes: list[str] = field(default_factory=list)
    empty: str = ""  # shown when set: the panel has no data in the window


def cell_text(value: Any, limit: int = MAX_TEXT) -> str:
    """Untrusted text for a table cell: one line of at most ``limit`` characters, control
    and bidi-override characters replaced. (HTML escaping is the template's job.)"""
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return figures.UNSAFE_CHARS.sub("\ufffd", text)


def pair_table(rows: list[dict], sort: tuple[str, str] = ("count", "desc")) -> Table:
    cols = [("caller", "caller"), ("callee", "callee"), ("count", "calls"), ("calls_per_day", "calls/day (extrapolated)"),
            ("p50_ms", "P50"), ("p90_ms", "P90"), ("p99_ms", "P99"), ("error_rate", "errors")]
    out = []
    for r in st.sort_rows(rows, *sort):
        out.append({"caller": cell_text(r["caller"]), "callee": cell_text(r["callee"]),
                    "count": fmt_count(r["count"]), "calls_per_day": fmt_count(round(r["calls_per_day"])),
                    "p50_ms": fmt_ms(r["p50_ms"]), "p90_ms": fmt_ms(r["p90_ms"]), "p99_ms": fmt_ms(r["p99_ms"]),
                    "error_rate": fmt_pct(r["error_rate"])})
    return Table(cols, out, [""] * len(out), "" if out else "No service-pair calls in this window.")


def baseline_status(row: dict) -> str:
    """Pure: an ``overview_rows`` row's verdict against its baseline, as the overview shows it."""
    change = row["p95_change"]
    if change is None:
        return "no baseline" if row["baseline_p95_ms"] is None else "no traffic"
    if row["regression"]:
        return f"▲ regression: P95 {fmt_pct(change, 0)} over baseline"
    return f"ok ({'+' if change >= 0 else ''}{fmt_pct(change, 0)})"


def input_types_table(rows: list[dict], margin: float) -> Table:
    """The overview's input-type table: live P50/P95/P99 and bottleneck against the baseline."""
    cols = [("input_type", "input type"), ("count", "traces"), ("rate", "rate"), ("p50", "P50"), ("p95", "P95"),
            ("p99", "P99"), ("baseline", "baseline P50 / P95"), ("bottleneck", "bottleneck stage"),
            ("errors", "errors"), ("status", f"vs baseline (margin {margin * 100:g} %)")]
    out, classes = [], []
    for r in rows:
        status = baseline_status(r)
        out.append({
            "input_type": cell_text(r["input_type"]), "count": fmt_count(r["count"]),
            "rate": f"{fmt_num(r['rate_per_min'])}/min" if r["count"] else "—",
            "p50": fmt_ms(r["p50_ms"]), "p95": fmt_ms(r["p95_ms"]), "p99": fmt_ms(r["p99_ms"]),
            "baseline": (f"{fmt_ms(r['baseline_p50_ms'])} / {fmt_ms(r['baseline_p95_ms'])}"
                         if r["baseline_p95_ms"] else "—"),
            "bottleneck": cell_text(r["bottleneck_stage"] or "—"),
            "errors": fmt_pct(r["error_rate"]) if r["count"] else "—", "status": status,
        })
        classes.append("ms-row-regression" if r["regression"] else "")
    empty = "No traces in this window." if not any(r["count"] for r in rows) else ""
    return Table(cols, out, classes, empty)


def subject_text(subject: Mapping[str, Any]) -> str:
    """A finding's subject as one line of text (as the Anomalies page shows it)."""
    parts = []
    if subject.get("caller") or subject.get("callee"):
        parts.append(f"{subject.get('caller') or 'any'} → {subject.get('callee') or 'any'}")
    for key in ("service", "stage", "input_type", "cache"):
        if subject.get(key) not in (None, ""):
            parts.append(f"{key} {subject[key]}")
    attr = subject.get("attribute")
    if isinstance(attr, Mapping):
        parts.append(f"{attr.get('key')}={attr.get('value')}")
    return " · ".join(str(p) for p in parts) or "everything"


def _evidence_text(evidence: Mapping[str, Any], limit: int = 4) -> str:
    return " · ".join(f"{label} {value}" for _, label, value in evidence_items(dict(evidence), limit))


def anomalies_table(found: list[Finding]) -> Table:
    cols = [("severity", "severity"), ("kind", "finding"), ("subject", "subject"), ("window", "window (UTC)"),
            ("evidence", "evidence"), ("hint", "hint")]
    out, classes = [], []
    for f in found:
        sev = f.severity
        window = f"{f.start} → {f.end}".replace("T", " ").replace("Z", "")
        out.append({"severity": cell_text(sev), "kind": cell_text(f.kind),
                    "subject": cell_text(subject_text(f.subject.to_json())), "window": cell_text(window),
                    "evidence": cell_text(_evidence_text(f.evidence)),
                    "hint": cell_text(f.hint, 400)})
        classes.append(f"ms-sev-{sev}" if sev in ("critical", "warning", "info") else "")
    return Table(cols, out, classes, "" if out else "No findings in this window.")
