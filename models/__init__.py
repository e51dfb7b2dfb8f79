"""SQLAlchemy 2.0 typed models of the store.

The tables:

* ``spans`` — raw spans, unique on ``(trace_id, span_id)``; kept ``MODALSCOPE_RETENTION_DAYS``.
* ``traces`` — one row a trace, written when the trace settles; ``pending`` marks traces
  with spans not yet folded into the rollups.
* ``series`` + ``rollups`` — per minute and series (operation, service pair, input type,
  per-trace stage time), a log-bucketed latency histogram with count, error count and sum.
* ``rollups_hourly`` — the same per hour, written in the same transaction as the minutes, so
  long windows merge 60 times fewer rows; kept ``MODALSCOPE_ROLLUP_RETENTION_DAYS`` while
  minute rows are kept ``MODALSCOPE_MINUTE_ROLLUP_DAYS``.
* ``cursors`` — ingest watermarks and leases (Cloud Trace poller, metrics exporter).
* ``finding_evaluations`` — the anomaly catalog's findings over the last hour / day, written
  by the worker once a minute (``app/evaluations.py``) so the Anomalies page need not run
  every detector on each request; a cache, kept for minutes.
* ``rollup_changes`` — which minutes each write to the rollups touched, and when: what keeps
  the caches above and below honest.
* ``link_waits`` — CONSUMER spans whose linked PRODUCER span is not stored yet: when it
  arrives, settling its trace re-opens the consumer's trace so the hand-off is counted.
* ``rollup_packs`` — closed hours of the minute rollups the detectors read whole, one blob a
  kind and hour (``models/packs.py``); a cache the settler fills.

User-supplied strings (service and span names) are unbounded ``String`` columns: a length
limit would make PostgreSQL refuse a whole batch for one hostile name.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only aliases ROWID (fast inserts) for a column declared exactly INTEGER.
BigId = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Span(Base):
    __tablename__ = "spans"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    trace_id: Mapped[str] = mapped_column(String(32))
    span_id: Mapped[str] = mapped_column(String(16))
    parent_span_id: Mapped[str | None] = mapped_column(String(16))
    service: Mapped[str] = mapped_column(String)
    name: Mapped[str] = mapped_column(String)
    kind: Mapped[int] = mapped_column(SmallInteger)  # OTLP SpanKind numbering
    stage: Mapped[str] = mapped_column(String(16))
    start_ns: Mapped[int] = mapped_column(BigInteger)
    duration_ns: Mapped[int] = mapped_column(BigInteger)
    # models/buckets.duration_bucket(duration_ns), written with the span: the exemplar index's key
    duration_bucket: Mapped[int] = mapped_column(SmallInteger)
    status: Mapped[int] = mapped_column(SmallInteger)  # 0 unset, 1 ok, 2 error
    status_message: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(16))
    instance: Mapped[str | None] = mapped_column(String)  # resource service.instance.id
    scope: Mapped[str] = mapped_column(String, default="")
    attributes: Mapped[str] = mapped_column(Text)  # JSON object
    resource: Mapped[str] = mapped_column(Text)  # JSON object
    events: Mapped[str | None] = mapped_column(Text)  # JSON list or NULL
    links: Mapped[str | None] = mapped_column(Text)  # JSON list of {trace_id, span_id, attributes} or NULL
    # What the span says about its trace (ingest/signals.py), JSON or NULL: read at ingest
    # from the whole attribute values, so settling never parses large message contents.
    signals: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        UniqueConstraint("trace_id", "span_id"),
        Index(None, "start_ns"),
        # Exemplars: a service's slowest spans in a window or latency band walk this index's
        # duration buckets downwards instead of sorting every span of the window (Jaeger's
        # duration index); within a bucket, start_ns bounds the read to the window and
        # duration_ns orders it without reading rows. Buckets rather than durations keep
        # inserts near a few hundred run ends (models/buckets.py).
        Index("ix_spans_duration_walk", "service", "duration_bucket", "start_ns", "duration_ns"),
    )


class Trace(Base):
    __tablename__ = "traces"

    trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    root_service: Mapped[str | None] = mapped_column(String)
    root_name: Mapped[str | None] = mapped_column(String)
    start_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    duration_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    span_count: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[bool] = mapped_column(Boolean, default=False)
    input_type: Mapped[str] = mapped_column(String(16), default="unknown")
    # Settling: a receiver sets pending and last_seen_ns; the settler folds the trace into
    # the rollups once it has been idle MODALSCOPE_SETTLE_SECONDS and clears pending.
    pending: Mapped[bool] = mapped_column(Boolean, default=True)
    last_seen_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    # Bumped by every write that adds spans: a settler that read the trace at another
    # version knows its result is stale.
    version: Mapped[int] = mapped_column(BigInteger, default=0)
    # The earliest start of any span stored for the trace, kept by every write (NULL: not
    # known, a row from before 0008). A pair's exemplar search reads the calls of pending
    # traces through the span index from here on instead of reading every pending trace.
    first_start_ns: Mapped[int | None] = mapped_column(BigInteger)
    settled_ns: Mapped[int | None] = mapped_column(BigInteger)
    # Exactly what the last settle added to the rollups, so a late span's re-settle can
    # subtract it: packed (series_id, minute, value_ns, error) records.
    contributions: Mapped[bytes | None] = mapped_column(LargeBinary)

    __table_args__ = (
        Index(None, "start_ns"),
        Index(None, "pending", "last_seen_ns"),
        # Slowest traces first, walked backwards; an input type's tail (the Stages page's P99)
        # with its window checked in the index.
        Index("ix_traces_duration_tail", "duration_ns", "input_type", "start_ns"),
        # One input type's tail alone (the Stages page's P99 of a fast type among slow ones).
        # Partial: only reads that ask for settled contributions can take it, so no other
        # read of one input type's traces is drawn away from the start index.
        Index("ix_traces_input_type_tail", "input_type", "duration_ns", "start_ns",
              sqlite_where=text("contributions IS NOT NULL"), postgresql_where=text("contributions IS NOT NULL")),
    )


class Series(Base):
    """One latency series: its kind and the dimensions that name it ('' when not used)."""

    __tablename__ = "series"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # sha256 of the dimension tuple: unique without indexing unbounded strings.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # op | pair | trace | tstage
    service: Mapped[str] = mapped_column(String, default="")
    name: Mapped[str] = mapped_column(String, default="")
    stage: Mapped[str] = mapped_column(String(16), default="")
    input_type: Mapped[str] = mapped_column(String(16), default="")
    caller: Mapped[str] = mapped_column(String, default="")
    callee: Mapped[str] = mapped_column(String, default="")


class Rollup(Base):
    """Per minute and series: count, errors, sum and a log-bucketed histogram (models/sketch.py)."""

    __tablename__ = "rollups"

    minute: Mapped[int] = mapped_column(Integer, primary_key=True)  # unix time // 60
    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    error_count: Mapped[int] = mapped_column(BigInteger, default=0)
    sum_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    sketch: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (Index(None, "series_id", "minute"),)


class HourlyRollup(Base):
    """Per hour and series: the sums and merged histogram of that hour's minute rollups."""

    __tablename__ = "rollups_hourly"

    hour: Mapped[int] = mapped_column(Integer, primary_key=True)  # unix time // 3600
    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    error_count: Mapped[int] = mapped_column(BigInteger, default=0)
    sum_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    sketch: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (Index(None, "series_id", "hour"),)


