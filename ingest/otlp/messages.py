"""Private protobuf classes, wire-compatible with the OTLP trace messages, that read only what
the decoders need.

google.protobuf's builders are imported when a class is first built.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError as _ProtobufDecodeError

from .common import DecodeError

# --------------------------------------------------------------------------- protobuf
#
# Two readers of one wire format. ``decode_request_message`` walks an already parsed
# official message. ``decode_protobuf`` parses the bytes with a private, wire-compatible
# copy of the trace messages (built below) that declares every ``KeyValue`` as ``bytes``,
# so an attribute arrives as its raw encoding; a bounded cache maps the raw encoding of a
# recurring attribute (``rpc.system=grpc``, ``cache.hit=true``) straight to its
# ``(key, value)``, skipping the per-attribute protobuf wrapper objects that otherwise
# dominate decoding (much faster than the plain walk when most attribute values repeat,
# as in real traffic; somewhat slower in the worst case, where nearly every value is
# unique and the cache only churns). An attribute the cache misses is
# read by hand when it is in the canonical encoding of a string, int, bool or double, or
# else parsed with the real ``KeyValue`` class; either way its UTF-8 is checked as the full
# parse checks it, and one that fails is never cached, so the same bytes always get the
# same answer. Fields the copy does not declare (trace_state, flags, dropped counts) are
# skipped as unknown fields, unvalidated. A span without links pays one empty repeated
# field access for them, a small share of decoding a request.


def _message_class(proto: Any, full_name: str) -> Any:
    """The class of message ``full_name`` of the file ``proto``, from a pool of its own
    (nothing registered globally)."""
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())
    descriptor = pool.FindMessageTypeByName(full_name)
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf < 4.22
        from google.protobuf.message_factory import MessageFactory

        return MessageFactory(pool).GetPrototype(descriptor)
    return GetMessageClass(descriptor)


def _build_fast_request_class() -> Any:
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FieldDescriptorProto
    package = "modalscope.otlp_fast"
    proto = descriptor_pb2.FileDescriptorProto(
        name="modalscope/otlp_fast.proto", package=package, syntax="proto3"
    )
    one, many = fd.LABEL_OPTIONAL, fd.LABEL_REPEATED

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> None:
        m = proto.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = f".{package}.{type_name}"

    msg, raw = fd.TYPE_MESSAGE, fd.TYPE_BYTES
    # Field numbers are opentelemetry/proto/trace/v1/trace.proto's; enums read as int32.
    message("ExportTraceServiceRequest", ("resource_spans", 1, msg, many, "ResourceSpans"))
    message(
        "ResourceSpans",
        ("resource", 1, msg, one, "Resource"),
        ("scope_spans", 2, msg, many, "ScopeSpans"),
        # The removed InstrumentationLibrarySpans is wire-compatible with ScopeSpans.
        ("instrumentation_library_spans", 1000, msg, many, "ScopeSpans"),
    )
    message("Resource", ("attributes", 1, raw, many, None))
    message("ScopeSpans", ("scope", 1, msg, one, "Scope"), ("spans", 2, msg, many, "Span"))
    message("Scope", ("name", 1, fd.TYPE_STRING, one, None))
    message(
        "Span",
        ("trace_id", 1, raw, one, None),
        ("span_id", 2, raw, one, None),
        ("parent_span_id", 4, raw, one, None),
        ("name", 5, fd.TYPE_STRING, one, None),
        ("kind", 6, fd.TYPE_INT32, one, None),
        ("start_time_unix_nano", 7, fd.TYPE_FIXED64, one, None),
        ("end_time_unix_nano", 8, fd.TYPE_FIXED64, one, None),
        ("attributes", 9, raw, many, None),
        ("events", 11, msg, many, "Event"),
        ("links", 13, msg, many, "Link"),
        ("status", 15, msg, one, "Status"),
    )
    message(
        "Link",
        ("trace_id", 1, raw, one, None),
        ("span_id", 2, raw, one, None),
        ("attributes", 4, raw, many, None),
    )
    message(
        "Event",
        ("time_unix_nano", 1, fd.TYPE_FIXED64, one, None),
        ("name", 2, fd.TYPE_STRING, one, None),
        ("attributes", 3, raw, many, None),
    )
    message("Status", ("message", 2, fd.TYPE_STRING, one, None), ("code", 3, fd.TYPE_INT32, one, None))

    return _message_class(proto, f"{package}.ExportTraceServiceRequest")


_FastRequest = _build_fast_request_class()


def _build_starts_class() -> Any:
    """A request that reads only each span's start time (the rest is skipped unparsed)."""
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FieldDescriptorProto
    package = "modalscope.otlp_starts"
    proto = descriptor_pb2.FileDescriptorProto(
        name="modalscope/otlp_starts.proto", package=package, syntax="proto3"
    )
    for name, fields in (
        ("Request", [("resource_spans", 1, "ResourceSpans")]),
        ("ResourceSpans", [("scope_spans", 2, "ScopeSpans"), ("instrumentation_library_spans", 1000, "ScopeSpans")]),
        ("ScopeSpans", [("spans", 2, "Span")]),
    ):
        m = proto.message_type.add(name=name)
        for fname, number, type_name in fields:
            m.field.add(name=fname, number=number, type=fd.TYPE_MESSAGE, label=fd.LABEL_REPEATED,
                        type_name=f".{package}.{type_name}")
    span = proto.message_type.add(name="Span")
    span.field.add(name="start_time_unix_nano", number=7, type=fd.TYPE_FIXED64, label=fd.LABEL_OPTIONAL)
    return _message_class(proto, f"{package}.Request")


_StartsRequest = _build_starts_class()


def oldest_start_ns(data: bytes) -> int | None:
    """The earliest span start in a serialized ``ExportTraceServiceRequest`` (None: no
    spans), without decoding the spans; :class:`DecodeError` when it does not parse."""
    try:
        msg = _StartsRequest.FromString(data)
    except (_ProtobufDecodeError, RecursionError, TypeError):
        raise DecodeError("invalid protobuf: not a parsable ExportTraceServiceRequest") from None
    starts = [
        sp.start_time_unix_nano
        for rs in msg.resource_spans
        for ss in (rs.scope_spans or rs.instrumentation_library_spans)
        for sp in ss.spans
    ]
    return min(starts) if starts else None
