"""`muster db ...` (schema migrations) and `muster history ...` (questions about the past)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine
from sqlalchemy.exc import DatabaseError

from controllers.cli.options import output_option
from controllers.history import migrate, queries
from controllers.history.engine import (
    ENV_VAR,
    DatabaseURLError,
    database_url,
    display_url,
    make_engine,
)

_url_option = click.option(
    "--database-url",
    "database_url_flag",
    metavar="URL",
    default=None,
    help=f"postgresql+psycopg://... or sqlite:///PATH (default: ${ENV_VAR}, else "
    "~/.local/share/muster/history.db).",
)


@contextmanager
def _engine(flag: str | None, *, read: bool = False) -> Iterator[Engine]:
    """The history store's engine, with every way it can be unusable turned into a message
    naming the store and what to do. `read`: the command only reads, so a store that does
    not exist is reported (never created) and its schema must be the current one."""
    try:
        url = database_url(flag)
    except DatabaseURLError as err:
        raise click.UsageError(str(err)) from None
    where = display_url(url)
    if read and url.get_backend_name() == "sqlite" and not Path(str(url.database)).is_file():
        raise click.ClickException(
            f"no history store at {url.database}: nothing was recorded there; check "
            "--database-url or $MUSTER_DATABASE_URL, or create one with `muster db upgrade`"
        )
    engine = make_engine(url)
    try:
        if read:
            problem = migrate.schema_problem(engine)
            if problem is not None:
                raise click.ClickException(f"history store at {where} {problem}")
        yield engine
    except (migrate.MigrationError, DatabaseError) as err:
        raise store_problem(err, where) from None
    finally:
        engine.dispose()


def store_problem(err: migrate.MigrationError | DatabaseError, where: str) -> click.ClickException:
    """What a person is told when the history store at `where` cannot be used, by any command
    that reads or writes it: which store, what is wrong, and what to do."""
    return click.ClickException(f"history store at {where} {migrate.describe(err)}")


# --- muster db ---------------------------------------------------------------------------------


@click.group("db")
def db() -> None:
    """Create and migrate the history store's schema."""


@db.command("upgrade")
@click.argument("revision", default="head")
@_url_option
def db_upgrade(revision: str, database_url_flag: str | None) -> None:
    """Migrate the history store up to REVISION (default: head)."""
    with _engine(database_url_flag) as engine:
        before = migrate.current_revision(engine)
        migrate.upgrade(engine, revision)
        after = migrate.current_revision(engine)
        problem = migrate.schema_problem(engine) if after == migrate.head_revision() else None
        if problem is not None:
            raise click.ClickException(f"history store at {display_url(engine.url)} {problem}")
        click.echo(
            f"history store {display_url(engine.url)}: {before or 'empty'} -> {after or 'empty'}"
        )


@db.command("downgrade")
@click.argument("revision")
@_url_option
@click.option("--yes", is_flag=True, help="Do not ask; downgrading can drop recorded history.")
def db_downgrade(revision: str, database_url_flag: str | None, yes: bool) -> None:
    """Migrate the history store down to REVISION (`base` drops every table)."""
    with _engine(database_url_flag) as engine:
        if not yes:
            click.confirm(
                f"Downgrade {display_url(engine.url)} to {revision}? History may be dropped",
                abort=True,
            )
        before = migrate.current_revision(engine)
        migrate.downgrade(engine, revision)
        after = migrate.current_revision(engine)
        click.echo(
            f"history store {display_url(engine.url)}: {before or 'empty'} -> {after or 'empty'}"
        )


@db.command("current")
@_url_option
def db_current(database_url_flag: str | None) -> None:
    """Show the schema revision of the history store and whether it is the newest."""
    try:
        url = database_url(database_url_flag)
    except DatabaseURLError as err:
        raise click.UsageError(str(err)) from None
    if url.get_backend_name() == "sqlite" and not Path(str(url.database)).is_file():
        # Only reads: the file is not created.
        click.echo(
            f"{display_url(url)}: not migrated (no file yet); head is "
            f"{migrate.head_revision()}; run `muster db upgrade`"
        )
        return
    with _engine(database_url_flag) as engine:
        current = migrate.current_revision(engine)
        head = migrate.head_revision()
        where = display_url(engine.url)
        foreign = migrate.not_ours(engine, current)
        if foreign is not None:
            raise click.ClickException(f"history store at {where} {foreign}")
        if current is None:
            click.echo(f"{where}: not migrated; head is {head}; run `muster db upgrade`")
        elif current == head:
            problem = migrate.schema_problem(engine)
            click.echo(f"{where}: {current} (head)" + (f"; but it {problem}" if problem else ""))
        else:
            click.echo(f"{where}: {current}; head is {head}; run `muster db upgrade`")


# --- muster history ----------------------------------------------------------------------------


@click.group("history")
def history() -> None:
    """What Muster decided, when and why."""


def _since(text: str) -> datetime:
    try:
        return queries.parse_since(text)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    except OverflowError:
        raise click.BadParameter(
            f"{text!r} reaches back further than a date can", param_hint="--since"
        ) from None


def _skipping(engine: Engine) -> queries.Skipped:
    """Tell the person, on stderr, of each row a question skipped (queries.py says why rows
    are skipped rather than the whole store refused)."""
    where = display_url(engine.url)

    def tell(row: queries.UnreadableRow) -> None:
        click.echo(f"Warning: history store at {where}: skipped {row}", err=True)

    return tell


