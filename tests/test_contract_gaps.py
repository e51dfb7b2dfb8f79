"""Small contract edges: JSON errors for unknown API paths and methods, `--range` on the
window commands, a description on every `--help`, and user-facing text naming the baseline."""

from __future__ import annotations

import argparse
import re

import pytest

from modalscope.app import create_app
from modalscope.cli import build_parser
from modalscope.models.migrate import upgrade
from modalscope.settings import Settings
from tests.test_cli import run

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def store_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('gaps') / 'store.db'}"
    upgrade(url)
    return url


def _client(url: str, **settings):
    app = create_app(Settings(database_url=url, **settings))
    return app, app.test_client()


@pytest.fixture(scope="module")
def open_app(store_url):
    app, client = _client(store_url)
    yield client
    app.extensions["modalscope"]["engine"].dispose()


@pytest.fixture(scope="module")
def gated_app(store_url):
    app, client = _client(store_url, auth_token=TOKEN)
    yield client
    app.extensions["modalscope"]["engine"].dispose()


# -- unknown API paths and methods -------------------------------------------------------
UNKNOWN = ["/api/v1/nope", "/api/v1/pairs/extra", "/api/v1/traces/", "/api/v1/health/", "/api/v1",
           "/api/v1/", "/api/v2/pairs", "/api", "/api/"]


@pytest.mark.parametrize("path", UNKNOWN)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE", "PUT", "PATCH"])
def test_unknown_api_path_is_a_json_404(open_app, path, method):
    r = open_app.open(path, method=method)
    assert r.status_code == 404, r.get_data(as_text=True)[:200]
    assert r.mimetype == "application/json"
    body = r.get_json()
    assert body["path"] == path and path in body["error"]


@pytest.mark.parametrize("method,path", [("POST", "/api/v1/pairs"), ("DELETE", "/api/v1/health"),
                                         ("PUT", "/api/v1/traces/" + "ab" * 16), ("PATCH", "/api/v1/stages")])
def test_wrong_method_on_a_known_api_path_is_a_json_405(open_app, method, path):
    r = open_app.open(path, method=method)
    assert r.status_code == 405
    assert r.mimetype == "application/json"
    body = r.get_json()
    assert body["path"] == path and method in body["error"]
    assert "GET" in body["allowed"] and method not in body["allowed"]
    assert "GET" in r.headers["Allow"]


def test_known_routes_and_pages_are_untouched(open_app):
    r = open_app.get("/api/v1/health")
    assert r.status_code == 200 and r.get_json()["status"] == "ok"
    r = open_app.get("/api/v1/traces/not-hex")
    assert r.status_code == 400 and r.get_json()["parameter"] == "trace_id"
    r = open_app.get("/api/v1/traces/" + "ab" * 16)
    assert r.status_code == 404 and r.get_json()["parameter"] == "trace_id"
    r = open_app.get("/pairs")  # a dashboard page is still Dash's HTML
    assert r.status_code == 200 and r.mimetype == "text/html"
    r = open_app.get("/apiary")  # not under /api/: Dash's page too
    assert r.status_code == 200 and r.mimetype == "text/html"


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_without_credentials_unknown_and_known_api_paths_look_alike(gated_app, method):
    known = gated_app.open("/api/v1/pairs", method=method)
    unknown = gated_app.open("/api/v1/nope", method=method)
    assert known.status_code == unknown.status_code == 401
    assert known.get_json() == unknown.get_json()
    assert unknown.headers["WWW-Authenticate"].startswith("Bearer")


def test_with_credentials_unknown_api_path_is_a_json_404(gated_app):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = gated_app.get("/api/v1/nope", headers=auth)
    assert r.status_code == 404 and r.get_json()["path"] == "/api/v1/nope"
    r = gated_app.delete("/api/v1/pairs", headers=auth)
    assert r.status_code == 405 and r.mimetype == "application/json"
    assert gated_app.get("/api/v1/health").status_code == 200  # still public


