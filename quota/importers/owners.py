"""Workloads queued through their owner (docs/integrations.md, "Queued by their pods"):
a source's LeaderWorkerSets, Deployments, StatefulSets and Ray clusters as the Workloads
Muster's controller makes of them, with the pod sets of `quota.model.serving`.

A LeaderWorkerSet gives one Workload per replica group (its leader and `size - 1`
workers); a Deployment or StatefulSet one Workload of `replicas` pods; a RayCluster (or a
RayJob's cluster) one Workload, its head and each worker group a pod set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quota.api.names import DISRUPTION_MODE_ANNOTATION
from quota.importers.reader import SourceObject
from quota.importers.report import ImportInputError, Unmapped
from quota.importers.workloads import PodSetSource, skipped
from quota.model.serving import (
    LEADER,
    MAIN,
    RAY_MAX_REPLICAS,
    WORKERS,
    leader_worker_set,
    lws_group,
    ray_worker_pods,
    replicas_group,
    replicas_of,
)

LWS = ("leaderworkerset.x-k8s.io", "LeaderWorkerSet")
DEPLOYMENT = ("apps", "Deployment")
STATEFULSET = ("apps", "StatefulSet")
RAY_CLUSTER = ("ray.io", "RayCluster")
RAY_JOB = ("ray.io", "RayJob")
OWNER_KINDS = (LWS, DEPLOYMENT, STATEFULSET, RAY_CLUSTER, RAY_JOB)


@dataclass(frozen=True)
class OwnerGroup:
    """One Workload of an owner object: its name, pod sets, and the PriorityClass its pod
    templates name ("" for none)."""

    name: str
    pod_sets: tuple[PodSetSource, ...]
    class_name: str


def is_owner(obj: SourceObject) -> bool:
    return (obj.group, obj.kind) in OWNER_KINDS


def _template(obj: SourceObject, value: object, path: str) -> tuple[Mapping[str, Any], str]:
    template = obj.mapping(value, path)
    return obj.mapping(template.get("spec"), f"{path}.spec"), f"{path}.spec"


def _class_of(obj: SourceObject, specs: list[tuple[Mapping[str, Any], str]]) -> str:
    for spec, path in specs:
        name = obj.text(spec.get("priorityClassName"), f"{path}.priorityClassName")
        if name:
            return name
    return ""


def owner_groups(obj: SourceObject, unmapped: list[Unmapped]) -> list[OwnerGroup]:
    """The Workloads the controller makes of `obj` (one of OWNER_KINDS); none, reported,
    when it asks for no pods (scaled to zero)."""

    def fail(path: str, rule: str) -> ImportInputError:
        return ImportInputError(obj.origin, path, rule)

    kind = (obj.group, obj.kind)
    spec = obj.spec()
    stem = f"{obj.kind.lower()}-{obj.name}"
    if kind == LWS:
        lws = leader_worker_set(obj.doc, fail)
        if lws.degradable:
            skipped(
                obj,
                f"metadata.annotations[{DISRUPTION_MODE_ANNOTATION}]",
                "imported with its groups whole (disruption mode all): Muster's controller "
                "reads the annotation off the LeaderWorkerSet itself once it is applied",
                unmapped,
            )
        leader, workers = (lws.leader.spec, lws.leader.path), (lws.workers.spec, lws.workers.path)
        specs = {LEADER: leader, WORKERS: workers}
        sets = tuple(
            PodSetSource(s.name, s.count, *specs[s.name]) for s in lws_group(lws.size, False)
        )
        groups = [
            OwnerGroup(f"{stem}-{i}", sets, _class_of(obj, [leader, workers]))
            for i in range(lws.replicas)
        ]
    elif kind in (DEPLOYMENT, STATEFULSET):
        pods = _template(obj, spec.get("template"), "spec.template")
        (main,) = replicas_group(replicas_of(spec, fail))
        groups = [
            OwnerGroup(stem, (PodSetSource(MAIN, main.count, *pods),), _class_of(obj, [pods]))
        ]
        if not main.count:
            groups = []
    elif obj.kind == "RayJob" and not spec.get("rayClusterSpec"):
        skipped(
            obj,
            "spec.clusterSelector",
            "runs on an existing RayCluster, queued (and imported) with that cluster: left out",
            unmapped,
        )
        return []
    else:
        groups = [_ray(obj, stem)]
    if not groups:
        skipped(obj, "spec.replicas", "scaled to zero: asks for nothing, left out", unmapped)
    return groups


def _ray(obj: SourceObject, stem: str) -> OwnerGroup:
    """A RayCluster's head and worker groups (a RayJob's `spec.rayClusterSpec`), one pod set
    each, sized as KubeRay sizes it (`quota.model.serving.ray_worker_pods`)."""
    root = "spec.rayClusterSpec" if obj.kind == "RayJob" else "spec"
    cluster = obj.mapping(obj.spec().get("rayClusterSpec"), root) if root != "spec" else obj.spec()
    head = _template(
        obj,
        obj.mapping(cluster.get("headGroupSpec"), f"{root}.headGroupSpec").get("template"),
        f"{root}.headGroupSpec.template",
    )
    sets = [PodSetSource("head", 1, *head)]
    specs = [head]
    for i, raw in enumerate(obj.items(cluster.get("workerGroupSpecs"), f"{root}.workerGroupSpecs")):
        path = f"{root}.workerGroupSpecs[{i}]"
        group = obj.mapping(raw, path)
        name = obj.text(group.get("groupName"), f"{path}.groupName", required=True)
        high = obj.integer(group.get("maxReplicas"), f"{path}.maxReplicas", low=0)
        count = ray_worker_pods(
            obj.integer(group.get("replicas"), f"{path}.replicas", low=0) or 0,
            obj.integer(group.get("minReplicas"), f"{path}.minReplicas", low=0) or 0,
            RAY_MAX_REPLICAS if high is None else high,
            obj.integer(group.get("numOfHosts", 1), f"{path}.numOfHosts", low=1) or 1,
            bool(group.get("suspend")),
        )
        pods = _template(obj, group.get("template"), f"{path}.template")
        specs.append(pods)
        if count:
            # As the controller admits a Ray cluster: every pod set whole, one gang.
            sets.append(PodSetSource(name, count, *pods))
    return OwnerGroup(stem, tuple(sets), _class_of(obj, specs))
