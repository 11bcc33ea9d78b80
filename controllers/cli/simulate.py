"""`muster simulate SCENARIO.yaml`: what would happen to each team's wait times, in seconds
of wall time, with no cluster.

The simulation itself is pure (`quota.simulation.simulator`); this module reads the file, shows a
progress bar on a terminal, prints the table / JSON / HTML report, and records every
transition in an SQLite history store that `muster history ... --database-url` can query.
"""

from __future__ import annotations

import html
import io
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from controllers.cli.fairshare import load_documents
from controllers.history import migrate
from controllers.history.engine import make_engine
from controllers.history.recorder import write_records
from controllers.history.records import (
    PreemptionDecision,
    QueueSample,
    TransitionKind,
    Victim,
    WorkloadTransition,
)
from controllers.runtime.gcpause import paused_collection
from quota.api import ManifestError
from quota.api.meta import parse_duration
from quota.api.quantity import format_quantity
from quota.model.resources import FlavorResource
from quota.simulation.report import (
    FlavorStats,
    QueueStats,
    flavor_stats,
    format_seconds,
    key_name,
    queue_stats,
    timeline,
    to_json,
)
from quota.simulation.scenario import Scenario, parse_scenario
from quota.simulation.simulator import SimResult, simulate

# ----------------------------------------------------------------------- history


def _uid(result: SimResult, job: str) -> str:
    # The same scenario and seed give the same uids, so recording a run twice into one store
    # stores it once (the store keys rows on uid, kind and sequence).
    return str(
        uuid.uuid5(uuid.NAMESPACE_URL, f"muster-sim/{result.settings.name}/{result.seed}/{job}")
    )


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


def history_records(
    result: SimResult,
) -> Iterator[WorkloadTransition | PreemptionDecision | QueueSample]:
    """The run as history-store records (transitions, preemptions, queue samples)."""
    start = result.settings.start

    def at(seconds: float) -> datetime:
        return start + timedelta(seconds=seconds)

    for t in result.transitions:
        namespace, name = _split(t.job)
        yield WorkloadTransition(
            namespace=namespace,
            name=name,
            uid=_uid(result, t.job),
            kind=TransitionKind(t.kind),
            at=at(t.at),
            sequence=t.sequence,
            local_queue=t.local_queue,
            cluster_queue=t.cluster_queue,
            flavors=dict(t.flavors),
            resources=dict(t.resources),
            reason=t.reason[:4000],
            actor=t.actor,
        )
    for p in result.preemptions:
        namespace, name = _split(p.preemptor)
        victims = tuple(
            Victim(
                namespace=_split(job)[0],
                name=_split(job)[1],
                uid=_uid(result, job),
                cluster_queue=queue,
                priority=priority,
                reason=victim.reason,
            )
            for job, queue, priority, victim in p.victims
        )
        reclaim = any(v.kind == "Reclaimed" for *_, v in p.victims)
        yield PreemptionDecision(
            namespace=namespace,
            name=name,
            uid=_uid(result, p.preemptor),
            at=at(p.at),
            victims=victims,
            sequence=p.sequence,
            cluster_queue=p.cluster_queue,
            strategy="reclaim" if reclaim else "preempt",
            reason=f"{len(victims)} victim(s) chosen by the admission cycle",
        )
    resolution = max(1, round(result.settings.sample_interval_s))
    for bucket in result.samples:
        covered = max(1, min(resolution, round(bucket.end - bucket.start)))
        for queue, measures in bucket.values.items():
            if not queue:
                continue  # the cluster total is not a queue
            keys: set[FlavorResource] = set()
            for values in measures.values():
                keys.update(values)
            for flavor, resource in sorted(keys):
                yield QueueSample(
                    cluster_queue=queue,
                    flavor=flavor,
                    resource=resource,
                    at=at(bucket.start),
                    usage=measures.get("usage", {}).get((flavor, resource), 0.0),
                    fair_share=measures.get("fairShare", {}).get((flavor, resource), 0.0),
                    demand=measures.get("demand", {}).get((flavor, resource), 0.0),
                    resolution_s=resolution,
                    covered_s=covered,
                )


