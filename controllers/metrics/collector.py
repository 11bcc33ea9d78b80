"""Gauges read from the caches at scrape time: what is pending, admitted and used per
ClusterQueue, the quota and fair share, the history store's backlog, leadership and the
informers' state.

Read at scrape time rather than set by the loops, so that every replica (a standby too)
serves the same figures from the same watch, and nothing can be left behind by a queue
that was deleted: a queue that is gone is simply not in the next scrape.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controllers.runtime.informer import Informer
from controllers.state import workloads as wls
from controllers.state.caches import Caches
from quota.api.conditions import WorkloadConditions
from quota.api.quantity import QuantityError, Unit, parse_quantity, unit_of
from quota.model.queues import cluster_queue_of
from quota.placement.topology import waiting_level

ACTIVE = "Active"


def amount(value: Any, resource: str) -> float | None:
    """A quantity as Prometheus shows it: cores for cpu, bytes, or a count; None if malformed."""
    try:
        base = parse_quantity(value, resource)
    except QuantityError:
        return None
    return base / 1000 if unit_of(resource) is Unit.MILLICORES else float(base)


def _is_active(cq: Mapping[str, Any] | None) -> bool:
    for cond in ((cq or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ACTIVE:
            return bool(cond.get("status") == "True")
    return False


def _per_flavor(
    gauge: GaugeMetricFamily, queue: str, nested: Any, *, zero_too: bool = True
) -> None:
    """Add {flavor: {resource: quantity}} of one queue to a gauge."""
    if not isinstance(nested, Mapping):
        return
    for flavor, resources in sorted(nested.items()):
        if not isinstance(resources, Mapping):
            continue
        for resource, quantity in sorted(resources.items()):
            value = amount(quantity, str(resource))
            if value is not None and (zero_too or value):
                gauge.add_metric([queue, str(flavor), str(resource)], value)


def _topology_wait(wl: Mapping[str, Any]) -> str | None:
    """The level no domain could hold a pending Workload at, from the reason the admission
    cycle wrote into its QuotaReserved condition; None when it waits for anything else."""
    condition = wls.condition(wl, WorkloadConditions.QUOTA_RESERVED) or {}
    if condition.get("reason") != WorkloadConditions.PENDING:
        return None
    return waiting_level(str(condition.get("message") or ""))


@dataclass
class Sources:
    """What the collector reads; each replica's Manager fills it in."""

    caches: Caches
    is_leader: Callable[[], bool]
    # (records waiting for the database, of which spooled on disk, database reachable)
    history: Callable[[], tuple[int, int, bool] | None] = lambda: None
    started: float = field(default_factory=time.time)


