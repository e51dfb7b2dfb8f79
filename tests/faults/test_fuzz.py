"""Fuzzing with hypothesis (deterministic: ``derandomize=True``, modest example counts).

* The OTLP decoders: random bytes, mutated valid payloads and random JSON structures never
  raise anything but ``DecodeError`` (the receivers' 400 / INVALID_ARGUMENT), and whatever
  they accept can be written.
* The OTLP/HTTP receiver (in process, real pipeline and store): any body is 200, 400 or 413,
  never 500.
* Every ``/api/v1`` query parameter, and unknown ones: never a 500, never a traceback; a 400
  names the parameter. On SQLite and PostgreSQL (values reach SQL).
* The stage-rules parser: any text is a ruleset or one ``FILE:LINE: reason`` line.
"""

from __future__ import annotations

import json
import re
import string
import subprocess
import sys
from urllib.parse import quote, urlencode

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from modalscope.ingest.otlp import DecodeError, decode_json, decode_protobuf
from modalscope.ingest.otlp_grpc import FULL_METHOD, serve_grpc
from modalscope.ingest.stages import StageRules
from modalscope.ingest.rules_file import RulesError, load_rules, parse_rules
from modalscope.ingest.writer import span_rows, write_spans
from modalscope.models.engine import make_engine
from modalscope.models.migrate import upgrade
from tests.faults.helpers import clean_env, free_port, make_traces, otlp_json_request, pb_payload

FUZZ = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fuzz(examples: int) -> settings:
    return settings(FUZZ, max_examples=examples)

_HEX32 = re.compile(r"[0-9a-f]{32}").fullmatch
_HEX16 = re.compile(r"[0-9a-f]{16}").fullmatch
INT64_MAX = (1 << 63) - 1

VALID_SPANS = [s for t in make_traces(3, seed=41) for s in t]
VALID_PB = pb_payload(VALID_SPANS)
VALID_JSON = json.dumps(otlp_json_request(VALID_SPANS)).encode()


def _check_records(result) -> None:
    """What a decoder accepted is well formed and can be turned into rows for the store."""
    for r in result.spans:
        assert _HEX32(r.trace_id) and r.trace_id != "0" * 32
        assert _HEX16(r.span_id) and r.span_id != "0" * 16
        assert r.parent_span_id is None or _HEX16(r.parent_span_id)
        assert 0 <= r.start_ns <= r.end_ns <= INT64_MAX
        assert isinstance(r.name, str) and isinstance(r.service, str)
        r.name.encode("utf-8"), r.service.encode("utf-8")  # noqa: B018 - no lone surrogates
    span_rows(result.spans)
    assert result.rejected >= 0 and all("\n" not in e for e in result.errors)


def _decodes_or_refuses(decode, data) -> None:
    try:
        result = decode(data)
    except DecodeError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    _check_records(result)


# -- protobuf --------------------------------------------------------------------------------

@st.composite
def mutated(draw, valid: bytes):
    """A valid payload with a few bytes flipped, cut, inserted or spliced."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "splice", "varint"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[pos:pos + draw(st.integers(1, 64))]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "splice":
            start = draw(st.integers(0, len(valid) - 1))
            data[pos:pos] = valid[start:start + draw(st.integers(1, 200))]
        elif op == "varint" and data:  # a huge or negative-looking length or value
            data[pos:pos + 1] = b"\xff" * draw(st.integers(1, 10)) + b"\x01"
    return bytes(data)


@fuzz(300)
@given(st.one_of(st.binary(max_size=300), mutated(VALID_PB)))
@example(b"\n\xff\xff\xff\xff\x0f")  # a length past the end
@example(VALID_PB[:-1])
def test_protobuf_decoder_never_raises_anything_but_decode_error(data):
    _decodes_or_refuses(decode_protobuf, data)


def test_span_times_past_int64_are_rejected_alone():
    """Found by the fuzzing: a time of 2^64-1 ns decoded, then failed the whole write."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest.FromString(VALID_PB)
    req.resource_spans[0].scope_spans[0].spans[0].end_time_unix_nano = (1 << 64) - 1
    result = decode_protobuf(req.SerializeToString())
    assert result.rejected == 1 and len(result.spans) == len(VALID_SPANS) - 1 and "2262" in result.errors[0]
    body = json.loads(VALID_JSON)
    body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["startTimeUnixNano"] = str(1 << 63)
    result = decode_json(json.dumps(body).encode())
    assert result.rejected == 1 and len(result.spans) == len(VALID_SPANS) - 1