def write_history(result: SimResult, path: Path) -> int:
    """Record the run in the SQLite history store at `path` (created and migrated if new).

    The one place the simulator touches the history store: it writes in bulk, in one
    transaction, instead of going through the controller's background recorder.
    """
    engine = make_engine(f"sqlite:///{path.resolve()}")
    try:
        migrate.upgrade(engine)
        records = list(history_records(result))
        with engine.begin() as conn:
            for i in range(0, len(records), 5000):
                write_records(conn, records[i : i + 5000])
        return len(records)
    finally:
        engine.dispose()


# ------------------------------------------------------------------------ table


def _amount(key: FlavorResource, value: float) -> str:
    """An average amount in the resource's own unit: 12.5 (gpu), 3.2 (cpu cores), 48Gi."""
    resource = key[1]
    if resource == "cpu":
        return f"{value / 1000:.1f}"
    if resource in ("memory", "ephemeral-storage", "storage"):
        return f"{value / 2**30:.0f}Gi"
    return f"{value:.1f}"


def _short(resource: str) -> str:
    return resource.rsplit("/", 1)[-1]


def _usage_cell(q: QueueStats) -> str:
    """ "avg usage / avg fair share" of the queue's headline flavor/resources."""
    parts: list[str] = []
    for key in q.headline:
        label = f"{key[0]} {_short(key[1])}" if len(q.headline) > 1 else _short(key[1])
        usage = _amount(key, q.avg_usage.get(key, 0.0))
        fair = _amount(key, q.avg_fair_share.get(key, 0.0))
        parts.append(f"{usage} / {fair} {label}")
    return "\n".join(parts)


def render_table(result: SimResult, console: Console) -> None:
    """The default report: one row per queue (tree order), then flavor utilisation."""
    table = Table(
        title=f"{result.settings.name}: {len(result.jobs):,} workloads, seed {result.seed}",
        caption="wait: time pending before the last admission (so far, if still pending); "
        "usage / fair share: time-weighted averages",
        caption_justify="left",
    )
    table.add_column("Queue", no_wrap=True)
    for column in ("Admitted", "Preempted", "Pending"):
        table.add_column(column, justify="right")
    table.add_column("Wait p50", justify="right")
    table.add_column("p90", justify="right")
    table.add_column("max", justify="right")
    table.add_column("Usage / fair share", justify="right", no_wrap=True)
    for q in queue_stats(result):
        name = "  " * q.depth + q.name
        table.add_row(
            name if q.leaf else f"[bold]{name}[/bold]",
            f"{q.admitted:,}",
            f"{q.preempted:,}",
            f"{q.pending:,}",
            format_seconds(q.wait(50)),
            format_seconds(q.wait(90)),
            format_seconds(max(q.waits) if q.waits else None),
            _usage_cell(q),
        )
    console.print(table)
    flavors = Table(title="Cluster")
    flavors.add_column("Flavor/resource", no_wrap=True)
    flavors.add_column("Capacity", justify="right")
    flavors.add_column("Avg in use", justify="right")
    flavors.add_column("Utilisation", justify="right")
    for f in flavor_stats(result):
        flavors.add_row(
            key_name(f.key),
            format_quantity(f.capacity, f.key[1]),
            _amount(f.key, f.avg_usage),
            _percent(f),
        )
    console.print(flavors)
    unfinished = sum(1 for j in result.jobs if j.finished_at is None)
    tail = "" if result.finished_all else f" ({unfinished:,} workloads had not finished)"
    console.print(
        f"makespan {format_seconds(result.makespan)}{tail}; {result.cycles:,} admission "
        f"cycles, {result.evictions:,} evictions"
    )


def _percent(f: FlavorStats) -> str:
    return "-" if f.utilisation is None else f"{100 * f.utilisation:.0f}%"


# ------------------------------------------------------------------------- html


