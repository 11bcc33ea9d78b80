"""The html report of a simulation run: tables, usage against fair share, waits, nodes."""

from __future__ import annotations

import html

from controllers.simreport.table import QUOTA_ONLY
from controllers.simreport.units import in_unit, percent, short, unit_of
from quota.simulation.report import (
    NodeTimeline,
    PlacementStats,
    QueueStats,
    Series,
    flavor_stats,
    format_seconds,
    key_name,
    percentile,
    placement_stats,
    queue_stats,
    timeline,
)
from quota.simulation.simulator import SimResult

# Points per plotted series, and node rows per heat map: the page stays small however long
# the run or large the cluster (plotly.js itself is most of its size).
MAX_POINTS = 240
MAX_HEAT_ROWS = 160

_SORT_SCRIPT = """
document.querySelectorAll("table.sortable th").forEach((th, col) => {
  th.style.cursor = "pointer";
  th.addEventListener("click", () => {
    const body = th.closest("table").tBodies[0];
    const up = th.dataset.dir !== "up";
    th.dataset.dir = up ? "up" : "down";
    const key = (row) => {
      const cell = row.cells[col];
      const v = cell.dataset.sort ?? cell.textContent;
      const n = parseFloat(v);
      return isNaN(n) ? v : n;
    };
    [...body.rows].sort((a, b) => {
      const x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
    }).forEach((row) => body.appendChild(row));
  });
});
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0 0.3em; font-size: 0.92em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.8em; text-align: right; }
th { background: #f4f4f4; position: sticky; top: 0; }
td:first-child, th:first-child { text-align: left; }
tr.parent td { font-weight: 600; }
p.note { color: #555; font-size: 0.88em; margin: 0 0 1.5em; }
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


def _downsample(series: Series, edges: list[tuple[float, float]]) -> tuple[list[float], ...]:
    """At most MAX_POINTS time-weighted points of a series (bucket widths from `edges`)."""
    step = max(1, -(-len(edges) // MAX_POINTS))
    times: list[float] = []
    usage: list[float] = []
    fair: list[float] = []
    for i in range(0, len(edges), step):
        group = range(i, min(i + step, len(edges)))
        widths = [edges[j][1] - edges[j][0] for j in group]
        total = sum(widths) or 1.0
        times.append(edges[group[0]][0])
        usage.append(sum(series.usage[j] * w for j, w in zip(group, widths, strict=True)) / total)
        fair.append(
            sum(series.fair_share[j] * w for j, w in zip(group, widths, strict=True)) / total
        )
    return times, usage, fair


def _usage_figure(result: SimResult, scale: float, unit: str) -> object:
    import plotly.graph_objects as go  # type: ignore[import-untyped]

    series = timeline(result)
    edges = [(b.start, b.end) for b in result.timeline]
    fig = go.Figure()
    queues = list(dict.fromkeys(s.queue for s in series))
    owner: list[str] = []
    axis: dict[str, str] = {}
    for s in series:
        divisor, what = unit_of(s.key[1])
        axis.setdefault(s.queue, f"{short(s.key[1])} ({what})")
        times, usage, fair = _downsample(s, edges)
        x = [round(t / scale, 4) for t in times]
        label = key_name(s.key)
        for name, values, dash in (("usage", usage, None), ("fair share", fair, "dash")):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[round(v / divisor, 3) for v in values],
                    name=f"{name} {label}",
                    mode="lines",
                    line={"dash": dash} if dash else {},
                    line_shape="hv",
                )
            )
            owner.append(s.queue)
    buttons = [
        {
            "label": queue,
            "method": "update",
            "args": [
                {"visible": [o == queue for o in owner]},
                {
                    "title": f"Queue {queue}: usage against fair share",
                    "yaxis": {"title": {"text": axis[queue]}, "rangemode": "tozero"},
                },
            ],
        }
        for queue in queues
    ]
    for i, trace in enumerate(fig.data):
        trace.visible = bool(queues) and owner[i] == queues[0]
    fig.update_layout(
        title=f"Queue {queues[0]}: usage against fair share" if queues else "No queues",
        xaxis_title=f"simulated time ({unit})",
        yaxis={"title": {"text": axis[queues[0]] if queues else ""}, "rangemode": "tozero"},
        updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.0, "y": 1.15}]
        if buttons
        else [],
        height=480,
    )
    return fig


def _wait_figure(result: SimResult) -> object:
    import plotly.graph_objects as go

    fig = go.Figure()
    for q in queue_stats(result):
        if q.leaf and q.waits:
            # Quartiles, not every wait: the page stays small with 100,000 workloads.
            fig.add_trace(
                go.Box(
                    name=q.name,
                    q1=[percentile(q.waits, 25)],
                    median=[percentile(q.waits, 50)],
                    q3=[percentile(q.waits, 75)],
                    lowerfence=[min(q.waits)],
                    upperfence=[max(q.waits)],
                    boxpoints=False,
                )
            )
    fig.update_layout(
        title="Wait time per queue (seconds pending before the last admission; "
        "whiskers at the shortest and longest)",
        yaxis_title="seconds",
        height=480,
        showlegend=False,
    )
    return fig


def _heat_rows(t: NodeTimeline) -> tuple[list[str], list[list[float]]]:
    """Node rows of the heat map; past MAX_HEAT_ROWS nodes, neighbours share a row."""
    per = max(1, -(-len(t.nodes) // MAX_HEAT_ROWS))
    names: list[str] = []
    rows: list[list[float]] = []
    for i in range(0, len(t.nodes), per):
        group = range(i, min(i + per, len(t.nodes)))
        first, last = t.nodes[group[0]], t.nodes[group[-1]]
        names.append(first if len(group) == 1 else f"{first} \u2026 {last} (avg)")
        rows.append(
            [
                round(sum(t.used[j][b] for j in group) / len(group), 2)
                for b in range(len(t.used[group[0]]))
            ]
        )
    return names, rows


def _node_figures(t: NodeTimeline, scale: float, unit: str) -> list[object]:
    import plotly.graph_objects as go

    divisor, what = unit_of(t.resource)
    x = [round(v / scale, 4) for v in t.times]
    names, rows = _heat_rows(t)
    heat = go.Figure(
        go.Heatmap(
            z=[[round(v / divisor, 2) for v in row] for row in rows],
            x=x,
            y=names,
            zmin=0,
            zmax=max(t.allocatable) / divisor,
            colorscale="Viridis",
            colorbar={"title": {"text": f"{short(t.resource)} in use ({what})"}},
            hovertemplate="%{y}<br>%{x}<br>%{z} in use<extra></extra>",
        )
    )
    heat.update_layout(
        title=f"{t.resource} in use per node over time",
        xaxis_title=f"simulated time ({unit})",
        yaxis={"title": {"text": "node"}, "autorange": "reversed", "type": "category"},
        height=max(320, min(1000, 120 + 14 * len(names))),
    )
    frag = go.Figure()
    for name, values in (
        ("free on partly used nodes", t.partial_free),
        ("free on empty nodes", t.whole_free),
    ):
        frag.add_trace(
            go.Scatter(
                x=x,
                y=[round(v / divisor, 3) for v in values],
                name=name,
                mode="lines",
                stackgroup="free",
                line_shape="hv",
            )
        )
    frag.update_layout(
        title=f"Free {t.resource}: fragments on partly used nodes against whole free nodes",
        xaxis_title=f"simulated time ({unit})",
        yaxis_title=f"{short(t.resource)} free ({what})",
        height=420,
    )
    return [heat, frag]


def render_html(result: SimResult) -> str:
    """One self-contained page: summary tables, usage against fair share per queue, wait
    times, and with nodes, per-node use and fragmentation over time."""
    scale, unit = _time_unit(result)
    stats = placement_stats(result)
    figures = [_usage_figure(result, scale, unit), _wait_figure(result)]
    if stats is not None:
        for t in stats.timelines:
            figures.extend(_node_figures(t, scale, unit))
    plots = "".join(
        fig.to_html(  # type: ignore[attr-defined]
            full_html=False, include_plotlyjs="inline" if i == 0 else False
        )
        for i, fig in enumerate(figures)
    )
    unfinished = sum(1 for j in result.jobs if j.finished_at is None)
    tail = "" if result.finished_all else f" ({unfinished:,} workloads had not finished)"
    summary = (
        f"{len(result.jobs):,} workloads; makespan {format_seconds(result.makespan)}{tail}; "
        f"{result.cycles:,} admission cycles, {result.evictions:,} evictions. "
        + (QUOTA_ONLY + "." if stats is None else f"Pods placed on {stats.nodes:,} nodes.")
    )
    name = html.escape(result.settings.name)
    body = [
        f"<h1>Simulation of {name} (seed {result.seed})</h1>",
        f"<p>{html.escape(summary)}</p>",
        "<h2>Queues</h2>",
        _queues_html(result),
        "<h2>Cluster</h2>",
        _cluster_html(result),
    ]
    if stats is not None and stats.timelines:
        body += ["<h2>Nodes</h2>", _nodes_html(stats)]
    body += ["<h2>Over time</h2>", plots]
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>muster simulate: {name}</title><style>{_STYLE}</style></head><body>"
        + "".join(body)
        + f"<script>{_SORT_SCRIPT}</script></body></html>"
    )


def _time_unit(result: SimResult) -> tuple[float, str]:
    if result.end >= 3 * 3600:
        return 3600.0, "hours"
    if result.end >= 3 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


# -------------------------------------------------------------------------- command