# -- JSON ------------------------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=20)

OTLP_KEYS = ["resourceSpans", "resource", "attributes", "scopeSpans", "scope", "spans", "traceId", "spanId",
             "parentSpanId", "name", "kind", "startTimeUnixNano", "endTimeUnixNano", "status", "code", "message",
             "events", "timeUnixNano", "key", "value", "stringValue", "intValue", "doubleValue", "boolValue",
             "arrayValue", "kvlistValue", "bytesValue", "values", "instrumentationLibrarySpans"]
otlp_like = st.recursive(
    st.one_of(json_scalars, st.sampled_from(["1" * 32, "0" * 32, "ab" * 8, "2" * 16, "SPAN_KIND_SERVER",
                                             "STATUS_CODE_ERROR", str(1 << 63), str((1 << 64) - 1), "-1"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(OTLP_KEYS), inner, max_size=5)),
    max_leaves=30)


@st.composite
def mutated_json(draw):
    """The valid request with one value somewhere replaced by a random JSON value."""
    body = json.loads(VALID_JSON)
    node = body
    for _ in range(draw(st.integers(1, 8))):
        if isinstance(node, dict) and node:
            key = draw(st.sampled_from(sorted(node)))
            if draw(st.booleans()) or not isinstance(node[key], (dict, list)):
                node[key] = draw(json_values)
                break
            node = node[key]
        elif isinstance(node, list) and node:
            i = draw(st.integers(0, len(node) - 1))
            if draw(st.booleans()) or not isinstance(node[i], (dict, list)):
                node[i] = draw(json_values)
                break
            node = node[i]
        else:
            break
    return json.dumps(body).encode()


@fuzz(300)
@given(st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    otlp_like.map(lambda v: json.dumps({"resourceSpans": v}).encode()),
    mutated_json(),
    mutated(VALID_JSON),
    st.binary(max_size=100),
))
@example(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "' + b"1" * 32 + b'", "spanId": "'
         + b"2" * 16 + b'", "name": "\\ud800"}]}]}]}')
@example(b"[" * 5000 + b"]" * 5000)
def test_json_decoder_never_raises_anything_but_decode_error(data):
    _decodes_or_refuses(decode_json, data)


# -- the receiver, in process ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ingest_client(tmp_path_factory):
    from modalscope.ingest.otlp_http import create_ingest_app
    from modalscope.ingest.pipeline import IngestPipeline
    from modalscope.settings import Settings

    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'ingest.db'}"
    upgrade(url)
    engine = make_engine(url, write=True)
    settings_ = Settings(database_url=url, max_request_bytes=64 * 1024)
    pipeline = IngestPipeline(engine, settings_, settle=False).start()
    grpc_server = serve_grpc(pipeline, settings_, "127.0.0.1", 0)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_server.port}")
    export = channel.unary_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
    yield create_ingest_app(pipeline, settings_, commit_timeout=30).test_client(), export
    channel.close()
    grpc_server.stop(None)
    pipeline.close()
    engine.dispose()


@fuzz(120)
@given(body=st.one_of(mutated(VALID_PB), mutated_json(), st.binary(max_size=200)),
       content_type=st.sampled_from(["application/x-protobuf", "application/json", "application/json; charset=x"]),
       encoding=st.sampled_from([None, "gzip", "deflate", "identity", "br"]))
