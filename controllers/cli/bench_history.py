"""`muster bench-history`: the history store's benchmark (see controllers/history/benchmark.py)."""

from __future__ import annotations

import os

import click

DEFAULT_PG = "postgresql+psycopg://muster:muster@127.0.0.1:5432/muster_test"


@click.command("bench-history")
@click.option("--records", default=50_000, show_default=True, help="Transitions per engine.")
@click.option("--cycles", default=25, show_default=True, help="Admission cycles timed per variant.")
@click.option(
    "--postgres-url",
    default=lambda: os.environ.get("MUSTER_TEST_POSTGRES_URL", DEFAULT_PG),
    show_default="$MUSTER_TEST_POSTGRES_URL or the local test server",
    help="A PostgreSQL database the benchmark may create a throw-away schema in.",
)
@click.option("--no-postgres", is_flag=True, help="Measure SQLite only.")
def bench_history(records: int, cycles: int, postgres_url: str, no_postgres: bool) -> None:
    """Measure record() cost, sustained writes per second, and admission-cycle overhead."""
    from controllers.history.benchmark import run

    if records < 1 or cycles < 1:
        raise click.BadParameter("--records and --cycles must be at least 1")
    run(None if no_postgres else postgres_url, records, cycles, out=click.echo)
