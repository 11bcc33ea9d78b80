"""The history store's schema: Alembic migrations up and down on both engines, and no drift."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import inspect

from controllers.history import migrate
from controllers.history.models import Base
from controllers.main import main
from tests.integration.conftest import Store

TABLES = {"workload_transitions", "placement_decisions", "preemption_decisions", "queue_samples"}


def _tables(store: Store) -> set[str]:
    return set(inspect(store.engine).get_table_names())


def test_migrations_go_up_to_head_and_back_down_to_empty(store: Store) -> None:
    assert migrate.current_revision(store.engine) is None
    migrate.upgrade(store.engine)
    assert migrate.current_revision(store.engine) == migrate.head_revision()
    assert _tables(store) >= TABLES
    indexes = {ix["name"] for ix in inspect(store.engine).get_indexes("workload_transitions")}
    assert {
        "ix_workload_transitions_namespace_name_at",
        "ix_workload_transitions_cluster_queue_at",
        "ix_workload_transitions_kind_at",
    } <= indexes

    migrate.downgrade(store.engine, "base")
    assert migrate.current_revision(store.engine) is None
    assert not TABLES & _tables(store)

    # And up again: a downgrade leaves nothing behind that blocks the next upgrade.
    migrate.upgrade(store.engine)
    assert _tables(store) >= TABLES


def test_models_and_migrations_do_not_drift(store: Store) -> None:
    migrate.upgrade(store.engine)
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    assert diff == [], f"models differ from migrations; write a new revision: {diff}"


def test_db_commands_upgrade_and_report_the_revision(store: Store) -> None:
    runner = CliRunner()
    url = store.url.render_as_string(hide_password=False)
    before = runner.invoke(main, ["db", "current", "--database-url", url])
    assert before.exit_code == 0, before.output
    assert "not migrated" in before.output

    up = runner.invoke(main, ["db", "upgrade", "--database-url", url])
    assert up.exit_code == 0, up.output
    head = migrate.head_revision()
    assert f"empty -> {head}" in up.output

    after = runner.invoke(main, ["db", "current", "--database-url", url])
    assert after.exit_code == 0, after.output
    assert f"{head} (head)" in after.output
    assert "muster:muster@" not in after.output  # the password is never printed

    # Downgrading drops history, so it asks; without an answer nothing happens.
    refused = runner.invoke(main, ["db", "downgrade", "base", "--database-url", url], input="n\n")
    assert refused.exit_code != 0
    assert migrate.current_revision(store.engine) == head
    down = runner.invoke(main, ["db", "downgrade", "base", "--yes", "--database-url", url])
    assert down.exit_code == 0, down.output
    assert migrate.current_revision(store.engine) is None


def test_history_command_on_an_unmigrated_store_says_to_upgrade(store: Store) -> None:
    result = CliRunner().invoke(
        main,
        ["history", "preemptions", "--database-url", store.url.render_as_string(False)],
    )
    assert result.exit_code != 0
    assert "muster db upgrade" in result.output
