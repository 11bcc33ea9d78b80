"""The pod sets of workloads queued by their pods (docs/integrations.md, "Queued by their
pods"), one home for the controller (`controllers/owners`), the simulator and the importer:
what a LeaderWorkerSet group, a serving Deployment or StatefulSet asks for, which of its pods
preemption may take one by one, and the fields of a LeaderWorkerSet document they are read
from."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quota.api.names import DISRUPTION_MODE_ANNOTATION

# A LeaderWorkerSet group's pod sets: its leader (worker index 0) and the rest.
LEADER = "leader"
WORKERS = "workers"
# The one pod set of a Deployment's, a StatefulSet's or any other owner's group.
MAIN = "main"


@dataclass(frozen=True)
class GroupPodSet:
    """One pod set of a group: its pods, and how many of them single-pod preemption never
    takes (all of them unless the group is degradable)."""

    name: str
    count: int
    protected: int


def lws_group(size: int, degradable: bool) -> tuple[GroupPodSet, ...]:
    """A LeaderWorkerSet replica of `size` pods (>= 1): its leader and `size - 1` workers,
    placed whole. Degradable (`disruptionMode` single): workers may be taken one by one, the
    leader never (without it the group serves nothing)."""
    if size < 1:
        raise ValueError(f"a LeaderWorkerSet group has at least one pod (got size {size})")
    workers = size - 1
    sets = [GroupPodSet(LEADER, 1, 1)]
    if workers:
        sets.append(GroupPodSet(WORKERS, workers, 0 if degradable else workers))
    return tuple(sets)


def replicas_group(replicas: int) -> tuple[GroupPodSet, ...]:
    """A serving Deployment's or StatefulSet's replicas, as one pod set that grows and
    shrinks through slices (every pod is a replica; none is taken alone)."""
    if replicas < 0:
        raise ValueError(f"replicas must not be negative (got {replicas})")
    return (GroupPodSet(MAIN, replicas, replicas),)


# KubeRay's bound on a worker group's replicas when it sets no maxReplicas.
RAY_MAX_REPLICAS = 2147483647


def ray_worker_pods(
    replicas: int, min_replicas: int, max_replicas: int, hosts: int, suspended: bool
) -> int:
    """Pods KubeRay runs for a worker group (its `GetWorkerGroupDesiredReplicas`): replicas,
    at least minReplicas and at most maxReplicas (maxReplicas if they cross), times
    numOfHosts; none while the group is suspended."""
    if suspended:
        return 0
    bounded = (
        max_replicas
        if min_replicas > max_replicas
        else min(max(replicas, min_replicas), max_replicas)
    )
    return bounded * hosts


# Makes the caller's own error for a field of a document that breaks a rule, from the
# field's path and the rule (the simulator's ManifestError, the importer's ImportInputError).
Fail = Callable[[str, str], Exception]


@dataclass(frozen=True)
class PodSpecAt:
    """A pod template's spec and its path in the document, for errors about it."""

    path: str
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class LeaderWorkerSetSpec:
    """What a LeaderWorkerSet document asks for: `replicas` groups of `size` pods (its
    leader and `size - 1` workers), the pod spec of each, and whether it is annotated
    degradable (disruption mode single)."""

    replicas: int
    size: int
    degradable: bool
    leader: PodSpecAt  # the worker template's when it has no leaderTemplate
    workers: PodSpecAt


def _whole(value: object, path: str, fail: Fail) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(path, f"must be a whole number (got {value!r})")
    return value


def spec_of(doc: Mapping[str, Any], fail: Fail) -> Mapping[str, Any]:
    """A document's `spec` (required)."""
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise fail("spec", "required field is missing")
    return spec


def replicas_of(spec: Mapping[str, Any], fail: Fail) -> int:
    """`spec.replicas` of a Deployment, StatefulSet or LeaderWorkerSet: 1 when unset (as the
    API server defaults it), never negative."""
    count = _whole(spec.get("replicas"), "spec.replicas", fail)
    if count is not None and count < 0:
        raise fail("spec.replicas", f"{count}: replicas must not be negative")
    return 1 if count is None else count


def pod_spec_at(template: object, path: str, fail: Fail) -> PodSpecAt:
    """The pod spec of the pod template at `path` (required)."""
    spec = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(spec, Mapping):
        raise fail(f"{path}.spec", "required: the pod spec")
    return PodSpecAt(f"{path}.spec", spec)


def disruption_single(annotations: Mapping[str, Any], fail: Fail) -> bool:
    """Whether an object is annotated degradable (`muster.dev/disruption-mode`, "single" or
    "all" in any case, "all" when unset)."""
    value = str(annotations.get(DISRUPTION_MODE_ANNOTATION) or "all").lower()
    if value not in ("single", "all"):
        raise fail(
            f"metadata.annotations[{DISRUPTION_MODE_ANNOTATION}]",
            f'must be "single" or "all" (got {value!r})',
        )
    return value == "single"


def degradable_lws(lwt: Mapping[str, Any], annotations: Mapping[str, Any], fail: Fail) -> bool:
    """Whether a LeaderWorkerSet (its `spec.leaderWorkerTemplate`) is degradable: annotated
    `single`, which needs `restartPolicy: None` (LWS's older name for it: Default), since with
    RecreateGroupOnPodRestart one lost worker restarts the whole group."""
    if not disruption_single(annotations, fail):
        return False
    if lwt.get("restartPolicy") not in ("None", "Default"):
        raise fail(
            f"metadata.annotations[{DISRUPTION_MODE_ANNOTATION}]",
            "single needs spec.leaderWorkerTemplate.restartPolicy None (with "
            "RecreateGroupOnPodRestart a lost worker restarts the whole group)",
        )
    return True


def leader_worker_set(doc: Mapping[str, Any], fail: Fail) -> LeaderWorkerSetSpec:
    """The fields of a LeaderWorkerSet document (leaderworkerset.x-k8s.io/v1) Muster reads:
    replicas and size (1 when unset, as LeaderWorkerSet defaults them), the disruption-mode
    annotation, and the leader's and workers' pod specs. `fail(path, rule)` makes the error
    raised for a field that breaks a rule."""
    spec = spec_of(doc, fail)
    path = "spec.leaderWorkerTemplate"
    lwt = spec.get("leaderWorkerTemplate")
    if not isinstance(lwt, Mapping):
        raise fail(path, "required field is missing")
    size = _whole(lwt.get("size"), f"{path}.size", fail)
    size = 1 if size is None else size
    if size < 1:
        raise fail(f"{path}.size", f"{size}: a group has at least one pod")
    workers = pod_spec_at(lwt.get("workerTemplate"), f"{path}.workerTemplate", fail)
    leader = lwt.get("leaderTemplate")
    meta = doc.get("metadata")
    annotations = (meta.get("annotations") if isinstance(meta, Mapping) else None) or {}
    if not isinstance(annotations, Mapping):
        raise fail("metadata.annotations", f"must be a mapping (got {annotations!r})")
    return LeaderWorkerSetSpec(
        replicas=replicas_of(spec, fail),
        size=size,
        degradable=degradable_lws(lwt, annotations, fail),
        leader=workers if leader is None else pod_spec_at(leader, f"{path}.leaderTemplate", fail),
        workers=workers,
    )
