"""What every query shares: milliseconds, the input types' display order, what a
drilldown's filters measure (its subject), and the values the filter pickers offer."""

from __future__ import annotations

from typing import Any

from ...core.spans import STAGES
from ...models.reader import Filters, RollupQuery, StoreReader
from ..params import Window

INPUT_TYPE_ORDER = ("text", "image", "multi_image", "audio", "video", "unknown")


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def _pcts(hist, qs=(0.5, 0.9, 0.99)) -> list[float | None]:
    return [_ms(v) for v in hist.quantiles(list(qs))]


def _group_value(value: Any) -> str | None:
    """An attribute value as a cache group or Compare facet: scalars as text, else None."""
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- what a drilldown measures ---------------------------------------------------------
def subject_of(filters: Filters) -> str:
    """What a drilldown or exemplar query measures, first match wins:

    ``pair`` (caller or callee given: the calls, i.e. CLIENT spans of the pair),
    ``stage`` (spans of that stage, in ``service`` if given), ``service`` (every span of
    the service), else ``trace`` (end-to-end trace latency). ``input_type`` narrows all.
    """
    if filters.caller or filters.callee:
        return "pair"
    if filters.stage:
        return "stage"
    if filters.service:
        return "service"
    return "trace"


def subject_label(filters: Filters) -> str:
    subject = subject_of(filters)
    it = f" ({filters.input_type} requests)" if filters.input_type else ""
    if subject == "pair":
        model = f" of model {filters.model}" if filters.model else ""
        return f"calls {filters.caller or 'any'} → {filters.callee or 'any'}{model}{it}"
    if subject == "stage":
        where = f" in {filters.service}" if filters.service else ""
        return f"{filters.stage} spans{where}{it}"
    if subject == "service":
        return f"every span of {filters.service}{it}"
    return f"end-to-end {filters.input_type + ' ' if filters.input_type else ''}requests"


def _subject_query(filters: Filters, window: Window, **kw) -> RollupQuery:
    subject = subject_of(filters)
    if subject == "pair":
        return RollupQuery("pair", window.start_ns, window.end_ns, filters, **kw)
    if subject in ("stage", "service"):
        f = Filters(service=filters.service, stage=filters.stage, input_type=filters.input_type)
        return RollupQuery("op", window.start_ns, window.end_ns, f, **kw)
    f = Filters(input_type=filters.input_type)
    return RollupQuery("trace", window.start_ns, window.end_ns, f, **kw)


def filter_options(reader: StoreReader) -> dict[str, list]:
    """Values the filter pickers offer (every known series dimension value)."""
    values = reader.rollups.series_values()
    order = {s: i for i, s in enumerate(STAGES)}
    it_order = {t: i for i, t in enumerate(INPUT_TYPE_ORDER)}
    values["stages"] = sorted(set(values["stages"]) | set(STAGES), key=lambda s: (order.get(s, 99), s))
    values["input_types"] = sorted(set(values["input_types"]) | set(INPUT_TYPE_ORDER),
                                   key=lambda t: (it_order.get(t, 99), t))
    return values
