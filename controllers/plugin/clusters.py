"""`kubectl muster clusters`: the worker clusters this (management) cluster dispatches to,
one row each: whether it answers and since when it has not, its Ready nodes, used / capacity
of cpu, memory and every extended resource, how many workloads were sent there, and the
ClusterQueues whose `spec.dispatch.clusterSelector` selects it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from quota.api.meta import LabelSelector
from quota.api.quantity import QuantityError, format_quantity, parse_quantity

# Shown first, in this order; the extended resources (nvidia.com/gpu, ...) follow by name.
FIRST = ("cpu", "memory")
# The Active condition's reasons, as a colour: answering, not lately, given up on or misread.
_STYLE = {"Connected": "green", "Unreachable": "yellow"}

NO_WORKERS = (
    "no WorkerClusters in this cluster: its ClusterQueues run their workloads here "
    "(a WorkerCluster and a queue's spec.dispatch send them to another cluster)"
)


def _extended(resource: str) -> bool:
    """An extended resource as Kubernetes defines one: a domain-prefixed name outside
    kubernetes.io (nvidia.com/gpu, example.com/fpga), not a quota's `requests.` name."""
    if "/" not in resource or resource.startswith("requests."):
        return False
    domain = resource.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def resources_of(workers: Sequence[Mapping[str, Any]]) -> list[str]:
    """The resource columns: cpu and memory always, then every extended resource any worker
    has capacity or usage of (pods, ephemeral-storage and hugepages are left out)."""
    seen: set[str] = set()
    for worker in workers:
        status = worker.get("status") or {}
        for key in ("capacity", "usage"):
            seen.update(str(r) for r in status.get(key) or {})
    return list(FIRST) + sorted(r for r in seen if _extended(r))


def _amount(value: Any, resource: str) -> int | None:
    try:
        return parse_quantity(value, resource)
    except QuantityError:
        return None


def used_of_capacity(status: Mapping[str, Any], resource: str) -> str:
    """`used/capacity` in Kubernetes' units ("3/8", "100Gi/1Ti", "1500m/4"); "-" when the
    worker reports neither, "?" for an amount that is not a quantity."""
    capacity = status.get("capacity") or {}
    usage = status.get("usage") or {}
    if resource not in capacity and resource not in usage:
        return "-"

    def show(values: Mapping[str, Any]) -> str:
        amount = _amount(values.get(resource, 0), resource)
        return "?" if amount is None else format_quantity(amount, resource)

    return f"{show(usage)}/{show(capacity)}"


def human_age(seconds: float) -> str:
    """A duration as kubectl prints ages (its duration.HumanDuration): 45s, 3m20s, 25m,
    5h10m, 2d3h, 400d."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        return f"{hours // 24 // 365}y{rest}d" if rest else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def last_seen(status: Mapping[str, Any], now: datetime) -> str:
    """How long ago the worker last answered ("12s ago"), or "never"."""
    raw = status.get("lastSeen")
    if not raw:
        return "never"
    try:
        seen = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return f"? ({raw})"
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=UTC)
    return f"{human_age((now - seen).total_seconds())} ago"


def active(status: Mapping[str, Any]) -> Text:
    """The Active condition as `True (Connected)`, `False (Lost)`; coloured by how bad."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Active":
            state, reason = str(cond.get("status") or "Unknown"), str(cond.get("reason") or "")
            words = f"{state} ({reason})" if reason else state
            style = "green" if state == "True" else _STYLE.get(reason, "red")
            return Text(words, style=style)
    return Text("Unknown (not seen yet)", style="yellow")


@dataclass(frozen=True)
class Dispatchers:
    """Which ClusterQueues dispatch to a worker, from their `spec.dispatch.clusterSelector`
    (None: the ClusterQueues could not be read)."""

    selectors: list[tuple[str, LabelSelector]] | None
    # ClusterQueues whose selector the model refuses: named, never silently dropped.
    unreadable: list[str]

    @classmethod
    def of(cls, cluster_queues: Sequence[Mapping[str, Any]] | None) -> Dispatchers:
        if cluster_queues is None:
            return cls(None, [])
        selectors: list[tuple[str, LabelSelector]] = []
        unreadable: list[str] = []
        for cq in sorted(cluster_queues, key=lambda o: str(o["metadata"]["name"])):
            name = str(cq["metadata"]["name"])
            dispatch = (cq.get("spec") or {}).get("dispatch")
            if dispatch is None:
                continue  # runs its workloads in this cluster
            try:
                selector = LabelSelector.model_validate(dispatch.get("clusterSelector") or {})
            except (ValidationError, AttributeError):
                unreadable.append(name)
                continue
            selectors.append((name, selector))
        return cls(selectors, unreadable)

    def of_worker(self, worker: Mapping[str, Any]) -> str:
        if self.selectors is None:
            return "?"
        labels = {
            str(k): str(v) for k, v in ((worker.get("metadata") or {}).get("labels") or {}).items()
        }
        names = [name for name, selector in self.selectors if selector.matches(labels)]
        return ", ".join(names) or "-"


def clusters_table(
    workers: Sequence[Mapping[str, Any]], dispatchers: Dispatchers, now: datetime
) -> Table:
    """One row per WorkerCluster, by name."""
    resources = resources_of(workers)
    table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    for column in ("NAME", "ACTIVE", "LAST SEEN", "NODES"):
        table.add_column(column, no_wrap=True)
    for resource in resources:
        table.add_column(resource.upper() if resource in FIRST else resource, no_wrap=True)
    table.add_column("DISPATCHED", justify="right", no_wrap=True)
    table.add_column("CLUSTERQUEUES")
    for worker in sorted(workers, key=lambda o: str(o["metadata"]["name"])):
        status = worker.get("status") or {}
        table.add_row(
            Text(str(worker["metadata"]["name"]), style="bold"),
            active(status),
            last_seen(status, now),
            str(int(status.get("nodes") or 0)),
            *(used_of_capacity(status, r) for r in resources),
            str(int(status.get("dispatched") or 0)),
            dispatchers.of_worker(worker),
        )
    return table


def notes(dispatchers: Dispatchers) -> list[str]:
    """What the table could not say, one line each."""
    if dispatchers.selectors is None:
        return [
            "CLUSTERQUEUES: not shown (?), ClusterQueues are not readable with your rights "
            "(the chart's queue-reader role reads them)"
        ]
    return [
        f"ClusterQueue {name}: its spec.dispatch.clusterSelector is not a valid label "
        "selector; it selects no worker here"
        for name in dispatchers.unreadable
    ]