class StateCollector(Collector):
    """Yields the scrape-time gauges (see the module docstring)."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[GaugeMetricFamily]:
        caches = self.sources.caches
        yield from self._workloads(caches)
        yield from self._queues(caches.cluster_queues.objects())
        yield from self._process(caches.all())

    def _workloads(self, caches: Caches) -> Iterable[GaugeMetricFamily]:
        pending = GaugeMetricFamily(
            "muster_pending_workloads",
            "Workloads waiting for admission, per ClusterQueue and status: active (the queue "
            "is active and tries them every cycle) or inadmissible (the queue is missing or "
            "inactive).",
            labels=["cluster_queue", "status"],
        )
        admitted = GaugeMetricFamily(
            "muster_admitted_active_workloads",
            "Workloads holding quota (admitted and not finished), per ClusterQueue.",
            labels=["cluster_queue"],
        )
        topology = GaugeMetricFamily(
            "muster_topology_waiting_workloads",
            "Workloads waiting because no domain of their flavor's Topology can hold them, per "
            "ClusterQueue and the level asked for (as reasons name it: rack, block, node; "
            "topology when not even the whole topology has room).",
            labels=["cluster_queue", "level"],
        )
        queues = {cq["metadata"]["name"]: cq for cq in caches.cluster_queues.objects()}
        waiting: Counter[tuple[str, str]] = Counter()
        holding: Counter[str] = Counter()
        no_domain: Counter[tuple[str, str]] = Counter()
        for wl in caches.workloads.objects():
            if wls.is_finished(wl):
                continue
            cq = cluster_queue_of(wl, caches.local_queues.get) or ""
            if wls.has_quota(wl):
                holding[cq] += 1
            elif cq:
                status = "active" if _is_active(queues.get(cq)) else "inadmissible"
                waiting[(cq, status)] += 1
                level = _topology_wait(wl)
                if level is not None:
                    no_domain[(cq, level)] += 1
        for name in queues:
            for status in ("active", "inadmissible"):
                pending.add_metric([name, status], waiting.pop((name, status), 0))
            admitted.add_metric([name], holding.pop(name, 0))
        # Workloads of queues the cache does not hold (deleted, or not yet seen).
        for (name, status), count in sorted(waiting.items()):
            pending.add_metric([name, status], count)
        for name, count in sorted(holding.items()):
            admitted.add_metric([name], count)
        for (name, level), count in sorted(no_domain.items()):
            topology.add_metric([name, level], count)
        return (pending, admitted, topology)

    def _queues(self, cluster_queues: list[dict[str, Any]]) -> Iterable[GaugeMetricFamily]:
        labels = ["cluster_queue", "flavor", "resource"]
        usage = GaugeMetricFamily(
            "muster_cluster_queue_resource_usage",
            "Quota in use per ClusterQueue, flavor and resource (cores, bytes or a count); a "
            "parent queue reports its subtree.",
            labels=labels,
        )
        quota = GaugeMetricFamily(
            "muster_cluster_queue_nominal_quota",
            "Guaranteed quota per ClusterQueue, flavor and resource.",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            "muster_cluster_queue_resource_limit",
            "Hard limit per ClusterQueue, flavor and resource (only where one is set).",
            labels=labels,
        )
        share = GaugeMetricFamily(
            "muster_cluster_queue_fair_share",
            "What the queue is entitled to now per flavor and resource: its guarantee plus "
            "its share of what its siblings leave idle.",
            labels=labels,
        )
        borrowed = GaugeMetricFamily(
            "muster_cluster_queue_borrowing",
            "Usage beyond the guarantee per ClusterQueue, flavor and resource.",
            labels=labels,
        )
        active = GaugeMetricFamily(
            "muster_cluster_queue_status",
            "1 for the ClusterQueue's current status (active or inactive), 0 for the other.",
            labels=["cluster_queue", "status"],
        )
        for cq in sorted(cluster_queues, key=lambda o: str(o["metadata"]["name"])):
            name = str(cq["metadata"]["name"])
            status = cq.get("status") or {}
            _per_flavor(usage, name, status.get("usage"))
            _per_flavor(share, name, status.get("fairShare"))
            _per_flavor(borrowed, name, status.get("borrowed"))
            for entry in (cq.get("spec") or {}).get("flavors") or []:
                if isinstance(entry, Mapping) and entry.get("name"):
                    _per_flavor(quota, name, {entry["name"]: entry.get("quota") or {}})
                    _per_flavor(limit, name, {entry["name"]: entry.get("limit") or {}})
            is_active = _is_active(cq)
            active.add_metric([name, "active"], 1 if is_active else 0)
            active.add_metric([name, "inactive"], 0 if is_active else 1)
        return (usage, quota, limit, share, borrowed, active)

    def _process(self, informers: list[Informer]) -> Iterable[GaugeMetricFamily]:
        leader = GaugeMetricFamily(
            "muster_leader", "1 while this replica holds the leader Lease and acts, else 0."
        )
        leader.add_metric([], 1 if self.sources.is_leader() else 0)
        synced = GaugeMetricFamily(
            "muster_informer_synced",
            "1 once an informer has listed and is watching.",
            labels=["informer"],
        )
        lag = GaugeMetricFamily(
            "muster_informer_last_event_age_seconds",
            "Seconds since an informer last heard from the apiserver (an event, a bookmark "
            "or a relist); grows without bound when its watch is stuck.",
            labels=["informer"],
        )
        now = time.monotonic()
        for informer in informers:
            kind = informer.name
            synced.add_metric([kind], 1 if informer.synced else 0)
            heard = informer.last_heard
            if heard is not None:
                lag.add_metric([kind], now - heard)
        out = [leader, synced, lag]
        history = self.sources.history()
        if history is not None:
            backlog, spooled, up = history
            out.append(
                GaugeMetricFamily(
                    "muster_history_backlog",
                    "History records accepted but not yet in the database.",
                    value=backlog,
                )
            )
            out.append(
                GaugeMetricFamily(
                    "muster_history_spooled_records",
                    "History records waiting in spool files on local disk.",
                    value=spooled,
                )
            )
            out.append(
                GaugeMetricFamily(
                    "muster_history_database_up",
                    "1 if the last write reached the history database, else 0.",
                    value=1 if up else 0,
                )
            )
        return out
