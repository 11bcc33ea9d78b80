"""Kubeflow TrainJob (trainer.kubeflow.org/v1alpha1) behind the workload seam
(`controllers.jobs.framework`).

The Trainer runs a TrainJob as a JobSet built from its runtime (a ClusterTrainingRuntime or
TrainingRuntime) with the TrainJob's values put in. Muster reads the same runtime: the
Workload has one pod set per replicated job of the runtime (its "role": dataset and model
initializers, the trainer nodes, a launcher), where the trainer step (label
`trainer.kubeflow.org/trainjob-ancestor-step: trainer`) runs `spec.trainer.numNodes` pods
(else the runtime's `mlPolicy.numNodes`, else 1) with `spec.trainer.resourcesPerNode`
in place of the runtime's resources for its `node` container, as the Trainer builds it.

Suspend-based: created suspended (the webhook), admitted whole, and run by adding a runtime
patch of Muster's own (while it stays suspended, as the Trainer requires; unsuspended by the
next write) (`spec.runtimePatches`, manager `muster.dev/muster`) that merges the
flavors' node labels and tolerations into every role's pod template and labels the pods
with the TrainJob's uid (so that Muster's pod webhook hands them to its scheduler and the
scheduler finds them), then unsuspending. Eviction suspends it; once its pods are gone the
patch is taken out again. Not elastic: a TrainJob's size cannot change while it runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controllers.jobs.framework import GenericJob, Integration, put_flavors, register
from controllers.jobs.jobset import ReplicatedJobs, first_started, pod_spec_of, workload_spec_of
from controllers.runtime.resources import Kind, Obj
from controllers.state.caches import Caches
from quota.api import ManifestError
from quota.api.names import OWNER_UID_POD_LABEL
from quota.api.topology import ForeignTopologyError, network_topology_request

GROUP = "trainer.kubeflow.org"
API_VERSION = f"{GROUP}/v1alpha1"
TRAINJOB = Kind("TrainJob", True, group=GROUP, version="v1alpha1", plural="trainjobs")
CLUSTER_RUNTIME = Kind(
    "ClusterTrainingRuntime",
    False,
    group=GROUP,
    version="v1alpha1",
    plural="clustertrainingruntimes",
)
RUNTIME = Kind("TrainingRuntime", True, group=GROUP, version="v1alpha1", plural="trainingruntimes")

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_STEP = "trainer"
NODE_CONTAINER = "node"
# The `manager` of Muster's entry in spec.runtimePatches (one entry per manager).
PATCH_MANAGER = "muster.dev/muster"

# (kind name, "ns/name" or "name") -> the runtime object, or None if it does not exist.
RuntimeLookup = Callable[[str, str], Obj | None]


def _copy(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def runtime_of(trainjob: Mapping[str, Any], lookup: RuntimeLookup) -> Obj:
    """The runtime the TrainJob names; ValueError naming the field if it does not exist."""
    meta = trainjob.get("metadata") or {}
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    kind = str(ref.get("kind") or CLUSTER_RUNTIME.name)
    name = str(ref.get("name") or "")
    key = name if kind == CLUSTER_RUNTIME.name else f"{meta.get('namespace')}/{name}"
    found = lookup(kind, key) if name else None
    if found is None:
        subject = f"TrainJob {meta.get('namespace')}/{meta.get('name')}"
        raise ManifestError(0, subject, [("spec.runtimeRef", f"{kind} {name!r} does not exist")])
    return found


def replicated_jobs(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> list[Obj]:
    """The runtime's replicated jobs as the Trainer runs them for this TrainJob: the trainer
    step with its node count (replicas 1, parallelism = completions = nodes), the TrainJob's
    resources per node, and the pod-template annotations of its users' runtime patches."""
    spec = runtime.get("spec") or {}
    jobs: list[Obj] = _copy(
        ((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    )
    trainer = (trainjob.get("spec") or {}).get("trainer") or {}
    nodes = trainer.get("numNodes") or (spec.get("mlPolicy") or {}).get("numNodes") or 1
    for rj in jobs:
        labels = ((rj.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(ANCESTOR_LABEL) != TRAINER_STEP:
            continue
        rj["replicas"] = 1
        job_spec = rj.setdefault("template", {}).setdefault("spec", {})
        job_spec["parallelism"] = job_spec["completions"] = int(nodes)
        resources = trainer.get("resourcesPerNode")
        if resources:
            for container in pod_spec_of(rj).get("containers") or []:
                if container.get("name") == NODE_CONTAINER:
                    container["resources"] = _copy(resources)
    _patch_annotations(trainjob, jobs)
    return jobs


def _patch_annotations(trainjob: Mapping[str, Any], jobs: list[Obj]) -> None:
    """Merge the pod-template annotations the TrainJob's own runtime patches set (in their
    order, a later one winning, as the Trainer applies them) into `jobs`: a TrainJob's user
    asks for topology there (`muster.dev/podset-*-topology`), since the runtime is shared."""
    by_name = {str(rj.get("name")): rj for rj in jobs}
    for patch in (trainjob.get("spec") or {}).get("runtimePatches") or []:
        if patch.get("manager") == PATCH_MANAGER:
            continue
        template = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")
        for rjp in (template or {}).get("replicatedJobs") or []:
            pod = (((rjp.get("template") or {}).get("spec") or {}).get("template")) or {}
            annotations = (pod.get("metadata") or {}).get("annotations")
            rj = by_name.get(str(rjp.get("name")))
            if not annotations or rj is None:
                continue
            job_spec = rj.setdefault("template", {}).setdefault("spec", {})
            meta = job_spec.setdefault("template", {}).setdefault("metadata", {})
            meta["annotations"] = {**(meta.get("annotations") or {}), **_copy(annotations)}


def network_topology(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> Obj:
    """The runtime's Volcano `podGroupPolicy.volcano.networkTopology` as a topologyRequest
    (the rule the PodGroup intake follows), which the Trainer would put on the PodGroup it
    makes: with the TrainJob queued by Muster, its own Workload stands for that PodGroup, so
    the constraint comes here rather than be dropped. Each role (pod set) without a request
    of its own is kept to it; roles are not kept together."""
    policy = ((runtime.get("spec") or {}).get("podGroupPolicy") or {}).get("volcano") or {}
    network = policy.get("networkTopology")
    if network is None:
        return {}
    try:
        return network_topology_request(network)
    except ForeignTopologyError as error:
        meta = trainjob.get("metadata") or {}
        name = (runtime.get("metadata") or {}).get("name")
        raise ManifestError(
            0,
            f"TrainJob {meta.get('namespace')}/{meta.get('name')}",
            [
                (
                    f"spec.runtimeRef ({name}: spec.podGroupPolicy.volcano.networkTopology"
                    f"{error.path})",
                    error.rule,
                )
            ],
        ) from None


def muster_patch(uid: str, names: Sequence[str], flavors: Sequence[Mapping[str, Any]]) -> Obj:
    """Muster's runtime patch: the flavors' node labels and tolerations on every role's pods,
    and the owner label its pod webhook and scheduler find them by."""
    pod_spec: Obj = {}
    put_flavors(pod_spec, {}, flavors)
    template: Obj = {"metadata": {"labels": {OWNER_UID_POD_LABEL: uid}}}
    if pod_spec:
        template["spec"] = pod_spec
    return {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": name, "template": {"spec": {"template": _copy(template)}}}
                        for name in names
                    ]
                }
            }
        },
    }


class TrainJob(ReplicatedJobs):
    """A TrainJob seen as a `GenericJob`, reading its runtime through `lookup`."""

    what = "TrainJob"
    jobs_status = "jobsStatus"

    def __init__(self, obj: Obj, lookup: RuntimeLookup) -> None:
        super().__init__(obj)
        self._lookup = lookup

    def _jobs(self) -> list[Obj]:
        return replicated_jobs(self._obj, runtime_of(self._obj, self._lookup))

    def run_with(self, flavors: Sequence[Mapping[str, Any]], granted: Mapping[str, int]) -> None:
        # Two writes: the Trainer accepts a change of runtimePatches only on a TrainJob that
        # stays suspended, so the first call writes the patch and the second (the reconcile
        # that the first write's event brings) unsuspends.
        names = [str(rj.get("name")) for rj in self._jobs()]
        spec = self._obj.setdefault("spec", {})
        want = muster_patch(str(self._obj["metadata"]["uid"]), names, flavors)
        patches = spec.get("runtimePatches") or []
        have = next((p for p in patches if p.get("manager") == PATCH_MANAGER), None)
        if have is not None and {k: v for k, v in have.items() if k != "time"} == want:
            spec["suspend"] = False
            return
        spec["runtimePatches"] = [p for p in patches if p.get("manager") != PATCH_MANAGER] + [want]

    def restore(self) -> bool:
        spec = self._obj.get("spec") or {}
        patches = spec.get("runtimePatches") or []
        kept = [p for p in patches if p.get("manager") != PATCH_MANAGER]
        if len(kept) == len(patches):
            return False
        if kept:
            spec["runtimePatches"] = kept
        else:
            spec.pop("runtimePatches", None)
        return True

    def workload_spec(self, priorities: Mapping[str, int], *, global_default: str | None) -> Obj:
        spec = workload_spec_of(
            self._obj,
            self._jobs(),
            priorities,
            global_default=global_default,
            where="spec.runtimeRef (its replicatedJobs, with spec.runtimePatches)",
        )
        asked = network_topology(self._obj, runtime_of(self._obj, self._lookup))
        if asked:
            for pod_set in spec["podSets"]:
                pod_set.setdefault("topologyRequest", dict(asked))
        return spec

    def first_pod_sets(self) -> list[str] | None:
        # Initializers before the trainer nodes, as the runtime's dependsOn says.
        runtime = runtime_of(self._obj, self._lookup)
        template = ((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}
        return first_started(template, self._jobs())


def _unbound(obj: Obj) -> GenericJob:
    # Without the caches (the webhook): no runtime is known.
    return TrainJob(obj, lambda kind, key: None)


def _bind(caches: Caches) -> Callable[[Obj], GenericJob]:
    def lookup(kind: str, key: str) -> Obj | None:
        informer = caches.extra_of(CLUSTER_RUNTIME if kind == CLUSTER_RUNTIME.name else RUNTIME)
        return informer.get(key) if informer is not None else None

    return lambda obj: TrainJob(obj, lookup)


TRAINJOB_INTEGRATION = register(
    Integration(API_VERSION, TRAINJOB, _unbound, bind=_bind, reads=(CLUSTER_RUNTIME, RUNTIME))
)
