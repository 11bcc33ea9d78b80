"""Scenario files: the examples load, and every kind of mistake names index, field and rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from quota.api import ManifestError
from quota.manifests.cluster import cluster_state
from quota.simulation.scenario import parse_scenario

REPO = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"

BASE = """
apiVersion: muster.dev/v1alpha1
kind: ResourceFlavor
metadata: {name: gpu}
spec: {nodeLabels: {pool: gpu}}
---
apiVersion: simulate.muster.dev/v1alpha1
kind: NodePool
metadata: {name: gpu}
spec: {count: 2, labels: {pool: gpu}, allocatable: {nvidia.com/gpu: 8, cpu: "64"}}
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {name: team}
spec:
  flavors: [{name: gpu, quota: {nvidia.com/gpu: 8}}]
---
apiVersion: muster.dev/v1alpha1
kind: LocalQueue
metadata: {name: q, namespace: ns}
spec: {clusterQueue: team}
"""

JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: train
  namespace: ns
  labels: {muster.dev/queue-name: q}
  annotations: {muster.dev/submit-at: 5m, muster.dev/run-for: 1h30m}
spec:
  parallelism: 3
  template:
    spec:
      containers: [{name: c, resources: {requests: {nvidia.com/gpu: 2}}}]
"""


def docs(*parts: str) -> list[Any]:
    return list(yaml.safe_load_all("\n---\n".join(parts)))


def error(*parts: str) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        parse_scenario(docs(*parts))
    return caught.value


def test_the_examples_load() -> None:
    for name, workloads, nodes in (
        ("three-teams", None, 6),
        ("kueue-baseline", 15_000, None),
        ("elastic", 9, 2),
        ("placement-binpack-vs-spread", 184, 8),
        ("multicluster", 10, 2),  # its own 2 nodes; the workers' 6 are the clusters'
    ):
        path = REPO / "examples" / f"{name}.yaml"
        scenario = parse_scenario(list(yaml.safe_load_all(path.read_text())))
        assert scenario.workload_count() > 0
        if workloads is not None:
            assert scenario.workload_count() == workloads
        assert (len(scenario.nodes) if scenario.nodes is not None else None) == nodes, name


def test_kueue_baseline_has_thirty_queues_in_five_parents() -> None:
    path = REPO / "examples" / "kueue-baseline.yaml"
    scenario = parse_scenario(list(yaml.safe_load_all(path.read_text())))
    parents = {q.parent for q in scenario.queues.values() if q.parent is not None}
    leaves = [q for q in scenario.queues.values() if q.parent is not None]
    assert len(parents) == 5 and len(leaves) == 30
    (generator,) = scenario.generators
    assert [c.name for c in generator.classes] == ["small", "medium", "large"]
    assert len(generator.targets) == 30


def test_a_job_becomes_a_timed_workload_in_its_cluster_queue() -> None:
    scenario = parse_scenario(docs(BASE, JOB))
    (job,) = scenario.jobs
    assert job.key == "ns/train"
    assert (job.local_queue, job.cluster_queue) == ("q", "team")
    assert (job.submit_at, job.run_for) == (300.0, 5400.0)
    assert job.pod_sets[0].count == 3 and job.pod_sets[0].per_pod == {GPU: 2}
    assert scenario.capacity == {("gpu", GPU): 16, ("gpu", "cpu"): 128_000}


def test_nodes_without_conditions_are_ready_and_not_ready_nodes_do_not_count() -> None:
    nodes = """
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {pool: gpu}}
status: {allocatable: {nvidia.com/gpu: "4"}}
---
apiVersion: v1
kind: Node
metadata: {name: n2, labels: {pool: gpu}}
status:
  allocatable: {nvidia.com/gpu: "4"}
  conditions: [{type: Ready, status: "False"}]
"""
    base = BASE.replace("count: 2", "count: 0")
    scenario = parse_scenario(docs(base, nodes))
    assert scenario.capacity == {("gpu", GPU): 4}
    # Placement sees both, and skips the NotReady one itself.
    assert [(n.name, n.ready) for n in scenario.nodes or ()] == [("n1", True), ("n2", False)]


