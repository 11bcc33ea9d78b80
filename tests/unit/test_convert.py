"""API objects -> engine snapshot types: what the controller, the CLI and the simulator share."""

from __future__ import annotations

from typing import Any

import pytest

from quota.api import ManifestError, ResourceFlavor, Workload, parse_manifest
from quota.model import convert
from quota.model.nodes import Taint, Toleration
from quota.model.snapshot import Assignment, Flavor

GPU = "nvidia.com/gpu"
GI = 1 << 30


def model(doc: dict[str, Any]) -> Any:
    return parse_manifest({"apiVersion": "muster.dev/v1alpha1", **doc}, 0)


def test_a_flavor_carries_labels_taints_and_the_tolerations_it_adds() -> None:
    rf = model(
        {
            "kind": "ResourceFlavor",
            "metadata": {"name": "h100"},
            "spec": {
                "nodeLabels": {"gpu": "h100"},
                "nodeTaints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
                ],
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists"},
                    {"key": "size", "operator": "Gt", "value": "3"},  # never matches a taint
                ],
            },
        }
    )
    assert isinstance(rf, ResourceFlavor)
    assert convert.flavor(rf) == Flavor(
        "h100",
        {"gpu": "h100"},
        (Taint("nvidia.com/gpu", "present", "NoSchedule"),),
        (Toleration("nvidia.com/gpu", "Exists"),),
    )


WORKLOAD = {
    "kind": "Workload",
    "metadata": {"name": "train", "namespace": "ns"},
    "spec": {
        "queueName": "q",
        "priorityClassName": "high",
        "replaces": "train-1",
        "sliceName": "train",
        "podSets": [
            {
                "name": "workers",
                "count": 4,
                "minCount": 2,
                "requests": {GPU: 1, "cpu": "2"},
                "template": {"nodeSelector": {"zone": "a"}},
            }
        ],
    },
}


def test_a_pending_workload_takes_its_priority_from_its_class() -> None:
    wl = model(WORKLOAD)
    assert isinstance(wl, Workload)
    engine = convert.workload(wl, "team", arrival=12.0, priority_classes={"high": 900})
    assert (engine.key, engine.queue, engine.priority, engine.arrival) == (
        "ns/train",
        "team",
        900,
        12.0,
    )
    assert engine.admission is None and engine.admitted_at is None
    assert engine.replaces == "ns/train-1"
    (ps,) = engine.pod_sets
    assert (ps.count, ps.min_count, dict(ps.per_pod)) == (4, 2, {GPU: 1, "cpu": 2000})
    assert dict(ps.node_selector) == {"zone": "a"}


def test_an_admitted_workload_carries_its_admission() -> None:
    doc = {
        **WORKLOAD,
        "status": {
            "admission": {
                "clusterQueue": "team",
                "podSetAssignments": [{"name": "workers", "count": 3, "flavors": {GPU: "h100"}}],
            }
        },
    }
    engine = convert.workload(model(doc), "team", arrival=5.0, admitted_at=9.0)
    assert engine.admission == (Assignment("workers", 3, {GPU: "h100"}),)
    assert engine.admitted_at == 9.0
    assert engine.priority == 0  # no class mapping given, no spec.priority


def node(name: str, labels: dict[str, str], gpus: str, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": extra.get("spec", {}),
        "status": {
            "allocatable": {GPU: gpus, "cpu": "95500m", "memory": "1Ti"},
            "conditions": [{"type": "Ready", "status": extra.get("ready", "True")}],
        },
    }


def test_node_capacity_counts_ready_schedulable_nodes_of_each_flavor() -> None:
    flavors = {
        "h100": Flavor("h100", {"gpu": "h100"}),
        "a100": Flavor("a100", {"gpu": "a100"}),
        "spare": Flavor("spare", {"gpu": "none"}),
        "any": Flavor("any"),  # no labels: describes no particular node
    }
    nodes = [
        node("n1", {"gpu": "h100", "zone": "a"}, "8"),
        node("n2", {"gpu": "h100"}, "8"),
        node("n3", {"gpu": "h100"}, "8", ready="False"),
        node("n4", {"gpu": "h100"}, "8", spec={"unschedulable": True}),
        node("n5", {"gpu": "a100"}, "4"),
    ]
    capacity = convert.node_capacity(nodes, flavors)
    assert capacity[("h100", GPU)] == 16
    assert capacity[("h100", "cpu")] == 191_000
    assert capacity[("h100", "memory")] == 2 << 40
    assert capacity[("a100", GPU)] == 4
    assert capacity[("spare", "cpu")] == 0  # a kind of node the cluster has none of
    assert not any(key[0] == "any" for key in capacity)
    assert convert.node_capacity([], flavors) == {}