class QuarterRollup(Base):
    """Per quarter hour and series: the sums and merged histogram of its 15 minute rollups,
    so a day-long time chart at 15- or 30-minute steps reads 96 rows a series, not 1,440."""

    __tablename__ = "rollups_15m"

    quarter: Mapped[int] = mapped_column(Integer, primary_key=True)  # unix time // 900
    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    error_count: Mapped[int] = mapped_column(BigInteger, default=0)
    sum_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    sketch: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (Index(None, "series_id", "quarter"),)


# The cursor row whose ``position`` is the oldest minute retention keeps minute rollups for.
MINUTE_BOUNDARY_CURSOR = "retention:minute_rollups"
# The cursor row whose ``position`` is the span start (ns) from which ``pair_calls`` is
# complete: a store upgraded to it holds no rows for the spans settled before; absent = 0.
PAIR_CALLS_CURSOR = "pair_calls:complete_from"


class PairCall(Base):
    """One call of a service pair: a settled CLIENT span and the ``pair`` series it counts
    in, so a pair's slowest calls are an index walk rather than a search through every
    CLIENT span of the caller. Written by the settler with the rollups."""

    __tablename__ = "pair_calls"
    # (named: the convention's name would pass PostgreSQL's 63-character limit)
    __table_args__ = (Index("ix_pair_calls_walk", "series_id", "duration_ns", "start_ns"),)

    span_row: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)  # spans.id
    series_id: Mapped[int] = mapped_column(Integer)
    start_ns: Mapped[int] = mapped_column(BigInteger)
    duration_ns: Mapped[int] = mapped_column(BigInteger)


