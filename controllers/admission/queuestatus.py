"""ClusterQueue and LocalQueue status, and the ClusterQueue deletion guard.

After every admission cycle the loop hands this module what the cycle saw: usage, fair
share, pending and admitted counts, and the Active state from the queue-tree check. The
desired status of each queue goes through a coalescing writer, so a burst of admissions
costs one status write per queue per interval, and a queue whose status did not change
costs none.

ClusterQueues carry the finalizer `muster.dev/resource-in-use` while they exist; a queue
being deleted keeps it, and admits nothing, until no workload holds quota in it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controllers.runtime import apply
from controllers.runtime.coalesce import CoalescingWriter
from controllers.runtime.resources import CLUSTER_QUEUE, LOCAL_QUEUE, Kind, Obj
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.clusterqueue import ClusterQueueSpec, usage_summary
from quota.api.conditions import ClusterQueueConditions
from quota.api.names import QUEUE_FINALIZER
from quota.api.quantity import format_quantity
from quota.model.queues import admitted_to
from quota.model.resources import FlavorResource

log = logging.getLogger(__name__)

ACTIVE = ClusterQueueConditions.ACTIVE


@dataclass(frozen=True)
class QueueStatus:
    """What one queue's status should say (quantities in base units)."""

    pending: int
    admitted: int
    usage: Mapping[FlavorResource, int]
    active: bool
    reason: str
    message: str
    fair_share: Mapping[FlavorResource, int] | None = None  # ClusterQueues only
    quota: Mapping[FlavorResource, int] | None = None  # ClusterQueues only
    spec: ClusterQueueSpec | None = None  # for the usage summary


def by_flavor(vector: Mapping[FlavorResource, int]) -> dict[str, dict[str, str]]:
    """{(flavor, resource): amount} as the status writes it: {flavor: {resource: "qty"}}."""
    out: dict[str, dict[str, str]] = {}
    for (flavor, resource), amount in sorted(vector.items()):
        if amount:
            out.setdefault(flavor, {})[resource] = format_quantity(amount, resource)
    return out


def status_fields(desired: QueueStatus) -> dict[str, Any]:
    """The status fields (other than conditions) for a queue."""
    fields: dict[str, Any] = {
        "pendingWorkloads": desired.pending,
        "admittedWorkloads": desired.admitted,
        "usage": by_flavor(desired.usage),
    }
    if desired.quota is not None:
        borrowed = {
            key: amount - desired.quota.get(key, 0)
            for key, amount in desired.usage.items()
            if amount > desired.quota.get(key, 0)
        }
        fields["borrowed"] = by_flavor(borrowed)
        fields["fairShare"] = by_flavor(desired.fair_share or {})
        if desired.spec is not None:
            nested: dict[str, dict[str, int]] = {}
            for (flavor, resource), amount in desired.usage.items():
                nested.setdefault(flavor, {})[resource] = amount
            fields["usageSummary"] = usage_summary(desired.spec, nested)[:1024]
    return fields


def apply_status(obj: Obj, desired: QueueStatus, now: Any) -> bool:
    """Mutation: make the object's status say `desired`; False if it already does."""
    status = wls.status_of(obj)
    changed = False
    for key, value in status_fields(desired).items():
        if status.get(key) != value:
            status[key] = value
            changed = True
    changed |= wls.set_condition(
        obj,
        ACTIVE,
        "True" if desired.active else "False",
        desired.reason,
        desired.message,
        now,
    )
    return changed


class QueueStatusPublisher:
    """Coalesced status writes for ClusterQueues and LocalQueues."""

    def __init__(
        self, ctx: Context, *, interval: float = 1.0, max_interval: float | None = None
    ) -> None:
        self.ctx = ctx
        self.writer: CoalescingWriter[tuple[str, str]] = CoalescingWriter(
            "queue-status", self._write, interval=interval, max_interval=max_interval
        )

    def submit_cluster_queue(self, name: str, desired: QueueStatus) -> None:
        self._submit("ClusterQueue", self.ctx.caches.cluster_queues.get(name), name, desired)

    def submit_local_queue(self, key: str, desired: QueueStatus) -> None:
        self._submit("LocalQueue", self.ctx.caches.local_queues.get(key), key, desired)

    def _submit(self, kind: str, current: Obj | None, key: str, desired: QueueStatus) -> None:
        """Queue the write of `desired`, unless the cached object already says it."""
        if current is not None and self._unchanged(current, desired):
            self.writer.discard((kind, key))
            return
        self.writer.submit((kind, key), desired)

    def _unchanged(self, current: Obj, desired: QueueStatus) -> bool:
        import copy

        probe = copy.deepcopy(
            {"metadata": current.get("metadata"), "status": current.get("status")}
        )
        return not apply_status(probe, desired, self.ctx.now())

    def _write(self, key: tuple[str, str], desired: QueueStatus) -> None:
        kind_name, name = key
        kind: Kind = CLUSTER_QUEUE if kind_name == "ClusterQueue" else LOCAL_QUEUE
        cache = (
            self.ctx.caches.cluster_queues
            if kind_name == "ClusterQueue"
            else self.ctx.caches.local_queues
        )
        if cache.get(name) is None:
            return
        now = self.ctx.now()
        apply.update(
            self.ctx.kube,
            kind,
            name,
            lambda obj: apply_status(obj, desired, now),
            cache=cache,
            status=True,
        )


def holding(ctx: Context) -> dict[str, int]:
    """Workloads holding quota per ClusterQueue (from the cache)."""
    counts: dict[str, int] = {}
    for wl in ctx.caches.workloads.objects():
        cq = admitted_to(wl) if wls.has_quota(wl) else None
        if cq is not None:
            counts[cq] = counts.get(cq, 0) + 1
    return counts


def reconcile_finalizers(ctx: Context) -> None:
    """Keep the finalizer on every ClusterQueue, and take it off a queue being deleted once
    no workload holds quota in it. (What holds quota is counted only when a queue is being
    deleted: it walks every Workload, and this runs every cycle.)"""
    in_use: Mapping[str, int] | None = None
    for cq in ctx.caches.cluster_queues.objects():
        meta = cq.get("metadata") or {}
        name = meta["name"]
        finalizers = list(meta.get("finalizers") or [])
        deleting = bool(meta.get("deletionTimestamp"))
        if not deleting and QUEUE_FINALIZER not in finalizers:
            want_present = True
        elif deleting and QUEUE_FINALIZER in finalizers:
            if in_use is None:
                in_use = holding(ctx)
            if in_use.get(name):
                continue
            want_present = False
        else:
            continue

        def mutate(obj: Obj, present: bool = want_present) -> bool:
            current = list((obj.get("metadata") or {}).get("finalizers") or [])
            if present and QUEUE_FINALIZER not in current:
                obj["metadata"]["finalizers"] = [*current, QUEUE_FINALIZER]
                return True
            if not present and QUEUE_FINALIZER in current:
                obj["metadata"]["finalizers"] = [f for f in current if f != QUEUE_FINALIZER]
                return True
            return False

        try:
            apply.update(ctx.kube, CLUSTER_QUEUE, name, mutate, cache=ctx.caches.cluster_queues)
            if not want_present:
                log.info("ClusterQueue drained; deletion may proceed", extra={"queue": name})
        except Exception as error:
            log.warning(
                "could not update the ClusterQueue finalizer",
                extra={"queue": name, "error": str(error)[:300]},
            )
