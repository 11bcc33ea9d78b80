"""Pods that single-pod preemption took from a workload (spec.disruptionMode Single).

The admission cycle shrinks the workload's admitted slice in place and names the pods it
took (`status.preemptedPods`: the ones in the preemptor's way on nodes; none named when it
decides on quota alone). Whoever runs its pods then deletes what the admission no longer
grants, named ones first (`excess`): an elastic Job's reconciler (`slices`), the owner-group
intake (`controllers.owners.intake`). Each goes as the scheduler's preemption makes a pod
go (`delete_marked`): the condition DisruptionTarget first, so a Job's `podFailurePolicy`
rule on it can ignore the loss, as for kube-scheduler's preemptions; then the deletion. The
owner makes a replacement, gated, which waits until a scale-up slice brings the workload
back to its size, so it is never restarted.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime

from controllers.runtime import apply
from controllers.runtime.resources import POD, Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.conditions import PodGroupConditions as PGC

# The DisruptionTarget reason of a pod Muster preempts (kube-scheduler's is
# PreemptionByScheduler).
PREEMPTION_BY_MUSTER = "PreemptionByMuster"


def was_shed(wl: Obj) -> bool:
    """Whether single-pod preemption shrank this admitted Workload (named pods or not)."""
    return "preemptedPods" in (wl.get("status") or {})


def preempted_names(wl: Obj) -> frozenset[str]:
    """The pods an admitted Workload lost to single-pod preemption (names)."""
    return frozenset((wl.get("status") or {}).get("preemptedPods") or ())


def excess(running: Sequence[Obj], allowed: int, names: Collection[str]) -> list[Obj]:
    """Which of a pod set's running (ungated) pods go when it holds more than `allowed`:
    those single-pod preemption named first (their room is promised to a preemptor), then
    unbound ones, then the newest, so that the fewest pods that serve are lost."""
    if len(running) <= allowed:
        return []

    def age(pod: Obj) -> tuple[str, str]:
        meta = pod.get("metadata") or {}
        return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")

    def rank(pod: Obj) -> tuple[bool, bool]:
        named = (pod.get("metadata") or {}).get("name") in names
        return not named, bool((pod.get("spec") or {}).get("nodeName"))

    return sorted(sorted(running, key=age, reverse=True), key=rank)[: len(running) - allowed]


def delete_marked(ctx: Context, pods: Iterable[Obj], why: str, now: datetime) -> int:
    """Delete `pods` (those not going already), each marked DisruptionTarget first;
    returns how many were deleted."""
    gone = 0
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue

        def mark(x: Obj) -> bool:
            return wls.set_condition(
                x, PGC.DISRUPTION_TARGET, "True", PREEMPTION_BY_MUSTER, why, now
            )

        apply.update(ctx.kube, POD, object_key(pod), mark, current=pod, status=True, attempts=1)
        apply.delete(ctx.kube, POD, pod)
        gone += 1
    return gone