class Cursor(Base):
    """A named watermark and, optionally, a lease on it (one active poller per project)."""

    __tablename__ = "cursors"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    position: Mapped[int] = mapped_column(BigInteger, default=0)
    holder: Mapped[str | None] = mapped_column(String(200))
    lease_expires_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    info: Mapped[str | None] = mapped_column(Text)  # JSON


class FindingEvaluation(Base):
    """The findings (unfiltered, exemplars included, JSON as ``/api/v1/anomalies`` returns
    them) of one evaluation over ``[start_ns, end_ns)`` with one set of thresholds."""

    __tablename__ = "finding_evaluations"
    # (named: the convention's name would pass PostgreSQL's 63-character limit)
    __table_args__ = (Index("ix_finding_evaluations_lookup", "range_s", "thresholds_key", "end_ns"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # end - start in seconds for a window ending when it was evaluated; 0 (ABSOLUTE_RANGE)
    # for an absolute window's findings, cached for that exact window
    range_s: Mapped[int] = mapped_column(BigInteger)
    thresholds_key: Mapped[str] = mapped_column(String(64))
    start_ns: Mapped[int] = mapped_column(BigInteger)
    end_ns: Mapped[int] = mapped_column(BigInteger)
    # when the detectors finished (an absolute window's: when they started reading)
    evaluated_ns: Mapped[int] = mapped_column(BigInteger)
    findings: Mapped[str] = mapped_column(Text)  # JSON list


class RollupChange(Base):
    """A write to the rollups (a settle batch, a retention pass, a retag) over the minutes
    ``[first_minute, last_minute]``, stamped when it was written. Findings cached for an
    absolute window stay valid while no change newer than their evaluation touches the
    minutes they were computed from (``app/evaluations.py``)."""

    __tablename__ = "rollup_changes"
    __table_args__ = (Index("ix_rollup_changes_changed_ns", "changed_ns"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    first_minute: Mapped[int] = mapped_column(BigInteger)  # unix time // 60
    last_minute: Mapped[int] = mapped_column(BigInteger)
    changed_ns: Mapped[int] = mapped_column(BigInteger)


class RollupPack(Base):
    """One hour of a series kind's minute rollups (every series), column by column in one blob
    (``models/packs.py``): the detectors read a day of ``pair`` rollups, ~50,000 rows at ten
    million spans a day, as 24 blobs (and the ``trace`` and convention kinds likewise). A cache the settler fills for closed hours; a write to the
    rollups deletes the packs of the hours it touches (``changes.record``), and a pack is read
    only once ``verified`` (no write in flight while it was built touched its hour)."""

    __tablename__ = "rollup_packs"

    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # unix time // 3600
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    built_ns: Mapped[int] = mapped_column(BigInteger)  # when its rows were read
    verified: Mapped[bool] = mapped_column(Boolean, default=False)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class LinkWait(Base):
    """A settled trace whose CONSUMER span links to a span not stored when it settled
    (``ingest/settle.py``): settling the trace that holds that span re-opens this one.
    Kept until the span arrives or the consumer's spans pass retention (``since_ns``)."""

    __tablename__ = "link_waits"
    __table_args__ = (Index("ix_link_waits_target", "target_trace_id"),
                      Index("ix_link_waits_since_ns", "since_ns"))

    consumer_trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    target_trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    target_span_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    since_ns: Mapped[int] = mapped_column(BigInteger)  # the consumer span's start


class RevokedSession(Base):
    """A dashboard session signed out before its cookie expires (``app/auth.py``): its id,
    kept until the cookie would have expired anyway. In the database so that every
    gunicorn worker and replica refuses it."""

    __tablename__ = "revoked_sessions"
    __table_args__ = (Index("ix_revoked_sessions_expires_ns", "expires_ns"),)

    sid: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_ns: Mapped[int] = mapped_column(BigInteger)


__all__ = ["MINUTE_BOUNDARY_CURSOR", "PAIR_CALLS_CURSOR", "Base", "Span", "Trace", "Series", "Rollup",
           "HourlyRollup", "QuarterRollup", "Cursor", "FindingEvaluation", "PairCall",
           "RollupChange", "RollupPack", "RevokedSession", "LinkWait", "NAMING_CONVENTION"]
