"""The time/filter toolbar and the options of its pickers, narrowed to what is typed."""

from __future__ import annotations

import json
import time
from typing import Any, Iterable, Mapping, Sequence

from dash import dcc, html

from .. import ids
from .. import state as st
from ..queries import filter_options
from .layout import reader


def toolbar(path: str, state: Mapping[str, str], show: Sequence[str] = ("service", "pair", "stage", "input_type"),
            error: str | None = None) -> html.Div:
    """Time-range presets, absolute start/end, and the filter pickers, initialised from the URL.

    Every page renders every control (hidden where it does not apply), so the toolbar's
    one callback finds all its inputs on any page.
    """
    rng = state.get("range") or ("" if state.get("start") else st.DEFAULT_RANGE_LABEL)
    pair = st.pair_value(state.get("caller"), state.get("callee"))

    def picker(key: str, component_id: str, value, placeholder: str, label: str):
        opts = [{"label": option_label(_pair_text(value) if key == "pair" else str(value)), "value": value}] \
            if value else []
        return html.Div(className="ms-filter", style=None if key in show else {"display": "none"}, children=[
            html.Label(label, htmlFor=component_id, className="ms-filter-label"),
            dcc.Dropdown(id=component_id, options=opts, value=value, placeholder=placeholder, clearable=True,
                         className="ms-dropdown", optionHeight=32, maxHeight=320),
        ])

    return html.Div(id=ids.TOOLBAR, className="ms-toolbar", children=[
        dcc.Store(id=ids.TOOLBAR_STATE, data={"path": path, "state": dict(state)}),
        html.Div(className="ms-range", children=[
            html.Span("Time", className="ms-filter-label"),
            dcc.RadioItems(id=ids.RANGE, className="ms-presets", inline=True, value=rng,
                           options=[{"label": p, "value": p} for p in st.PRESETS]
                           + ([{"label": state["range"], "value": state["range"]}]
                              if state.get("range") and state["range"] not in st.PRESETS else [])),
            dcc.Input(id=ids.START, type="text", debounce=True, placeholder="start, e.g. 2026-11-30T14:00Z",
                      value=state.get("start") or "", className="ms-input ms-time", spellCheck=False),
            html.Span("→", className="ms-arrow"),
            dcc.Input(id=ids.END, type="text", debounce=True, placeholder="end (default now)",
                      value=state.get("end") or "", className="ms-input ms-time", spellCheck=False),
            html.Button("Apply", id=ids.APPLY, n_clicks=0, className="ms-button"),
        ]),
        html.Div(className="ms-filters", style=None if show else {"display": "none"}, children=[
            picker("service", ids.SERVICE, state.get("service"), "any service", "Service"),
            picker("pair", ids.PAIR, pair, "any pair", "Pair"),
            picker("stage", ids.STAGE, state.get("stage"), "any stage", "Stage"),
            picker("input_type", ids.INPUT_TYPE, state.get("input_type"), "any input type", "Input type"),
            html.Button("Clear filters", id=ids.CLEAR, n_clicks=0, className="ms-button ms-button-quiet"),
        ]),
        html.Div(error or "", id=ids.TOOLBAR_ERROR, className="ms-toolbar-error", role="alert"),
    ])


def _pair_text(value: str | None) -> str:
    caller, callee = st.parse_pair_value(value)
    return f"{caller or 'any'} → {callee or 'any'}"


# A picker holds at most this many options; typing searches every value on the server
# (the dropdown indexes each option's label for its own search, at a cost that grows with
# the option count and the square of the label's length).
FILTER_OPTIONS = 100
OPTION_LABEL_CHARS = 80


def option_label(text: str) -> str:
    return text if len(text) <= OPTION_LABEL_CHARS else text[: OPTION_LABEL_CHARS - 1] + "…"


def _matching(values: Iterable, text_of, search: str | None, current=None) -> list:
    """The first ``FILTER_OPTIONS`` of ``values`` whose text contains ``search`` (any case),
    and ``current`` (the selected value) among them, so the dropdown keeps it."""
    needle = (search or "").casefold()
    out = []
    for v in values:
        if len(out) >= FILTER_OPTIONS:
            break
        if not needle or needle in text_of(v).casefold():
            out.append(v)
    if current is not None and current not in out:
        out.append(current)
    return out


_VALUES_SECONDS = 5.0  # typing in a picker re-reads the known values at most this often
_values_cache: dict[int, tuple[float, Any, dict]] = {}


def _filter_values(store) -> dict:
    """``queries.filter_options`` of ``store``, kept a few seconds: every keystroke in a
    picker asks again, and reading every series takes a few hundred ms at 20,000 services."""
    now = time.monotonic()
    hit = _values_cache.get(id(store))
    if hit is not None and hit[1] is store and now - hit[0] < _VALUES_SECONDS:
        return hit[2]
    values = filter_options(store)
    if len(_values_cache) > 16:
        _values_cache.clear()
    _values_cache[id(store)] = (now, store, values)
    return values


def toolbar_options(state: Mapping[str, Any], service_search: str | None = None,
                    pair_search: str | None = None) -> tuple[list, list, list, list]:
    """The pickers' options (service, pair, stage, input type) for a page's ``state``,
    services and pairs narrowed to those matching what is typed in their picker."""
    values = _filter_values(reader())
    services = _matching(values["services"], str, service_search, state.get("service") or None)
    current = (state.get("caller") or "", state.get("callee") or "")
    pairs = _matching([tuple(p) for p in values["pairs"]], lambda p: f"{p[0]} → {p[1]}", pair_search,
                      current if any(current) else None)
    stages = list(values["stages"])
    if state.get("stage") and state["stage"] not in stages:
        stages.append(state["stage"])
    its = list(values["input_types"])
    if state.get("input_type") and state["input_type"] not in its:
        its.append(state["input_type"])
    return ([{"label": option_label(s), "value": s} for s in services],
            [{"label": option_label(f"{c or 'any'} → {e or 'any'}"), "value": json.dumps([c, e])} for c, e in pairs],
            [{"label": option_label(s), "value": s} for s in stages],
            [{"label": option_label(t), "value": t} for t in its])