def render_html(result: SimResult) -> str:
    """One self-contained page: usage against fair share per queue, and wait times."""
    # Imported here: plotly takes a while to load and only this output needs it.
    import plotly.graph_objects as go  # type: ignore[import-untyped]

    series = timeline(result)
    usage_fig = go.Figure()
    queues = list(dict.fromkeys(s.queue for s in series))
    owner: list[str] = []
    for s in series:
        label = f"{key_name(s.key)}"
        times = [t / _time_unit(result)[0] for t in s.times]
        usage_fig.add_trace(
            go.Scatter(x=times, y=s.usage, name=f"usage {label}", mode="lines", line_shape="hv")
        )
        usage_fig.add_trace(
            go.Scatter(
                x=times,
                y=s.fair_share,
                name=f"fair share {label}",
                mode="lines",
                line={"dash": "dash"},
                line_shape="hv",
            )
        )
        owner.extend([s.queue, s.queue])
    buttons = [
        {
            "label": queue,
            "method": "update",
            "args": [
                {"visible": [o == queue for o in owner]},
                {"title": f"Queue {queue}: usage against fair share"},
            ],
        }
        for queue in queues
    ]
    for i, trace in enumerate(usage_fig.data):
        trace.visible = bool(queues) and owner[i] == queues[0]
    unit = _time_unit(result)[1]
    usage_fig.update_layout(
        title=f"Queue {queues[0]}: usage against fair share" if queues else "No queues",
        xaxis_title=f"simulated time ({unit})",
        yaxis_title="amount (devices; cpu in millicores; memory in bytes)",
        updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.0, "y": 1.15}]
        if buttons
        else [],
        height=500,
    )
    wait_fig = go.Figure()
    for q in queue_stats(result):
        if q.leaf and q.waits:
            wait_fig.add_trace(go.Box(y=list(q.waits), name=q.name, boxpoints=False))
    wait_fig.update_layout(
        title="Wait time per queue (seconds pending before the last admission)",
        yaxis_title="seconds",
        height=500,
        showlegend=False,
    )
    console = Console(record=True, width=140, file=io.StringIO())
    render_table(result, console)
    summary = console.export_text()
    return str(
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>muster simulate: {html.escape(result.settings.name)}</title></head>"
        "<body style='font-family: sans-serif; margin: 2em'>"
        f"<h1>Simulation of {html.escape(result.settings.name)} (seed {result.seed})</h1>"
        f"<pre>{html.escape(summary)}</pre>"
        + usage_fig.to_html(full_html=False, include_plotlyjs="inline")
        + wait_fig.to_html(full_html=False, include_plotlyjs=False)
        + "</body></html>"
    )


def _time_unit(result: SimResult) -> tuple[float, str]:
    if result.end >= 3 * 3600:
        return 3600.0, "hours"
    if result.end >= 3 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


# -------------------------------------------------------------------------- command


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
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write result.json, report.html and history.db into this directory.",
)
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
def simulate_command(
    scenario: Path,
    output: str,
    out_dir: Path | None,
    seed: int,
    until: str | None,
    history_path: Path | None,
    no_history: bool,
) -> None:
    """Simulate SCENARIO.yaml with Muster's admission engine and report per-queue outcomes."""
    loaded = _load(scenario)
    if until is not None:
        try:
            seconds = parse_duration(until).total_seconds()
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--until") from None
        loaded = replace(loaded, settings=replace(loaded.settings, until_s=seconds))
    err = Console(stderr=True)
    started = time.perf_counter()
    if err.is_terminal:
        progress, update = _progress(err, loaded.workload_count(), loaded.settings.until_s)
        with progress, paused_collection():
            result = simulate(loaded, seed, record=not no_history, progress=update)
    else:
        with paused_collection():
            result = simulate(loaded, seed, record=not no_history)
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
            directory = (
                out_dir if out_dir is not None else Path(tempfile.mkdtemp(prefix="muster-sim-"))
            )
            history_path = directory / "history.db"
        history_path.parent.mkdir(parents=True, exist_ok=True)
        count = write_history(result, history_path)
        notes.append(f"{count:,} history records in {history_path}")
    if out_dir is not None:
        notes.append(f"result.json and report.html in {out_dir}")
    err.print("; ".join(notes), style="dim", highlight=False)
