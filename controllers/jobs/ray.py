"""Ray (ray.io/v1 RayCluster and RayJob, run by KubeRay) behind the workload seam
(`controllers.jobs.framework`).

A labelled RayCluster becomes one Workload: pod set `head` (1 pod) and one pod set per worker
group, named after its `groupName`, of the pods KubeRay runs for it (its `replicas` bounded
by `minReplicas`/`maxReplicas` as KubeRay bounds them, times `numOfHosts`; a suspended group
runs none and asks for nothing). It is admitted whole, all pod sets one gang. Suspend-based:
created suspended (Muster's generic rule), unsuspended on admission with the flavors' node
labels and tolerations merged into the head's and every worker group's pod template (the
user's kept in an annotation and put back once the pods are gone), and each template
labelled with the owner's uid and its pod set (so that Muster's scheduler takes its pods and
tells the head from the workers). Eviction suspends it: KubeRay deletes its pods. A
RayCluster never finishes by itself: its quota is released when it is deleted.

A RayJob's Workload has the pod sets of its `spec.rayClusterSpec`, plus `submitter` (1 pod)
in K8sJobMode (the default), where KubeRay runs the submission as a Kubernetes Job once the
cluster is up: that pod comes after the cluster's (`first_pod_sets`), with the requests of
`spec.submitterPodTemplate`, else of KubeRay's default submitter container. On admission the
flavors and labels are written into spec.rayClusterSpec (KubeRay copies it into the
RayCluster it creates, owned by the RayJob, which Muster then leaves alone:
`framework.child_of_managed_kind`) and, in K8sJobMode, into the submitter template (KubeRay's
default one written out when the user gave none, taken out again on restore). In SidecarMode
the submitter is a container KubeRay adds to the head: its requests count on the head. The
Workload finishes when `status.jobDeploymentStatus` is Complete or Failed (KubeRay deletes
the cluster with `shutdownAfterJobFinishes`).

An elastic RayCluster (annotated `muster.dev/elastic-job: "true"`, or autoscaled by Ray:
`spec.enableInTreeAutoscaling: true`) resizes through WorkloadSlices, as an elastic Job
does (`controllers.jobs.slices`): its worker groups are the pod sets that scale. On
admission their templates get the admission gate and the elastic pod label, so every worker
KubeRay makes waits gated until a slice grants it; a scale-up of any group (by its user or
Ray's autoscaler) asks for a slice of the whole new size, whose extra pods wait gated
until it is admitted, and a scale-down shrinks the admission in place. The cluster is
never restarted for a resize.

Otherwise not elastic: a worker group resized while running beyond what was admitted is
evicted and queued again at its new size, as a JobSet is; shrinking keeps running inside
the admitted quota. A RayJob is never elastic (its cluster is KubeRay's to make).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controllers.jobs import gates
from controllers.jobs.framework import Integration, SuspendedObject, register
from controllers.jobs.jobset import inject_flavors, restore_templates, workload_spec_of
from controllers.runtime.resources import Kind, Obj
from quota.api import ManifestError
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import (
    ELASTIC_ANNOTATION,
    ELASTIC_POD_LABEL,
    OWNER_UID_POD_LABEL,
    POD_SET_POD_LABEL,
)
from quota.model.serving import RAY_MAX_REPLICAS, ray_worker_pods

GROUP = "ray.io"
API_VERSION = f"{GROUP}/v1"
RAYCLUSTER = Kind("RayCluster", True, group=GROUP, version="v1", plural="rayclusters")
RAYJOB = Kind("RayJob", True, group=GROUP, version="v1", plural="rayjobs")

HEAD = "head"
SUBMITTER = "submitter"
K8S_JOB_MODE = "K8sJobMode"
SIDECAR_MODE = "SidecarMode"
# KubeRay's default submitter container (common.GetDefaultSubmitterContainer), which runs in
# the submitter Job's pod (K8sJobMode) or beside the head (SidecarMode).
SUBMITTER_CONTAINER = "ray-job-submitter"
SUBMITTER_RESOURCES = {
    "limits": {"cpu": "1", "memory": "1Gi"},
    "requests": {"cpu": "500m", "memory": "200Mi"},
}
# The container KubeRay adds to the head of an autoscaled cluster (BuildAutoscalerContainer),
# its resources replaced by spec.autoscalerOptions.resources when given.
AUTOSCALER_CONTAINER = "autoscaler"
AUTOSCALER_RESOURCES = {
    "limits": {"cpu": "500m", "memory": "512Mi"},
    "requests": {"cpu": "500m", "memory": "512Mi"},
}
# KubeRay's defaults for a worker group's bounds (CRD defaults).
# The status conditions KubeRay sets on a RayCluster once suspension deleted its pods.
SUSPENDED_CONDITION = "RayClusterSuspended"
FINISHED_DEPLOYMENT = {"Complete": WC.SUCCEEDED, "Failed": WC.FAILED}
# RayJob deployment states in which KubeRay runs no cluster nor submitter for it.
IDLE_DEPLOYMENT = {"", "New", "Suspended", "Complete", "Failed"}


def _subject(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')} {meta.get('namespace')}/{meta.get('name')}"


def _whole(obj: Mapping[str, Any], value: Any, field: str, default: int, least: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        rule = "a whole number" + (" of at least 1" if least else ", not negative")
        raise ManifestError(0, _subject(obj), [(field, f"must be {rule} (got {value!r})")])
    return value


@dataclass(frozen=True)
class Group:
    """The head or one worker group: its pod set, where it is written, its pods at once."""

    name: str
    field: str  # e.g. "spec.workerGroupSpecs[0]"
    spec: Obj  # the group's own dict in the object (for writing its template)
    pods: int

    @property
    def template(self) -> Obj:
        template: Obj = self.spec.setdefault("template", {})
        return template

    @property
    def pod_spec(self) -> Obj:
        spec: Obj = self.template.setdefault("spec", {})
        return spec


def worker_pods(obj: Mapping[str, Any], group: Mapping[str, Any], field: str) -> int:
    """Pods KubeRay runs for a worker group (`quota.model.serving.ray_worker_pods`), its
    fields checked."""
    return ray_worker_pods(
        _whole(obj, group.get("replicas"), f"{field}.replicas", 0),
        _whole(obj, group.get("minReplicas"), f"{field}.minReplicas", 0),
        _whole(obj, group.get("maxReplicas"), f"{field}.maxReplicas", RAY_MAX_REPLICAS),
        _whole(obj, group.get("numOfHosts"), f"{field}.numOfHosts", 1, least=1),
        bool(group.get("suspend")),
    )


def groups_of(obj: Mapping[str, Any], cluster: Obj, where: str) -> list[Group]:
    """The head and the worker groups of a RayClusterSpec (`cluster`, at field `where` of
    `obj`), validated; raises ManifestError naming the field."""

    def fail(field: str, rule: str) -> ManifestError:
        return ManifestError(0, _subject(obj), [(field, rule)])

    head = cluster.get("headGroupSpec")
    if not isinstance(head, dict) or not isinstance(head.get("template"), dict):
        raise fail(f"{where}.headGroupSpec.template", "required field is missing")
    found = [Group(HEAD, f"{where}.headGroupSpec", head, 1)]
    workers = cluster.get("workerGroupSpecs") or []
    if not isinstance(workers, list):
        raise fail(f"{where}.workerGroupSpecs", "must be a list of worker groups")
    for i, group in enumerate(workers):
        field = f"{where}.workerGroupSpecs[{i}]"
        if not isinstance(group, dict):
            raise fail(field, "must be a worker group (a mapping)")
        name = group.get("groupName")
        if not isinstance(name, str) or not name:
            raise fail(f"{field}.groupName", "required: it names the group's pod set")
        if name in {g.name for g in found} or name == SUBMITTER:
            raise fail(
                f"{field}.groupName",
                f"must be unique and not {HEAD!r} or {SUBMITTER!r} (got {name!r})",
            )
        if not isinstance(group.get("template"), dict):
            raise fail(f"{field}.template", "required field is missing")
        found.append(Group(name, field, group, worker_pods(obj, group, field)))
    return found


def label_templates(groups: Sequence[Group], uid: str) -> None:
    """Label each group's pods with the owner's uid (Muster's scheduler takes them) and their
    pod set (the scheduler loop tells the head from the workers by it)."""
    for group in groups:
        labels = group.template.setdefault("metadata", {}).setdefault("labels", {})
        labels[OWNER_UID_POD_LABEL] = uid
        labels[POD_SET_POD_LABEL] = group.name


def _copy(obj: Mapping[str, Any]) -> Obj:
    copy: Obj = json.loads(json.dumps(obj))
    return copy


class RayObject(SuspendedObject):
    """What RayCluster and RayJob share: their pod sets are a RayClusterSpec's groups (plus,
    for a RayJob, its submitter's)."""

    where = "spec"

    def _cluster(self, obj: Obj) -> Obj:
        """The RayClusterSpec inside `obj`."""
        spec: Obj = obj.setdefault("spec", {})
        return spec

    def _groups(self, obj: Obj) -> list[Group]:
        """Every pod set of `obj` (the wrapped object, or a copy of it)."""
        return groups_of(obj, self._cluster(obj), self.where)

    def _as_written(self) -> Obj:
        """A copy of the object with the user's templates (as before `run_with`), and the
        head as KubeRay runs it: with Ray's autoscaler beside it when it autoscales."""
        copy = _copy(self._obj)
        restore_templates(copy, {g.name: g.pod_spec for g in self._groups(copy)})
        cluster = self._cluster(copy)
        if cluster.get("enableInTreeAutoscaling"):
            head = cluster["headGroupSpec"]["template"].setdefault("spec", {})
            options = cluster.get("autoscalerOptions") or {}
            resources = options.get("resources") or _copy(AUTOSCALER_RESOURCES)
            container = {"name": AUTOSCALER_CONTAINER, "resources": resources}
            head.setdefault("containers", []).append(container)
        return copy

    def run_with(self, flavors: Sequence[Mapping[str, Any]], granted: Mapping[str, int]) -> None:
        groups = self._groups(self._obj)
        inject_flavors(self._obj, {g.name: g.pod_spec for g in groups}, flavors)
        label_templates(groups, str(self._obj["metadata"]["uid"]))
        self._obj["spec"]["suspend"] = False

    def restore(self) -> bool:
        groups = self._groups(self._obj)
        if not restore_templates(self._obj, {g.name: g.pod_spec for g in groups}):
            return False
        for group in groups:
            labels = (group.template.get("metadata") or {}).get("labels") or {}
            labels.pop(OWNER_UID_POD_LABEL, None)
            labels.pop(POD_SET_POD_LABEL, None)
        return True

    def workload_spec(self, priorities: Mapping[str, int], *, global_default: str | None) -> Obj:
        groups = [g for g in self._groups(self._as_written()) if g.pods]
        # Each group as a replicated job of `pods` pods whose Job runs its pod template, so
        # that it goes through the one Job -> Workload conversion.
        jobs = [
            {"name": g.name, "replicas": g.pods, "template": {"spec": {"template": g.template}}}
            for g in groups
        ]

        def at(i: int, path: str) -> str:
            return f"{groups[i].field}.{path.removeprefix('spec.')}" if path else groups[i].field

        return workload_spec_of(
            self._obj,
            jobs,
            priorities,
            global_default=global_default,
            where=self.where,
            at=at,
        )

    def pod_counts(self) -> dict[str, int]:
        return {g.name: g.pods for g in self._groups(_copy(self._obj))}

    def first_pod_sets(self) -> list[str] | None:
        return None


class RayCluster(RayObject):
    """A RayCluster seen as a `GenericJob`, elastic when it says so (see the module)."""

    def is_elastic(self) -> bool:
        meta = self._obj.get("metadata") or {}
        annotated = str((meta.get("annotations") or {}).get(ELASTIC_ANNOTATION, "")).lower()
        return annotated == "true" or bool(
            (self._obj.get("spec") or {}).get("enableInTreeAutoscaling")
        )

    def elastic_sizes(self) -> dict[str, int]:
        return {g.name: g.pods for g in self._groups(_copy(self._obj)) if g.name != HEAD}

    def run_with(self, flavors: Sequence[Mapping[str, Any]], granted: Mapping[str, int]) -> None:
        super().run_with(flavors, granted)
        if self.is_elastic():
            # Every worker KubeRay makes waits at the gate until a slice grants it.
            for group in self._groups(self._obj)[1:]:
                gates.hold_template(group.template)

    def restore(self) -> bool:
        restored = super().restore()
        for group in self._groups(self._obj)[1:]:
            labels = (group.template.get("metadata") or {}).get("labels") or {}
            if labels.pop(ELASTIC_POD_LABEL, None) is not None:
                restored = True
            restored |= gates.drop_gate(group.template)
        return restored

    def finished(self) -> tuple[str, str] | None:
        return None  # runs until deleted; deleting it releases its quota

    def pods_gone(self) -> bool:
        conditions = (self._obj.get("status") or {}).get("conditions") or []
        return any(
            c.get("type") == SUSPENDED_CONDITION and c.get("status") == "True" for c in conditions
        )


def default_submitter(cluster: Mapping[str, Any]) -> Obj:
    """KubeRay's submitter pod template when the RayJob names none (`GetSubmitterTemplate`):
    one container on the head's image with KubeRay's default resources (KubeRay fills in its
    command)."""
    head = ((cluster.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    containers = head.get("containers") or [{}]
    return {
        "spec": {
            "containers": [
                {
                    "name": SUBMITTER_CONTAINER,
                    "image": containers[0].get("image"),
                    "resources": _copy(SUBMITTER_RESOURCES),
                }
            ],
            "restartPolicy": "Never",
        }
    }


# Set on a RayJob whose submitter template Muster wrote out (KubeRay's default), so that
# restore takes it out again.
WROTE_SUBMITTER_ANNOTATION = "muster.dev/wrote-submitter-template"


class RayJob(RayObject):
    """A RayJob seen as a `GenericJob`: the RayClusterSpec it makes, and its submitter."""

    where = "spec.rayClusterSpec"

    def _mode(self, obj: Mapping[str, Any]) -> str:
        return str((obj.get("spec") or {}).get("submissionMode") or K8S_JOB_MODE)

    def _cluster(self, obj: Obj) -> Obj:
        spec = obj.get("spec") or {}
        cluster = spec.get("rayClusterSpec")
        if not isinstance(cluster, dict):
            rule = (
                "required: Muster queues a RayJob that makes its own RayCluster"
                " (one naming an existing cluster by spec.clusterSelector is not queued)"
            )
            raise ManifestError(0, _subject(obj), [("spec.rayClusterSpec", rule)])
        return cluster

    def _groups(self, obj: Obj) -> list[Group]:
        groups = super()._groups(obj)
        if self._mode(obj) != K8S_JOB_MODE:
            # SidecarMode: a container of the head (`_as_written` counts it there);
            # HTTPMode, InteractiveMode: submitted from outside, no pod.
            return groups
        spec = obj["spec"]
        template = spec.get("submitterPodTemplate")
        if not isinstance(template, dict):
            # A view only, never written into the object (see `run_with`).
            template = default_submitter(self._cluster(obj))
        holder = {"template": template}
        return [*groups, Group(SUBMITTER, "spec.submitterPodTemplate", holder, 1)]

    def _as_written(self) -> Obj:
        copy = super()._as_written()
        spec = copy["spec"]
        annotations = (copy.get("metadata") or {}).get("annotations") or {}
        if annotations.get(WROTE_SUBMITTER_ANNOTATION):
            spec.pop("submitterPodTemplate", None)
        if self._mode(copy) == SIDECAR_MODE:
            head = self._cluster(copy)["headGroupSpec"]["template"].setdefault("spec", {})
            sidecar = {"name": SUBMITTER_CONTAINER, "resources": _copy(SUBMITTER_RESOURCES)}
            head.setdefault("containers", []).append(sidecar)
        return copy

    def workload_spec(self, priorities: Mapping[str, int], *, global_default: str | None) -> Obj:
        if not (self._obj.get("spec") or {}).get("shutdownAfterJobFinishes"):
            rule = (
                "must be true for a queued RayJob: KubeRay suspends (and so queues) only a"
                " RayJob whose cluster goes when it finishes"
            )
            raise ManifestError(0, _subject(self._obj), [("spec.shutdownAfterJobFinishes", rule)])
        return super().workload_spec(priorities, global_default=global_default)

    def run_with(self, flavors: Sequence[Mapping[str, Any]], granted: Mapping[str, int]) -> None:
        spec = self._obj.setdefault("spec", {})
        if self._mode(self._obj) == K8S_JOB_MODE and not isinstance(
            spec.get("submitterPodTemplate"), dict
        ):
            # Written out so that its pod carries Muster's labels and the flavors too.
            spec["submitterPodTemplate"] = default_submitter(self._cluster(self._obj))
            meta = self._obj.setdefault("metadata", {})
            meta.setdefault("annotations", {})[WROTE_SUBMITTER_ANNOTATION] = "true"
        super().run_with(flavors, granted)

    def restore(self) -> bool:
        restored = super().restore()
        annotations = (self._obj.get("metadata") or {}).get("annotations") or {}
        if annotations.pop(WROTE_SUBMITTER_ANNOTATION, None):
            self._obj["spec"].pop("submitterPodTemplate", None)
            restored = True
        return restored

    def first_pod_sets(self) -> list[str] | None:
        # KubeRay starts the submitter once the cluster is up.
        names = [g.name for g in self._groups(_copy(self._obj)) if g.pods]
        return [n for n in names if n != SUBMITTER] if SUBMITTER in names else None

    def finished(self) -> tuple[str, str] | None:
        status = self._obj.get("status") or {}
        reason = FINISHED_DEPLOYMENT.get(str(status.get("jobDeploymentStatus") or ""))
        if reason is None:
            return None
        detail = status.get("message") or status.get("jobStatus") or ""
        what = "completed" if reason == WC.SUCCEEDED else "failed"
        return reason, f"the RayJob {what}{': ' + detail if detail else ''}"

    def pods_gone(self) -> bool:
        status = self._obj.get("status") or {}
        return str(status.get("jobDeploymentStatus") or "") in IDLE_DEPLOYMENT


def _cluster_of_pod(pod: Obj) -> str | None:
    """The RayCluster a (gated, elastic) worker pod belongs to, by KubeRay's label."""
    meta = pod.get("metadata") or {}
    cluster = (meta.get("labels") or {}).get(CLUSTER_POD_LABEL)
    return f"{meta.get('namespace')}/{cluster}" if cluster else None


# Set by KubeRay on every pod of a cluster: the RayCluster's name.
CLUSTER_POD_LABEL = "ray.io/cluster"

RAYCLUSTER_INTEGRATION = register(
    Integration(API_VERSION, RAYCLUSTER, RayCluster, elastic=True, owner_of_pod=_cluster_of_pod)
)
RAYJOB_INTEGRATION = register(Integration(API_VERSION, RAYJOB, RayJob))
