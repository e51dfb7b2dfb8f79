"""The `modalscope` command as a user runs it: real processes, one-line errors, exit codes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest
from sqlalchemy import func, select

from modalscope.models import Span, Trace
from modalscope.models.engine import make_engine
from tests.factories import multimodal_trace
from tests.otlp_payloads import json_line, request_protobuf

MIN = 60_000_000_000


def run(args, env_extra=None, cwd=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "modalscope", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)


def _traces(n, seed=11):
    rng = random.Random(seed)
    base = (time.time_ns() // MIN - 20) * MIN
    return [multimodal_trace(rng, base + i * 1_000_000_000) for i in range(n)]


@pytest.mark.slow
def test_import_json_lines_and_protobuf_skipping_bad_lines(db_url, tmp_path):
    traces = _traces(5)
    jsonl = tmp_path / "spans.jsonl"
    lines = [json_line(traces[0]), json_line(traces[1]), '{"resourceSpans": [ broken', json_line(traces[2])]
    bad_id = json.loads(json_line(traces[4]))
    bad_id["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "xyz"
    lines.append(json.dumps(bad_id))
    jsonl.write_text("\n".join(lines) + "\n")
    pb = tmp_path / "one.pb"
    pb.write_bytes(request_protobuf(traces[3]))
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(b"\xff\xff\xff\xff not protobuf")

    r = run(["import", str(jsonl), str(pb), str(garbage)], {"MODALSCOPE_DATABASE_URL": db_url})
    assert r.returncode == 1, r.stderr
    assert f"{jsonl}:3:" in r.stderr
    assert f"{jsonl}:5:" in r.stderr  # the request with a bad span id is skipped whole
    assert f"{garbage}:1:" in r.stderr
    assert "Traceback" not in r.stderr
    assert "imported" in r.stdout and "3 skipped" in r.stdout

    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar_one() == sum(len(t) for t in traces[:4])
        # import settles what it imported before it returns
        rows = conn.execute(select(Trace.pending, Trace.input_type)).all()
    engine.dispose()
    assert len(rows) == 4 and all(not p and it == "image" for p, it in rows)

    # Importing the same file again stores nothing twice.
    r2 = run(["import", str(pb)], {"MODALSCOPE_DATABASE_URL": db_url})
    assert r2.returncode == 0 and "(0 new)" in r2.stdout


def test_import_pretty_printed_single_request(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    f = tmp_path / "req.json"
    from tests.otlp_payloads import request_json

    f.write_text(json.dumps(request_json(_traces(1)[0]), indent=2))
    r = run(["import", str(f)], {"MODALSCOPE_DATABASE_URL": url})
    assert r.returncode == 0, r.stderr
    assert "imported 7 spans (7 new)" in r.stdout


def test_missing_database_directory_is_one_line(tmp_path):
    r = run(["import", "nothing.json"], {"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path}/no/such/dir/x.db"})
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "does not exist" in r.stderr
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_unusable_database_urls(tmp_path):
    for url in ("mysql://x@localhost/db", "not a url at all", "postgresql://nobody@127.0.0.1:1/nodb"):
        r = run(["db", "upgrade"], {"MODALSCOPE_DATABASE_URL": url})
        assert r.returncode == 2, (url, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


@pytest.mark.slow
def test_invalid_rules_file_names_file_and_line_and_retags_nothing(db_url, tmp_path):
    traces = _traces(2)
    f = tmp_path / "a.jsonl"
    f.write_text("\n".join(json_line(t) for t in traces))
    assert run(["import", str(f)], {"MODALSCOPE_DATABASE_URL": db_url}).returncode == 0
    rules = tmp_path / "rules.toml"
    rules.write_text('[[name]]\nstage = "encoder"\npatterns = ["vit"\n')
    r = run(["retag"], {"MODALSCOPE_DATABASE_URL": db_url, "MODALSCOPE_RULES": str(rules)})
    assert r.returncode == 2 and str(rules) in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_retag_applies_new_rules_and_rebuilds_rollups(db_url, tmp_path):
    traces = _traces(3)
    f = tmp_path / "a.jsonl"
    f.write_text("\n".join(json_line(t) for t in traces))
    env = {"MODALSCOPE_DATABASE_URL": db_url}
    assert run(["import", str(f)], env).returncode == 0
    rules = tmp_path / "rules.toml"
    rules.write_text('[[name]]\nstage = "fusion"\npatterns = ["vit"]\n')
    r = run(["retag"], {**env, "MODALSCOPE_RULES": str(rules)})
    assert r.returncode == 0, r.stderr
    engine = make_engine(db_url)
    with engine.connect() as conn:
        stages = dict(conn.execute(select(Span.name, Span.stage)).all())
    engine.dispose()
    assert stages["vit.forward"] == "fusion"
    assert stages["image.decode"] == "other"  # the new file replaces the defaults
    from modalscope.app import create_app
    from modalscope.settings import Settings

    app = create_app(Settings(database_url=db_url))
    rows = app.test_client().get("/api/v1/stages?range=2h").get_json()
    app.extensions["modalscope"]["engine"].dispose()
    by_stage = {r["stage"]: r["count"] for r in rows}
    assert by_stage.get("fusion") == 3 and "encoder" not in by_stage  # one vit.forward a trace


def test_db_upgrade_creates_schema(tmp_path):
    from modalscope.models.schema import head_revision

    url = f"sqlite:///{tmp_path / 'new.db'}"
    r = run(["db", "upgrade"], {"MODALSCOPE_DATABASE_URL": url})
    assert r.returncode == 0 and f"revision {head_revision(url)}" in r.stdout
    # progress: what will run, then each step as it ends, in order
    assert r.stdout.startswith("upgrading from revision none (empty database): ")
    done = [line.split()[0] for line in r.stdout.splitlines() if " done in " in line]
    assert done[0] == "0001" and done[-1] == head_revision(url) and done == sorted(done)
    again = run(["db", "upgrade"], {"MODALSCOPE_DATABASE_URL": url})
    assert again.returncode == 0 and " done in " not in again.stdout  # nothing to do: no steps


def test_db_upgrade_reports_each_step_from_an_older_revision(tmp_path):
    from modalscope.models.migrate import upgrade
    from modalscope.models.schema import head_revision

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0006")
    r = run(["db", "upgrade"], {"MODALSCOPE_DATABASE_URL": url})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("upgrading from revision 0006: ") and "0007" in lines[0]
    steps = [line.split()[0] for line in lines if " done in " in line]
    assert steps[0] == "0007" and steps[-1] == head_revision(url)
    assert "duration bucket" in next(line for line in lines if line.strip().startswith("0007 done"))


def test_db_upgrade_refuses_a_database_from_a_newer_release_in_one_line(tmp_path):
    import sqlite3

    url = f"sqlite:///{tmp_path / 'newer.db'}"
    assert run(["db", "upgrade"], {"MODALSCOPE_DATABASE_URL": url}).returncode == 0
    with sqlite3.connect(tmp_path / "newer.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0099'")
    r = run(["db", "upgrade"], {"MODALSCOPE_DATABASE_URL": url})
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "revision 0099" in r.stderr and "newer release" in r.stderr and "Traceback" not in r.stderr
