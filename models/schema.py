"""Making sure a database is usable before a command touches it.

alembic's script tooling is imported only to name an unknown revision.
"""

from __future__ import annotations

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import DBAPIError

from .engine import DatabaseURLError, make_engine
from .migrate import alembic_config, upgrade


class SchemaError(RuntimeError):
    """The database is not at the schema this version needs; the message says what to run."""


def head_revision(url: str) -> str:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def ensure_schema(url: str, *, create: bool = True) -> None:
    """Create the schema in an empty database; refuse one at another revision.

    An empty database is migrated (so a newcomer's first command just works); a database
    behind head needs an explicit ``modalscope db upgrade`` (several processes may share it).
    """
    engine = make_engine(url)
    try:
        try:
            rev = current_revision(engine)
            has_tables = bool(inspect(engine).get_table_names()) if rev is None else True
        except DBAPIError as exc:
            raise DatabaseURLError(f"cannot open database {engine.url.render_as_string()}: "
                                   f"{_first_line(exc.orig or exc)}") from None
    finally:
        engine.dispose()
    head = head_revision(url)
    if rev == head:
        return
    if rev is None and not has_tables and create:
        upgrade(url)
        return
    if rev is None:
        raise SchemaError("the database has tables but no modalscope schema version; "
                          "point MODALSCOPE_DATABASE_URL at an empty or modalscope database")
    if not known_revision(url, rev):
        raise newer_release_error(url, rev)
    raise SchemaError(f"the database schema is at revision {rev}, this version needs {head}: "
                      "run `modalscope db upgrade`")


def known_revision(url: str, rev: str) -> bool:
    """Whether this version's migrations know ``rev`` (an unknown one: a newer release's)."""
    from alembic.script.revision import RevisionError
    from alembic.util.exc import CommandError

    try:
        return ScriptDirectory.from_config(alembic_config(url)).get_revision(rev) is not None
    except (RevisionError, CommandError):
        return False


def newer_release_error(url: str, rev: str) -> SchemaError:
    return SchemaError(f"the database schema is at revision {rev}, which this version of modalscope "
                       f"(up to {head_revision(url)}) does not know: a newer release wrote it")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__