def test_no_nodes_means_quota_only_mode() -> None:
    text = BASE.split("---")[0] + "---" + "---".join(BASE.split("---")[2:])
    scenario = parse_scenario(docs(text))
    assert scenario.capacity is None and scenario.nodes is None


def test_pool_nodes_get_numbered_names_and_the_kubelets_pod_limit() -> None:
    node = """
apiVersion: v1
kind: Node
metadata: {name: big, labels: {pool: gpu}}
status: {allocatable: {nvidia.com/gpu: "8", pods: "16"}}
"""
    scenario = parse_scenario(docs(BASE, node))
    assert [n.name for n in scenario.nodes or ()] == ["big", "gpu-0", "gpu-1"]
    by_name = {n.name: n for n in scenario.nodes or ()}
    assert by_name["big"].allocatable == {GPU: 8, "pods": 16}  # as written
    assert by_name["gpu-1"].allocatable == {GPU: 8, "cpu": 64_000, "pods": 110}
    assert by_name["gpu-1"].labels == {"pool": "gpu"} and by_name["gpu-1"].ready


def test_a_pool_node_named_like_a_node_is_an_error() -> None:
    node = """
apiVersion: v1
kind: Node
metadata: {name: gpu-1, labels: {pool: gpu}}
status: {allocatable: {nvidia.com/gpu: "8"}}
"""
    problem = error(BASE, node)
    assert problem.index == 1 and "NodePool gpu" in str(problem)
    assert "gpu-1" in str(problem) and "document 4" in str(problem)


@pytest.mark.parametrize(
    ("parts", "index", "path", "rule"),
    [
        (
            (BASE, "apiVersion: v1\nkind: Pod\nmetadata: {name: p}"),
            4,
            "kind",
            "not accepted by muster simulate",
        ),
        (
            (BASE, JOB.replace("muster.dev/run-for: 1h30m", "other: x")),
            4,
            "metadata.annotations[muster.dev/run-for]",
            "required",
        ),
        (
            (BASE, JOB.replace("submit-at: 5m", "submit-at: soon")),
            4,
            "metadata.annotations[muster.dev/submit-at]",
            "not a duration",
        ),
        (
            (BASE, JOB.replace("queue-name: q", "queue-name: missing")),
            4,
            "metadata.labels[muster.dev/queue-name]",
            "LocalQueue ns/missing does not exist",
        ),
        (
            (BASE, JOB.replace("labels: {muster.dev/queue-name: q}", "labels: {}")),
            4,
            "metadata.labels[muster.dev/queue-name]",
            "required",
        ),
        (
            (BASE, JOB.replace("nvidia.com/gpu: 2", "nvidia.com/gpu: 1.5")),
            4,
            "spec.template.spec.containers[0].resources[nvidia.com/gpu]",
            "whole units",
        ),
        (
            (BASE, JOB.replace("parallelism: 3", "parallelism: many")),
            4,
            "spec.parallelism",
            "whole number",
        ),
        (
            (BASE.replace("allocatable: {nvidia.com/gpu: 8", "allocatable: {nvidia.com/gpu: x"),),
            1,
            "spec.allocatable[nvidia.com/gpu]",
            "not a Kubernetes quantity",
        ),
        (
            (BASE.replace("count: 2,", "count: 2, size: 3,"),),
            1,
            "spec.size",
            "unknown field",
        ),
        (
            (BASE, JOB, JOB),
            5,
            "metadata.name",
            "duplicate: document 4 already defines Job ns/train",
        ),
        (
            (
                BASE,
                JOB,
                "apiVersion: simulate.muster.dev/v1alpha1\nkind: ScaleEvent\nmetadata: {name: s}\n"
                "spec: {job: ns/train, at: 10m, parallelism: 6}",
            ),
            5,
            "spec.job",
            "is not elastic",
        ),
        (
            (
                BASE,
                "apiVersion: simulate.muster.dev/v1alpha1\nkind: ScaleEvent\nmetadata: {name: s}\n"
                "spec: {job: ns/nope, at: 10m, parallelism: 0}",
            ),
            4,
            "spec.parallelism",
            "greater than or equal to 1",
        ),
        (
            (
                BASE,
                "apiVersion: simulate.muster.dev/v1alpha1\nkind: WorkloadGenerator\n"
                "metadata: {name: g}\nspec:\n  targets: [ns/other]\n  classes:\n"
                "  - {name: c, count: 1, interval: 1s, runtime: 1s, requests: {cpu: 1}}",
            ),
            4,
            "spec.targets[0]",
            "LocalQueue ns/other does not exist",
        ),
        (
            (
                BASE,
                "apiVersion: simulate.muster.dev/v1alpha1\nkind: WorkloadGenerator\n"
                "metadata: {name: g}\nspec:\n  allLocalQueues: true\n  classes:\n"
                "  - {name: c, count: 1, interval: 1s, runtime: 0s, requests: {cpu: 1}}",
            ),
            4,
            "spec.classes[0]",
            "runtime must be positive",
        ),
        (
            (
                BASE,
                "apiVersion: muster.dev/v1alpha1\nkind: ClusterQueue\nmetadata: {name: x}\n"
                "spec: {parent: y}\n---\napiVersion: muster.dev/v1alpha1\nkind: ClusterQueue\n"
                "metadata: {name: y}\nspec: {parent: x}",
            ),
            4,
            "spec.parent",
            "cycle",
        ),
        (
            (BASE.replace("{name: gpu, quota", "{name: tpu, quota"),),
            2,
            "spec.flavors[0].name",
            "ResourceFlavor 'tpu'",
        ),
        (
            (BASE.replace("labels: {pool: gpu}", "labels: {pool: cpu}"),),
            0,
            "spec.nodeLabels",
            "no Node or NodePool",
        ),
    ],
)
def test_bad_scenarios_name_the_document_the_field_and_the_rule(
    parts: tuple[str, ...], index: int, path: str, rule: str
) -> None:
    problem = error(*parts)
    assert problem.index == index, str(problem)
    paths = [p for p, _ in problem.problems]
    assert path in paths, str(problem)
    assert rule in str(problem), str(problem)


