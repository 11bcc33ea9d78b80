"""A worker cluster as the management cluster sees it, and the free room its nodes have.

The controller keeps, per worker cluster, its parsed nodes and bound pods (whoever owns
them) and the placements of the gangs it sent there. A gang sent there whose pods are not
all bound yet still needs its room: the unbound rest of its placement is reserved on the
nodes it was placed on, by the rule the admission cycle and the scheduler loop reserve
admitted plans with (`quota.placement.reservations.planned_pods`), so that the next gang is
not sent into room already promised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from quota.model.nodes import BoundPod, Node
from quota.model.snapshot import Assignment, PodSet, Workload
from quota.placement.gang import Placement
from quota.placement.nodes import NodeView
from quota.placement.reservations import planned_pods


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker cluster: its nodes, its bound pods, the gangs sent there, whether it answers.

    `dispatched` maps a management-cluster Workload key ("namespace/name") to the placement
    chosen when it was sent here; its pods bound here carry that key in `BoundPod.workload`.
    `why` says why an unavailable worker is (e.g. "unreachable for 40s").
    """

    name: str
    nodes: tuple[Node, ...] = ()
    pods: tuple[BoundPod, ...] = ()
    dispatched: Mapping[str, Placement] = field(default_factory=dict)
    available: bool = True
    why: str = ""


def as_admitted(key: str, placement: Placement) -> Workload:
    """A gang sent to a worker as the reservation rule reads an admitted workload: its
    placement is its plan (pod set -> nodes), its per-pod requests the placement's."""
    pod_sets = []
    assignments = []
    for pod_set, pairs in placement.nodes.items():
        count = sum(n for _, n in pairs)
        pod_sets.append(PodSet(pod_set, count, dict(placement.requests.get(pod_set, {}))))
        assignments.append(Assignment(pod_set, count, {}, tuple(pairs)))
    return Workload(key, "", 0, 0.0, tuple(pod_sets), admission=tuple(assignments))


def worker_view(worker: WorkerState, exclude: frozenset[str] = frozenset()) -> NodeView:
    """The free room on `worker`'s nodes: less its bound pods and the unbound rest of every
    gang sent there (but those in `exclude`, which the caller is placing itself).

    Raises ValueError naming the node or pod when the state is inconsistent (a node or pod
    listed twice)."""
    sent = [as_admitted(key, placement) for key, placement in sorted(worker.dispatched.items())]
    reserved = planned_pods(sent, worker.pods, exclude)
    return NodeView(worker.nodes, [*worker.pods, *reserved])
