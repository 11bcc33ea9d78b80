"""Volcano's queues as Muster's (scheduling.volcano.sh/v1beta1 Queue).

Volcano has no flavors: every queue becomes a ClusterQueue with one flavor, `default`.
`deserved` (the capacity plugin's entitlement, reclaimable above it) is Muster's quota,
else `guarantee.resource`; `capability` is the limit and `weight` the over-quota weight
(the proportion plugin's share). The implicit `root` queue is the top of the tree: its
children become Muster's root queues unless the files define `root` themselves.
docs/import.md has the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from quota.api.meta import INT32_MAX
from quota.api.quantity import format_resource_list
from quota.api.topology import ForeignTopologyError, network_topology_request
from quota.importers.build import (
    DEFAULT_FLAVOR,
    ClusterState,
    QueueDraft,
    cluster_queues,
)
from quota.importers.reader import SourceObject
from quota.importers.report import ImportResult, Unmapped, refuse
from quota.importers.topologies import hypernode_topology
from quota.importers.workloads import (
    GroupedWork,
    PodSetSource,
    QueuedWork,
    owned_by,
    pod_work,
    queued_import,
    skipped,
    skipped_fields,
    source_objects,
)

GROUP = "scheduling.volcano.sh"
JOB_GROUP = "batch.volcano.sh"
QUEUE = (GROUP, "Queue")
JOB = (JOB_GROUP, "Job")
HYPERNODE = ("topology.volcano.sh", "HyperNode")
ROOT = "root"
DEFAULT_QUEUE = "default"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
MAX_WEIGHT = 65535
_QUEUE_UNMAPPED = {
    "affinity": "Muster ties queues to nodes through ResourceFlavors, not queue affinity",
    "extendClusters": "Muster manages one cluster",
    "type": "Muster has no queue types",
}


def _queue_of_group(group: SourceObject) -> str:
    """The queue a PodGroup names."""
    return group.ref(group.spec().get("queue"), "spec.queue") or DEFAULT_QUEUE


def _queue(
    obj: SourceObject, root_defined: bool, resources: set[str], unmapped: list[Unmapped]
) -> QueueDraft:
    spec = obj.spec()
    # Volcano's own bounds (its CRD): weight 1..65535, priority at least 0.
    weight = obj.integer(spec.get("weight"), "spec.weight", low=1, high=MAX_WEIGHT)
    capability = obj.quantities(spec.get("capability"), "spec.capability")
    deserved = obj.quantities(spec.get("deserved"), "spec.deserved")
    guarantee_block = obj.mapping(spec.get("guarantee"), "spec.guarantee")
    guarantee = obj.quantities(guarantee_block.get("resource"), "spec.guarantee.resource")
    quota = dict(deserved) if deserved else dict(guarantee)
    for resource in resources:
        # Volcano leaves a resource a queue does not mention unconstrained; a Muster flavor
        # offers only the resources it lists, so each is listed, at no guarantee.
        quota.setdefault(resource, 0)
    if guarantee:
        unmapped.append(
            Unmapped(
                obj.origin,
                "spec.guarantee.resource",
                "Volcano reserves a guarantee for the queue alone; Muster lends unused quota "
                "and reclaims it on demand"
                + (
                    ", and takes the quota from spec.deserved"
                    if deserved
                    else ": imported as the quota"
                ),
            )
        )
    for resource, amount in guarantee.items():
        if deserved and amount > deserved.get(resource, 0):
            refuse(
                obj.origin,
                f"spec.guarantee.resource[{resource}]",
                "must not exceed spec.deserved (Volcano: guarantee <= deserved <= capability)",
            )
    for resource, amount in quota.items():
        if resource in capability and amount > capability[resource]:
            refuse(
                obj.origin,
                f"spec.capability[{resource}]",
                "must not be below the deserved or guaranteed amount "
                "(Volcano: guarantee <= deserved <= capability)",
            )
    if not obj.boolean(spec.get("reclaimable"), "spec.reclaimable", True):
        skipped(
            obj,
            "spec.reclaimable",
            "Muster reclaims from any queue above its fair share; a queue cannot opt out",
            unmapped,
        )
    skipped_fields(obj, spec, _QUEUE_UNMAPPED, unmapped)
    priority = obj.integer(spec.get("priority"), "spec.priority", low=0, high=INT32_MAX)
    strategy = obj.choice(
        spec.get("dequeueStrategy"), "spec.dequeueStrategy", ("fifo", "traverse"), "traverse"
    )
    state = obj.mapping(obj.doc.get("status"), "status").get("state")
    if state not in (None, "Open", "Closed", "Closing", "Unknown"):
        refuse(obj.origin, "status.state", f"must be Open, Closed or Closing (got {state!r})")
    parent = obj.ref(spec.get("parent"), "spec.parent")
    if parent == ROOT and not root_defined:
        parent = ""
    flavor: dict[str, Any] = {"name": DEFAULT_FLAVOR, "quota": format_resource_list(quota)}
    if capability:
        flavor["limit"] = format_resource_list(capability)
    return QueueDraft(
        obj.name,
        obj.origin,
        parent=parent or None,
        parent_path="spec.parent",
        weight=Fraction(1 if weight is None else weight),
        weight_path="spec.weight",
        spec={
            "priority": priority or 0,
            "flavors": [flavor],
            # Volcano ties no priority to preemptibility: every job stays preemptible.
            "preemption": {
                "withinQueue": "LowerPriority",
                "reclaim": "Any",
                "preemptibleBelowPriority": INT32_MAX,
            },
            "queueingStrategy": "StrictFIFO" if strategy == "fifo" else "BestEffortFIFO",
            # A closed queue takes no new jobs and keeps its running ones.
            "stopPolicy": "Hold" if state in ("Closed", "Closing") else "None",
        },
    )


def _network_topology(obj: SourceObject) -> dict[str, Any] | None:
    """A Volcano Job's or PodGroup's `spec.networkTopology` as a topologyRequest in tiers,
    by the rule the controller's intake follows (`network_topology_request`)."""
    network = obj.spec().get("networkTopology")
    if network is None:
        return None
    try:
        return network_topology_request(network)
    except ForeignTopologyError as error:
        refuse(obj.origin, f"spec.networkTopology{error.path}", error.rule)


