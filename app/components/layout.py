"""The page frame and its small pieces: navigation, who is signed in, panels, empty states."""

from __future__ import annotations

from typing import Any, Mapping

import dash
from dash import dcc, html
from flask import current_app

from .. import ids


NAV_ITEMS = (  # (path, label, link id)
    ("/", "Overview", ids.NAV_LINKS["/"]),
    ("/pairs", "Service pairs", ids.NAV_LINKS["/pairs"]),
    ("/drilldown", "Drilldown", ids.NAV_LINKS["/drilldown"]),
    ("/trace", "Trace", ids.NAV_LINKS["/trace"]),
    ("/stages", "Stages", ids.NAV_LINKS["/stages"]),
    ("/cache", "Cache", ids.NAV_LINKS["/cache"]),
    ("/anomalies", "Anomalies", ids.NAV_LINKS["/anomalies"]),
    ("/compare", "Compare", ids.NAV_LINKS["/compare"]),
)
EMPTY_HINT = ["send OTLP to ", html.Code(":4318"), " (or gRPC ", html.Code(":4317"), ") or run ",
              html.Code("modalscope demo"), "."]


def reader():
    return current_app.extensions["modalscope"]["reader"]


# -- shell -----------------------------------------------------------------------------
def shell(account: Mapping[str, Any] | None = None) -> html.Div:
    """The page frame; ``account`` (``auth.account()``) adds "Signed in as …" / "Sign out"."""
    return html.Div(className="ms-app", children=[
        dcc.Location(id=ids.URL, refresh="callback-nav"),
        html.Header(className="ms-header", children=[
            dcc.Link(className="ms-brand", href="/", children=[html.Span("◆", className="ms-logo"), "modalscope"]),
            html.Nav(id=ids.NAV, className="ms-nav", children=[
                dcc.Link(label, id=link_id, href=path, className="ms-nav-link") for path, label, link_id in NAV_ITEMS
            ]),
            *account_links(account),
        ]),
        html.Main(className="ms-main", children=[dash.page_container]),
    ])


def account_links(account: Mapping[str, Any] | None) -> list:
    """Who is signed in (a proxy's identity, as text) and, for a login session, "Sign out":
    a plain link, since /logout is a server route, not a Dash page."""
    if not account:
        return []
    children: list = []
    if account.get("identity"):
        children.append(html.Span(f"Signed in as {account['identity']}", className="ms-account-who"))
    if account.get("session"):
        children.append(html.A("Sign out", href="/logout", className="ms-account-signout"))
    return [html.Div(children, className="ms-account")] if children else []


# -- small pieces ----------------------------------------------------------------------
def empty_state(title: str, *hint: Any, id: str | None = None) -> html.Div:
    kw = {"id": id} if id else {}
    return html.Div(className="ms-empty", children=[html.Div(title, className="ms-empty-title"),
                                                    html.Div(list(hint), className="ms-empty-hint")], **kw)


def no_data(what: str = "spans") -> html.Div:
    return empty_state(f"No {what} in this window.", "Widen the time range, clear filters, or ", *EMPTY_HINT)


def banner(text: str | None, kind: str = "error") -> html.Div | None:
    return html.Div(text, className=f"ms-banner ms-banner-{kind}", role="alert") if text else None


def panel(title: str, *children: Any, id: str | None = None, className: str = "", actions=None) -> html.Section:
    kw = {"id": id} if id else {}
    head = [html.H2(title, className="ms-panel-title")]
    if actions:
        head.append(html.Div(actions, className="ms-panel-actions"))
    return html.Section(className=f"ms-panel {className}".strip(), children=[html.Div(head, className="ms-panel-head"),
                                                                              *children], **kw)


def loading(*children: Any) -> dcc.Loading:
    return dcc.Loading(type="default", delay_show=250, color="#2563eb", children=list(children))


def graph(component_id: str, **kw) -> dcc.Graph:
    config = {"displaylogo": False,
              "modeBarButtonsToRemove": ["lasso2d", "autoScale2d", "toImage"]}
    config.update(kw.pop("config", {}))
    return dcc.Graph(id=component_id, config=config, className="ms-graph", **kw)