def _short(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _amounts(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))


def _emit(output: str, data: Any, render: Callable[[Console], None]) -> None:
    if output == "json":
        click.echo(json.dumps(queries.as_json(data), indent=2, sort_keys=True))
    else:
        # Piped into grep or a file, a row stays on one line instead of wrapping at 80 columns.
        console = Console()
        if not console.is_terminal:
            console = Console(width=240)
        render(console)


@history.command("workload")
@click.argument("workload", metavar="NAMESPACE/NAME")
@_url_option
@output_option
def history_workload(workload: str, database_url_flag: str | None, output: str) -> None:
    """A workload's timeline: transitions, placements and preemptions, with reasons."""
    namespace, sep, name = workload.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise click.BadParameter(
            f"expected NAMESPACE/NAME, got {workload!r}", param_hint="NAMESPACE/NAME"
        )
    with _engine(database_url_flag, read=True) as engine:
        entries = queries.workload_timeline(engine, namespace, name, skipped=_skipping(engine))
    if not entries and output == "table":
        raise click.ClickException(f"no history recorded for workload {namespace}/{name}")

    def render(console: Console) -> None:
        table = Table(title=f"workload {namespace}/{name}")
        for col in ("time (UTC)", "event", "queue", "resources@flavor", "reason", "by"):
            table.add_column(col)
        for e in entries:
            queue = f"{e.local_queue} -> {e.cluster_queue}" if e.local_queue else e.cluster_queue
            # Amounts in base units (millicores, bytes, devices), each with its flavor.
            what = ", ".join(
                f"{res}={amount}" + (f"@{e.flavors[res]}" if res in e.flavors else "")
                for res, amount in sorted(e.resources.items())
            )
            if e.event == "placed":
                what = _amounts(e.detail.get("nodes", {}))
            elif e.event in ("preempting", "reclaiming"):
                what = f"victims: {e.detail.get('victims', '')}"
            table.add_row(_short(e.at), e.event, queue, what, e.reason, e.actor)
        console.print(table)

    _emit(output, entries, render)


@history.command("queue")
@click.argument("cluster_queue", metavar="NAME")
@click.option(
    "--since",
    "since_text",
    default="24h",
    show_default=True,
    help="Window start: a duration back from now (30m, 24h, 7d) or an ISO timestamp.",
)
@_url_option
@output_option
def history_queue(
    cluster_queue: str, since_text: str, database_url_flag: str | None, output: str
) -> None:
    """A cluster queue's admissions, preemptions and usage vs fair share over a window."""
    since = _since(since_text)
    with _engine(database_url_flag, read=True) as engine:
        report = queries.queue_report(engine, cluster_queue, since, skipped=_skipping(engine))

    def render(console: Console) -> None:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items())) or "no events"
        console.print(
            f"cluster queue [bold]{cluster_queue}[/bold] from {_short(report.since)} "
            f"to {_short(report.until)} UTC: {counts}"
        )
        usage = Table(title="usage vs fair share (time-weighted averages)")
        for col in (
            "flavor",
            "resource",
            "avg usage",
            "peak usage",
            "avg fair share",
            "peak demand",
            "observed",
        ):
            usage.add_column(col, justify="right" if col not in ("flavor", "resource") else "left")
        for u in report.usage:
            usage.add_row(
                u.flavor,
                u.resource,
                f"{u.average_usage:,.0f}",
                f"{u.peak_usage:,.0f}",
                f"{u.average_fair_share:,.0f}",
                f"{u.peak_demand:,.0f}",
                f"{u.observed_s / 3600:.1f}h",
            )
        console.print(usage)
        events = Table(title=f"events (latest {len(report.events)})")
        for col in ("time (UTC)", "event", "workload", "reason", "by"):
            events.add_column(col)
        for e in report.events:
            events.add_row(_short(e.at), e.event, f"{e.namespace}/{e.name}", e.reason, e.actor)
        console.print(events)

    _emit(output, report, render)


@history.command("preemptions")
@click.option(
    "--since",
    "since_text",
    default="1h",
    show_default=True,
    help="Window start: a duration back from now (30m, 24h, 7d) or an ISO timestamp.",
)
@click.option(
    "--queue",
    "cluster_queue",
    default=None,
    help="Only preemptions where the preemptor or a victim is in this cluster queue.",
)
@_url_option
@output_option
def history_preemptions(
    since_text: str, cluster_queue: str | None, database_url_flag: str | None, output: str
) -> None:
    """Who preempted or reclaimed whom, and why."""
    since = _since(since_text)
    with _engine(database_url_flag, read=True) as engine:
        entries = queries.preemptions(
            engine, since, cluster_queue=cluster_queue, skipped=_skipping(engine)
        )

    def render(console: Console) -> None:
        table = Table(title=f"preemptions since {_short(since)} UTC ({len(entries)})")
        for col in ("time (UTC)", "preemptor", "queue", "rule", "victims", "reason"):
            table.add_column(col)
        for e in entries:
            victims = "\n".join(
                f"{v['namespace']}/{v['name']} ({v.get('cluster_queue', '')})" for v in e.victims
            )
            table.add_row(
                _short(e.at),
                f"{e.namespace}/{e.name}",
                e.cluster_queue,
                e.strategy,
                victims,
                e.reason,
            )
        console.print(table)

    _emit(output, entries, render)


__all__ = ["db", "history"]
