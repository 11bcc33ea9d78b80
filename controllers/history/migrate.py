"""Alembic, driven from code: upgrade, downgrade and inspect the history store's schema.

The Alembic environment lives in the repository's `migrations/` directory; `alembic.ini` at the
repository root points there too, so `alembic upgrade head` and `muster db upgrade` agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DatabaseError

from controllers.history.models import Base

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"

# The PostgreSQL advisory lock every Muster migration of one database holds (any fixed 64-bit
# number; advisory locks are per database, so two stores in two databases never wait on each
# other). Two replicas start together and each migrates in the background.
MIGRATION_LOCK = 0x6D75737465720001


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic `Config` for the history store, optionally bound to an open connection."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise FileNotFoundError(
            f"history migrations: {MIGRATIONS_DIR}/env.py is missing; "
            "install Muster from its source tree (pip install -e .)"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        # env.py uses this connection instead of building its own engine.
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision the code knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "history migrations: no revisions found"
    return head


class MigrationError(ValueError):
    """A migration that cannot be carried out; the message says why and what to do."""


def known_revisions() -> list[str]:
    """Every revision the code knows, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def _check_target(engine: Engine, revision: str) -> None:
    current = current_revision(engine)
    problem = not_ours(engine, current)
    if problem is not None:
        raise MigrationError(problem)
    if revision not in ("head", "base") and revision not in known_revisions():
        raise MigrationError(
            f"cannot migrate to unknown revision {revision!r}; the revisions are "
            f"{', '.join(known_revisions())} (or head, base)"
        )


def _newer(current: str) -> str:
    return (
        f"is at revision {current!r}, which this Muster does not know (its newest is "
        f"{head_revision()}): a newer Muster wrote it; use that version"
    )


def not_ours(engine: Engine, current: str | None) -> str | None:
    """Why the database must be left alone, or None: one a newer Muster migrated, or another
    application's (tables, but no revision of Muster's). Muster neither reads nor writes it."""
    if current is not None and current in known_revisions():
        return None
    tables = sorted(set(inspect(engine).get_table_names()) - {"alembic_version"})
    ours = set(Base.metadata.tables)
    if current is not None and ours & set(tables):
        return _newer(current)
    if current is None and not tables:
        return None  # empty: a new store
    shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    revision = f"Alembic revision {current!r} (not Muster's) and " if current else ""
    return (
        f"holds {revision}tables {shown or '(none)'}, but no Muster history store: it is another "
        "application's database, which Muster leaves alone; give Muster a database (or a file) "
        "of its own"
    )


def upgrade_problem(engine: Engine) -> str | None:
    """Why `upgrade` cannot make the store one Muster can write, or None: it is not Muster's
    (`not_ours`), or it is stamped at the newest revision with tables missing (damaged)."""
    current = current_revision(engine)
    problem = not_ours(engine, current)
    if problem is None and current == head_revision():
        problem = schema_problem(engine)
    return problem


def describe(err: MigrationError | DatabaseError) -> str:
    """What is wrong with a history store that raised `err`, said after the store's name by
    every command and component that uses it (`history store at WHERE ...`)."""
    if isinstance(err, MigrationError):
        return str(err)
    reason = _reason(err)
    if "no such table" in reason or "does not exist" in reason:
        return "has no schema; run `muster db upgrade`"
    if _damaged(reason):
        return f"is not an SQLite database, or is damaged: {reason}"
    return f"is unreachable: {reason}"


def is_permanent(err: MigrationError | DatabaseError) -> bool:
    """Whether waiting cannot mend the store (it is another application's, a newer Muster's,
    not a database, or damaged), unlike an unreachable server."""
    return isinstance(err, MigrationError) or _damaged(_reason(err))


def _reason(err: DatabaseError) -> str:
    """The driver's first line, without the statement and its parameters."""
    return str(err.orig).strip().splitlines()[0] if err.orig else str(err)


def _damaged(reason: str) -> bool:
    return "not a database" in reason or "malformed" in reason


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the history store up to `revision` (default: the newest). Raises
    MigrationError for an unknown revision or a store written by a newer Muster."""
    _migrate(engine, revision, command.upgrade)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the history store down to `revision` (`base` removes every table)."""
    _migrate(engine, revision, command.downgrade)


def _migrate(engine: Engine, revision: str, step: Callable[[Config, str], None]) -> None:
    """Run Alembic's `step` to `revision` in one transaction of `engine`, one process at a
    time: the revision is read, checked and moved only under the lock."""
    with _one_at_a_time(engine):
        _check_target(engine, revision)
        try:
            with engine.begin() as conn:
                step(alembic_config(conn), revision)
        except CommandError as error:
            raise MigrationError(f"cannot migrate: {error}") from None


@contextmanager
def _one_at_a_time(engine: Engine) -> Iterator[None]:
    """Hold MIGRATION_LOCK (PostgreSQL) while the body runs. Without it two replicas both read
    the old revision and both run its steps: one fails on a table or column the other has just
    made, and a step that only changes rows would run twice. The lock is a transaction's, on a
    connection of its own: it goes with the transaction, so a process that dies mid-migration
    (its migration rolled back) frees it too. SQLite history has one replica."""
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        yield


def schema_problem(engine: Engine) -> str | None:
    """Why the store cannot be read as a Muster history store now, or None if it can:
    no schema yet, an older one, one from a newer Muster, or tables missing under a stamp."""
    current = current_revision(engine)
    problem = not_ours(engine, current)
    if problem is not None:
        return problem
    if current is None:
        return "has no schema; run `muster db upgrade`"
    if current != head_revision():
        return f"is at revision {current}, older than {head_revision()}; run `muster db upgrade`"
    missing = sorted(set(Base.metadata.tables) - set(inspect(engine).get_table_names()))
    if missing:
        return (
            f"is stamped at revision {current} but its tables {', '.join(missing)} are missing: "
            "it is damaged; restore it from a backup, or start a new store (a new file, or "
            "drop table alembic_version) and run `muster db upgrade`"
        )
    return None


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
