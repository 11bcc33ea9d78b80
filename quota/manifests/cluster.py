"""The cluster file of `muster fairshare` and `muster admit`: one snapshot of a cluster.

The file holds the manifests an admin would export — ResourceFlavors, ClusterQueues,
LocalQueues, PriorityClasses, Nodes, Namespaces — and the Workloads, pending or admitted.

With Nodes, the cycle places pods on them as the controller's does (the same decision code);
without, it trusts quota alone. It reads no Pods: an admitted Workload takes room on the
nodes its admission names (`status.admission.podSetAssignments[].nodes`, which the
controller writes), so a file with Nodes must name them for every admitted pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from quota.api.conditions import find_condition
from quota.api.workload import Workload as WorkloadModel
from quota.manifests.documents import (
    capacity,
    flavors,
    invalid,
    nodes,
    priority_classes,
    queues,
    read_documents,
    topologies,
)
from quota.model import convert
from quota.model.decisions import CycleResult, Pending
from quota.model.queues import cluster_queue_of
from quota.model.snapshot import Flavor, QueueSpec, Snapshot, Workload

CLUSTER_KINDS = frozenset(
    {"ResourceFlavor", "ClusterQueue", "LocalQueue", "PriorityClass", "Node", "Namespace"}
    | {"Workload", "Topology"}
)


@dataclass(frozen=True)
class ClusterState:
    """A cluster file: one snapshot, plus names."""

    snapshot: Snapshot
    # Workload key -> its LocalQueue ("" for admitted workloads found by ClusterQueue).
    local_queue_of: Mapping[str, str] = field(default_factory=dict)
    # Pending Workloads no cycle can decide (`convert.priority_wait`), kept out of the
    # snapshot, with why: a cycle's result is reported with them (`with_waiting`).
    waiting: tuple[Pending, ...] = ()

    def with_waiting(self, result: CycleResult) -> CycleResult:
        """A cycle's decisions on this file, and the Workloads the cycle could not see."""
        return replace(result, pending=result.pending + self.waiting)


def _check_admission(
    index: int,
    doc: Mapping[str, Any],
    wl: WorkloadModel,
    queues: Mapping[str, QueueSpec],
    flavors: Mapping[str, Flavor],
) -> None:
    """An admission the file claims must be one Muster could have made: to a leaf queue, of
    pod sets the Workload has, at most their count, on flavors that exist and the queue
    lists for each requested resource. Anything else would be counted wrongly."""
    admission = wl.status.admission
    assert admission is not None
    queue = queues[admission.cluster_queue]
    if any(spec.parent == queue.name for spec in queues.values()):
        raise invalid(
            index,
            doc,
            "status.admission.clusterQueue",
            f"ClusterQueue {queue.name!r} has child queues; only a leaf queue admits",
        )
    pod_sets = {ps.name: ps for ps in wl.spec.pod_sets}
    listed = {fq.flavor for fq in queue.flavors}
    for i, assignment in enumerate(admission.pod_set_assignments):
        path = f"status.admission.podSetAssignments[{i}]"
        pod_set = pod_sets.get(assignment.name)
        if pod_set is None:
            raise invalid(
                index,
                doc,
                f"{path}.name",
                f"no pod set {assignment.name!r} in spec.podSets ({', '.join(pod_sets)})",
            )
        if assignment.count > pod_set.count:
            raise invalid(
                index,
                doc,
                f"{path}.count",
                f"{assignment.count} pods admitted, but pod set {pod_set.name} has {pod_set.count}",
            )
        for resource in pod_set.requests:
            chosen = assignment.flavors.get(resource)
            where = f"{path}.flavors[{resource}]"
            if chosen is None:
                if assignment.count:
                    raise invalid(index, doc, where, "required: the flavor the resource came from")
                continue
            if chosen not in flavors:
                raise invalid(index, doc, where, f"ResourceFlavor {chosen!r} does not exist")
            if chosen not in listed:
                raise invalid(
                    index,
                    doc,
                    where,
                    f"ClusterQueue {queue.name} lists no flavor {chosen!r}",
                )


