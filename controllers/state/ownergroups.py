"""Which group a queued pod belongs to, read off the pod alone, so that the caches can index
pods by it (`controllers.state.caches.job_uid_of_pod`, as `foreigngroups` does for foreign
PodGroups) and a Workload finds its pods.

A pod is grouped here when it carries the queue label, belongs to no Job-like object Muster
queues (no owner or Job uid label) and names no foreign PodGroup. Its group, in order:

- a LeaderWorkerSet's pods (its labels name the set and the group index): one group per
  replica, a leader and `size - 1` workers, placed whole (`LWS_*` below, as the LWS
  controller writes them on every pod);
- pods with `muster.dev/pod-group` (as Kueue's pod groups): that group, of the total count
  their `muster.dev/pod-group-total-count` annotation gives;
- a Deployment's pods (a ReplicaSet named `<deployment>-<pod-template-hash>` controls them):
  the Deployment, across its rollouts;
- any other controller (a StatefulSet, a custom operator's object): that controller, the top
  owner for every kind that creates its pods itself (a chain through a kind Muster does not
  know is not followed: its pods are grouped by the object that made them);
- a bare pod: itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controllers.state.foreigngroups import group_of_pod
from quota.api.names import (
    JOB_UID_POD_LABEL,
    OWNER_UID_POD_LABEL,
    POD_GROUP_LABEL,
    QUEUE_LABEL,
)
from quota.model.serving import LEADER, MAIN, WORKERS

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
# The ReplicaSets of a Deployment, and the label that names each one's template.
TEMPLATE_HASH_LABEL = "pod-template-hash"
DEPLOYMENT_API = "apps/v1"
# A group made by the pod-group label has no object of its own.
POD_GROUP_KIND = "PodGroupLabel"
# Every group id starts so: never a uid's shape, nor a foreign PodGroup's id.
PREFIX = "owner."


@dataclass(frozen=True)
class OwnerGroup:
    """The group a pod belongs to. `uid` is the owner's where the pod names it (a controller
    reference to the owner itself); `index` tells a LeaderWorkerSet's groups apart."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""
    index: str = ""

    @property
    def gid(self) -> str:
        """The id the caches index the group's pods and Workloads by."""
        group = self.api_version.rpartition("/")[0] or "core"
        tail = f"#{self.index}" if self.index else ""
        return f"{PREFIX}{group}/{self.kind}:{self.namespace}/{self.name}{tail}"

    @property
    def is_lws(self) -> bool:
        return self.kind == LWS_KIND

    @property
    def subject(self) -> str:
        """How messages name it."""
        if self.is_lws:
            return f"LeaderWorkerSet {self.namespace}/{self.name} group {self.index}"
        if self.kind == POD_GROUP_KIND:
            return f"pod group {self.namespace}/{self.name} ({POD_GROUP_LABEL})"
        return f"{self.kind} {self.namespace}/{self.name}"


def is_grouped(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is queued by its group here (see the module's docstring)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not labels.get(QUEUE_LABEL):
        return False
    if any(k in labels for k in (OWNER_UID_POD_LABEL, JOB_UID_POD_LABEL, "controller-uid")):
        return False
    return group_of_pod(pod) is None


def _controller(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = meta.get("ownerReferences") or []
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None)


def group_of(pod: Mapping[str, Any]) -> OwnerGroup | None:
    """The group of a queued pod (None if the pod is not one, `is_grouped`)."""
    if not is_grouped(pod):
        return None
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    namespace = str(meta.get("namespace") or "")
    if labels.get(LWS_NAME_LABEL) and labels.get(LWS_GROUP_INDEX_LABEL) is not None:
        return OwnerGroup(
            LWS_API,
            LWS_KIND,
            namespace,
            str(labels[LWS_NAME_LABEL]),
            index=str(labels[LWS_GROUP_INDEX_LABEL]),
        )
    if labels.get(POD_GROUP_LABEL):
        return OwnerGroup("", POD_GROUP_KIND, namespace, str(labels[POD_GROUP_LABEL]))
    ref = _controller(meta)
    if ref is None:
        return OwnerGroup(
            "v1", "Pod", namespace, str(meta.get("name") or ""), str(meta.get("uid") or "")
        )
    name = str(ref.get("name") or "")
    template_hash = labels.get(TEMPLATE_HASH_LABEL)
    if ref.get("kind") == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
        return OwnerGroup(DEPLOYMENT_API, "Deployment", namespace, name[: -len(template_hash) - 1])
    return OwnerGroup(
        str(ref.get("apiVersion") or ""),
        str(ref.get("kind") or ""),
        namespace,
        name,
        str(ref.get("uid") or ""),
    )


def gid_of(pod: Mapping[str, Any]) -> str | None:
    group = group_of(pod)
    return group.gid if group is not None else None


def pod_set_of(pod: Mapping[str, Any], group: OwnerGroup) -> str:
    """The Workload pod set of a grouped pod: a LeaderWorkerSet's leader or workers, else
    the one pod set."""
    if group.is_lws:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return LEADER if str(labels.get(LWS_WORKER_INDEX_LABEL, "0")) == "0" else WORKERS
    return MAIN


@dataclass(frozen=True)
class OwnerKind:
    """A kind whose pods are queued by their owner and whose labelled objects carry the
    queue label into their pod templates at admission (so that their pods are gated)."""

    api_group: str
    version: str
    resource: str
    # JSON pointers of its pod templates; the optional ones only where the object has them.
    templates: tuple[str, ...]
    optional: tuple[str, ...] = ()

    def rule(self) -> dict[str, list[str]]:
        return {
            "apiGroups": [self.api_group],
            "apiVersions": [self.version],
            "resources": [self.resource],
        }


OWNER_KINDS = (
    OwnerKind("apps", "v1", "deployments", ("/spec/template",)),
    OwnerKind("apps", "v1", "statefulsets", ("/spec/template",)),
    OwnerKind(
        "leaderworkerset.x-k8s.io",
        "v1",
        "leaderworkersets",
        ("/spec/leaderWorkerTemplate/workerTemplate",),
        optional=("/spec/leaderWorkerTemplate/leaderTemplate",),
    ),
)