def _job_sets(obj: SourceObject, unmapped: list[Unmapped]) -> list[PodSetSource]:
    spec = obj.spec()
    sets: list[PodSetSource] = []
    total = 0
    for i, task in enumerate(obj.items(spec.get("tasks"), "spec.tasks")):
        path = f"spec.tasks[{i}]"
        task = obj.mapping(task, path)
        replicas = obj.integer(task.get("replicas", 1), f"{path}.replicas", low=0) or 0
        total += replicas
        template = obj.mapping(task.get("template"), f"{path}.template")
        if task.get("partitionPolicy"):
            skipped(
                obj,
                f"{path}.partitionPolicy",
                "Muster's slices name a level by its node label, not a HyperNode tier; "
                "write the task's pods as a Muster Workload with sliceRequiredTopology",
                unmapped,
            )
        sets.append(
            PodSetSource(
                obj.text(task.get("name"), f"{path}.name") or f"task-{i}",
                replicas,
                obj.mapping(template.get("spec"), f"{path}.template.spec"),
                f"{path}.template.spec",
                obj.integer(task.get("minAvailable"), f"{path}.minAvailable", low=1),
            )
        )
    least = obj.integer(spec.get("minAvailable"), "spec.minAvailable", low=0)
    if least is not None and 0 < least < total and not any(s.min_count for s in sets):
        skipped(
            obj,
            "spec.minAvailable",
            f"{least} of {total} pods: Muster admits the job whole "
            "(set the tasks' minAvailable for partial admission)",
            unmapped,
        )
    return sets


def import_volcano(objects: Sequence[SourceObject]) -> ImportResult:
    """Muster manifests for Volcano Queues, and the Volcano Jobs, PodGroups and pods queued
    in them."""
    unmapped: list[Unmapped] = []
    state = ClusterState()
    found = GroupedWork(GROUP)
    by_kind = source_objects(
        objects, state, found, "volcano", "Volcano", [QUEUE, JOB, HYPERNODE], unmapped
    )
    queue_objects = {obj.name: obj for obj in by_kind[QUEUE]}
    vcjobs = by_kind[JOB]
    hypernodes = by_kind[HYPERNODE]
    root_defined = ROOT in queue_objects
    resources = {"cpu", "memory"}
    for node in state.nodes:
        resources.update(node["status"]["allocatable"])
    for obj in queue_objects.values():
        spec = obj.spec()
        resources.update(obj.mapping(spec.get("capability"), "spec.capability"))
        resources.update(obj.mapping(spec.get("deserved"), "spec.deserved"))
        guarantee = obj.mapping(spec.get("guarantee"), "spec.guarantee")
        resources.update(obj.mapping(guarantee.get("resource"), "spec.guarantee.resource"))
    resources.discard("pods")  # placement counts pods on nodes; quota does not
    drafts = {
        name: _queue(obj, root_defined, resources, unmapped) for name, obj in queue_objects.items()
    }
    queues = cluster_queues(drafts, unmapped)

    work: list[QueuedWork] = []
    for obj in vcjobs:
        spec = obj.spec()
        queue = obj.ref(spec.get("queue"), "spec.queue") or DEFAULT_QUEUE
        sets = _job_sets(obj, unmapped)
        class_name = obj.text(spec.get("priorityClassName"), "spec.priorityClassName")
        work.append(
            QueuedWork(
                obj,
                queue,
                "spec.queue",
                pod_sets=sets,
                class_name=class_name,
                topology=_network_topology(obj),
            )
        )
    for obj in found.jobs:
        named = obj.meta_strings("annotations").get(QUEUE_ANNOTATION) or obj.meta_strings(
            "labels"
        ).get(QUEUE_ANNOTATION, "")
        if not named:
            skipped(
                obj,
                f"metadata.annotations[{QUEUE_ANNOTATION}]",
                "the Job names no Volcano queue: left out",
                unmapped,
            )
            continue
        work.append(
            QueuedWork(
                obj,
                named,
                f"metadata.annotations[{QUEUE_ANNOTATION}]",
                job=True,
            )
        )
    # A Volcano Job's own PodGroup is not work of its own: the Job is the workload.
    own = {k: g for k, g in found.groups.items() if not owned_by(g, {"Job"})}
    work += pod_work(
        found.pods,
        own,
        GROUP_ANNOTATION,
        _queue_of_group,
        _queue_annotation,
        (
            f"metadata.annotations[{QUEUE_ANNOTATION}]",
            "the pod names no Volcano queue or PodGroup: left out",
        ),
        unmapped,
        _network_topology,
    )
    topologies = hypernode_topology(hypernodes, unmapped)
    return queued_import(drafts, queues, work, state, unmapped, topologies)


def _queue_annotation(obj: SourceObject) -> tuple[str, str]:
    """The queue a pod names, and where."""
    return obj.meta_strings("annotations").get(QUEUE_ANNOTATION, ""), (
        f"metadata.annotations[{QUEUE_ANNOTATION}]"
    )