def test_http_receiver_answers_any_body_with_200_or_4xx(ingest_client, body, content_type, encoding):
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    resp = ingest_client[0].post("/v1/traces", data=body, headers=headers)
    assert resp.status_code in (200, 400, 413, 415), resp.data[:300]
    assert b"Traceback" not in resp.data


@fuzz(60)
@given(body=st.one_of(mutated(VALID_PB), st.binary(max_size=200)))
def test_grpc_receiver_answers_any_message_ok_or_invalid_argument(ingest_client, body):
    try:
        ingest_client[1](body, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        assert "\n" not in (exc.details() or "")


# -- /api/v1 ---------------------------------------------------------------------------------

PARAMS = ["start", "end", "range", "baseline_start", "baseline_end", "service", "caller", "callee", "stage",
          "input_type", "min_ms", "max_ms", "limit", "group_by", "cache", "trace_id", "panel", "ttl"]
ENDPOINTS = ["/api/v1/health", "/api/v1/pairs", "/api/v1/stages", "/api/v1/input-types", "/api/v1/traces", "/api/v1/share",
             "/api/v1/cache", "/api/v1/compare", "/api/v1/anomalies"]
NASTY = ["", " ", "0", "-0", "-1", "1e308", "-1e308", "1e400", "nan", "NaN", "inf", "-inf", "9" * 40,
         str(1 << 63), str(1 << 64), "0x10", "1_000", "٣", "2026-11-30T14:05:00Z", "2026-11-30T14:05:00+14:00",
         "0001-01-01T00:00:00+14:00", "0001-01-01", "9999-12-31T23:59:59-14:00", "1970-01-01T00:00:00Z",
         "2026-02-30", "15m", "0m", "1h", "400d", "401d", "1e9d", "1.5h", "99999999999w", "7d ", "none",
         "input_type", "user_tier", "a" * 129, "gateway", "vision-encoder", "encoder", "image", "%00", "\x00",
         "<script>alert(1)</script>", "'; DROP TABLE spans;--", "é", "😀", "0" * 32, "f" * 32, "F" * 32,
         "pair-heatmap", "-5"]
values = st.one_of(st.sampled_from(NASTY), st.text(max_size=24), st.integers().map(str),
                   st.floats().map(repr), st.datetimes().map(lambda d: d.isoformat()))
queries = st.dictionaries(st.one_of(st.sampled_from(PARAMS), st.text(string.ascii_letters + "_[]", max_size=8)),
                          values, max_size=6)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api_client(request, tmp_path_factory):
    """A small settled store (SQLite, then a fresh PostgreSQL database) behind the real app."""
    from modalscope.app import create_app
    from modalscope.ingest.otlp import decode_protobuf as decode
    from modalscope.ingest.settle import settle
    from modalscope.ingest.rules_file import default_rules
    from modalscope.settings import Settings

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'api.db'}"
        upgrade(url)
        drop = None
    else:
        from tests.conftest import _pg_url

        pg = request.getfixturevalue("_postgres")
        name = pg.new_database()
        url, drop = _pg_url(name), (pg, name)
    engine = make_engine(url, write=True)
    records = decode(pb_payload([s for t in make_traces(30, seed=43) for s in t])).spans
    default_rules().tag(records)
    write_spans(engine, records)
    settle(engine, force=True)
    engine.dispose()
    app = create_app(Settings(database_url=url))
    yield app.test_client()
    app.extensions["modalscope"]["engine"].dispose()
    if drop:
        drop[0].drop(drop[1])


def _assert_clean_answer(resp) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.data[:500])
    assert b"Traceback" not in resp.data and b'File "' not in resp.data
    if resp.status_code == 400:
        body = resp.get_json()
        assert isinstance(body.get("error"), str) and isinstance(body.get("parameter"), str), body


