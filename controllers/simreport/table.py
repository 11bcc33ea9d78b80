"""The terminal report of a simulation run: per-queue waits and usage, per-flavor use."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from controllers.simreport.units import in_unit, percent, short
from quota.api.quantity import format_quantity
from quota.model.convert import is_priority_wait
from quota.model.resources import FlavorResource
from quota.simulation.report import (
    LANDED_NOTE,
    LEVELS_NOTE,
    QueueStats,
    cluster_stats,
    flavor_stats,
    format_seconds,
    key_name,
    landed_columns,
    placement_stats,
    queue_stats,
)
from quota.simulation.results import SimResult

QUOTA_ONLY = (
    "quota-only mode: the scenario has no Node or NodePool, so workloads are admitted on quota "
    "alone and no pod is placed"
)


def _amount(key: FlavorResource, value: float) -> str:
    """An average amount in the resource's own unit: 12.5 (gpu), 3.2 (cpu cores), 48Gi."""
    resource = key[1]
    if resource == "cpu":
        return f"{value / 1000:.1f}"
    if resource in ("memory", "ephemeral-storage", "storage"):
        return f"{value / 2**30:.0f}Gi"
    return f"{value:.1f}"


def _usage_cell(q: QueueStats) -> str:
    """ "avg usage / avg fair share" of the queue's headline flavor/resources."""
    parts: list[str] = []
    for key in q.headline:
        label = f"{key[0]} {short(key[1])}" if len(q.headline) > 1 else short(key[1])
        usage = _amount(key, q.avg_usage.get(key, 0.0))
        fair = _amount(key, q.avg_fair_share.get(key, 0.0))
        parts.append(f"{usage} / {fair} {label}")
    return "\n".join(parts)


def render_table(result: SimResult, console: Console) -> None:
    """The default report: one row per queue (tree order), then flavor utilisation."""
    placing = result.nodes is not None
    caption = (
        "wait: time pending before the last admission (so far, if still pending); "
        "usage / fair share: time-weighted averages"
    )
    if placing:
        caption += (
            "; waited for nodes: workloads that quota allowed but no nodes could hold yet, "
            "and their summed wait"
        )
    table = Table(
        title=f"{result.settings.name}: {len(result.jobs):,} workloads, seed {result.seed}",
        caption=caption,
        caption_justify="left",
    )
    table.add_column("Queue", no_wrap=True)
    for column in ("Admitted", "Preempted", "Pending"):
        table.add_column(column, justify="right")
    table.add_column("Wait p50", justify="right")
    table.add_column("p90", justify="right")
    table.add_column("max", justify="right")
    table.add_column("Usage / fair share", justify="right", no_wrap=True)
    if placing:
        table.add_column("Waited for nodes", justify="right", no_wrap=True)
    for q in queue_stats(result):
        name = "  " * q.depth + q.name
        cells = [
            name if q.leaf else f"[bold]{name}[/bold]",
            f"{q.admitted:,}",
            f"{q.preempted:,}",
            f"{q.pending:,}",
            format_seconds(q.wait(50)),
            format_seconds(q.wait(90)),
            format_seconds(max(q.waits) if q.waits else None),
            _usage_cell(q),
        ]
        if placing:
            cells.append(_node_wait_cell(q))
        table.add_row(*cells)
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
            percent(f),
        )
    console.print(flavors)
    stats = placement_stats(result)
    if stats is None:
        console.print(QUOTA_ONLY, style="dim", highlight=False)
    elif stats.timelines:
        nodes = _figures(
            f"Nodes ({stats.nodes:,}): free room over time",
            "partly used: nodes with some but not all of the resource in use (room a "
            "whole-node gang cannot use); empty: nodes with none of it in use",
            ["Resource"],
            ["Capacity", "Avg free on partly used", "max", "Avg free on empty"],
        )
        for t in stats.timelines:
            nodes.add_row(
                t.resource,
                in_unit(t.resource, t.capacity),
                in_unit(t.resource, t.avg_partial_free),
                in_unit(t.resource, t.max_partial_free),
                in_unit(t.resource, t.avg_whole_free),
            )
        console.print(nodes)
    if stats is not None and stats.levels:
        levels = _figures(
            "Topology: the largest free room in one domain over time",
            LEVELS_NOTE,
            ["Topology", "Level", "Resource"],
            ["Domains", "Largest domain", "Avg largest free", "min"],
        )
        for f in stats.levels:
            levels.add_row(
                f.topology,
                f.level,
                f.resource,
                f"{f.domains:,}",
                in_unit(f.resource, f.largest),
                in_unit(f.resource, f.avg_largest_free),
                in_unit(f.resource, f.min_largest_free),
            )
        console.print(levels)
    if stats is not None and stats.landed:
        landed = _figures(
            "Topology: where gangs landed",
            LANDED_NOTE,
            ["Queue"],
            ["Gangs", *landed_columns(stats.landed_levels)],
        )
        for q in stats.landed:
            landed.add_row(
                q.queue,
                f"{q.gangs:,}",
                *(f"{q.by_level.get(level, 0):,}" for level in stats.landed_levels),
            )
        console.print(landed)
    clusters = cluster_stats(result)
    if clusters:
        workers = _figures(
            f"Worker clusters ({len(clusters):,})",
            "workloads: those whose last run was there; in use: what their pods requested, "
            "time-weighted",
            ["Cluster", "Labels"],
            ["Nodes", "Workloads", "Resource", "Capacity", "Avg in use", "Utilisation"],
        )
        for c in clusters:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(c.labels.items())) or "-"
            for i, r in enumerate(c.capacity):
                share = c.utilisation(r)
                workers.add_row(
                    c.name if i == 0 else "",
                    labels if i == 0 else "",
                    f"{c.nodes:,}" if i == 0 else "",
                    f"{c.workloads:,}" if i == 0 else "",
                    r,
                    in_unit(r, c.capacity[r]),
                    in_unit(r, c.avg_used.get(r, 0.0)),
                    "-" if share is None else f"{share:.0%}",
                )
        console.print(workers)
    _print_undecidable(result, console)
    unfinished = sum(1 for j in result.jobs if j.finished_at is None)
    tail = "" if result.finished_all else f" ({unfinished:,} workloads had not finished)"
    console.print(
        f"makespan {format_seconds(result.makespan)}{tail}; {result.cycles:,} admission "
        f"cycles, {result.evictions:,} evictions"
    )


def _figures(title: str, caption: str, names: list[str], figures: list[str]) -> Table:
    """A table of named rows (left, never wrapped) and figures (right-aligned)."""
    table = Table(title=title, caption=caption, caption_justify="left")
    for column in names:
        table.add_column(column, no_wrap=True)
    for column in figures:
        table.add_column(column, justify="right")
    return table


def _node_wait_cell(q: QueueStats) -> str:
    waits = q.placement_waits
    return f"{len(waits):,}: {format_seconds(sum(waits))}" if waits else "-"


def _print_undecidable(result: SimResult, console: Console) -> None:
    """Workloads no cycle could decide (they name a PriorityClass that does not exist), with
    the reason, so that they do not pass for an ordinary wait in the table above."""
    waiting: dict[str, list[str]] = {}
    for j in result.jobs:
        if j.admitted_at is None and is_priority_wait(j.last_pending_reason):
            waiting.setdefault(j.last_pending_reason, []).append(j.key)
    for reason, keys in waiting.items():
        shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3:,} more" if len(keys) > 3 else "")
        console.print(f"never decided: {shown}: {reason}", style="yellow", highlight=False)
