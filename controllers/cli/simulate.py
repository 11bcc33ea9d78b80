"""`muster simulate SCENARIO.yaml`: what would happen to each team's wait times, in seconds
of wall time, with no cluster.

The simulation itself is pure (`quota.simulation.simulator`); this module reads the file, shows a
progress bar on a terminal, prints the table / JSON / HTML report, and records every
transition in an SQLite history store that `muster history ... --database-url` can query.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy.exc import DatabaseError

from controllers.cli.fairshare import load_documents
from controllers.cli.history import store_problem
from controllers.cli.options import out_dir_option
from controllers.history import migrate
from controllers.history.engine import make_engine
from controllers.runtime.gcpause import paused_collection
from controllers.simreport.history import write_history
from controllers.simreport.html import render_html
from controllers.simreport.table import render_table
from quota.api import ManifestError
from quota.api.meta import parse_duration
from quota.model.snapshot import PlacementStrategy
from quota.simulation.report import (
    format_seconds,
    to_json,
)
from quota.simulation.scenario import MAX_SAMPLES, Scenario, parse_scenario
from quota.simulation.simulator import simulate


def _progress(
    console: Console, total: int, end: float | None
) -> tuple[Progress, Callable[[float, int], None]]:
    progress = Progress(
        TextColumn("simulating"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("finished, at {task.fields[at]} simulated"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task("simulate", total=total, at="0s")
    last = [0.0]

    def update(t: float, finished: int) -> None:
        now = time.monotonic()
        if now - last[0] < 0.1:  # redrawing on every instant would cost more than simulating
            return
        last[0] = now
        progress.update(task, completed=finished, at=format_seconds(t))

    return progress, update


def with_placement(scenario: Scenario, strategy: str) -> Scenario:
    """`scenario` with every queue placing its pods by `strategy` (BinPack or Spread)."""
    if strategy not in ("BinPack", "Spread"):
        raise ValueError(f"unknown placement strategy {strategy!r} (BinPack or Spread)")
    chosen: PlacementStrategy = "Spread" if strategy == "Spread" else "BinPack"
    queues = {name: replace(q, placement=chosen) for name, q in scenario.queues.items()}
    return replace(scenario, queues=queues)


def _check_history(path: Path) -> None:
    """Refuse, before simulating, a history store the run could not be recorded in (a file
    that is not a database, another application's, a newer Muster's): nothing is written."""
    if not path.exists():
        return
    engine = make_engine(f"sqlite:///{path.resolve()}")
    try:
        problem = migrate.upgrade_problem(engine)
    except DatabaseError as error:
        raise store_problem(error, str(path)) from None
    finally:
        engine.dispose()
    if problem is not None:
        raise click.ClickException(f"history store at {path} {problem}")


def _load(path: Path) -> Scenario:
    docs = load_documents(path)
    try:
        return parse_scenario(docs, name=path.stem)
    except ManifestError as error:
        raise click.ClickException(f"{path}: {error}") from None


@click.command("simulate")
@click.argument(
    "scenario", type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)
)
@click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json", "html"]),
    default="table",
    show_default=True,
    help="What to print: a table per queue, the full JSON, or a self-contained HTML page.",
)
@out_dir_option("Also write result.json, report.html and history.db into this directory.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for generator jitter.")
@click.option(
    "--until",
    metavar="DURATION",
    default=None,
    help="Stop at this simulated time (e.g. 8h); overrides the scenario's Simulation.until.",
)
@click.option(
    "--history",
    "history_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="SQLite file to record every transition in (default: history.db in --out, else a "
    "temporary file). Query it with `muster history ... --database-url PATH`.",
)
@click.option("--no-history", is_flag=True, help="Do not record the run in a history store.")
@click.option(
    "--placement",
    type=click.Choice(["BinPack", "Spread"]),
    default=None,
    help="Place every queue's pods with this strategy, whatever its placementStrategy says "
    "(a what-if for scenarios with nodes).",
)
def simulate_command(
    scenario: Path,
    output: str,
    out_dir: Path | None,
    seed: int,
    until: str | None,
    history_path: Path | None,
    no_history: bool,
    placement: str | None,
) -> None:
    """Simulate SCENARIO.yaml with Muster's admission engine and report per-queue outcomes."""
    loaded = _load(scenario)
    if history_path is None and out_dir is not None:
        history_path = out_dir / "history.db"
    if history_path is not None and not no_history:
        _check_history(history_path)
    if placement is not None:
        loaded = with_placement(loaded, placement)
    if until is not None:
        try:
            seconds = parse_duration(until).total_seconds()
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--until") from None
        samples = seconds / loaded.settings.sample_interval_s
        if samples > MAX_SAMPLES:
            raise click.BadParameter(
                f"{until} is {samples:,.0f} samples at the scenario's sample interval of "
                f"{loaded.settings.sample_interval_s:,.0f}s; at most {MAX_SAMPLES:,} (shorten "
                "it, or raise the Simulation's spec.sampleInterval)",
                param_hint="--until",
            )
        loaded = replace(loaded, settings=replace(loaded.settings, until_s=seconds))
    err = Console(stderr=True)
    # The html page shows each workload's timeline from the recorded transitions.
    record = not no_history or output == "html" or out_dir is not None
    started = time.perf_counter()
    if err.is_terminal:
        progress, update = _progress(err, loaded.workload_count(), loaded.settings.until_s)
        with progress, paused_collection():
            result = simulate(loaded, seed, record=record, progress=update)
    else:
        with paused_collection():
            result = simulate(loaded, seed, record=record)
    elapsed = time.perf_counter() - started

    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "result.json").write_text(json.dumps(to_json(result), indent=2) + "\n")
        (out_dir / "report.html").write_text(render_html(result), encoding="utf-8")
    if output == "json":
        json.dump(to_json(result), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif output == "html":
        sys.stdout.write(render_html(result))
    else:
        # Piped or redirected output gets a width that fits the table instead of 80 columns.
        render_table(result, Console(width=None if sys.stdout.isatty() else 120))

    sys.stdout.flush()  # the notes on stderr come after the report, not inside it
    notes = [f"simulated {format_seconds(result.end)} in {elapsed:.1f}s of wall time"]
    if not no_history:
        if history_path is None:
            history_path = Path(tempfile.mkdtemp(prefix="muster-sim-")) / "history.db"
        history_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            count = write_history(result, history_path)
        except (migrate.MigrationError, DatabaseError) as problem:
            # Nothing was written: a store that is not a database, or one a newer Muster
            # migrated, is refused before its first record (`migrate.upgrade` checks first).
            raise store_problem(problem, str(history_path)) from None
        notes.append(f"{count:,} history records in {history_path}")
    if out_dir is not None:
        notes.append(f"result.json and report.html in {out_dir}")
    err.print("; ".join(notes), style="dim", highlight=False)
