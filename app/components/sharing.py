"""The Share control beside a panel: its link, embed and image addresses, signed on the server."""

from __future__ import annotations

from typing import Any, Mapping

import dash
from dash import MATCH, Input, Output, State, dcc, html
from flask import current_app, has_app_context, has_request_context, request

from .. import ids, panels
from ..params import ParamError


SHARE_TTLS = ((0, "not signed"), (86400, "1 day"), (7 * 86400, "7 days"), (30 * 86400, "30 days"))


def _share_secret() -> str:
    """MODALSCOPE_SECRET_KEY of the app serving this request ('' outside one)."""
    return current_app.extensions["modalscope"]["settings"].secret_key if has_app_context() else ""


def _base_url() -> str:
    """This site's root as the browser reached it (through the proxy's host when trusted)."""
    return request.url_root if has_request_context() else "/"


def share_values(panel: str, params: Mapping[str, str], ttl_seconds: int = 0) -> tuple[dict | None, str]:
    """The Share control's values: ``panels.share_urls`` (what ``/api/v1/share`` answers),
    signed when ``ttl_seconds`` > 0 and MODALSCOPE_SECRET_KEY is set; else (None, why not)."""
    if panel not in panels.PANELS:
        return None, f"unknown panel {panel[:64]!r}"
    secret = _share_secret()
    try:
        values = panels.share_urls(_base_url(), panel, params, secret=secret,
                                   ttl_seconds=ttl_seconds or None, sign=bool(secret and ttl_seconds))
    except ParamError as exc:
        return None, f"{exc.parameter}: {exc.message}"
    if values["signed"]:
        note = (f"Signed: opens this panel read-only without a login until {values['expires']}; "
                "changing its time or filters voids the signature (width, height and theme stay free).")
    elif secret:
        note = "Not signed: whoever opens these needs access to the dashboard. Sign them to share without a login."
    else:
        note = "Not signed (set MODALSCOPE_SECRET_KEY to sign read-only, expiring links)."
    return values, note


def _share_field(label: str, kind: str, panel: str, value: str) -> html.Div:
    field_id = ids.share_id(kind, panel)
    return html.Div(className="ms-share-field", children=[
        html.Label(label, className="ms-filter-label"),
        html.Div(className="ms-share-row", children=[
            dcc.Input(id=field_id, type="text", value=value, readOnly=True, spellCheck=False,
                      className="ms-input ms-share-value"),
            dcc.Clipboard(target_id=field_id, title="copy", className="ms-share-copy"),
        ]),
    ])


def share_control(panel: str, state: Mapping[str, Any], trace_id: str | None = None) -> html.Details:
    """The "Share" button beside a panel: a popover with the deep link, the embed URL, the
    iframe snippet and the PNG URL in read-only fields with copy buttons, and (with
    MODALSCOPE_SECRET_KEY set) "signed, expires in 1 day | 7 days | 30 days", signed on the
    server by the same function as ``/api/v1/share``."""
    params = panels.panel_params(panels.PANELS[panel], state, trace_id)
    values, note = share_values(panel, params)
    values = values or {}
    body = [
        dcc.Store(id=ids.share_id(ids.SHARE_QUERY, panel), data={"panel": panel, "params": params}),
        _share_field("Link to this view", ids.SHARE_LINK, panel, values.get("link", "")),
        _share_field("Embed URL (Notion, iframe macros)", ids.SHARE_EMBED, panel, values.get("embed_url", "")),
        _share_field("iframe snippet (HTML)", ids.SHARE_IFRAME, panel, values.get("iframe", "")),
        _share_field("PNG image (GitHub wiki, Markdown)", ids.SHARE_IMAGE, panel, values.get("image_url", "")),
    ]
    if _share_secret():
        body.append(html.Div(className="ms-share-sign", children=[
            html.Span("Signed, expires in", className="ms-filter-label"),
            dcc.RadioItems(id=ids.share_id(ids.SHARE_TTL, panel), value=0, inline=True, className="ms-share-ttl",
                           options=[{"label": label, "value": seconds} for seconds, label in SHARE_TTLS]),
        ]))
    body.append(html.Div(note, id=ids.share_id(ids.SHARE_NOTE, panel), className="ms-note ms-share-note"))
    return html.Details(id=ids.share_id(ids.SHARE, panel), className="ms-share", children=[
        html.Summary("Share", className="ms-share-button", title="link, embed and image of this panel"),
        html.Div(body, className="ms-share-pop"),
    ])


def register_share_callback() -> None:
    """Signing happens on the server: the chosen lifetime comes in, signed URLs go out."""
    @dash.callback(
        Output(ids.share_id(ids.SHARE_LINK, MATCH), "value"),
        Output(ids.share_id(ids.SHARE_EMBED, MATCH), "value"),
        Output(ids.share_id(ids.SHARE_IFRAME, MATCH), "value"),
        Output(ids.share_id(ids.SHARE_IMAGE, MATCH), "value"),
        Output(ids.share_id(ids.SHARE_NOTE, MATCH), "children"),
        Input(ids.share_id(ids.SHARE_TTL, MATCH), "value"),
        State(ids.share_id(ids.SHARE_QUERY, MATCH), "data"),
        prevent_initial_call=True,
    )
    def _share(ttl, data):
        data = data or {}
        try:
            ttl_seconds = int(ttl or 0)
        except (TypeError, ValueError):
            ttl_seconds = 0
        if ttl_seconds not in {s for s, _ in SHARE_TTLS}:
            ttl_seconds = 0
        values, note = share_values(str(data.get("panel") or ""), data.get("params") or {}, ttl_seconds)
        if values is None:
            return "", "", "", "", note
        return values["link"], values["embed_url"], values["iframe"], values["image_url"], note