@fuzz(150)
@given(endpoint=st.sampled_from(ENDPOINTS), query=queries)
@example(endpoint="/api/v1/traces", query={"min_ms": "1e300"})
@example(endpoint="/api/v1/traces", query={"max_ms": "1e16", "min_ms": "1e15"})
@example(endpoint="/api/v1/pairs", query={"start": "0001-01-01T00:00:00+14:00"})
@example(endpoint="/api/v1/compare", query={"baseline_start": "0", "baseline_end": "99999999999"})
@example(endpoint="/api/v1/anomalies", query={"range": "400d"})
def test_api_parameters_never_500(api_client, endpoint, query):
    _assert_clean_answer(api_client.get(f"{endpoint}?{urlencode(query)}"))


@fuzz(60)
@given(trace_id=st.one_of(st.text(max_size=40), st.sampled_from(NASTY)), query=queries)
def test_api_trace_ids_never_500(api_client, trace_id, query):
    resp = api_client.get(f"/api/v1/traces/{quote(trace_id, safe='')}?{urlencode(query)}")
    _assert_clean_answer(resp)
    assert resp.status_code in (200, 400, 404)


def test_api_trace_id_with_a_slash_is_a_json_404(api_client):
    resp = api_client.get("/api/v1/traces/%2F0")
    assert resp.status_code == 404 and resp.is_json


# -- stage rules -------------------------------------------------------------------------------

RULE_LINES = ["[[name]]", "[[attribute]]", "[[service]]", "[[other]]", "[name]", 'stage = "encoder"',
              'stage = "nope"', "stage = 3", 'patterns = ["vit", "decode"]', 'patterns = [""]', "patterns = [1]",
              'patterns = "vit"', 'keys = ["gen_ai.*"]', 'keys = ["*"]', 'keys = ["a*b"]', "values = [1, true]",
              "values = [[1]]", 'extra = "x"', 'patterns = ["vit"', '"unterminated', "= 1", "a.b.c = 1",
              "[[name]]]", "x = 1979-05-27T07:32:00Z", "", "# comment", "\t", 'stage = """', "key = 'x"]


@fuzz(300)
@given(st.one_of(st.lists(st.one_of(st.sampled_from(RULE_LINES), st.text(max_size=20)), max_size=12)
                 .map("\n".join), st.text(max_size=200)))
def test_rules_parser_gives_rules_or_one_line_naming_file_and_line(text):
    try:
        rules = parse_rules(text, "bad.toml")
    except RulesError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith("bad.toml")
        if exc.line is not None:
            assert message.startswith(f"bad.toml:{exc.line}: ")
            assert 1 <= exc.line <= max(1, text.count("\n") + 1)
        return
    assert isinstance(rules, StageRules)


@fuzz(60)
@given(st.binary(max_size=120))
def test_rules_file_of_any_bytes_loads_or_is_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("rules", numbered=True) / "rules.toml"
    path.write_bytes(data)
    try:
        load_rules(path)
    except RulesError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path))


def test_bad_rules_file_is_one_line_and_nothing_runs_or_is_written(tmp_path):
    """`MODALSCOPE_RULES` (how a rules file is given) naming a file that is not valid TOML:
    each command that tags spans stops with one line naming the file and the line, before
    it writes anything."""
    bad = tmp_path / "bad.toml"
    bad.write_text('[[name]]\npatterns = ["vit"]\nstage = "encoder\n\n[[service]]\n')  # line 3: unterminated
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps(otlp_json_request(VALID_SPANS)))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    for args in (["import", str(spans)], ["retag"], ["ingest", "otlp"]):
        env = clean_env(MODALSCOPE_DATABASE_URL=url, MODALSCOPE_RULES=str(bad),
                        MODALSCOPE_OTLP_HTTP_PORT=str(free_port()), MODALSCOPE_OTLP_GRPC_PORT=str(free_port()))
        r = subprocess.run([sys.executable, "-m", "modalscope", *args], env=env, capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0, r.stderr
        assert re.match(rf"modalscope: error: {re.escape(str(bad))}:3: invalid TOML: ", r.stderr), r.stderr
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM spans").scalar() == 0
    finally:
        engine.dispose()
