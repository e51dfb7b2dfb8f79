"""Tables of text cells: numbers right-aligned, long words cut, untrusted text as Dash text."""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from dash import dcc, html

from .. import state as st
from ..params import rfc3339
from ..units import fmt_ms


#: An unbroken identifier longer than this many characters is cut with an ellipsis (the
#: whole text in its tooltip) rather than broken mid-word or widening its table.
LONG_WORD = 32
# A cell a number reads in: "1,234", "12.3 ms", "−4 s", "2.5 %", "1.4×", "3.1/min", "12 / 30", "—".
_NUMBER = re.compile(r"^[−+-]?(\d[\d,]*(\.\d+)?|\.\d+)\s?(µs|ms|s|min|%|k|M|×|/min|/s|/day)?$")


def is_number_text(value: Any) -> bool:
    """Whether a cell's text is a number in human units (or several joined by " / ")."""
    if not isinstance(value, str) or not value.strip():
        return False
    return all(_NUMBER.match(part.strip()) for part in value.split(" / "))


def numeric_columns(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """The columns whose every text cell (blanks and "—" aside) is a number: right-aligned."""
    out = set()
    for k, _ in columns:
        values = [r.get(k) for r in rows if r.get(k) not in (None, "", "—")]
        if values and all(is_number_text(v) for v in values):
            out.add(k)
    return out


def cell_text(value: str, cut: bool = True) -> tuple[Any, str]:
    """A text cell that wraps at spaces only, as (content, extra cell class): one unbroken word
    stays on its line (the cell's own ``ms-word`` class, not a wrapper: every component costs
    the browser time on each update, and big tables have hundreds of cells), and one longer
    than ``LONG_WORD`` is cut with an ellipsis, whole in its tooltip."""
    if not cut or any(ch.isspace() for ch in value):
        return value, ""
    if len(value) > LONG_WORD:
        return html.Span(value, className="ms-cut", title=value), ""
    return value, " ms-word"


def text_table(columns: Sequence[tuple[str, str]], rows: Iterable[Mapping[str, Any]], *,
               row_class=None, id: str | None = None, className: str = "ms-table",
               numeric: Iterable[str] = ()) -> html.Table:
    """An HTML table of text cells: ``columns`` = [(key, header)]; a cell may also be a component.

    Number columns (``numeric``, and any whose every cell reads as a number) are right-aligned
    (``col-num``); text wraps at spaces only (``cell_text``), except in key/value tables
    (``ms-kv``), which show span data whole."""
    rows = list(rows)
    numeric = numeric_columns(columns, rows) | set(numeric)
    cut = "ms-kv" not in className.split()

    def cls(k: str) -> str:
        return f"col-{k} col-num" if k in numeric else f"col-{k}"

    head = html.Thead(html.Tr([html.Th(h, className=cls(k)) for k, h in columns]))
    body = []
    for r in rows:
        cells = []
        for k, _ in columns:
            v = r.get(k)
            if v is None or hasattr(v, "to_plotly_json") or isinstance(v, list):
                cells.append(html.Td(v, className=cls(k)))
            else:
                text, extra = (str(v), "") if k in numeric else cell_text(str(v), cut)
                cells.append(html.Td(text, className=cls(k) + extra))
        rc = row_class(r) if row_class else None
        body.append(html.Tr(cells, className=rc) if rc else html.Tr(cells))
    kw = {"id": id} if id else {}
    return html.Table([head, html.Tbody(body)], className=className, **kw)


def exemplar_table(rows: list[dict], state: Mapping[str, str], id: str = "drilldown-exemplar-table") -> html.Table:
    """Exemplar traces (``queries.exemplar_traces`` rows), each linking to its trace view."""
    keep = {k: v for k, v in st.carried(state).items() if k in st.TIME_KEYS}
    span_level = any("span_id" in r for r in rows)

    def row(r):
        href = st.to_href(f"/trace/{r['trace_id']}", st.with_(keep, span=r.get("span_id")))
        out = {
            "trace": dcc.Link(r["trace_id"][:16] + "…", href=href, className="ms-mono ms-trace-link",
                              title=r["trace_id"]),
            "start": rfc3339(r["start_unix_nano"]).replace("T", " ").replace("Z", " UTC"),
            "duration": fmt_ms(r["duration_ms"]),
            "root": f"{r['root_service'] or '?'} · {r['root_name'] or '?'}",
            "input_type": r["input_type"],
            "spans": str(r["span_count"]),
            "error": "error" if r["error"] else "",
        }
        if span_level:
            out["span"] = f"{r.get('span_service', '')} · {r.get('span_name', '')}"
            out["span_ms"] = fmt_ms(r.get("span_ms"))
        return out

    cols = [("trace", "trace")]
    if span_level:
        cols += [("span_ms", "matched span"), ("span", "span")]
    cols += [("duration", "trace duration"), ("start", "start"), ("root", "root"), ("input_type", "input type"),
             ("spans", "spans"), ("error", "status")]
    return text_table(cols, [row(r) for r in rows], id=id,
                        row_class=lambda r: "ms-row-error" if r["error"] else None)
