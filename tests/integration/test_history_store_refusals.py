"""A history store Muster must not use is refused by every command, on SQLite and on a real
PostgreSQL, and what it holds is left exactly as it was (issue 24, item 6): one a newer Muster
migrated, another application's database, and rows a reader cannot parse.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from click.testing import CliRunner, Result
from sqlalchemy import inspect, text

from controllers.history.rows import write_records
from controllers.main import main
from tests.integration.conftest import Store
from tests.integration.test_history_queries import history_of_the_last_hours

COMMANDS = [
    ["history", "workload", "team-a/train-0"],
    ["history", "queue", "team-a", "--since", "7d"],
    ["history", "preemptions", "--since", "7d"],
    ["db", "current"],
    ["db", "upgrade"],
    ["db", "downgrade", "base", "--yes"],
]


def muster(store: Store, *args: str) -> Result:
    result = CliRunner().invoke(
        main, [*args, "--database-url", store.url.render_as_string(hide_password=False)]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def contents(store: Store) -> dict[str, list[Any]]:
    """Every row of every table, in a fixed order."""
    out: dict[str, list[Any]] = {}
    with store.engine.connect() as conn:
        for table in sorted(inspect(conn).get_table_names()):
            rows = conn.execute(text(f"SELECT * FROM {table}")).all()
            out[table] = sorted((tuple(str(v) for v in r) for r in rows), key=str)
    return out


def refused_by_every_command(store: Store, *needles: str) -> None:
    """Every command exits 1 saying `needles`, and every row of every table stays as it was."""
    before = contents(store)
    for args in COMMANDS:
        result = muster(store, *args)
        assert result.exit_code == 1, (args, result.output)
        for needle in needles:
            assert needle in result.output, (args, result.output)
    assert contents(store) == before


def test_a_store_a_newer_muster_migrated_is_refused_and_kept(migrated: Store) -> None:
    with migrated.engine.begin() as conn:
        write_records(conn, history_of_the_last_hours(datetime.now(UTC).replace(microsecond=0)))
        conn.execute(text("UPDATE alembic_version SET version_num = '9000_future'"))
    refused_by_every_command(
        migrated, "revision '9000_future', which this Muster does not know", "a newer Muster"
    )


def test_another_applications_database_is_left_alone(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount REAL)"))
        conn.execute(text("INSERT INTO invoices VALUES (1, 9.5)"))
    # Nothing added either: no alembic_version, no history tables.
    refused_by_every_command(store, "holds tables invoices, but no Muster history store")


def test_rows_a_reader_cannot_parse_are_skipped_with_a_warning(migrated: Store) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    with migrated.engine.begin() as conn:
        write_records(conn, history_of_the_last_hours(now))
        first = conn.execute(text("SELECT min(id) FROM preemption_decisions")).scalar_one()
        # Valid JSON, so PostgreSQL takes it, but not a list of victims.
        conn.execute(
            text("UPDATE preemption_decisions SET victims = :v WHERE id = :id"),
            {"v": "[1, 2]", "id": first},
        )
        count = conn.execute(text("SELECT count(*) FROM preemption_decisions")).scalar_one()
    before = contents(migrated)
    result = muster(migrated, "history", "preemptions", "--since", "7d", "-o", "json")
    assert result.exit_code == 0, result.output
    assert f"skipped preemption_decisions row id={first}: column victims must be" in result.output
    assert result.output.count('"strategy"') == count - 1  # one per decision shown
    assert contents(migrated) == before
