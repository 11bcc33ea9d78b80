"""Alembic, driven from code: upgrade, downgrade and inspect the history store's schema.

The Alembic environment lives in the repository's `migrations/` directory; `alembic.ini` at the
repository root points there too, so `alembic upgrade head` and `muster db upgrade` agree.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


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


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the history store up to `revision` (default: the newest)."""
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the history store down to `revision` (`base` removes every table)."""
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
