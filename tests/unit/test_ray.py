"""Ray behind the workload seam: the Workload a RayCluster or RayJob asks for (head, worker
groups sized as KubeRay sizes them, a RayJob's submitter), running on its flavors and
restored afterwards, when it finishes, and which bad input is refused naming the field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from controllers.jobs import ray
from controllers.jobs.framework import queue_of
from controllers.webhooks import decisions
from quota.api import ManifestError
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import (
    ADMISSION_GATE,
    ELASTIC_ANNOTATION,
    ELASTIC_POD_LABEL,
    ORIGINAL_SCHEDULING_ANNOTATION,
    OWNER_UID_POD_LABEL,
    POD_SET_POD_LABEL,
    QUEUE_LABEL,
)
from quota.api.quantity import parse_quantity

FLAVOR = {
    "metadata": {"name": "gpu"},
    "spec": {
        "nodeLabels": {"pool": "gpu"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def template(cpu: str, **spec: Any) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [
                {"name": "ray", "image": "ray", "resources": {"requests": {"cpu": cpu}}}
            ],
            **spec,
        }
    }


def cluster_spec() -> dict[str, Any]:
    return {
        "headGroupSpec": {"rayStartParams": {}, "template": template("2")},
        "workerGroupSpecs": [
            {"groupName": "small", "replicas": 2, "template": template("1")},
            {
                "groupName": "tpu",
                "replicas": 5,
                "minReplicas": 1,
                "maxReplicas": 3,  # KubeRay runs at most 3 replicas...
                "numOfHosts": 2,  # ...of 2 pods each
                "template": template("4", nodeSelector={"zone": "a"}),
            },
        ],
    }


def raycluster(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": "rc",
            "namespace": "ns",
            "uid": "uid-rc",
            "labels": {QUEUE_LABEL: "team"},
        },
        "spec": {"suspend": True, **cluster_spec(), **spec},
    }


def rayjob(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": "rj",
            "namespace": "ns",
            "uid": "uid-rj",
            "labels": {QUEUE_LABEL: "team"},
        },
        "spec": {
            "suspend": True,
            "shutdownAfterJobFinishes": True,
            "entrypoint": "python run.py",
            "rayClusterSpec": cluster_spec(),
            **spec,
        },
    }


def pod_sets(obj: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    job = ray.RAYCLUSTER_INTEGRATION.wrap(obj) if obj["kind"] == "RayCluster" else None
    job = job or ray.RAYJOB_INTEGRATION.wrap(obj)
    spec = job.workload_spec({}, global_default=None)
    return [(ps["name"], ps["count"], ps) for ps in spec["podSets"]]


def test_a_raycluster_asks_for_its_head_and_each_worker_group_as_kuberay_sizes_them() -> None:
    found = pod_sets(raycluster())
    assert [(name, count) for name, count, _ in found] == [("head", 1), ("small", 2), ("tpu", 6)]
    assert [ps["requests"] for _, _, ps in found] == [{"cpu": "2"}, {"cpu": "1"}, {"cpu": "4"}]
    assert found[2][2]["template"]["nodeSelector"] == {"zone": "a"}


def test_a_suspended_worker_group_asks_for_nothing() -> None:
    obj = raycluster()
    obj["spec"]["workerGroupSpecs"][0]["suspend"] = True
    assert [name for name, _, _ in pod_sets(obj)] == ["head", "tpu"]


def test_running_on_flavors_labels_every_group_and_restore_gives_back_what_the_user_wrote() -> None:
    obj = raycluster()
    written = copy.deepcopy(obj)
    job = ray.RayCluster(obj)
    before = job.workload_spec({}, global_default=None)

    job.run_with([FLAVOR], {"head": 1, "small": 2, "tpu": 6})
    assert obj["spec"]["suspend"] is False
    head = obj["spec"]["headGroupSpec"]["template"]
    tpu = obj["spec"]["workerGroupSpecs"][1]["template"]
    assert head["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert tpu["spec"]["nodeSelector"] == {"zone": "a", "pool": "gpu"}
    assert tpu["spec"]["tolerations"] == FLAVOR["spec"]["tolerations"]
    assert head["metadata"]["labels"] == {OWNER_UID_POD_LABEL: "uid-rc", POD_SET_POD_LABEL: "head"}
    assert tpu["metadata"]["labels"][POD_SET_POD_LABEL] == "tpu"
    saved = json.loads(obj["metadata"]["annotations"][ORIGINAL_SCHEDULING_ANNOTATION])
    assert saved["tpu"] == {"nodeSelector": {"zone": "a"}, "tolerations": []}
    # While it runs, the Workload it asks for is still the one its user wrote.
    assert job.workload_spec({}, global_default=None) == before

    # Evicted: suspended, and once its pods are gone the templates are the user's again.
    assert job.suspend()
    assert not job.pods_gone()
    obj["status"] = {"conditions": [{"type": "RayClusterSuspended", "status": "True"}]}
    assert job.pods_gone()
    assert job.restore()
    for group in [obj["spec"]["headGroupSpec"], *obj["spec"]["workerGroupSpecs"]]:
        assert group["template"].get("metadata", {}).get("labels", {}) == {}
        group["template"].pop("metadata", None)
    assert obj["metadata"]["annotations"] == {}
    obj["metadata"].pop("annotations")
    obj.pop("status")
    assert obj == written
    assert not job.restore()


@pytest.mark.parametrize("how", ["annotation", "autoscaling"])
def test_an_elastic_raycluster_gates_its_workers_and_scales_each_group(how: str) -> None:
    obj = raycluster()
    if how == "annotation":
        obj["metadata"]["annotations"] = {ELASTIC_ANNOTATION: "true"}
    else:
        obj["spec"]["enableInTreeAutoscaling"] = True
    written = copy.deepcopy(obj)
    job = ray.RayCluster(obj)
    assert job.is_elastic()
    assert job.elastic_sizes() == {"small": 2, "tpu": 6}  # the head never scales
    assert job.pods_selector() == f"{OWNER_UID_POD_LABEL}=uid-rc"

    job.run_with([FLAVOR], {"head": 1, "small": 2, "tpu": 6})
    head = obj["spec"]["headGroupSpec"]["template"]
    assert "schedulingGates" not in head["spec"]  # the head runs at once
    for group in obj["spec"]["workerGroupSpecs"]:
        spec, labels = group["template"]["spec"], group["template"]["metadata"]["labels"]
        assert spec["schedulingGates"] == [{"name": ADMISSION_GATE}]
        assert labels[ELASTIC_POD_LABEL] == "true"
    # What Ray's autoscaler does: a group's replicas change, and so does its size.
    obj["spec"]["workerGroupSpecs"][0]["replicas"] = 4
    assert job.elastic_sizes() == {"small": 4, "tpu": 6}

    obj["spec"]["workerGroupSpecs"][0]["replicas"] = 2
    job.suspend()
    assert job.restore()
    for group in [obj["spec"]["headGroupSpec"], *obj["spec"]["workerGroupSpecs"]]:
        assert group["template"].get("metadata", {}).get("labels", {}) == {}
        group["template"].pop("metadata", None)
    obj["metadata"]["annotations"].pop(ORIGINAL_SCHEDULING_ANNOTATION, None)
    if not obj["metadata"]["annotations"]:
        obj["metadata"].pop("annotations")
    assert obj == written


def test_a_plain_raycluster_is_not_elastic() -> None:
    assert not ray.RayCluster(raycluster()).is_elastic()


@pytest.mark.parametrize(
    ("options", "extra"),
    [(None, {"cpu": 0.5, "memory": 512 * 2**20}), ({"requests": {"cpu": "2"}}, {"cpu": 2})],
)
def test_an_autoscaled_head_asks_for_rays_autoscaler_beside_it(
    options: dict[str, Any] | None, extra: dict[str, float]
) -> None:
    obj = raycluster(enableInTreeAutoscaling=True)
    if options is not None:
        obj["spec"]["autoscalerOptions"] = {"resources": options}
    head = pod_sets(obj)[0][2]
    asked = {r: parse_quantity(v, r) for r, v in head["requests"].items()}
    want = {"cpu": 2 + extra["cpu"], **({"memory": extra["memory"]} if "memory" in extra else {})}
    assert asked == {r: parse_quantity(str(v), r) for r, v in want.items()}


def test_a_raycluster_never_finishes_by_itself() -> None:
    obj = raycluster()
    obj["status"] = {"state": "ready"}
    assert ray.RayCluster(obj).finished() is None


def test_a_rayjob_asks_for_its_cluster_and_its_submitter_which_comes_after() -> None:
    job = ray.RayJob(rayjob())
    found = pod_sets(job.object)
    assert [(name, count) for name, count, _ in found] == [
        ("head", 1),
        ("small", 2),
        ("tpu", 6),
        ("submitter", 1),
    ]
    # KubeRay's default submitter container (500m, 200Mi) unless the RayJob gives its own.
    assert found[3][2]["requests"] == {"cpu": "500m", "memory": "200Mi"}
    assert job.first_pod_sets() == ["head", "small", "tpu"]
    # In SidecarMode the submitter runs beside the head, counted there.
    sidecar = pod_sets(rayjob(submissionMode="SidecarMode"))
    assert [name for name, _, _ in sidecar] == ["head", "small", "tpu"]
    assert sidecar[0][2]["requests"] == {"cpu": "2500m", "memory": "200Mi"}
    assert ray.RayJob(rayjob(submissionMode="HTTPMode")).first_pod_sets() is None


def test_a_rayjob_runs_its_cluster_spec_and_submitter_on_the_flavors_and_restores_them() -> None:
    obj = rayjob()
    written = copy.deepcopy(obj)
    job = ray.RayJob(obj)
    before = job.workload_spec({}, global_default=None)
    job.run_with([FLAVOR], {})
    assert obj["spec"]["suspend"] is False
    cluster = obj["spec"]["rayClusterSpec"]
    labels = cluster["workerGroupSpecs"][0]["template"]["metadata"]["labels"]
    assert labels == {OWNER_UID_POD_LABEL: "uid-rj", POD_SET_POD_LABEL: "small"}
    submitter = obj["spec"]["submitterPodTemplate"]
    assert submitter["metadata"]["labels"][POD_SET_POD_LABEL] == "submitter"
    assert submitter["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert submitter["spec"]["containers"][0]["image"] == "ray"
    assert job.workload_spec({}, global_default=None) == before

    job.suspend()
    obj["status"] = {"jobDeploymentStatus": "Running"}
    assert not job.pods_gone()
    obj["status"] = {"jobDeploymentStatus": "Suspended"}
    assert job.pods_gone()
    assert job.restore()
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        group["template"].pop("metadata")
    obj["metadata"].pop("annotations")
    obj.pop("status")
    assert obj == written


def test_a_rayjob_finishes_with_its_deployment() -> None:
    obj = rayjob()
    job = ray.RayJob(obj)
    obj["status"] = {"jobDeploymentStatus": "Running"}
    assert job.finished() is None
    obj["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    assert job.finished() == (WC.SUCCEEDED, "the RayJob completed: SUCCEEDED")
    obj["status"] = {"jobDeploymentStatus": "Failed", "message": "entrypoint exited 1"}
    assert job.finished() == (WC.FAILED, "the RayJob failed: entrypoint exited 1")


def test_the_cluster_of_a_queued_rayjob_is_not_queued_again() -> None:
    # KubeRay copies the RayJob's labels, the queue label too, onto the RayCluster it makes.
    child = raycluster()
    child["metadata"]["ownerReferences"] = [
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "rj", "controller": True}
    ]
    assert queue_of(child, managed=False) is None
    assert queue_of(child, managed=True) is None
    # Nor created suspended by Muster's webhook: the RayJob's admission runs it.
    child["spec"]["suspend"] = False
    assert decisions.mutate_suspend(child) == []
    assert decisions.mutate_suspend(raycluster(suspend=False)) != []
    assert queue_of(raycluster(), managed=False) == "team"


@pytest.mark.parametrize(
    ("change", "field", "rule"),
    [
        (
            lambda s: s["workerGroupSpecs"][0].pop("groupName"),
            "spec.workerGroupSpecs[0].groupName",
            "required",
        ),
        (
            lambda s: s["workerGroupSpecs"][1].update(groupName="small"),
            "spec.workerGroupSpecs[1].groupName",
            "must be unique",
        ),
        (
            lambda s: s["workerGroupSpecs"][0].update(replicas=-1),
            "spec.workerGroupSpecs[0].replicas",
            "not negative (got -1)",
        ),
        (
            lambda s: s["workerGroupSpecs"][1].update(numOfHosts=0),
            "spec.workerGroupSpecs[1].numOfHosts",
            "at least 1",
        ),
        (lambda s: s.pop("headGroupSpec"), "spec.headGroupSpec.template", "required"),
        (
            lambda s: s["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
                "requests"
            ].update(cpu="lots"),
            "spec.workerGroupSpecs[0].template.spec.containers[0]",
            "",
        ),
    ],
)
def test_a_malformed_raycluster_is_refused_naming_the_field(
    change: Any, field: str, rule: str
) -> None:
    obj = raycluster()
    change(obj["spec"])
    with pytest.raises(ManifestError) as raised:
        pod_sets(obj)
    [(path, said)] = raised.value.problems
    assert path.startswith(field), path
    assert rule in said
    assert "RayCluster ns/rc" in str(raised.value)


def test_a_rayjob_that_keeps_its_cluster_or_names_none_is_refused_naming_the_field() -> None:
    with pytest.raises(ManifestError, match=r"spec\.shutdownAfterJobFinishes"):
        pod_sets(rayjob(shutdownAfterJobFinishes=False))
    obj = rayjob(clusterSelector={"ray.io/cluster": "shared"})
    del obj["spec"]["rayClusterSpec"]
    with pytest.raises(ManifestError, match=r"spec\.rayClusterSpec"):
        pod_sets(obj)
    broken = rayjob()
    del broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    with pytest.raises(ManifestError, match=r"spec\.rayClusterSpec\.workerGroupSpecs\[0\]"):
        pod_sets(broken)