JOB: dict[str, Any] = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {
        "name": "train",
        "namespace": "ns",
        "labels": {"muster.dev/queue-name": "q"},
        "annotations": {"muster.dev/min-parallelism": "2"},
    },
    "spec": {
        "parallelism": 6,
        "completions": 4,
        "template": {
            "spec": {
                "priorityClassName": "high",
                "nodeSelector": {"zone": "a"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "overhead": {"cpu": "100m"},
                "initContainers": [
                    {"name": "setup", "resources": {"requests": {"cpu": "4"}}},
                    {
                        "name": "sidecar",
                        "restartPolicy": "Always",
                        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                    },
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {GPU: "2"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
                ],
            }
        },
    },
}


def test_a_job_becomes_one_pod_set_with_what_the_scheduler_would_count() -> None:
    wl = convert.job_to_workload_model(JOB, {"high": 500})
    assert (wl.metadata.namespace, wl.name, wl.spec.queue_name) == ("ns", "train", "q")
    assert (wl.spec.priority, wl.spec.priority_class_name) == (500, "high")
    (ps,) = wl.spec.pod_sets
    assert ps.count == 4  # parallelism 6, but only 4 completions
    assert ps.min_count == 2
    # Containers 2 cpu + sidecar 0.5 = 2.5; the init container runs before the sidecar
    # starts, so its peak is 4; the larger wins, plus 0.1 of pod overhead.
    assert ps.requests == {"cpu": 4100, GPU: 2, "memory": 3 * GI}
    assert ps.template.node_selector == {"zone": "a"}
    assert ps.template.tolerations[0].key == "gpu"


def test_an_elastic_job_ignores_min_parallelism_and_can_be_sliced() -> None:
    elastic = {
        **JOB,
        "metadata": {
            **JOB["metadata"],
            "annotations": {
                "muster.dev/elastic-job": "true",
                "muster.dev/min-parallelism": "2",
            },
        },
    }
    assert convert.job_is_elastic(elastic)
    wl = convert.job_to_workload_model(elastic, {"high": 500}, count=9, name="train-slice-2")
    assert wl.name == "train-slice-2"
    assert wl.spec.pod_sets[0].count == 9 and wl.spec.pod_sets[0].min_count is None


def test_the_global_default_priority_class_applies_to_jobs_without_one() -> None:
    job = {**JOB, "spec": {**JOB["spec"], "template": {"spec": {"containers": []}}}}
    assert convert.job_to_workload_model(job, {"base": 7}, global_default="base").spec.priority == 7
    assert convert.job_to_workload_model(job, {}).spec.priority == 0


@pytest.mark.parametrize(
    ("change", "path", "rule"),
    [
        (
            lambda j: j["metadata"].pop("labels"),
            "metadata.labels[muster.dev/queue-name]",
            "required",
        ),
        (
            lambda j: j["spec"]["template"]["spec"]["containers"][0]["resources"].update(
                requests={"cpu": "lots"}
            ),
            "spec.template.spec.containers[0].resources[cpu]",
            "not a Kubernetes quantity",
        ),
        (
            lambda j: j["metadata"]["annotations"].update({"muster.dev/min-parallelism": "x"}),
            "metadata.annotations[muster.dev/min-parallelism]",
            "whole number",
        ),
        (
            lambda j: j["spec"].update(parallelism=200_000, completions=None),
            "spec.parallelism",
            "less than or equal to 100000",
        ),
        (lambda j: j["spec"].update(parallelism=-1), "spec.parallelism", "must not be negative"),
    ],
)
def test_a_job_that_cannot_be_queued_names_the_field_and_the_rule(
    change: Any, path: str, rule: str
) -> None:
    import copy

    job = copy.deepcopy(JOB)
    change(job)
    with pytest.raises(ManifestError) as caught:
        convert.job_to_workload_model(job, {"high": 1}, index=7)
    assert caught.value.index == 7
    assert caught.value.subject == "Job ns/train"
    assert caught.value.problems[0][0] == path, caught.value.problems
    assert rule in str(caught.value)
