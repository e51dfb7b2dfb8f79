"""Every Dash component id, in one place (pages import these; tests select by them)."""

# shell
URL = "url"
NAV = "nav"
NAV_LINKS = {  # path -> id of its nav link
    "/": "nav-overview",
    "/pairs": "nav-pairs",
    "/drilldown": "nav-drilldown",
    "/trace": "nav-trace",
    "/stages": "nav-stages",
    "/cache": "nav-cache",
    "/anomalies": "nav-anomalies",
    "/compare": "nav-compare",
}

# toolbar (on every page)
TOOLBAR = "toolbar"
TOOLBAR_STATE = "toolbar-state"
RANGE = "range-preset"
START = "range-start"
END = "range-end"
APPLY = "range-apply"
SERVICE = "filter-service"
PAIR = "filter-pair"
STAGE = "filter-stage"
INPUT_TYPE = "filter-input-type"
TOOLBAR_ERROR = "toolbar-error"
WINDOW_LABEL = "window-label"
CLEAR = "filters-clear"

# overview
OV_STATE = "overview-state"
OV_TABLE = "overview-table"
OV_TRAFFIC = "overview-traffic"
OV_FINDINGS = "overview-findings"
OV_INCIDENTS = "overview-incidents"  # the top incidents panel
OV_INCIDENT_LIST = "overview-incidents-list"

# service pairs
PAIRS_STATE = "pairs-state"
PAIRS_HEATMAP = "pairs-heatmap"
PAIRS_HEAT_DATA = "pairs-heatmap-data"
PAIRS_TABLE = "pairs-table"
PAIRS_EMPTY = "pairs-empty"

# drilldown
DD_STATE = "drilldown-state"
DD_TITLE = "drilldown-title"
DD_SUMMARY = "drilldown-summary"
DD_HIST = "drilldown-histogram"
DD_TIME = "drilldown-timeseries"
DD_EXEMPLARS = "drilldown-exemplars"

# trace
TR_STATE = "trace-state"
TR_OPEN_INPUT = "trace-open-id"
TR_OPEN_BUTTON = "trace-open-button"
TR_OPEN_ERROR = "trace-open-error"
TR_HEADER = "trace-header"
TR_WATERFALL = "trace-waterfall"
TR_ICICLE = "trace-icicle"
TR_SPANS = "trace-spans"
TR_DETAIL = "trace-span-detail"

# stages
ST_STATE = "stages-state"
ST_STACK = "stages-stack"
ST_TIME = "stages-timeseries"
ST_VIT = "stages-vit"
ST_TABLE = "stages-table"

# cache
CA_STATE = "cache-state"
CA_GROUP_BY = "cache-group-by"
CA_RATE = "cache-hit-rate"
CA_SHARE = "cache-share"
CA_TABLE = "cache-table"

# anomalies
AN_STATE = "anomalies-state"
AN_LIST = "anomalies-list"
AN_CHART = "anomalies-chart"  # {"type": AN_CHART, "index": n} per finding
AN_CHART_SPEC = "anomalies-chart-spec"  # its store: the finding's window and subject
AN_INCIDENTS = "anomalies-incidents"  # the incident sections (each id "incident-<id>")
AN_KIND_FILTER = "anomalies-kind-filter"  # links: all kinds, then each kind found
AN_SEVERITY_FILTER = "anomalies-severity-filter"
# an incident whose cause is unknown, its suspects drawn after the page (Overview, Anomalies)
INCIDENT_SUSPECTS = "incident-suspects"  # {"type": ..., "incident": id}: its cause line
INCIDENT_SUSPECTS_ASK = "incident-suspects-ask"  # its store: the incident's span and subject

# compare
CMP_STATE = "compare-state"
CMP_SUMMARY = "compare-summary"
CMP_STAGES = "compare-stages"
CMP_STAGE_TABLE = "compare-stage-table"
CMP_ATTRS = "compare-attributes"

# time charts: "Compare this window"
OV_COMPARE = "overview-compare-link"
DD_COMPARE = "drilldown-compare-link"

# share control: one per panel, pattern-matching ids {"type": <below>, "panel": <panel name>}
SHARE = "share"  # the <details> holding the popover
SHARE_QUERY = "share-query"  # dcc.Store {"panel", "params"}: what the control shares
SHARE_TTL = "share-ttl"  # radio: 0 (unsigned) or the signed link's lifetime in seconds
SHARE_LINK = "share-link"  # read-only inputs (each with a dcc.Clipboard) ...
SHARE_EMBED = "share-embed"
SHARE_IFRAME = "share-iframe"
SHARE_IMAGE = "share-image"
SHARE_NOTE = "share-note"


def share_id(kind: str, panel) -> dict:
    """The pattern-matching id of one piece of a panel's Share control (``panel`` may be MATCH)."""
    return {"type": kind, "panel": panel}
