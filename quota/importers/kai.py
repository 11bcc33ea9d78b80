"""KAI-Scheduler's queues as Muster's (scheduling.run.ai/v2 Queue).

KAI has no flavors: every queue becomes a ClusterQueue with one flavor, `default`, for the
whole cluster. Per resource (gpu -> nvidia.com/gpu, cpu in millicores, memory in megabytes
of 10^6 bytes) quota is Muster's quota and limit its limit; -1 means unlimited, and an
unset or zero limit means no more than the quota, as KAI documents. KAI weighs each
resource separately; Muster has one over-quota weight per queue, taken from gpu (else cpu,
else memory). docs/import.md has the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from quota.api.meta import INT32_MAX, INT32_MIN, parse_duration
from quota.api.quantity import format_quantity
from quota.importers.build import (
    DEFAULT_FLAVOR,
    ClusterState,
    QueueDraft,
    cluster_queues,
)
from quota.importers.owners import OWNER_KINDS, owner_groups
from quota.importers.reader import SourceObject
from quota.importers.report import ImportResult, Unmapped, refuse
from quota.importers.topologies import level_topologies
from quota.importers.workloads import (
    GroupedWork,
    QueuedWork,
    pod_work,
    queued_import,
    skipped,
    source_objects,
)

GROUP = "scheduling.run.ai"
QUEUE_LABELS = ("kai.scheduler/queue", "runai/queue")
GROUP_ANNOTATION = "pod-group-name"
DEFAULT_PRIORITY = 100  # KAI's default queue priority
QUEUE = (GROUP, "Queue")
TOPOLOGY = ("kai.scheduler", "Topology")
# KAI's topology annotations on a workload's top owner -> the PodGroup field each stands for.
JOB_ANNOTATIONS = {
    "topology": "kai.scheduler/topology",
    "requiredTopologyLevel": "kai.scheduler/topology-required-placement",
    "preferredTopologyLevel": "kai.scheduler/topology-preferred-placement",
}
UNLIMITED = -1
# The podgrouper's annotations on a top owner that Muster has no equivalent for, and why.
OWNER_ANNOTATIONS = {
    "kai.scheduler/preemptibility": "Muster ties preemptibility to priority (a queue's "
    "preemptibleBelowPriority, 100 here): set the PriorityClass instead",
    "kai.scheduler/segment-size": "Muster places a LeaderWorkerSet group by one request; "
    "segments of it are not placed apart",
    "kai.scheduler/segment-topology-required-placement": "Muster places a group by one "
    "request; segments of it are not placed apart",
    "kai.scheduler/segment-topology-preferred-placement": "Muster places a group by one "
    "request; segments of it are not placed apart",
    "kai.scheduler/node-pool": "Muster has no node pools: a flavor's nodeLabels choose nodes",
}
# KAI's resources, the Muster resource each is, and one KAI unit in Muster's base units.
RESOURCES = (
    ("gpu", "nvidia.com/gpu", Fraction(1)),
    ("cpu", "cpu", Fraction(1)),  # millicpus are Muster's base unit for cpu
    ("memory", "memory", Fraction(10**6)),  # megabytes of 10^6 bytes
)


def _queue_of_group(group: SourceObject) -> str:
    """The queue a PodGroup names."""
    return group.ref(group.spec().get("queue"), "spec.queue", required=True)


def _amount(
    obj: SourceObject,
    value: Fraction,
    path: str,
    resource: str,
    scale: Fraction,
    unmapped: list[Unmapped],
) -> int:
    exact = value * scale
    whole = int(exact)  # toward zero: never a larger guarantee or cap than written
    if whole != exact:
        unmapped.append(
            Unmapped(
                obj.origin,
                path,
                f"{float(value):g} is a fraction of a {resource} unit Muster counts whole: "
                f"imported as {format_quantity(whole, resource)}",
            )
        )
    return whole


def _queue(obj: SourceObject, unmapped: list[Unmapped]) -> QueueDraft:
    spec = obj.spec()
    resources = obj.mapping(spec.get("resources"), "spec.resources")
    quota: dict[str, int] = {}
    limit: dict[str, int] = {}
    weights: list[tuple[str, Fraction]] = []
    for key, resource, scale in RESOURCES:
        path = f"spec.resources.{key}"
        entry = obj.mapping(resources.get(key), path)
        q = obj.number(entry.get("quota"), f"{path}.quota") or Fraction(0)
        cap = obj.number(entry.get("limit"), f"{path}.limit") or Fraction(0)
        weight = obj.number(entry.get("overQuotaWeight"), f"{path}.overQuotaWeight") or Fraction(0)
        for name, value in (("quota", q), ("limit", cap), ("overQuotaWeight", weight)):
            if value < 0 and not (value == UNLIMITED and name != "overQuotaWeight"):
                refuse(
                    obj.origin,
                    f"{path}.{name}",
                    f"must be {'-1 or ' if name != 'overQuotaWeight' else ''}at least 0 "
                    f"(got {float(value):g})",
                )
        if key in resources:
            weights.append((f"{path}.overQuotaWeight", weight))
        if q == UNLIMITED:
            unmapped.append(
                Unmapped(
                    obj.origin,
                    f"{path}.quota",
                    "-1 (an unlimited guarantee) has no Muster equivalent: imported as no "
                    "guarantee; the queue gets capacity through its over-quota weight",
                )
            )
            # Listed at 0, so that the flavor still offers the resource.
            quota[resource] = 0
        else:
            quota[resource] = _amount(obj, q, f"{path}.quota", resource, scale, unmapped)
        if cap == UNLIMITED:
            continue
        if cap == 0:
            # KAI: an unset or zero limit allows nothing beyond the quota.
            limit[resource] = quota.get(resource, 0)
            continue
        amount = _amount(obj, cap, f"{path}.limit", resource, scale, unmapped)
        if amount < quota.get(resource, 0):
            unmapped.append(
                Unmapped(
                    obj.origin,
                    f"{path}.limit",
                    "below the quota; Muster's quota never exceeds the limit, so the quota "
                    "is imported as the limit",
                )
            )
            quota[resource] = amount
        limit[resource] = amount
    chosen = weights[0][1] if weights else Fraction(0)
    for path, weight in weights[1:]:
        if weight != chosen:
            unmapped.append(
                Unmapped(
                    obj.origin,
                    path,
                    f"Muster has one over-quota weight per queue, taken from {weights[0][0]} "
                    f"({float(chosen):g}); this one ({float(weight):g}) is not used",
                )
            )
    priority = obj.integer(spec.get("priority"), "spec.priority", low=INT32_MIN, high=INT32_MAX)
    preemption: dict[str, Any] = {"withinQueue": "LowerPriority", "reclaim": "Any"}
    for field, target in (
        ("preemptMinRuntime", "preemptMinRuntime"),
        ("reclaimMinRuntime", "reclaimMinRuntime"),
    ):
        raw = spec.get(field)
        if raw is not None:
            try:
                parse_duration(raw)
            except ValueError as error:
                refuse(obj.origin, f"spec.{field}", str(error))
            preemption[target] = raw
    if spec.get("displayName"):
        skipped(obj, "spec.displayName", "Muster shows the queue's name", unmapped)
    parent = obj.ref(spec.get("parentQueue"), "spec.parentQueue")
    flavor: dict[str, Any] = {
        "name": DEFAULT_FLAVOR,
        "quota": {r: format_quantity(v, r) for r, v in quota.items()},
    }
    if limit:
        flavor["limit"] = {r: format_quantity(v, r) for r, v in limit.items()}
    return QueueDraft(
        obj.name,
        obj.origin,
        parent=parent or None,
        parent_path="spec.parentQueue",
        weight=chosen,
        weight_path=weights[0][0] if weights else "spec.resources",
        spec={
            "priority": DEFAULT_PRIORITY if priority is None else priority,
            "flavors": [flavor],
            "preemption": preemption,
        },
    )


class _Placement:
    """KAI's topology constraints (a PodGroup's `spec.topologyConstraint`, a Job's
    `kai.scheduler/topology*` annotations) as Muster topologyRequests, on the Topology the
    one flavor names (`flavor_topology`)."""

    def __init__(self, flavor_topology: str | None, unmapped: list[Unmapped]) -> None:
        self.flavor_topology = flavor_topology
        self.unmapped = unmapped

    def request(
        self, obj: SourceObject, fields: dict[str, tuple[str, str]]
    ) -> dict[str, Any] | None:
        """`fields`: KAI's field (topology, requiredTopologyLevel, preferredTopologyLevel)
        -> (its value, its path in `obj`). A required level keeps every pod in one domain
        of it; inside, Muster keeps pods in as few domains of each lower level as it can,
        which is what KAI's preferred level there asks. A preferred level alone: Muster's
        preferred (climbing only when it must)."""
        required = fields["requiredTopologyLevel"][0]
        preferred, preferred_path = fields["preferredTopologyLevel"]
        topology, topology_path = fields["topology"]
        if not required and not preferred:
            return None
        if topology != self.flavor_topology:
            skipped(
                obj,
                topology_path,
                f"Topology {topology or '(unset)'}: Muster's one flavor names "
                f"{self.flavor_topology or 'no Topology'}, whose levels the request is read "
                "against",
                self.unmapped,
            )
        if required and preferred and preferred != required:
            skipped(
                obj,
                preferred_path,
                f"inside one domain of {required}, Muster keeps the pods in as few domains "
                "of each lower level as it can: the preferred level adds nothing to that",
                self.unmapped,
            )
        return {"required": required} if required else {"preferred": preferred}

    def of_group(self, group: SourceObject) -> dict[str, Any] | None:
        spec = group.spec()
        path = "spec.topologyConstraint"
        constraint = group.mapping(spec.get("topologyConstraint"), path)
        for i, sub in enumerate(group.items(spec.get("subGroups"), "spec.subGroups")):
            if group.mapping(sub, f"spec.subGroups[{i}]").get("topologyConstraint"):
                skipped(
                    group,
                    f"spec.subGroups[{i}].topologyConstraint",
                    "Muster places a group by one request; sub-groups of it are not placed "
                    "apart yet",
                    self.unmapped,
                )
        return self.request(
            group,
            {
                key: (group.text(constraint.get(key), f"{path}.{key}"), f"{path}.{key}")
                for key in ("topology", "requiredTopologyLevel", "preferredTopologyLevel")
            },
        )

    def of_job(self, job: SourceObject) -> dict[str, Any] | None:
        annotations = job.meta_strings("annotations")
        return self.request(
            job,
            {
                key: (annotations.get(name, ""), f"metadata.annotations[{name}]")
                for key, name in JOB_ANNOTATIONS.items()
            },
        )


def _queue_label(obj: SourceObject) -> tuple[str, str]:
    labels = obj.meta_strings("labels")
    for key in QUEUE_LABELS:
        if labels.get(key):
            return labels[key], f"metadata.labels[{key}]"
    return "", ""


def _owner_work(
    objects: Sequence[SourceObject], placement: _Placement, unmapped: list[Unmapped]
) -> list[QueuedWork]:
    """KAI's podgrouper groups pods by their top owner: a LeaderWorkerSet's replica groups,
    a Deployment's or StatefulSet's replicas, a Ray cluster's head and workers — each the
    Workloads Muster's controller makes of it, on the queue its label (on the object or its
    pod template) names, placed by the topology annotations on the object."""
    work: list[QueuedWork] = []
    for obj in objects:
        queue, path = _queue_label(obj)
        if not queue:
            template = obj.mapping(obj.spec().get("template"), "spec.template")
            meta = obj.mapping(template.get("metadata"), "spec.template.metadata")
            labels = obj.strings(meta.get("labels"), "spec.template.metadata.labels")
            key = next((k for k in QUEUE_LABELS if labels.get(k)), "")
            queue, path = labels.get(key, ""), f"spec.template.metadata.labels[{key}]"
        if not queue:
            skipped(
                obj,
                "metadata.labels[kai.scheduler/queue]",
                f"the {obj.kind} names no KAI queue: left out",
                unmapped,
            )
            continue
        for key, reason in OWNER_ANNOTATIONS.items():
            if key in obj.meta_strings("annotations"):
                skipped(obj, f"metadata.annotations[{key}]", reason, unmapped)
        topology = placement.of_job(obj)
        for group in owner_groups(obj, unmapped):
            work.append(
                QueuedWork(
                    obj,
                    queue,
                    path,
                    pod_sets=group.pod_sets,
                    class_name=group.class_name,
                    topology=topology,
                    name=group.name,
                )
            )
    return work


def import_kai(objects: Sequence[SourceObject]) -> ImportResult:
    """Muster manifests for KAI Queues, and the Jobs, PodGroups and pods queued in them."""
    unmapped: list[Unmapped] = []
    state = ClusterState()
    found = GroupedWork(GROUP)
    by_kind = source_objects(
        objects, state, found, "kai", "KAI", [QUEUE, TOPOLOGY, *OWNER_KINDS], unmapped
    )
    drafts = {obj.name: _queue(obj, unmapped) for obj in by_kind[QUEUE]}
    topology_objects = by_kind[TOPOLOGY]
    queues = cluster_queues(drafts, unmapped)
    topologies = level_topologies(topology_objects, unmapped)
    for obj in topology_objects[1:]:
        skipped(
            obj,
            "",
            f"imported, but Muster's one flavor for the cluster names Topology "
            f"{topology_objects[0].name}; name this one from a flavor of its nodes",
            unmapped,
        )
    placement = _Placement(topology_objects[0].name if topology_objects else None, unmapped)
    work: list[QueuedWork] = []
    for obj in found.jobs:
        queue, path = _queue_label(obj)
        if not queue:
            skipped(
                obj,
                "metadata.labels[kai.scheduler/queue]",
                "the Job names no KAI queue: left out",
                unmapped,
            )
            continue
        work.append(QueuedWork(obj, queue, path, job=True, topology=placement.of_job(obj)))
    for kind in OWNER_KINDS:
        work += _owner_work(by_kind[kind], placement, unmapped)
    work += pod_work(
        found.pods,
        found.groups,
        GROUP_ANNOTATION,
        _queue_of_group,
        _queue_label,
        ("metadata.labels[kai.scheduler/queue]", "the pod names no KAI queue: left out"),
        unmapped,
        placement.of_group,
        by_owner=True,
    )
    return queued_import(drafts, queues, work, state, unmapped, topologies)
