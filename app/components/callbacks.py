"""The shell's callbacks: nav links that keep the window and filters, the toolbar writing
the URL, the pickers' options, the Share control's signing, and the suspects of an incident
listed without them (Overview, Anomalies)."""

from __future__ import annotations

from urllib.parse import parse_qs

import dash
from dash import MATCH, Input, Output, State, ctx, no_update

from .. import ids
from .. import incidents as inc
from .. import links
from .. import state as st
from .cards import asked_suspects, suspects_line
from .filters import toolbar_options
from .layout import NAV_ITEMS, reader
from .sharing import register_share_callback


def rendering() -> bool:
    """True when a callback runs because its inputs were just rendered (a page was laid out),
    not because a user changed one. Dash reports every input as triggered then, even for
    ``prevent_initial_call`` callbacks whose components a page change inserted; a user
    changes one input at a time."""
    return len(ctx.triggered) > 1


def register_callbacks() -> None:
    """Register the shell's callbacks (``dash.callback``) for the app being built."""
    register_share_callback()

    @dash.callback(
        [Output(link_id, "href") for _, _, link_id in NAV_ITEMS]
        + [Output(link_id, "className") for _, _, link_id in NAV_ITEMS],
        Input(ids.URL, "pathname"),
        Input(ids.URL, "search"),
    )
    def _nav_links(pathname, search):
        state = st.from_query({k: v for k, v in parse_qs((search or "").lstrip("?")).items()})
        keep = st.carried(state)
        hrefs = [st.to_href(path, keep) for path, _, _ in NAV_ITEMS]
        current = pathname or "/"
        classes = []
        for path, _, _ in NAV_ITEMS:
            active = current == path or (path != "/" and current.startswith(path + "/"))
            classes.append("ms-nav-link active" if active else "ms-nav-link")
        return hrefs + classes

    @dash.callback(
        Output(ids.URL, "href", allow_duplicate=True),
        Output(ids.TOOLBAR_ERROR, "children"),
        Input(ids.RANGE, "value"),
        Input(ids.APPLY, "n_clicks"),
        Input(ids.START, "n_submit"),
        Input(ids.END, "n_submit"),
        Input(ids.SERVICE, "value"),
        Input(ids.PAIR, "value"),
        Input(ids.STAGE, "value"),
        Input(ids.INPUT_TYPE, "value"),
        Input(ids.CLEAR, "n_clicks"),
        State(ids.START, "value"),
        State(ids.END, "value"),
        State(ids.TOOLBAR_STATE, "data"),
        prevent_initial_call=True,
    )
    def _toolbar(rng, _apply, _s1, _s2, service, pair, stage, input_type, _clear, start, end, data):
        if rendering():
            return no_update, no_update
        data = data or {}
        href, error = links.toolbar_href(data.get("path") or "/", data.get("state") or {}, ctx.triggered_id,
                                   {"range": rng, "start": start, "end": end, "service": service, "pair": pair,
                                    "stage": stage, "input_type": input_type})
        if href is None:
            return no_update, error
        current = st.to_href(data.get("path") or "/", data.get("state") or {})
        return (no_update if href == current else href), ""

    @dash.callback(
        Output(ids.SERVICE, "options"),
        Output(ids.PAIR, "options"),
        Output(ids.STAGE, "options"),
        Output(ids.INPUT_TYPE, "options"),
        Input(ids.TOOLBAR_STATE, "data"),
        Input(ids.SERVICE, "search_value"),
        Input(ids.PAIR, "search_value"),
    )
    def _filter_options(data, service_search, pair_search):
        state = (data or {}).get("state") or {}
        opts = toolbar_options(state, service_search, pair_search)
        if not rendering() and ctx.triggered_id == ids.SERVICE:  # typing: only that picker changes
            return opts[0], no_update, no_update, no_update
        if not rendering() and ctx.triggered_id == ids.PAIR:
            return no_update, opts[1], no_update, no_update
        return opts

    @dash.callback(
        Output({"type": ids.INCIDENT_SUSPECTS, "incident": MATCH}, "children"),
        Input({"type": ids.INCIDENT_SUSPECTS_ASK, "incident": MATCH}, "data"),
    )
    def _incident_suspects(ask):
        asked = asked_suspects(ask)
        return suspects_line(None if asked is None else inc.suspects_in(reader(), *asked))


def narrow(path: str, state, selected, relayout):
    """Callback answer for a box-select/zoom on a time chart."""
    href = links.narrow_href(path, state or {}, selected, relayout)
    return no_update if href is None else href
