"""JobSet and TrainJob behind the workload seam: the Workload each asks for, what admission
writes into it and takes out again, and what the webhooks do to them and their pods."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controllers.jobs.jobset import JobSet
from controllers.jobs.trainjob import PATCH_MANAGER, TrainJob
from controllers.runtime.frozen import freeze
from controllers.webhooks import decisions
from quota.api import ManifestError

FLAVOR = {
    "metadata": {"name": "a100"},
    "spec": {
        "nodeLabels": {"pool": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def rj(name: str, replicas: int, parallelism: int, cpu: str = "1") -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": parallelism,
                "completions": parallelism,
                "template": {
                    "spec": {
                        "nodeSelector": {"zone": "z1"},
                        "containers": [{"name": "node", "resources": {"requests": {"cpu": cpu}}}],
                    }
                },
            }
        },
    }


def a_jobset() -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "js",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {"muster.dev/queue-name": "team"},
        },
        "spec": {"suspend": True, "replicatedJobs": [rj("leader", 1, 1), rj("workers", 2, 3, "2")]},
    }


def test_a_jobset_asks_for_one_pod_set_per_replicated_job() -> None:
    spec = JobSet(a_jobset()).workload_spec({}, global_default=None)
    assert spec["queueName"] == "team"
    assert [(p["name"], p["count"], p["requests"]) for p in spec["podSets"]] == [
        ("leader", 1, {"cpu": "1"}),
        ("workers", 6, {"cpu": "2"}),
    ]


def test_admission_merges_flavors_into_every_template_and_eviction_restores_them() -> None:
    obj = a_jobset()
    written = JobSet(obj)
    written.run_with([FLAVOR], {"leader": 1, "workers": 6})
    assert obj["spec"]["suspend"] is False
    for job in obj["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]
        assert pod["spec"]["nodeSelector"] == {"zone": "z1", "pool": "a100"}
        assert pod["spec"]["tolerations"] == FLAVOR["spec"]["tolerations"]
        assert pod["metadata"]["labels"]["muster.dev/owner-uid"] == "u-1"
    # The Workload it asks for is still the one its user wrote.
    again = JobSet(copy.deepcopy(obj)).workload_spec({}, global_default=None)
    assert again["podSets"][0]["template"]["nodeSelector"] == {"zone": "z1"}
    obj["spec"]["suspend"] = True
    assert written.restore() is True
    for job in obj["spec"]["replicatedJobs"]:
        pod_spec = job["template"]["spec"]["template"]["spec"]
        assert pod_spec["nodeSelector"] == {"zone": "z1"} and "tolerations" not in pod_spec
    assert written.restore() is False


def test_a_bad_replicated_job_is_named_in_the_jobsets_terms() -> None:
    obj = a_jobset()
    obj["spec"]["replicatedJobs"][1]["template"]["spec"]["parallelism"] = "three"
    with pytest.raises((ManifestError, ValueError), match=r"replicatedJobs\[1\]"):
        JobSet(obj).workload_spec({}, global_default=None)


RUNTIME = {
    "metadata": {"name": "torch"},
    "spec": {
        "mlPolicy": {"numNodes": 1},
        "template": {
            "spec": {
                "replicatedJobs": [
                    {**rj("launcher", 1, 1), "template": rj("launcher", 1, 1)["template"]},
                    {
                        "name": "node",
                        "template": {
                            "metadata": {
                                "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                            },
                            "spec": rj("node", 1, 1)["template"]["spec"],
                        },
                    },
                ]
            }
        },
    },
}


def a_trainjob(**trainer: Any) -> dict[str, Any]:
    return {
        "kind": "TrainJob",
        "metadata": {
            "name": "tj",
            "namespace": "ns",
            "uid": "u-2",
            "labels": {"muster.dev/queue-name": "team"},
        },
        "spec": {"suspend": True, "runtimeRef": {"name": "torch"}, "trainer": trainer},
    }


def lookup(kind: str, key: str) -> dict[str, Any] | None:
    return RUNTIME if (kind, key) == ("ClusterTrainingRuntime", "torch") else None


def test_a_trainjob_asks_for_its_runtimes_roles_sized_as_the_trainer_builds_them() -> None:
    job = TrainJob(a_trainjob(numNodes=4, resourcesPerNode={"requests": {"cpu": "3"}}), lookup)
    spec = job.workload_spec({}, global_default=None)
    assert [(p["name"], p["count"], p["requests"]) for p in spec["podSets"]] == [
        ("launcher", 1, {"cpu": "1"}),
        ("node", 4, {"cpu": "3"}),
    ]
    # Without numNodes, the runtime's mlPolicy says how many.
    default = TrainJob(a_trainjob(), lookup).workload_spec({}, global_default=None)
    assert default["podSets"][1]["count"] == 1


def test_a_trainjob_runs_through_a_runtime_patch_of_musters_own() -> None:
    obj = a_trainjob()
    obj["spec"]["runtimePatches"] = [{"manager": "someone-else"}]
    job = TrainJob(obj, lookup)
    # The Trainer takes a new runtime patch only while the TrainJob stays suspended: the
    # patch is written first, and the next write unsuspends.
    job.run_with([FLAVOR], {})
    assert obj["spec"]["suspend"] is True
    obj["spec"]["runtimePatches"][1]["time"] = "2026-11-24T00:00:00Z"  # the Trainer's webhook
    job.run_with([FLAVOR], {})
    assert obj["spec"]["suspend"] is False
    ours = obj["spec"]["runtimePatches"][1]
    assert ours["manager"] == PATCH_MANAGER
    jobs = ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["launcher", "node"]
    pod = jobs[1]["template"]["spec"]["template"]
    assert pod["metadata"]["labels"] == {"muster.dev/owner-uid": "u-2"}
    assert pod["spec"]["nodeSelector"] == {"pool": "a100"}
    assert job.restore() is True
    assert obj["spec"]["runtimePatches"] == [{"manager": "someone-else"}]


def test_a_missing_runtime_is_named() -> None:
    obj = a_trainjob()
    obj["spec"]["runtimeRef"] = {"name": "nope"}
    with pytest.raises(ManifestError, match="ClusterTrainingRuntime 'nope' does not exist"):
        TrainJob(obj, lookup).workload_spec({}, global_default=None)


def test_webhook_creates_labelled_jobsets_suspended_and_hands_their_pods_to_muster() -> None:
    obj = a_jobset()
    obj["spec"].pop("suspend")
    assert decisions.mutate_suspend(obj) == [{"op": "add", "path": "/spec/suspend", "value": True}]
    obj["metadata"]["labels"] = {}
    assert decisions.mutate_suspend(obj) == []
    pod = {"spec": {"schedulerName": "default-scheduler"}}
    assert decisions.mutate_pod(pod) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "muster-scheduler"}
    ]
    assert decisions.mutate_pod({"spec": {"schedulerName": "volcano"}}) == []
    assert decisions.mutate_pod(pod, scheduler_name="") == []


def test_pod_sets_started_in_stages_name_those_that_come_first() -> None:
    obj = a_jobset()
    assert JobSet(obj).first_pod_sets() is None  # all start at once
    obj["spec"]["replicatedJobs"][1]["dependsOn"] = [{"name": "leader", "status": "Ready"}]
    assert JobSet(obj).first_pod_sets() == ["leader"]
    del obj["spec"]["replicatedJobs"][1]["dependsOn"]
    obj["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    assert JobSet(obj).first_pod_sets() == ["leader"]
    assert TrainJob(a_trainjob(), lookup).first_pod_sets() is None


@pytest.mark.parametrize("kind", ["JobSet", "TrainJob"])
def test_what_a_reconcile_reads_works_on_the_informers_frozen_object(kind: str) -> None:
    """The reconciler asks these of the object the cache holds, which refuses any change
    (controllers/runtime/frozen.py): a read that sets a default on the way fails every
    reconcile of the kind."""
    obj = freeze(a_jobset() if kind == "JobSet" else a_trainjob())
    job = JobSet(obj) if kind == "JobSet" else TrainJob(obj, lookup)
    spec = job.workload_spec({}, global_default=None)
    assert spec["podSets"]
    assert job.pod_counts()
    assert job.queue_name() == "team"
    assert job.is_suspended()
    job.first_pod_sets()
    job.finished()
    job.pods_gone()


# -- topology: the pod-template annotations a batch Job has, per replicated job ------------

RACK = "example.com/rack"
NODE = "kubernetes.io/hostname"


def annotate(replicated_job: dict[str, Any], annotations: dict[str, str]) -> None:
    replicated_job["template"]["spec"]["template"]["metadata"] = {"annotations": annotations}


def test_a_replicated_jobs_topology_annotations_become_its_pod_sets_request() -> None:
    obj = a_jobset()
    annotate(
        obj["spec"]["replicatedJobs"][1],
        {
            "muster.dev/podset-required-topology": RACK,
            "muster.dev/podset-slice-required-topology": NODE,
            "muster.dev/podset-slice-size": "3",
        },
    )
    leader, workers = JobSet(obj).workload_spec({}, global_default=None)["podSets"]
    assert "topologyRequest" not in leader
    assert workers["topologyRequest"] == {
        "required": RACK,
        "sliceRequiredTopology": NODE,
        "sliceSize": 3,
    }


@pytest.mark.parametrize(
    ("annotations", "field", "rule"),
    [
        (
            {
                "muster.dev/podset-slice-required-topology": NODE,
                "muster.dev/podset-slice-size": "4",
            },
            "[muster.dev/podset-slice-size]",
            "4 does not divide the Job's 6 pods",
        ),
        (
            {
                "muster.dev/podset-required-topology": RACK,
                "muster.dev/podset-preferred-topology": RACK,
            },
            "",
            "at most one of muster.dev/podset-required-topology, "
            "muster.dev/podset-preferred-topology and muster.dev/podset-unconstrained-topology",
        ),
    ],
)
def test_a_bad_topology_annotation_is_refused_in_a_jobs_words_at_the_jobsets_field(
    annotations: dict[str, str], field: str, rule: str
) -> None:
    obj = a_jobset()
    annotate(obj["spec"]["replicatedJobs"][1], annotations)
    with pytest.raises(ManifestError) as error:
        JobSet(obj).workload_spec({}, global_default=None)
    assert error.value.problems == [
        (f"spec.replicatedJobs[1].template.spec.template.metadata.annotations{field}", rule)
    ]


def test_a_trainjob_asks_for_topology_through_its_runtime_or_its_own_runtime_patch() -> None:
    runtime = copy.deepcopy(RUNTIME)
    annotate(
        runtime["spec"]["template"]["spec"]["replicatedJobs"][1],
        {"muster.dev/podset-required-topology": "example.com/block"},
    )
    obj = a_trainjob(numNodes=4)
    spec = TrainJob(obj, lambda kind, key: runtime).workload_spec({}, global_default=None)
    assert spec["podSets"][1]["topologyRequest"] == {"required": "example.com/block"}
    # The runtime is shared; a TrainJob's own patch of the trainer's pod template wins.
    pod_patch = {
        "metadata": {
            "annotations": {
                "muster.dev/podset-required-topology": RACK,
                "muster.dev/podset-slice-required-topology": NODE,
                "muster.dev/podset-slice-size": "2",
            }
        }
    }
    obj["spec"]["runtimePatches"] = [
        {
            "manager": "trainer.kubeflow.org/user",
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {"name": "node", "template": {"spec": {"template": pod_patch}}}
                        ]
                    }
                }
            },
        }
    ]
    launcher, node = TrainJob(freeze(obj), lambda kind, key: runtime).workload_spec(
        {}, global_default=None
    )["podSets"]
    assert "topologyRequest" not in launcher
    assert node["topologyRequest"] == {
        "required": RACK,
        "sliceRequiredTopology": NODE,
        "sliceSize": 2,
    }


def test_a_runtimes_volcano_network_topology_keeps_each_role_in_one_domain() -> None:
    """Trainer would put it on the Volcano PodGroup it makes; a TrainJob Muster queues has its
    own Workload instead, which carries it (the PodGroup intake's rule), not drops it."""
    runtime = copy.deepcopy(RUNTIME)
    runtime["spec"]["podGroupPolicy"] = {
        "volcano": {"networkTopology": {"mode": "hard", "highestTierAllowed": 2}}
    }
    annotate(
        runtime["spec"]["template"]["spec"]["replicatedJobs"][1],
        {"muster.dev/podset-required-topology": RACK},
    )
    spec = TrainJob(freeze(a_trainjob(numNodes=4)), lambda kind, key: runtime).workload_spec(
        {}, global_default=None
    )
    # A role's own request stands; the others take the runtime's.
    assert [p.get("topologyRequest") for p in spec["podSets"]] == [
        {"requiredTier": 2},
        {"required": RACK},
    ]
    runtime["spec"]["podGroupPolicy"]["volcano"]["networkTopology"]["highestTierAllowed"] = 0
    with pytest.raises(ManifestError) as error:
        TrainJob(a_trainjob(), lambda kind, key: runtime).workload_spec({}, global_default=None)
    assert error.value.problems == [
        (
            "spec.runtimeRef (torch: spec.podGroupPolicy.volcano.networkTopology"
            ".highestTierAllowed)",
            "must be a tier, at least 1 (got 0)",
        )
    ]
