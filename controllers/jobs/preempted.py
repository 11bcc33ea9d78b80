"""Pods that single-pod preemption took from an elastic Job (spec.disruptionMode Single).

The admission cycle shrinks the Job's admitted slice in place and names the pods it took
(`status.preemptedPods`: the ones in the preemptor's way on nodes). Each goes as the
scheduler's preemption makes a pod go: the condition DisruptionTarget first (so a Job's
`podFailurePolicy` rule on it can ignore the loss, as for kube-scheduler's preemptions),
then the deletion. The Job controller makes a replacement, which the admission webhook
gates; it waits gated until a scale-up slice brings the Job back to its parallelism
(`slices.reconcile_elastic`), so the Job is never restarted.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime

from controllers.jobs import gates
from controllers.runtime import apply
from controllers.runtime.resources import POD, Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.conditions import PodGroupConditions as PGC

# The DisruptionTarget reason of a pod Muster preempts (kube-scheduler's is
# PreemptionByScheduler).
PREEMPTION_BY_MUSTER = "PreemptionByMuster"


def preempted_names(wl: Obj) -> frozenset[str]:
    """The pods an admitted Workload lost to single-pod preemption (names)."""
    return frozenset((wl.get("status") or {}).get("preemptedPods") or ())


def delete_preempted(
    ctx: Context, pods: Iterable[Obj], names: Collection[str], why: str, now: datetime
) -> int:
    """Delete the running (ungated, unfinished) pods among `pods` named in `names`, each
    marked DisruptionTarget first; returns how many went."""
    gone = 0
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (
            meta.get("name") not in names
            or meta.get("deletionTimestamp")
            or gates.is_gated(pod)
            or not gates.holds_capacity(pod)
        ):
            continue

        def mark(p: Obj) -> bool:
            return wls.set_condition(
                p, PGC.DISRUPTION_TARGET, "True", PREEMPTION_BY_MUSTER, why, now
            )

        apply.update(ctx.kube, POD, object_key(pod), mark, current=pod, status=True, attempts=1)
        apply.delete(ctx.kube, POD, pod)
        gone += 1
    return gone
