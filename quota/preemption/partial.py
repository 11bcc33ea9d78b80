"""Single-pod disruption: a victim Workload with disruptionMode Single loses single pods.

KEP-5710's `disruptionMode: Single`: each pod of such a workload is preemptible on its
own, except a pod set's `protectedCount` pods, which are not preemptible at all (a
LeaderWorkerSet's leader). The victim search therefore sees a Single workload as a
candidate holding only its unprotected pods' quota; once the victims are chosen, each
Single victim gives back, most important first, every pod the preemptor fits without.

So a Single victim whose unprotected pods are not enough on their own loses all of them
(never a protected one) while other victims make up the rest; if no set of victims
suffices the search fails as for any other candidate. It never becomes a whole victim
unless nothing of it is protected and every pod is needed, which is the same thing.
A victim's `pods`, ((pod set, pods taken), ...), is None for a whole eviction.

On nodes the same rule chooses pods, not counts (`on_nodes`, `lost_pods`): a Single
candidate offers the node search only its unprotected pods, and once the preemptor's
placement is fixed it loses exactly those of them still in its way; its other pods stay.
Which pods of a pod set are protected is not said by the API (they are alike): the first
`protectedCount` in key order, so a search and the next one agree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from quota.model.nodes import BoundPod
from quota.model.resources import FlavorResource, flavor_resource
from quota.model.snapshot import Workload

Taken = tuple[tuple[str, int], ...]


def takeable(workload: Workload) -> dict[str, int]:
    """Pods single-pod disruption may take, per pod set: admitted minus protected."""
    protected = {ps.name: ps.protected_count for ps in workload.pod_sets}
    return {
        a.pod_set: max(0, a.count - protected.get(a.pod_set, 0))
        for a in workload.admission or ()
        if a.count > protected.get(a.pod_set, 0)
    }


def admitted_counts(workload: Workload, taken: Taken | None) -> dict[str, int]:
    """Pods admitted per pod set once `taken` is gone (None: the whole workload, all 0)."""
    lost = dict(taken) if taken is not None else None
    return {
        a.pod_set: 0 if lost is None else a.count - lost.get(a.pod_set, 0)
        for a in workload.admission or ()
    }


def pods_usage(workload: Workload, taken: Taken) -> dict[FlavorResource, int]:
    """Quota `taken` pods of an admitted workload hold, per (flavor, resource)."""
    per_pod = {ps.name: ps.per_pod for ps in workload.pod_sets}
    flavors = {a.pod_set: a.flavors for a in workload.admission or ()}
    out: dict[FlavorResource, int] = {}
    for pod_set, pods in taken:
        for resource, amount in per_pod.get(pod_set, {}).items():
            flavor = flavors.get(pod_set, {}).get(resource)
            if flavor is not None and amount:
                key = flavor_resource(flavor, resource)
                out[key] = out.get(key, 0) + amount * pods
    return out


def is_whole(workload: Workload, taken: Taken) -> bool:
    return dict(taken) == {a.pod_set: a.count for a in workload.admission or () if a.count}


def pod_set_of(workload: Workload, pod: BoundPod) -> str | None:
    """The pod set `pod` runs for: its own label, or the only one the workload has."""
    if pod.pod_set is not None:
        return pod.pod_set
    return workload.pod_sets[0].name if len(workload.pod_sets) == 1 else None


def on_nodes(workload: Workload, keys: Sequence[str], pods: Mapping[str, BoundPod]) -> list[str]:
    """The pods (keys of `pods`, among `keys`) that single-pod disruption may take from a
    Single `workload` on nodes: per pod set, all but its protectedCount. A pod whose pod set
    is unknown is never taken (it could be a protected one)."""
    protected = {ps.name: ps.protected_count for ps in workload.pod_sets}
    kept: Counter[str] = Counter()
    out: list[str] = []
    for key in sorted(keys):
        pod = pods.get(key)
        pod_set = pod_set_of(workload, pod) if pod is not None else None
        if pod_set is None or pod_set not in protected:
            continue
        if kept[pod_set] < protected[pod_set]:
            kept[pod_set] += 1
            continue
        out.append(key)
    return out


def lost_pods(workload: Workload, lost: Iterable[BoundPod]) -> Taken:
    """`lost` (pods of `workload` a node plan takes) as ((pod set, pods), ...), in the
    order of the workload's pod sets."""
    counts = Counter(pod_set_of(workload, pod) for pod in lost)
    return tuple((ps.name, counts[ps.name]) for ps in workload.pod_sets if counts[ps.name])
