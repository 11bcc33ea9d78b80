"""Which foreign PodGroup a pod or a Workload belongs to: Volcano's
(`scheduling.volcano.sh/v1beta1`) or the native one (`scheduling.k8s.io/v1beta1`).

Muster admits such a group as one Workload owned by the PodGroup (`controllers/podgroups`).
Everything that follows a Workload to its pods (the pod index of the caches, the admission
view, the scheduler loop) knows a Job's pods by the Job's uid; a foreign group's pods carry
no uid of their group, only its name, so the group's id is made of its API group, namespace
and name, which both the pod and the Workload's owner reference can spell. Defined here, in
one place, because the caches index by it and the intake writes Workloads with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_API = f"{VOLCANO_GROUP}/v1beta1"
NATIVE_GROUP = "scheduling.k8s.io"
NATIVE_API = f"{NATIVE_GROUP}/v1beta1"
FOREIGN_APIS = (VOLCANO_API, NATIVE_API)

# On a pod: the Volcano PodGroup it belongs to (Volcano's KubeGroupNameAnnotationKey, which
# Kubeflow Trainer sets, and its own spelling VolcanoGroupNameAnnotationKey).
VOLCANO_POD_GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
# On a Volcano PodGroup (or written there by Trainer as spec.queue): the Volcano queue.
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"


def group_id(api_group: str, namespace: str, name: str) -> str:
    """The id a foreign group's pods and Workload are indexed by (never a uid's shape)."""
    return f"podgroup.{api_group}:{namespace}/{name}"


def group_of_pod(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(api group, name) of the foreign PodGroup the pod names: the native
    spec.schedulingGroup first (the apiserver validates it), then Volcano's annotations."""
    spec = pod.get("spec") or {}
    native = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if native:
        return NATIVE_GROUP, str(native)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    for key in VOLCANO_POD_GROUP_ANNOTATIONS:
        if annotations.get(key):
            return VOLCANO_GROUP, str(annotations[key])
    return None


def group_id_of_pod(pod: Mapping[str, Any]) -> str | None:
    found = group_of_pod(pod)
    if found is None:
        return None
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    return group_id(found[0], namespace, found[1])


def is_foreign_group(ref: Mapping[str, Any]) -> bool:
    """Whether an owner reference names a foreign PodGroup."""
    return ref.get("kind") == "PodGroup" and ref.get("apiVersion") in FOREIGN_APIS


def foreign_owner(wl: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference of a Workload made for a foreign PodGroup, or None."""
    refs = (wl.get("metadata") or {}).get("ownerReferences") or []
    return next((dict(r) for r in refs if is_foreign_group(r)), None)


def group_id_of_workload(wl: Mapping[str, Any]) -> str | None:
    ref = foreign_owner(wl)
    if ref is None:
        return None
    namespace = str((wl.get("metadata") or {}).get("namespace") or "")
    return group_id(str(ref["apiVersion"]).split("/", 1)[0], namespace, str(ref.get("name")))


def parse_group_id(gid: str) -> tuple[str, str, str]:
    """(api group, namespace, name) of an id made by `group_id`."""
    head, _, key = gid.partition(":")
    namespace, _, name = key.partition("/")
    return head.removeprefix("podgroup."), namespace, name
