"""Shared fixtures: every storage test runs on SQLite and on PostgreSQL.

PostgreSQL comes from ``MODALSCOPE_TEST_POSTGRES`` (default: the local server,
``postgresql://postgres@127.0.0.1:5432/postgres``). Each run migrates one template database
and clones it per test (``CREATE DATABASE ... TEMPLATE``), dropping every clone and the
template afterwards. Without a reachable server the PostgreSQL half is skipped with the
reason — unless ``MODALSCOPE_REQUIRE_POSTGRES=1`` (``.ci/run`` sets it), which fails instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import uuid

import pytest

from modalscope.app import render
from modalscope.ingest.runtime import tune_gc
from modalscope.models.engine import make_engine
from modalscope.models.migrate import upgrade

# The demo stores (clean_store, pattern_store) shared by the demo, findings and page tests.
pytest_plugins = ["tests.demo_stores"]

PG_ADMIN_URL = os.environ.get("MODALSCOPE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
REQUIRE_PG = os.environ.get("MODALSCOPE_REQUIRE_POSTGRES") == "1"
RUN_ID = uuid.uuid4().hex[:10]

# The inner-loop subset (`scripts/test.sh -m quick`): SQLite only, no browser, no child
# processes, no shared demo stores, nothing marked slow (a test that takes seconds).
# Everything else still runs in the whole suite.
SLOW_FIXTURES = {"clean_store", "pattern_store", "filled_templates", "site", "procs", "empty_db_url",
                 "auth_site", "wiki_and_site", "live_store", "hostile_app"}
SLOW_MODULE_WORDS = ("browser", "e2e", "bench", "scale_out", "faults", "instrumented", "big_traces",
                     "cli_incidents", "test_render")


def _is_quick(item) -> bool:
    if any(word in item.nodeid.split("::")[0] for word in SLOW_MODULE_WORDS):
        return False
    if item.get_closest_marker("slow") is not None:
        return False
    if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return False
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "postgresql" not in params.values()


def pytest_configure(config):
    # Collect garbage as every ``modalscope`` command's process does (the apps and receivers
    # tests run in-process would otherwise run at Python's default, unlike in a deployment).
    tune_gc()
    # Chromium can take longer than the image renderer's start bound to start on a busy host;
    # the tests' renderer waits four times as long (still bounded), so a slow start is no failure.
    render.renderer().start_timeout = 4 * render.START_TIMEOUT_S


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_quick(item):
            item.add_marker(pytest.mark.quick)


def _pg_connect(dbname: str | None = None):
    import psycopg

    conninfo = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    kwargs = {"autocommit": True, "connect_timeout": 3}
    if dbname:
        kwargs["dbname"] = dbname
    return psycopg.connect(conninfo, **kwargs)


def _pg_url(dbname: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(PG_ADMIN_URL).set(drivername="postgresql+psycopg", database=dbname).render_as_string(
        hide_password=False
    )


class _Postgres:
    def __init__(self) -> None:
        self.error: str | None = None
        self.template: str | None = None
        self.created: list[str] = []

    def ensure_template(self) -> str:
        if self.template is None and self.error is None:
            import psycopg

            name = f"modalscope_test_{RUN_ID}_tmpl"
            try:
                with _pg_connect() as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
            except psycopg.OperationalError as exc:  # unreachable: the one reason to skip
                self.error = f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            else:
                self.created.append(name)
                upgrade(_pg_url(name))  # a failing migration is a bug: it errors, never skips
                self.template = name
        if self.error is not None:
            msg = f"PostgreSQL not reachable at {PG_ADMIN_URL} ({self.error})"
            if REQUIRE_PG:
                pytest.fail(msg + " and MODALSCOPE_REQUIRE_POSTGRES=1", pytrace=False)
            pytest.skip(msg)
        return self.template

    def new_database(self) -> str:
        template = self.ensure_template()
        name = f"modalscope_test_{RUN_ID}_{uuid.uuid4().hex[:8]}"
        with _pg_connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        self.created.append(name)
        return name

    def clone(self, name: str, template: str) -> None:
        """Replace database ``name`` (nobody connected) with a copy of ``template``."""
        with _pg_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')

    def drop(self, name: str) -> None:
        try:
            with _pg_connect() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass

    def drop_all(self) -> None:
        for name in reversed(self.created):
            self.drop(name)


@pytest.fixture(scope="module")
def filled_templates(_postgres, _sqlite_template, tmp_path_factory):
    """Stores of demo traffic a module's tests copy (``FilledTemplates``); its PostgreSQL
    databases are dropped with the run's others. Left out of the quick subset."""
    return FilledTemplates(_postgres, _sqlite_template, tmp_path_factory.mktemp("filled"))


