"""The Workload of a group of pods queued by their owner (`controllers.owners.grouping`):
its name, its owner references and its spec, read from the group's pods (and the owner's
pod templates for pods not created yet), checked with the rule broken named."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controllers.podgroups.queues import resolve
from controllers.runtime.resources import Obj
from controllers.scheduler import pods as p
from controllers.state import workloads as wls
from controllers.state.ownergroups import POD_GROUP_KIND, OwnerGroup
from quota.api import ManifestError, parse_manifest
from quota.api.meta import API_VERSION
from quota.api.names import (
    OWNER_GROUP_ANNOTATION,
    POD_GROUP_LABEL,
    QUEUE_LABEL,
    WORKLOAD_FINALIZER,
)
from quota.api.quantity import format_quantity
from quota.model.convert import copied_annotations, topology_annotations
from quota.model.nodeconvert import pod_requests
from quota.model.serving import GroupPodSet

# LeaderWorkerSet's own placement rule, one group per domain and nothing else there: not one
# Muster can keep, so a set asking for it is refused rather than placed without it.
LWS_EXCLUSIVE_ANNOTATIONS = (
    "leaderworkerset.sigs.k8s.io/exclusive-topology",
    "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology",
)


class Refused(ValueError):
    """The group cannot be queued: `reason` is a word, the message says what to fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Shape:
    """What a group asks for: its pod sets (in order, `quota.model.serving`), whether it
    grows and shrinks through slices (else it is one gang of fixed size), whether preemption
    may take single pods, and pod specs of pod sets with no pod yet (the owner's templates)."""

    sets: tuple[GroupPodSet, ...]
    elastic: bool
    single: bool = False
    templates: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        return {s.name: s.count for s in self.sets}


def workload_name(group: OwnerGroup, serial: int) -> str:
    """Deterministic per group and serial number (how many Workloads it had before), so a
    create repeated after a restart is the same create."""
    digest = wls.short_hash(group.gid, str(serial))
    stem = f"{group.kind.lower()}-{group.name}" + (f"-{group.index}" if group.index else "")
    room = wls.MAX_NAME - len(digest) - 1
    return f"{stem[:room]}-{digest}"


