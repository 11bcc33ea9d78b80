"""The data the html report's plots and workload timelines draw from, embedded in the page
once as JSON: amounts already in the units a person reads, series downsampled so the page
stays small however long the run or large the cluster."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from controllers.simreport.units import short, unit_of
from quota.placement.topology import level_name
from quota.simulation.report import (
    NodeTimeline,
    PlacementStats,
    Series,
    format_seconds,
    key_name,
    percentile,
    queue_keys,
    queue_stats,
    timeline,
)
from quota.simulation.results import SimResult

# Points per plotted series, node rows and time columns per heat map, and workloads whose
# timeline is embedded: the data stays well under a megabyte whatever the run.
MAX_POINTS = 240
MAX_HEAT_ROWS = 160
MAX_WORKLOADS = 3000
# How a transition is named on a workload's timeline.
_EVENT = {
    "created": "submitted",
    "quota_reserved": "quota reserved",
    "admitted": "admitted",
    "evicted": "evicted",
    "preempted": "preempted",
    "reclaimed": "reclaimed",
    "requeued": "requeued",
    "slice_replaced": "resized",
    "finished": "finished",
    "dispatched": "dispatched",
}
# What an admission reason says after this is where its pods went.
_PLANNED = " planned on "


def time_unit(result: SimResult) -> tuple[float, str]:
    """The unit the page's time axes use: (seconds per unit, its name)."""
    if result.end >= 3 * 3600:
        return 3600.0, "hours"
    if result.end >= 3 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _downsample(
    series: Series, edges: Sequence[tuple[float, float]]
) -> tuple[list[float], list[float], list[float]]:
    """At most MAX_POINTS time-weighted points of a series: bucket starts, usage, fair share."""
    step = max(1, -(-len(edges) // MAX_POINTS))
    starts: list[float] = []
    usage: list[float] = []
    fair: list[float] = []
    for i in range(0, len(edges), step):
        group = range(i, min(i + step, len(edges)))
        widths = [edges[j][1] - edges[j][0] for j in group]
        total = sum(widths) or 1.0
        starts.append(edges[group[0]][0])
        usage.append(sum(series.usage[j] * w for j, w in zip(group, widths, strict=True)) / total)
        fair.append(
            sum(series.fair_share[j] * w for j, w in zip(group, widths, strict=True)) / total
        )
    return starts, usage, fair


def _usage(result: SimResult, scale: float) -> tuple[list[float], list[dict[str, Any]]]:
    """Every queue's usage and fair share of every flavor/resource it has quota for."""
    edges = [(b.start, b.end) for b in result.timeline]
    starts: list[float] = []
    out: list[dict[str, Any]] = []
    for s in timeline(result, keys=queue_keys):
        divisor, unit = unit_of(s.key[1])
        starts, usage, fair = _downsample(s, edges)
        out.append(
            {
                "queue": s.queue,
                "key": key_name(s.key),
                "title": f"{s.key[0]} {s.key[1]}",
                "axis": f"{short(s.key[1])} ({unit})",
                "usage": [round(v / divisor, 3) for v in usage],
                "fair": [round(v / divisor, 3) for v in fair],
            }
        )
    return [round(t / scale, 4) for t in starts], out


def _waits(result: SimResult) -> list[dict[str, Any]]:
    """Quartiles of each leaf queue's waits, not every wait: small with 100,000 workloads."""
    return [
        {
            "queue": q.name,
            "min": min(q.waits),
            "q1": percentile(q.waits, 25),
            "median": percentile(q.waits, 50),
            "q3": percentile(q.waits, 75),
            "max": max(q.waits),
        }
        for q in queue_stats(result)
        if q.leaf and q.waits
    ]


def _heat_rows(t: NodeTimeline) -> tuple[list[str], list[list[float]]]:
    """Node rows of a heat map; past MAX_HEAT_ROWS nodes, neighbours share a row (averaged)."""
    per = max(1, -(-len(t.nodes) // MAX_HEAT_ROWS))
    names: list[str] = []
    rows: list[list[float]] = []
    for i in range(0, len(t.nodes), per):
        group = range(i, min(i + per, len(t.nodes)))
        first, last = t.nodes[group[0]], t.nodes[group[-1]]
        names.append(first if len(group) == 1 else f"{first} \u2026 {last} (avg)")
        rows.append(
            [sum(t.used[j][b] for j in group) / len(group) for b in range(len(t.used[group[0]]))]
        )
    return names, rows


def _nodes(stats: PlacementStats | None, scale: float) -> list[dict[str, Any]]:
    """Per placement resource: use per node over time, and free room split by node state."""
    out: list[dict[str, Any]] = []
    for t in stats.timelines if stats is not None else ():
        divisor, unit = unit_of(t.resource)
        names, rows = _heat_rows(t)
        out.append(
            {
                "resource": t.resource,
                "unit": unit,
                "title": f"{t.resource} in use per node over time",
                "freeTitle": f"Free {t.resource}: fragments on partly used nodes against "
                "whole free nodes",
                "axis": f"{short(t.resource)} free ({unit})",
                "starts": [round(v / scale, 4) for v in t.edges[:-1]],
                "max": round(max(t.allocatable) / divisor, 3),
                "nodes": names,
                "used": [[round(v / divisor, 2) for v in row] for row in rows],
                "partial": [round(v / divisor, 3) for v in t.partial_free],
                "whole": [round(v / divisor, 3) for v in t.whole_free],
            }
        )
    return out


def _levels(stats: PlacementStats | None, scale: float) -> list[dict[str, Any]]:
    """Per Topology and resource: the largest free room in one domain of each level over time."""
    charts: dict[tuple[str, str], dict[str, Any]] = {}
    for f in stats.levels if stats is not None else ():
        divisor, unit = unit_of(f.resource)
        chart = charts.setdefault(
            (f.topology, f.resource),
            {
                "title": f"Topology {f.topology}: the most free {f.resource} in one domain",
                "axis": f"{short(f.resource)} free ({unit})",
                "starts": [round(v / scale, 4) for v in f.times],
                "series": [],
            },
        )
        values = [round(v / divisor, 3) for v in f.largest_free]
        chart["series"].append({"name": f"one {level_name(f.level)}", "y": values})
    return list(charts.values())


class _Reasons:
    """Reason texts stored once and referred to by index: most repeat across workloads."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        return self.index.setdefault(text, len(self.index))


def _placed(reason: str) -> str | None:
    """Where an admission put the pods, as its reason says (scenarios with nodes only)."""
    at = reason.find(_PLANNED)
    return None if at < 0 else reason[reason.rfind(";", 0, at) + 1 :].strip()


def _add_wait(
    steps: list[tuple[float, str, str]], reason: str, waited: float, never: bool, end: float
) -> None:
    """The cycle's last reason for making the workload wait, just before its last admission
    (or at the end if it never ran): the simulator keeps the last reason, not every pass's."""
    if never:
        steps.append((end, "waiting", f"still pending at the end: {reason}"))
        return
    last = max((i for i, step in enumerate(steps) if step[1] == "admitted"), default=len(steps))
    at = steps[last][0] if last < len(steps) else end
    text = f"pending {format_seconds(waited)} in all before its last admission: {reason}"
    steps.insert(last, (at, "waiting", text))


def _workloads(result: SimResult, placing: bool) -> dict[str, Any]:
    """Each workload's life: submitted, admitted, placed, preempted or moved, finished, with
    the reasons the admission cycle gave; the most eventful ones past MAX_WORKLOADS."""
    chosen = sorted(result.jobs, key=lambda j: (-j.evictions, -j.waited, j.submitted_at, j.key))
    chosen = sorted(chosen[:MAX_WORKLOADS], key=lambda j: (j.submitted_at, j.key))
    events: dict[str, list[tuple[float, str, str]]] = {j.key: [] for j in chosen}
    for tr in result.transitions:
        if tr.job not in events:
            continue
        events[tr.job].append((tr.at, _EVENT[tr.kind], tr.reason))
        where = _placed(tr.reason) if placing and tr.kind == "admitted" else None
        if where is not None:
            events[tr.job].append((tr.at, "placed", where))
    for p in result.preemptions:
        if p.preemptor in events:
            names = [job for job, *_ in p.victims]
            listed = ", ".join(names[:5]) + (
                f" and {len(names) - 5} more" if len(names) > 5 else ""
            )
            events[p.preemptor].append(
                (p.at, "preempting", f"{len(names)} workload(s) evicted to make room: {listed}")
            )
    reasons = _Reasons()
    out: list[dict[str, Any]] = []
    for j in chosen:
        steps = sorted(events[j.key], key=lambda e: e[0])  # stable: a cycle's order stays
        if j.last_pending_reason and j.waited > 0:
            _add_wait(steps, j.last_pending_reason, j.waited, j.admitted_at is None, result.end)
        out.append(
            {
                "name": j.key,
                "queue": j.local_queue,
                "clusterQueue": j.cluster_queue,
                "priority": j.priority,
                "evictions": j.evictions,
                "events": [[round(at, 3), kind, reasons(text)] for at, kind, text in steps],
            }
        )
    return {
        "total": len(result.jobs),
        "recorded": bool(result.transitions) or not result.jobs,
        "reasons": list(reasons.index),
        "list": out,
    }


def page_data(result: SimResult, stats: PlacementStats | None) -> dict[str, Any]:
    """All the page draws, in one document."""
    scale, unit = time_unit(result)
    starts, usage = _usage(result, scale)
    return {
        "timeUnit": unit,
        "timeScale": scale,
        "end": round(result.end / scale, 4),
        "starts": starts,
        "usage": usage,
        "waits": _waits(result),
        "nodes": _nodes(stats, scale),
        "levels": _levels(stats, scale),
        "workloads": _workloads(result, stats is not None),
    }


def embed(data: dict[str, Any]) -> str:
    """JSON safe inside a <script> element: no "</" can end it early."""
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