@pytest.fixture(scope="module")
def small_templates(_postgres, _sqlite_template, tmp_path_factory):
    """Like ``filled_templates``, for small hand-made stores the quick subset keeps."""
    return FilledTemplates(_postgres, _sqlite_template, tmp_path_factory.mktemp("small"))


@pytest.fixture(scope="session")
def _postgres():
    pg = _Postgres()
    yield pg
    pg.drop_all()


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory):
    path = tmp_path_factory.mktemp("tmpl") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path, _postgres, _sqlite_template):
    """A migrated, empty database URL: SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        path = tmp_path / "modalscope.db"
        shutil.copyfile(_sqlite_template, path)
        yield f"sqlite:///{path}"
        return
    name = _postgres.new_database()
    try:
        yield _pg_url(name)
    finally:
        _postgres.drop(name)


@pytest.fixture
def engine(db_url):
    eng = make_engine(db_url, write=True)
    yield eng
    eng.dispose()


@pytest.fixture
def empty_db_url(request, tmp_path, _postgres):
    """Like db_url but NOT migrated (for migration tests)."""
    kind = getattr(request, "param", "sqlite")
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    _postgres.ensure_template()
    name = f"modalscope_test_{RUN_ID}_{uuid.uuid4().hex[:8]}"
    with _pg_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    _postgres.created.append(name)
    try:
        yield _pg_url(name)
    finally:
        _postgres.drop(name)


class FilledTemplates:
    """Stores filled once and copied for each test that asks (``fill_like``): a module whose
    tests each start from the same settled demo traffic pays for the fill once a backend,
    not once a test (a PostgreSQL fill and settle took 4-5 s a test). Each test still gets
    its own database, so what it writes is its own."""

    def __init__(self, postgres: _Postgres, sqlite_template, root) -> None:
        self.postgres = postgres
        self.sqlite_template = sqlite_template
        self.root = root
        self.built: dict[tuple[str, str], str] = {}

    def fill_like(self, engine, db_url: str, key: str, build) -> None:
        """Make ``engine``'s (empty, migrated) database a copy of the store ``build(engine)``
        makes, building that store on the first call for this backend and ``key``. The
        engine's pooled connections are closed; it reconnects to the copy."""
        from sqlalchemy.engine import make_url

        backend = engine.dialect.name
        if (backend, key) not in self.built:
            self.built[(backend, key)] = self._build(backend, key, build)
        template = self.built[(backend, key)]
        engine.dispose()
        if backend == "sqlite":
            path = make_url(db_url).database
            for suffix in ("-wal", "-shm"):
                if os.path.exists(path + suffix):
                    os.unlink(path + suffix)
            shutil.copyfile(template, path)
        else:
            self.postgres.clone(make_url(db_url).database, template)

    def _build(self, backend: str, key: str, build) -> str:
        if backend == "sqlite":
            path = str(self.root / f"filled-{key}.db")
            shutil.copyfile(self.sqlite_template, path)
            url = f"sqlite:///{path}"
        else:
            name = self.postgres.new_database()
            path, url = name, _pg_url(name)
        eng = make_engine(url, write=True)
        try:
            build(eng)
        finally:
            eng.dispose()
        if backend == "sqlite":  # everything in the main file before it is copied
            with contextlib.closing(sqlite3.connect(path)) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return path
