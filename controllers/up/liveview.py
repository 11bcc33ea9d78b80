"""The live view of `muster up`: queues with usage against fair share, the workloads that
wait and why, and the last decisions (admitted, placed, preempted, scaled, finished).

It reads what an operator can read: the ClusterQueues' and Workloads' status from the
apiserver (`kubectl muster queues` draws the same tree) and the decisions from the history
store the controller writes. On a terminal it redraws in place; elsewhere (a log, a test)
it prints each new decision once, as a line, and the queues now and then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from controllers.history.queries import TimelineEntry, recent_timeline
from controllers.plugin.explain import state_of
from controllers.runtime.resources import CLUSTER_QUEUE, LOCAL_QUEUE, WORKLOAD, Kube, Obj
from quota.api.quantity import QuantityError, format_quantity, parse_quantity
from quota.model.nodewords import pods_on_nodes

_WORDS = {
    "created": "queued",
    "quota_reserved": "reserved quota for",
    "admitted": "admitted",
    "evicted": "evicted",
    "preempted": "preempted",
    "reclaimed": "reclaimed (preempted)",
    "requeued": "requeued",
    "slice_replaced": "resized (new slice)",
    "finished": "finished",
    "placed": "placed",
    "unplaceable": "could not place",
    "preempting": "preempts for",
    "reclaiming": "reclaims for",
    "consolidating": "moves workloads for",
}
# Decisions worth a line; "created" and "quota_reserved" would drown them.
_SHOWN = frozenset(_WORDS) - {"created", "quota_reserved"}


def decision_line(entry: TimelineEntry) -> str:
    """One decision as a person reads it, with its time and the engine's reason."""
    at = entry.at.astimezone(UTC).strftime("%H:%M:%S")
    what = f"{at}  {_WORDS.get(entry.event, entry.event)} {entry.namespace}/{entry.name}"
    if entry.event == "placed":
        nodes = entry.detail.get("nodes") or {}
        what += " on " + pods_on_nodes(sorted(nodes.items()))
    elif entry.event in {"preempting", "reclaiming", "consolidating"}:
        what += f": {entry.detail.get('victims')}"
    elif entry.flavors and entry.event == "admitted":
        what += " on " + ", ".join(sorted(set(entry.flavors.values())))
    if entry.reason and entry.event not in {"admitted", "placed", "finished"}:
        what += f" — {entry.reason}"
    return what


@dataclass
class Picture:
    """What one refresh read."""

    cluster_queues: list[Obj] = field(default_factory=list)
    local_queues: list[Obj] = field(default_factory=list)
    workloads: list[Obj] = field(default_factory=list)
    decisions: list[TimelineEntry] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class LiveView:
    """Reads the cluster and the history store; renders what it read."""

    def __init__(self, kube: Kube, engine: Engine, since: datetime, title: str) -> None:
        self._kube = kube
        self._engine = engine
        self._since = since
        self._title = title
        self.activity: deque[str] = deque(maxlen=200)  # the player's lines, newest last
        self._printed: set[tuple[str, str, str, str]] = set()

    def read(self) -> Picture:
        picture = Picture()
        try:
            picture.cluster_queues, _ = self._kube.list(CLUSTER_QUEUE, None)
            picture.local_queues, _ = self._kube.list(LOCAL_QUEUE, None)
            picture.workloads, _ = self._kube.list(WORKLOAD, None)
        except Exception as error:  # the apiserver restarting: show it, try again
            picture.problems.append(f"cannot read the cluster: {error}")
        try:
            picture.decisions = [
                e for e in recent_timeline(self._engine, self._since) if e.event in _SHOWN
            ]
        except SQLAlchemyError as error:
            # The controller creates the store's tables when it starts; until then, nothing.
            picture.problems.append(f"history store not readable yet: {type(error).__name__}")
        return picture

    def new_lines(self, picture: Picture) -> list[str]:
        """Decisions not printed before, oldest first (for output that is not a terminal)."""
        lines: list[str] = []
        for entry in picture.decisions:
            key = (entry.at.isoformat(), entry.event, entry.namespace, entry.name)
            if key not in self._printed:
                self._printed.add(key)
                lines.append(decision_line(entry))
        return lines

    def render(self, picture: Picture, footer: str) -> RenderableType:
        parts: list[RenderableType] = [
            queue_table(picture.cluster_queues),
            _pending_table(picture.workloads),
            _decisions_table(picture.decisions[-12:], list(self.activity)[-4:]),
        ]
        parts += [Text(p, style="yellow") for p in picture.problems]
        parts.append(Text(footer, style="dim"))
        return Panel(Group(*parts), title=self._title, border_style="blue")


