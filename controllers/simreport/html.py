"""The html report of a simulation run: tables, usage against fair share, waits, nodes."""

from __future__ import annotations

import html

from controllers.simreport.pagedata import embed, page_data
from controllers.simreport.plots import SCRIPT
from controllers.simreport.table import QUOTA_ONLY
from controllers.simreport.units import in_unit, percent, unit_of
from quota.simulation.report import (
    LANDED_NOTE,
    LEVELS_NOTE,
    PlacementStats,
    QueueStats,
    flavor_stats,
    format_seconds,
    key_name,
    landed_columns,
    placement_stats,
    queue_keys,
    queue_stats,
)
from quota.simulation.results import SimResult

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0 0.3em; font-size: 0.92em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.8em; text-align: right; }
th { background: #f4f4f4; position: sticky; top: 0; }
td:first-child, th:first-child { text-align: left; }
tr.parent td { font-weight: 600; }
p.note { color: #555; font-size: 0.88em; margin: 0 0 1.5em; }
th[data-dir="up"]::after { content: " \\25B2"; }
th[data-dir="down"]::after { content: " \\25BC"; }
table.sortable th { cursor: pointer; }
table.timeline td, table.timeline th { text-align: left; vertical-align: top; }
table.timeline td:nth-child(3) { max-width: 60em; }
tr.ev-preempted td, tr.ev-reclaimed td, tr.ev-evicted td { color: #b35900; }
details.queue { margin: 0.4em 0; }
details.queue summary { cursor: pointer; font-weight: 600; }
div.grid { display: flex; flex-wrap: wrap; gap: 0.5em 1.5em; }
svg.chart, canvas.heat { display: block; margin: 0.5em 0; font-size: 11px; }
svg.chart text { fill: #333; }
svg.chart text.title { font-weight: 600; font-size: 12px; }
svg.chart line.grid { stroke: #e4e4e4; }
svg.chart line.cursor { stroke: #999; stroke-dasharray: 2 2; }
#tip { position: absolute; display: none; background: #fff; border: 1px solid #aaa;
  padding: 0.3em 0.5em; font-size: 0.85em; pointer-events: none; box-shadow: 1px 1px 4px #ccc; }
#filter { width: 18em; }
"""


def _cell(text: str, sort: float | str | None = None) -> str:
    attr = f" data-sort='{html.escape(str(sort))}'" if sort is not None else ""
    return f"<td{attr}>{html.escape(text)}</td>"


def _table(headers: list[str], rows: list[str], note: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    out = (
        f"<table class='sortable'><thead><tr>{head}</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
    return out + (f"<p class='note'>{html.escape(note)}</p>" if note else "")


def _usage_text(q: QueueStats) -> str:
    parts = []
    for key in q.headline:
        usage = in_unit(key[1], q.avg_usage.get(key, 0.0))
        fair = in_unit(key[1], q.avg_fair_share.get(key, 0.0))
        parts.append(f"{usage} / {fair} {key_name(key)}")
    return "; ".join(parts)


def _queues_html(result: SimResult) -> str:
    placing = result.nodes is not None
    headers = ["Queue", "Admitted", "Preempted", "Pending", "Wait p50", "p90", "max"]
    headers.append("Avg usage / fair share")
    if placing:
        headers += ["Waited for nodes", "Their wait for nodes"]
    rows = []
    for q in queue_stats(result):
        longest = max(q.waits) if q.waits else None
        cells = [
            _cell("\u2003" * q.depth + q.name, q.name),
            _cell(f"{q.admitted:,}", q.admitted),
            _cell(f"{q.preempted:,}", q.preempted),
            _cell(f"{q.pending:,}", q.pending),
            _cell(format_seconds(q.wait(50)), q.wait(50)),
            _cell(format_seconds(q.wait(90)), q.wait(90)),
            _cell(format_seconds(longest), longest),
            _cell(_usage_text(q)),
        ]
        if placing:
            total = sum(q.placement_waits)
            cells.append(_cell(f"{len(q.placement_waits):,}", len(q.placement_waits)))
            cells.append(_cell(format_seconds(total) if q.placement_waits else "-", total))
        css = "" if q.leaf else " class='parent'"
        rows.append(f"<tr{css}>{''.join(cells)}</tr>")
    note = (
        "Wait: time pending before the last admission (so far, if still pending). Usage and "
        "fair share: time-weighted averages; GPUs in devices, cpu in cores, memory in GiB. "
        "Parent queues (bold) cover their subtree."
    )
    if placing:
        note += (
            " Waited for nodes: workloads whose quota allowed them while no nodes could hold "
            "their pods yet, and the time they waited so."
        )
    return _table(headers, rows, note)


def _cluster_html(result: SimResult) -> str:
    rows = []
    for f in flavor_stats(result):
        util = f.utilisation
        rows.append(
            "<tr>"
            + _cell(f.key[0])
            + _cell(f.key[1])
            + _cell(in_unit(f.key[1], f.capacity), f.capacity)
            + _cell(in_unit(f.key[1], f.avg_usage), f.avg_usage)
            + _cell(percent(f), util)
            + "</tr>"
        )
    headers = ["Flavor", "Resource", "Capacity", "Avg in use", "Utilisation"]
    return _table(headers, rows)


def _nodes_html(stats: PlacementStats) -> str:
    rows = []
    for t in stats.timelines:
        rows.append(
            "<tr>"
            + _cell(t.resource)
            + _cell(f"{len(t.nodes):,}", len(t.nodes))
            + _cell(in_unit(t.resource, t.capacity), t.capacity)
            + _cell(in_unit(t.resource, t.avg_partial_free), t.avg_partial_free)
            + _cell(in_unit(t.resource, t.max_partial_free), t.max_partial_free)
            + _cell(in_unit(t.resource, t.avg_whole_free), t.avg_whole_free)
            + "</tr>"
        )
    headers = [
        "Resource",
        "Nodes",
        "Capacity",
        "Avg free on partly used nodes",
        "max",
        "Avg free on empty nodes",
    ]
    note = (
        "Partly used: nodes with some but not all of the resource in use, whose free room a "
        "gang of whole-node pods cannot use. Empty: nodes with none of it in use. "
        f"{stats.waited:,} workloads waited for nodes while quota allowed them, "
        f"{format_seconds(stats.wait_total)} in all."
    )
    return _table(headers, rows, note)


def _topology_html(stats: PlacementStats) -> str:
    """Fragmentation per level, and where each queue's gangs landed."""
    out = ""
    if stats.levels:
        rows = [
            "<tr>"
            + _cell(f.topology)
            + _cell(f.level)
            + _cell(f.resource)
            + _cell(f"{f.domains:,}", f.domains)
            + _cell(in_unit(f.resource, f.largest), f.largest)
            + _cell(in_unit(f.resource, f.avg_largest_free), f.avg_largest_free)
            + _cell(in_unit(f.resource, f.min_largest_free), f.min_largest_free)
            + "</tr>"
            for f in stats.levels
        ]
        headers = ["Topology", "Level", "Resource", "Domains", "Largest domain"]
        out += _table([*headers, "Avg largest free", "min"], rows, _sentence(LEVELS_NOTE))
    if stats.landed:
        levels = stats.landed_levels
        rows = [
            "<tr>"
            + _cell(q.queue)
            + _cell(f"{q.gangs:,}", q.gangs)
            + "".join(_cell(f"{q.by_level.get(lv, 0):,}", q.by_level.get(lv, 0)) for lv in levels)
            + "</tr>"
            for q in stats.landed
        ]
        out += _table(["Queue", "Gangs", *landed_columns(levels)], rows, _sentence(LANDED_NOTE))
    return out


def _sentence(note: str) -> str:
    return note[0].upper() + note[1:] + "."


def _resources_html(result: SimResult) -> str:
    """Every queue's average usage against its average fair share, one row per resource."""
    rows = []
    for q in queue_stats(result):
        for key in queue_keys(result.queues[q.name], result.capacity):
            usage = q.avg_usage.get(key, 0.0)
            fair = q.avg_fair_share.get(key, 0.0)
            ratio = usage / fair if fair else None
            _, unit = unit_of(key[1])
            rows.append(
                "<tr>"
                + _cell(q.name)
                + _cell(key[0])
                + _cell(key[1])
                + _cell(unit)
                + _cell(in_unit(key[1], usage), usage)
                + _cell(in_unit(key[1], fair), fair)
                + _cell("-" if ratio is None else f"{100 * ratio:.0f}%", ratio)
                + "</tr>"
            )
    headers = ["Queue", "Flavor", "Resource", "Unit", "Avg usage", "Avg fair share", "Of share"]
    note = (
        "Every flavor/resource each queue has quota or a limit for; time-weighted averages "
        "over the run. Of share: average usage as a share of the average fair share."
    )
    return _table(headers, rows, note)


def render_html(result: SimResult) -> str:
    """One self-contained page: summary tables, usage against fair share for every queue and
    resource, wait times, with nodes per-node use and fragmentation over time, and any one
    workload's timeline. Its data is embedded once as JSON; its script draws from it."""
    stats = placement_stats(result)
    unfinished = sum(1 for j in result.jobs if j.finished_at is None)
    tail = "" if result.finished_all else f" ({unfinished:,} workloads had not finished)"
    summary = (
        f"{len(result.jobs):,} workloads; makespan {format_seconds(result.makespan)}{tail}; "
        f"{result.cycles:,} admission cycles, {result.evictions:,} evictions. "
        + (QUOTA_ONLY + "." if stats is None else f"Pods placed on {stats.nodes:,} nodes.")
    )
    data = page_data(result, stats)
    workloads = data["workloads"]
    shown = len(workloads["list"])
    picked = (
        f"The {shown:,} most eventful of {workloads['total']:,} workloads (most evictions, "
        "then longest waits)."
        if shown < workloads["total"]
        else f"All {shown:,} workloads."
    )
    if not workloads["recorded"]:
        picked += " The run recorded no transitions, so there is nothing to show."
    name = html.escape(result.settings.name)
    body = [
        f"<h1>Simulation of {name} (seed {result.seed})</h1>",
        f"<p>{html.escape(summary)}</p>",
        "<h2>Queues</h2>",
        _queues_html(result),
        "<h2>Usage against fair share, per resource</h2>",
        _resources_html(result),
        "<h2>Cluster</h2>",
        _cluster_html(result),
    ]
    if stats is not None and stats.timelines:
        body += ["<h2>Nodes</h2>", _nodes_html(stats), "<div id='nodes'></div>"]
    if stats is not None and (stats.levels or stats.landed):
        body += ["<h2>Topology</h2>", _topology_html(stats), "<div id='levels'></div>"]
    body += [
        "<h2>Usage against fair share over time</h2>",
        "<p class='note'>Solid: usage; dashed: fair share. One chart per flavor/resource of "
        "each queue; a parent queue covers its subtree.</p>",
        "<div id='usage'></div>",
        "<h2>Wait time per queue</h2>",
        "<p class='note'>Per leaf queue: a box from the 25th to the 75th percentile of its "
        "waits, the median marked, whiskers at the shortest and the longest.</p>",
        "<div id='waits'></div>",
        "<h2>One workload's timeline</h2>",
        f"<p class='note'>{html.escape(picked)} Submitted, admitted, placed, preempted or "
        "moved, requeued, finished, with the reasons the admission cycle gave.</p>",
        "<p><input id='filter' placeholder='filter by name or queue'> "
        "<select id='pick'></select></p>",
        "<div id='workload'></div>",
    ]
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>muster simulate: {name}</title><style>{_STYLE}</style></head><body>"
        + "".join(body)
        + "<div id='tip'></div>"
        + f"<script type='application/json' id='report-data'>{embed(data)}</script>"
        + f"<script>{SCRIPT}</script></body></html>"
    )
