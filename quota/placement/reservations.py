"""Room planned for admitted workloads whose pods are not bound yet, and room held for
pending preemptors while their victims leave.

An admission decided with nodes carries its plan (`Assignment.nodes`). Until the scheduler
has bound those pods, the room must stay taken, or the next admission cycle (or the next
group the scheduler places) would count it as free and place two gangs on one GPU. Pods
already bound count as themselves; only the rest of the plan is reserved, on the planned
nodes, as pods attributed to the workload.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from quota.model.nodes import BoundPod
from quota.model.snapshot import Workload, active_hold


def planned_pods(
    admitted: Iterable[Workload], bound: Iterable[BoundPod], exclude: frozenset[str] = frozenset()
) -> list[BoundPod]:
    """Placeholder pods for the planned, not yet bound pods of `admitted` workloads.

    Bound pods of a workload fill its plan node by node first; a workload's pods bound
    outside its plan (re-placed by the scheduler) shorten what is reserved, never lengthen
    it. Workloads in `exclude` (the ones the caller is placing itself) reserve nothing.
    """
    on_node: Counter[tuple[str, str]] = Counter()
    total: Counter[str] = Counter()
    for pod in bound:
        if pod.workload is not None:
            on_node[(pod.workload, pod.node)] += 1
            total[pod.workload] += 1
    out: list[BoundPod] = []
    for w in admitted:
        if w.admission is None or w.key in exclude:
            continue
        # Pods that may still be missing: the admitted count less every pod bound anywhere.
        missing = sum(a.count for a in w.admission) - total.get(w.key, 0)
        if missing <= 0:
            continue  # every pod bound (most admitted workloads, most cycles)
        per_pod = {ps.name: ps.per_pod for ps in w.pod_sets}
        seen: Counter[str] = Counter()
        for a in w.admission:
            requests = per_pod.get(a.pod_set, {})
            for node, count in a.nodes:
                here = on_node.get((w.key, node), 0) - seen[node]
                used = min(max(here, 0), count)
                seen[node] += used
                for i in range(min(count - used, missing)):
                    out.append(
                        BoundPod(
                            f"{w.key}#planned-{a.pod_set}-{node}-{i}",
                            node,
                            requests,
                            w.key,
                            a.pod_set,
                        )
                    )
                    missing -= 1
    return out


def leaving_of(key: str) -> str:
    """The owner of the pods single-pod preemption took from workload `key`: no longer its
    own (its admission shrank), leaving, their room promised to a preemptor."""
    return f"{key}{LEAVING}"


LEAVING = "#leaving"


def pod_keys(keys: Iterable[str]) -> tuple[str, ...]:
    """The keys of a view's pods that name pods, not planned or held room (`planned_pods`,
    `held_pods`: every placeholder's key has a "#" no pod name can have), in order."""
    return tuple(sorted(k for k in keys if "#" not in k))


def held_by(key: str) -> str:
    """The owner of the placeholder pods holding room for workload `key`: not the workload
    itself, whose own pods (a moved workload's, still running) are counted apart."""
    return f"{key}#held"


def held_pods(
    pending: Iterable[Workload], now: float, timeout_s: float, exclude: frozenset[str] = frozenset()
) -> list[BoundPod]:
    """Placeholder pods for the room held for pending preemptors (`Workload.hold`) that
    has not lapsed, attributed to the preemptor: until it is admitted, nothing else may be
    placed there, whoever comes first. The victims' own pods may still be on those nodes:
    the node then shows as overcommitted, which is exactly "taken" to everyone else."""
    out: list[BoundPod] = []
    for w in pending:
        hold = active_hold(w, now, timeout_s)
        if hold is None or w.key in exclude:
            continue
        per_pod = {ps.name: ps.per_pod for ps in w.pod_sets}
        owner = held_by(w.key)
        for a in hold.assignments:
            requests = per_pod.get(a.pod_set, {})
            for node, count in a.nodes:
                for i in range(count):
                    out.append(
                        BoundPod(f"{w.key}#held-{a.pod_set}-{node}-{i}", node, requests, owner)
                    )
    return out