def owner_references(
    group: OwnerGroup, owner: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> list[Obj]:
    """Who owns the Workload, so that the garbage collector removes it with them: the owner
    object when known, else the group's pods themselves (a pod group without a controller)."""
    if owner is not None:
        meta = owner.get("metadata") or {}
        refs = [(owner.get("apiVersion"), owner.get("kind"), meta.get("name"), meta.get("uid"))]
    elif group.uid:
        refs = [(group.api_version, group.kind, group.name, group.uid)]
    else:
        refs = [("v1", "Pod", p.key_of(x).split("/", 1)[1], p.uid_of(x)) for x in pods]
    return [{"apiVersion": a, "kind": k, "name": n, "uid": u} for a, k, n, u in refs if n and u]


def group_spec(
    group: OwnerGroup,
    shape: Shape,
    pods: Mapping[str, Sequence[Obj]],
    local_queues: list[Obj],
    priorities: Mapping[str, int],
    global_default: str | None,
) -> Obj:
    """The Workload spec of a group: one pod set per `shape.counts` entry, each asking for the
    most any of its pods (or its template) asks of each resource, with the scheduling fields
    and topology annotations of its oldest pod. `pods` (pod set -> pods, oldest first) holds
    at least one pod. Raises Refused naming the object, the field and the rule."""
    every = [x for members in pods.values() for x in members]
    first = every[0]
    labels = (first.get("metadata") or {}).get("labels") or {}
    queue = str(labels.get(QUEUE_LABEL) or "")
    local_queue, how = resolve(group.namespace, queue, local_queues)
    if local_queue is None:
        raise Refused("QueueNotFound", f"{group.subject}: metadata.labels[{QUEUE_LABEL}]: {how}")
    for key in LWS_EXCLUSIVE_ANNOTATIONS:
        if key in ((first.get("metadata") or {}).get("annotations") or {}):
            raise Refused(
                "UnsupportedTopology",
                f"{group.subject}: metadata.annotations[{key}]: Muster keeps a group inside "
                "one domain but not alone in it; use muster.dev/podset-required-topology on "
                "the templates instead",
            )
    pod_sets: list[Obj] = []
    for group_set in shape.sets:
        name, count = group_set.name, group_set.count
        members = list(pods.get(name) or [])
        specs = [p.spec_of(x) for x in members] or [shape.templates.get(name) or {}]
        if not members and name not in shape.templates:
            raise Refused("InvalidWorkload", f"{group.subject}: no pod of pod set {name} yet")
        requests: dict[str, int] = {}
        for pod_spec in specs:
            try:
                for resource, amount in pod_requests(pod_spec).items():
                    requests[resource] = max(requests.get(resource, 0), amount)
            except ValueError as error:
                raise Refused("InvalidWorkload", f"{group.subject}: {error}") from None
        model = specs[0]
        template: Obj = {
            "nodeSelector": dict(model.get("nodeSelector") or {}),
            "tolerations": list(model.get("tolerations") or []),
        }
        if model.get("affinity"):
            template["affinity"] = model["affinity"]
        pod_set: Obj = {
            "name": name,
            "count": count,
            "template": template,
            "requests": {r: format_quantity(v, r) for r, v in sorted(requests.items())},
        }
        if shape.single:
            pod_set["protectedCount"] = group_set.protected
        if members:

            def fail(path: str, rule: str, pod: Obj = members[0]) -> ManifestError:
                return ManifestError(0, f"Pod {p.key_of(pod)}", [(path, rule)])

            try:
                topology = topology_annotations(
                    {"metadata": members[0].get("metadata") or {}}, count, fail
                )
            except ManifestError as error:
                problems = "; ".join(f"{path}: {rule}" for path, rule in error.problems)
                raise Refused("InvalidWorkload", f"{group.subject}: {problems}") from None
            if topology:
                pod_set["topologyRequest"] = topology
        pod_sets.append(pod_set)
    spec_of_first = p.spec_of(first)
    class_name = spec_of_first.get("priorityClassName") or global_default
    explicit = spec_of_first.get("priority")
    if isinstance(explicit, int) and not isinstance(explicit, bool):
        priority = explicit
    else:
        priority = priorities.get(str(class_name), 0) if class_name else 0
    spec: Obj = {"queueName": local_queue, "priority": priority, "podSets": pod_sets}
    if class_name:
        spec["priorityClassName"] = class_name
    if shape.single:
        spec["disruptionMode"] = "Single"
    document = {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {"name": "group", "namespace": group.namespace},
        "spec": spec,
    }
    try:
        parsed = parse_manifest(document, 0)
    except ManifestError as error:
        problems = "; ".join(f"{path}: {rule}" for path, rule in error.problems)
        raise Refused("InvalidWorkload", f"{group.subject}: {problems}") from None
    # As the model reads it, defaults written out: what the apiserver stores (its CRD has the
    # same defaults), so a pending Workload compares equal to what the group asks.
    stored: Obj = parsed.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return stored


def new_workload(
    group: OwnerGroup,
    name: str,
    spec: Obj,
    owner: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
) -> Obj:
    """A Workload for the group, held by the resource-in-use finalizer until no pod of the
    group is bound any more."""
    annotations = copied_annotations(((owner or {}).get("metadata") or {}).get("annotations") or {})
    annotations[OWNER_GROUP_ANNOTATION] = group.gid
    meta: Obj = {
        "name": name,
        "namespace": group.namespace,
        "finalizers": [WORKLOAD_FINALIZER],
        "annotations": annotations,
        "ownerReferences": owner_references(group, owner, pods),
    }
    if group.kind == POD_GROUP_KIND:
        meta["labels"] = {POD_GROUP_LABEL: group.name[:63]}
    return {"apiVersion": API_VERSION, "kind": "Workload", "metadata": meta, "spec": spec}