def _check_placed(
    index: int, doc: Mapping[str, Any], wl: WorkloadModel, node_names: frozenset[str]
) -> None:
    """An admitted Workload of a file with Nodes says where its pods run: without Pods in
    the file, that is the only way to know the room it takes."""
    admission = wl.status.admission
    assert admission is not None
    for i, assignment in enumerate(admission.pod_set_assignments):
        path = f"status.admission.podSetAssignments[{i}].nodes"
        placed = sum(n.count for n in assignment.nodes)
        if assignment.count and not assignment.nodes:
            raise invalid(
                index,
                doc,
                path,
                "required when the file has Nodes: the nodes this pod set's pods run on "
                "([{name, count}], as the controller writes them); muster admit reads no Pods, "
                "so it cannot tell the room they take (or leave the Nodes out to decide on "
                "quota alone)",
            )
        if placed != assignment.count:
            raise invalid(
                index, doc, path, f"{placed} pods placed, but {assignment.count} admitted"
            )
        for j, node in enumerate(assignment.nodes):
            if node.name not in node_names:
                raise invalid(index, doc, f"{path}[{j}].name", f"no Node {node.name!r} in the file")


def cluster_state(docs: Sequence[Any], now: float, *, place: bool = True) -> ClusterState:
    """The snapshot a cluster file describes (for `muster fairshare` and `muster admit`).

    A pending Workload's `spec.queueName` names a LocalQueue of its namespace; in files
    without that LocalQueue it may name a ClusterQueue directly. An admitted Workload
    (`status.admission` set) is charged to `status.admission.clusterQueue`. Arrival is
    `metadata.creationTimestamp` (workloads without one arrive first, in file order), and
    the admission time is the QuotaReserved condition's lastTransitionTime. A pending
    Workload naming a PriorityClass the file does not hold waits (`ClusterState.waiting`).
    With Nodes and `place` (`muster admit`), pending Workloads are placed on them, and every
    admitted one must name the nodes its pods run on (`_check_placed`); `muster fairshare`
    shares quota and node capacity and places nothing.
    """
    read = read_documents(docs, CLUSTER_KINDS, "muster fairshare / muster admit")
    classes, _ = priority_classes(read)
    specs, _ = queues(read)
    engine_flavors = flavors(read)
    file_nodes = nodes(read) if place else None
    node_names = frozenset(n.name for n in file_nodes or ())
    local_queues = {
        f"{lq.metadata.namespace or 'default'}/{lq.name}": read.raw[index]
        for index, lq in read.local_queues
    }
    admitted: list[Workload] = []
    pending: list[Workload] = []
    lq_of: dict[str, str] = {}
    waiting: list[Pending] = []
    for index, wl in read.workloads:
        doc = read.raw[index]
        created = wl.metadata.creation_timestamp
        arrival = created.timestamp() if created is not None else float(index)
        queue = cluster_queue_of(doc, local_queues.get)  # where the controller counts it
        lq_of[f"{wl.metadata.namespace or 'default'}/{wl.name}"] = wl.spec.queue_name
        if wl.status.admission is not None:
            if queue not in specs:
                raise invalid(
                    index,
                    doc,
                    "status.admission.clusterQueue",
                    f"ClusterQueue {queue!r} does not exist",
                )
            _check_admission(index, doc, wl, specs, engine_flavors)
            if file_nodes is not None:
                _check_placed(index, doc, wl, node_names)
            reserved = find_condition(wl.status.conditions, "QuotaReserved")
            admitted_at = reserved.last_transition_time.timestamp() if reserved else arrival
            admitted.append(
                convert.workload(
                    wl, queue, arrival=arrival, admitted_at=admitted_at, priority_classes=classes
                )
            )
            continue
        if queue is None and wl.spec.queue_name in specs:
            queue = wl.spec.queue_name  # a file may name a ClusterQueue directly
        if queue is None:
            namespace = wl.metadata.namespace or "default"
            raise invalid(
                index,
                doc,
                "spec.queueName",
                f"queue {wl.spec.queue_name!r} does not exist: no LocalQueue "
                f"{namespace}/{wl.spec.queue_name} and no ClusterQueue of that name",
            )
        wait = convert.priority_wait(wl.spec.priority, wl.spec.priority_class_name, classes)
        if wait is not None:
            waiting.append(Pending(f"{wl.metadata.namespace or 'default'}/{wl.name}", queue, wait))
            continue
        pending.append(convert.workload(wl, queue, arrival=arrival, priority_classes=classes))
    snapshot = Snapshot(
        now=now,
        queues=specs,
        flavors=engine_flavors,
        capacity=capacity(read, engine_flavors),
        nodes=file_nodes,
        admitted=tuple(admitted),
        pending=tuple(pending),
        topologies=topologies(read),
    )
    return ClusterState(snapshot=snapshot, local_queue_of=lq_of, waiting=tuple(waiting))