def test_cluster_files_resolve_workload_queues_and_reject_unknown_ones() -> None:
    pending = """
apiVersion: muster.dev/v1alpha1
kind: Workload
metadata: {name: w, namespace: ns, creationTimestamp: "2025-01-06T09:00:00Z"}
spec:
  queueName: q
  podSets: [{name: main, count: 2, requests: {nvidia.com/gpu: 1}}]
"""
    admitted = """
apiVersion: muster.dev/v1alpha1
kind: Workload
metadata: {name: r, namespace: other}
spec:
  queueName: whatever
  podSets: [{name: main, count: 4, requests: {nvidia.com/gpu: 1}}]
status:
  admission:
    clusterQueue: team
    podSetAssignments: [{name: main, count: 4, flavors: {nvidia.com/gpu: gpu}}]
"""
    base = BASE.replace("kind: NodePool", "kind: NodePool").split("---")
    no_pool = "---".join([base[0], *base[2:]])
    state = cluster_state(docs(no_pool, pending, admitted), now=0.0)
    (waiting,) = state.snapshot.pending
    (running,) = state.snapshot.admitted
    assert (waiting.key, waiting.queue) == ("ns/w", "team")
    assert (running.key, running.queue) == ("other/r", "team")
    assert running.admission is not None and running.admission[0].count == 4
    with pytest.raises(ManifestError) as caught:
        cluster_state(docs(no_pool, pending.replace("queueName: q", "queueName: nope")), 0.0)
    assert caught.value.index == 3
    assert caught.value.problems[0][0] == "spec.queueName"
    assert "does not exist" in str(caught.value)
    with pytest.raises(ManifestError) as caught:
        cluster_state(docs(no_pool, JOB), 0.0)
    assert caught.value.problems[0][0] == "kind"