def _main_resource(quota: Mapping[str, Any], used: Mapping[str, Any]) -> str:
    """What a flavor is about: its GPUs when it has any, else cpu."""
    gpus = sorted(r for r in {*quota, *used} if "gpu" in r)
    return gpus[0] if gpus else "cpu"


def _amount(value: Any, resource: str) -> str:
    try:
        return format_quantity(parse_quantity(value, resource), resource)
    except QuantityError:
        return "?"


def queue_table(cluster_queues: list[Obj]) -> Table:
    """One row per ClusterQueue, children under their parent: per flavor, its main resource
    (GPUs, else cpu) used / quota, and the fair share the last cycle computed. Compact, so
    that the view fits a terminal; `kubectl muster queues` shows every resource."""
    table = Table(title="Queues", title_justify="left", expand=True, show_edge=False)
    table.add_column("ClusterQueue", no_wrap=True)
    table.add_column("Admitted", justify="right")
    table.add_column("Pending", justify="right")
    table.add_column("Used / quota (fair share), per flavor", ratio=1)
    by_name = {str(cq["metadata"]["name"]): cq for cq in cluster_queues}
    children: dict[str | None, list[str]] = {}
    for name, cq in sorted(by_name.items()):
        parent = (cq.get("spec") or {}).get("parent")
        children.setdefault(parent if parent in by_name else None, []).append(name)
    seen: set[str] = set()

    def add(name: str, depth: int) -> None:
        if name in seen:
            return
        seen.add(name)
        cq = by_name[name]
        status = cq.get("status") or {}
        usage, share = status.get("usage") or {}, status.get("fairShare") or {}
        cells = []
        for entry in (cq.get("spec") or {}).get("flavors") or []:
            flavor = str(entry.get("name"))
            quota, used = entry.get("quota") or {}, usage.get(flavor) or {}
            resource = _main_resource(quota, used)
            in_use = _amount(used.get(resource, 0), resource)
            text = f"{flavor} {resource.rsplit('/', 1)[-1]} {in_use}/"
            text += _amount(quota.get(resource, 0), resource)
            fair = (share.get(flavor) or {}).get(resource)
            if fair is not None:
                text += f" ({_amount(fair, resource)})"
            cells.append(text)
        pending = int(status.get("pendingWorkloads") or 0)
        table.add_row(
            "  " * depth + name,
            str(int(status.get("admittedWorkloads") or 0)),
            Text(str(pending), style="magenta" if pending else ""),
            " · ".join(cells),
        )
        for child in children.get(name, []):
            add(child, depth + 1)

    for root in children.get(None, []):
        add(root, 0)
    return table


def _pending_table(workloads: list[Obj], shown: int = 8) -> Table:
    table = Table(title="Waiting", title_justify="left", expand=True, show_edge=False)
    table.add_column("Workload", no_wrap=True)
    table.add_column("Queue", no_wrap=True)
    table.add_column("Why it waits", ratio=1)
    waiting = []
    for wl in workloads:
        state, reason = state_of(wl)
        if state in {"admitted", "finished"}:
            continue
        meta: Mapping[str, Any] = wl.get("metadata") or {}
        queue = str((wl.get("spec") or {}).get("queueName") or "")
        waiting.append((str(meta.get("creationTimestamp") or ""), meta, queue, state, reason))
    for _, meta, queue, state, reason in sorted(waiting, key=lambda w: w[0])[:shown]:
        table.add_row(f"{meta.get('namespace')}/{meta.get('name')}", queue, f"{state}: {reason}")
    if len(waiting) > shown:
        table.add_row("", "", f"and {len(waiting) - shown} more (kubectl get workloads -A)")
    if not waiting:
        table.add_row("-", "", "nothing waits")
    return table


def _decisions_table(decisions: list[TimelineEntry], activity: list[str]) -> Table:
    table = Table(title="Last decisions", title_justify="left", expand=True, show_edge=False)
    table.add_column("What happened", ratio=1)
    for entry in decisions:
        style = "red" if entry.event in {"preempted", "reclaimed", "evicted"} else ""
        table.add_row(Text(decision_line(entry), style=style))
    for line in activity:
        table.add_row(Text(line, style="dim"))
    if not decisions and not activity:
        table.add_row("none yet")
    return table
