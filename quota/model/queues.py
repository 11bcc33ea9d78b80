"""The queues of a snapshot, from the API's queue objects, and which of them a Workload counts in.

The controller (from its watch caches), `muster fairshare` / `muster admit` (from a cluster
file) and the simulator (from a scenario) all assemble their queues here and place their
Workloads by `cluster_queue_of`, so that a queue tree and a Workload mean the same thing to
each of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from quota.api.clusterqueue import DEFAULT_WAIT_BEFORE_EVICTING, ClusterQueue
from quota.api.conditions import ClusterQueueConditions
from quota.api.queuetree import QueueTree
from quota.model.snapshot import FlavorQuota, QueueSpec

# A LocalQueue manifest by "namespace/name" (a watch cache's `get`, a dict's `get`); None
# when there is no such LocalQueue.
LocalQueues = Callable[[str], Mapping[str, Any] | None]

# Queues the tree check cannot place in the tree: detached, so that the rest stays a tree.
_DETACHED = (ClusterQueueConditions.PARENT_NOT_FOUND, ClusterQueueConditions.CYCLE)


def admitted_to(workload: Mapping[str, Any]) -> str | None:
    """The ClusterQueue an admitted Workload's quota is charged to (`status.admission`), while
    it holds it: running, being evicted, or finished; None when it is not admitted."""
    admission = (workload.get("status") or {}).get("admission") or {}
    return str(admission["clusterQueue"]) if admission.get("clusterQueue") else None


def counts_in(admitted_to: str | None, local_queue_target: str | None) -> str | None:
    """The ClusterQueue a Workload counts in, from what it says of itself.

    An admitted Workload counts where it was admitted (`admitted_to`): its quota was reserved
    there and is released there, whatever its LocalQueue points at since. Any other Workload
    counts where its LocalQueue points now (`local_queue_target`, None when there is no such
    LocalQueue): pointing a LocalQueue elsewhere moves the work waiting in it.
    """
    return admitted_to if admitted_to is not None else local_queue_target


def cluster_queue_of(workload: Mapping[str, Any], local_queues: LocalQueues) -> str | None:
    """The ClusterQueue a Workload manifest counts in (`counts_in`); its LocalQueue is
    `spec.queueName` in its namespace."""
    name = (workload.get("spec") or {}).get("queueName")
    namespace = (workload.get("metadata") or {}).get("namespace") or "default"
    local_queue = local_queues(f"{namespace}/{name}") if name else None
    target = ((local_queue or {}).get("spec") or {}).get("clusterQueue")
    return counts_in(admitted_to(workload), str(target) if target else None)


def queue_spec(cq: ClusterQueue, active: bool = True, reason: str = "") -> QueueSpec:
    """A ClusterQueue as the engine sees it; `active`/`reason` come from the tree check."""
    spec = cq.spec
    preemption = spec.preemption
    preempt_min = preemption.preempt_min_runtime
    reclaim_min = preemption.reclaim_min_runtime
    wait = preemption.wait_before_evicting
    if wait is None:
        wait = DEFAULT_WAIT_BEFORE_EVICTING
    return QueueSpec(
        name=cq.name,
        parent=spec.parent,
        priority=spec.priority,
        over_quota_weight=float(spec.over_quota_weight),
        flavors=tuple(FlavorQuota(f.name, dict(f.quota), dict(f.limit)) for f in spec.flavors),
        queueing_strategy=spec.queueing_strategy,
        within_queue=preemption.within_queue,
        reclaim=preemption.reclaim,
        min_runtime_preempt_s=preempt_min.total_seconds() if preempt_min else 0.0,
        min_runtime_reclaim_s=reclaim_min.total_seconds() if reclaim_min else 0.0,
        wait_before_evicting_s=wait.total_seconds(),
        stop_policy=spec.stop_policy,
        placement=spec.placement_strategy,
        movable=spec.consolidation.movable,
        remote=spec.dispatch is not None,
        movable_below=spec.consolidation.below_priority,
        preemptible_below=preemption.preemptible_below_priority,
        active=active,
        inactive_reason="" if active else reason,
    )


def inherit_min_runtimes(
    queues: Mapping[str, QueueSpec], cluster_queues: Iterable[ClusterQueue]
) -> dict[str, QueueSpec]:
    """`queues` with each queue's minimum runtimes and wait before evicting taken from its
    nearest ancestor that sets one, where it sets none itself: protecting a department's
    workloads protects its teams' (a queue may still say `0s` to opt out). A wait before
    evicting no queue on the path sets is `DEFAULT_WAIT_BEFORE_EVICTING`."""
    own = {cq.name: cq.spec.preemption for cq in cluster_queues}
    out: dict[str, QueueSpec] = {}
    for name, spec in queues.items():
        preempt = own[name].preempt_min_runtime if name in own else None
        reclaim = own[name].reclaim_min_runtime if name in own else None
        wait = own[name].wait_before_evicting if name in own else None
        seen = {name}
        parent = spec.parent
        while (
            (preempt is None or reclaim is None or wait is None)
            and parent in own
            and parent not in seen
        ):
            seen.add(parent)
            if preempt is None:
                preempt = own[parent].preempt_min_runtime
            if reclaim is None:
                reclaim = own[parent].reclaim_min_runtime
            if wait is None:
                wait = own[parent].wait_before_evicting
            parent = queues[parent].parent if parent in queues else None
        if wait is None:
            wait = DEFAULT_WAIT_BEFORE_EVICTING
        out[name] = replace(
            spec,
            min_runtime_preempt_s=preempt.total_seconds() if preempt else 0.0,
            min_runtime_reclaim_s=reclaim.total_seconds() if reclaim else 0.0,
            wait_before_evicting_s=wait.total_seconds(),
        )
    return out


def queue_specs(
    cluster_queues: Iterable[ClusterQueue],
    tree: QueueTree,
    unreadable: Mapping[str, tuple[object, str]] | None = None,
) -> dict[str, QueueSpec]:
    """The snapshot's queues: every ClusterQueue, active or not as the tree check (`tree`)
    says, with minimum runtimes flowing down the tree.

    A queue whose parent is missing or loops is inactive anyway, and detached so that the rest
    stays a tree. A queue the model refused (`unreadable`: name -> (its parent as written,
    why)) admits nothing but still counts what it admitted, under its parent's limits.
    """
    listed = list(cluster_queues)
    queues: dict[str, QueueSpec] = {}
    for cq in listed:
        state = tree.cluster_queues[cq.name]
        spec = queue_spec(cq, state.active, state.message)
        queues[cq.name] = replace(spec, parent=None) if state.reason in _DETACHED else spec
    for name, (parent, why) in (unreadable or {}).items():
        up = parent if isinstance(parent, str) and parent in queues else None
        queues[name] = QueueSpec(name, up, active=False, inactive_reason=f"invalid: {why}")
    return inherit_min_runtimes(queues, listed)
