"""Alembic environment for Muster's history store (PostgreSQL or SQLite)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from controllers.history.engine import database_url, make_engine
from controllers.history.models import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate through the caller's connection, else one made from the history URL setting."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    configured = context.config.get_main_option("sqlalchemy.url")
    engine = make_engine(database_url(configured or None))
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    """Emit SQL for the configured URL instead of running it (`alembic upgrade --sql`)."""
    configured = context.config.get_main_option("sqlalchemy.url")
    context.configure(
        url=database_url(configured or None),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