# -- --range on the window commands --------------------------------------------------------
@pytest.fixture
def seen_windows(monkeypatch, store_url):
    """The window each command asks the store about (the detectors themselves run elsewhere)."""
    from modalscope.app import findings, incidents

    seen: list[float] = []

    def fake_find(reader, window, **kw):
        seen.append(window.seconds)
        return []

    def fake_incidents(reader, window, finder, *a, **kw):
        seen.append(window.seconds)
        return []

    monkeypatch.setattr(findings, "find", fake_find)
    monkeypatch.setattr(incidents, "incidents", fake_incidents)
    monkeypatch.setenv("MODALSCOPE_DATABASE_URL", store_url)
    return seen


@pytest.mark.parametrize("command", ["anomalies", "incidents"])
def test_range_and_since_set_the_same_window(seen_windows, command, capsys):
    parser = build_parser()
    for argv, seconds in ([[], 3600], [["--since", "15m"], 900], [["--range", "15m"], 900],
                          [["--range", "24h"], 86400], [["--range", "7d"], 7 * 86400]):
        args = parser.parse_args([command, *argv])
        assert args.func(args) == 0
        assert seen_windows[-1] == pytest.approx(seconds, abs=1), argv
    args = parser.parse_args([command, "--range", "2h"])
    args.func(args)
    assert "in the last 2h" in capsys.readouterr().out


@pytest.mark.slow
def test_window_flags_fail_in_one_line_alike(store_url):
    env = {"MODALSCOPE_DATABASE_URL": store_url}
    for command in ("anomalies", "incidents"):
        r = run([command, "--since", "1h", "--range", "2h"], env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "either --since or --range" in r.stderr
        r = run([command, "--range", "soon"], env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--range" in r.stderr
        r = run([command, "--range", "30d"], env)
        assert r.returncode == 2 and "at most 7d" in r.stderr and "Traceback" not in r.stderr
    r = run(["anomalies", "--range", "2h", "--json"], env)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


# -- --help: a description for every command, a help line for every option ---------------
def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            listed = {a.dest for a in action._choices_actions}  # noqa: SLF001
            assert set(action.choices) == listed, f"{' '.join(path)}: a subcommand without help="
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def test_every_command_and_option_is_described():
    parsers = list(_parsers(build_parser()))
    names = {" ".join(p) for p, _ in parsers}
    assert {"demo", "serve", "ingest otlp", "ingest cloud-trace", "import", "export-metrics", "anomalies",
            "incidents", "retag", "db upgrade", "db prune"} <= names
    for path, parser in parsers:
        where = "modalscope " + " ".join(path)
        assert parser.description and len(parser.description) > 20, f"{where}: no description"
        for action in parser._actions:  # noqa: SLF001
            if isinstance(action, argparse._HelpAction):  # noqa: SLF001
                continue
            assert action.help and action.help != argparse.SUPPRESS, f"{where}: {action.dest} has no help"
        if path:
            parent = dict(parsers)[path[:-1]]
            sub = next(a for a in parent._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
            line = next(a.help for a in sub._choices_actions if a.dest == path[-1])  # noqa: SLF001
            assert line, f"{where}: no one-line help in the parent's list"


def test_help_prints_the_description_for_every_command(capsys):
    for path, parser in _parsers(build_parser()):
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([*path, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert " ".join(out.split()).startswith(f"usage: {' '.join(['modalscope', *path])}")
        # argparse re-wraps (and may split long words): compare without whitespace
        assert re.sub(r"\s", "", parser.description) in re.sub(r"\s", "", out), path


# -- the baseline is named for what it is ---------------------------------------------------
# "the seed", "the seed's table", "seed document"; not the demo's random seed (--seed)
SEED_WORDING = re.compile(r"\bthe seed\b|\bseed's\b|\bseed document\b", re.IGNORECASE)


def test_help_texts_do_not_say_the_seed():
    for path, parser in _parsers(build_parser()):
        text = parser.format_help()
        assert not SEED_WORDING.search(text), (path, SEED_WORDING.search(text))
    demo = dict(_parsers(build_parser()))[("demo",)]
    assert "--seed" in demo.format_help()  # the random-seed flag is a flag, and stays


def test_anomaly_hints_name_the_study_not_the_seed():
    from modalscope.app.detectors import HINTS

    for kind, hint in HINTS.items():
        assert not SEED_WORDING.search(hint), kind
    assert "multimodal inference latency study" in HINTS["fusion_sync_wait"]
