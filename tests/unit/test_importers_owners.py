"""`muster import` of work queued through its owner: LeaderWorkerSets, Deployments,
StatefulSets, Ray clusters and pod groups in Kueue and KAI, and Kueue's Configuration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from quota.importers import ImportInputError, ImportResult, import_documents

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "imports"

KUEUE_QUEUES = """
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: f}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: cq}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu]
    flavors:
    - name: f
      resources: [{name: cpu, nominalQuota: 8}]
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: lq, namespace: ns}
spec: {clusterQueue: cq}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: WorkloadPriorityClass
metadata: {name: serving}
value: 500
"""

KAI_QUEUES = """
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: inference}
spec:
  resources:
    gpu: {quota: 8, limit: -1, overQuotaWeight: 1}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
"""


def run(source: str, text: str) -> ImportResult:
    return import_documents(source, [("in.yaml", list(yaml.safe_load_all(text)))])


def workloads(result: ImportResult) -> dict[str, dict[str, Any]]:
    return {w.manifest["metadata"]["name"]: w.manifest["spec"] for w in result.workloads}


def sets(spec: dict[str, Any]) -> list[tuple[str, int, dict[str, str]]]:
    return [(p["name"], p["count"], p["requests"]) for p in spec["podSets"]]


def reported(result: ImportResult) -> list[str]:
    return [f"{u.origin.subject}: {u.path}: {u.reason}" for u in result.unmapped]


def pod(name: str, meta: str) -> str:
    """A pod in namespace ns asking for 1 cpu; `meta`: more of its metadata, flow style."""
    return f"""
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: ns, {meta}}}
spec:
  containers: [{{name: c, resources: {{requests: {{cpu: "1"}}}}}}]
"""


def lws(size: object, replicas: int = 2, labels: str = "kueue.x-k8s.io/queue-name: lq") -> str:
    return f"""
---
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: llm
  namespace: ns
  labels: {{{labels}}}
spec:
  replicas: {replicas}
  leaderWorkerTemplate:
    size: {size}
    leaderTemplate:
      spec:
        containers: [{{name: l, resources: {{requests: {{cpu: "2"}}}}}}]
    workerTemplate:
      spec:
        priorityClassName: high
        containers: [{{name: w, resources: {{requests: {{cpu: "1"}}}}}}]
"""


def serving(kind: str, replicas: object, where: str = "template") -> str:
    label = "{kueue.x-k8s.io/queue-name: lq, kai.scheduler/queue: inference}"
    return f"""
---
apiVersion: apps/v1
kind: {kind}
metadata:
  name: web
  namespace: ns
  {"labels: " + label if where == "object" else ""}
spec:
  replicas: {replicas}
  template:
    metadata:
      {"labels: " + label if where == "template" else ""}
    spec:
      containers: [{{name: c, resources: {{requests: {{cpu: 500m}}}}}}]
"""


def test_kueue_lws_groups_deployments_and_ray_become_the_controllers_workloads() -> None:
    ray = """
---
apiVersion: ray.io/v1
kind: RayJob
metadata:
  name: tune
  namespace: ns
  labels: {kueue.x-k8s.io/queue-name: lq, kueue.x-k8s.io/priority-class: serving}
spec:
  rayClusterSpec:
    headGroupSpec:
      template:
        spec:
          containers: [{name: h, resources: {requests: {cpu: "1"}}}]
    workerGroupSpecs:
    - groupName: gpu
      replicas: 3
      minReplicas: 1
      numOfHosts: 2
      template:
        spec:
          containers: [{name: w, resources: {requests: {cpu: "1"}}}]
"""
    high = "\n---\napiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\n"
    high += "metadata: {name: high}\nvalue: 9\n"
    result = run("kueue", KUEUE_QUEUES + high + lws(3) + serving("Deployment", 2) + ray)
    work = workloads(result)
    # One Workload per replica group: the leader's template and size - 1 workers.
    for name in ("leaderworkerset-llm-0", "leaderworkerset-llm-1"):
        assert sets(work[name]) == [("leader", 1, {"cpu": "2"}), ("workers", 2, {"cpu": "1"})]
        assert (work[name]["priority"], work[name]["priorityClassName"]) == (9, "high")
    # The Deployment's queue label is on its pod template, as Kueue reads it.
    assert sets(work["deployment-web"]) == [("main", 2, {"cpu": "500m"})]
    assert work["deployment-web"]["queueName"] == "lq"
    # A RayJob's cluster: head plus replicas x hosts workers, sized as KubeRay sizes them and
    # admitted whole, as the controller admits it (no minCount).
    tune = work["rayjob-tune"]
    assert sets(tune) == [("head", 1, {"cpu": "1"}), ("gpu", 6, {"cpu": "1"})]
    assert "minCount" not in tune["podSets"][1]
    assert (tune["priority"], tune["priorityClassName"]) == (500, "serving")


def test_kueue_pods_of_a_deployment_are_counted_through_it_and_pod_groups_check_their_count() -> (
    None
):
    def member(name: str, count: str, owner: str = "") -> str:
        refs = f"ownerReferences: [{{kind: ReplicaSet, name: {owner}}}], " if owner else ""
        return pod(
            name,
            f"{refs}labels: {{kueue.x-k8s.io/queue-name: lq, kueue.x-k8s.io/pod-group-name: g}}, "
            f'annotations: {{kueue.x-k8s.io/pod-group-total-count: "{count}"}}',
        )

    result = run(
        "kueue", KUEUE_QUEUES + member("a", "3") + member("b", "3") + member("r", "3", "web-1")
    )
    assert sets(workloads(result)["g"]) == [("main", 2, {"cpu": "1"})]
    assert any("3 pods in the group, 2 in the files" in r for r in reported(result))
    for bad, rule in (("0", "'0': must be a positive whole number"), ("x", "'x': must be")):
        with pytest.raises(ImportInputError) as err:
            run("kueue", KUEUE_QUEUES + member("a", bad))
        assert str(err.value).startswith(
            "in.yaml: document 4 (Pod ns/a): "
            f"metadata.annotations[kueue.x-k8s.io/pod-group-total-count]: {rule}"
        )
    with pytest.raises(ImportInputError, match="2: another pod of its group says 3"):
        run("kueue", KUEUE_QUEUES + member("a", "3") + member("b", "2"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            lws(0),
            "in.yaml: document 4 (LeaderWorkerSet ns/llm): spec.leaderWorkerTemplate.size: "
            "0: a group has at least one pod",
        ),
        (
            lws(2).replace(
                "  labels:", "  annotations: {muster.dev/disruption-mode: some}\n  labels:"
            ),
            "in.yaml: document 4 (LeaderWorkerSet ns/llm): "
            'metadata.annotations[muster.dev/disruption-mode]: must be "single" or "all"',
        ),
        (
            serving("Deployment", -1),
            "in.yaml: document 4 (Deployment ns/web): spec.replicas: -1: replicas must not be "
            "negative",
        ),
        (
            serving("StatefulSet", '"2"'),
            "in.yaml: document 4 (StatefulSet ns/web): spec.replicas: must be a whole number",
        ),
    ],
)
def test_bad_owner_objects_are_refused_naming_object_field_and_rule(
    text: str, message: str
) -> None:
    with pytest.raises(ImportInputError) as err:
        run("kueue", KUEUE_QUEUES + text)
    assert str(err.value).startswith(message)


def test_kueue_configuration_is_reported_with_musters_equivalents() -> None:
    config = """
---
apiVersion: config.kueue.x-k8s.io/v1beta1
kind: Configuration
manageJobsWithoutQueueName: true
managedJobsNamespaceSelector: {matchLabels: {team: a}}
integrations:
  frameworks: [batch/job, deployment, kubeflow.org/pytorchjob]
  podOptions:
    namespaceSelector: {matchLabels: {pods: queued}}
"""
    result = run("kueue", KUEUE_QUEUES + config + serving("StatefulSet", 0))
    lines = reported(result)
    assert [line.split(": ")[1] for line in lines if line.startswith("Configuration")] == [
        "manageJobsWithoutQueueName",
        "integrations.frameworks[2]",
        "integrations.podOptions",
    ]
    assert (
        "Configuration: manageJobsWithoutQueueName: set Muster's managedNamespaceSelector "
        "(chart value, docs/tenancy.md) to managedJobsNamespaceSelector: unlabelled work there "
        "is queued in the namespace's LocalQueue default"
    ) in lines
    assert "kubeflow.org/pytorchjob: Muster does not queue this kind" in "\n".join(lines)
    # Scaled to zero asks for nothing.
    assert not result.workloads
    assert "StatefulSet ns/web: spec.replicas: scaled to zero: asks for nothing, left out" in lines
    assert (
        "StatefulSet ns/web: metadata.annotations[kueue.x-k8s.io/elastic-job]: unset: Kueue "
        "admits the replicas together; Muster admits a StatefulSet's replicas one by one unless "
        'annotated muster.dev/gang: "true" (with podManagementPolicy Parallel)'
    ) in lines


def test_kai_groups_by_top_owner_and_reports_annotations_without_equivalent() -> None:
    annotated = (
        lws(2, replicas=1, labels="kai.scheduler/queue: inference")
        .replace(
            "  labels:",
            "  annotations: {kai.scheduler/preemptibility: preemptible, "
            "kai.scheduler/segment-size: '2', muster.dev/disruption-mode: single}\n  labels:",
        )
        .replace("    size: 2\n", "    size: 2\n    restartPolicy: None\n")
    )
    result = run("kai", KAI_QUEUES + annotated + serving("StatefulSet", 3, where="object"))
    work = workloads(result)
    assert sets(work["leaderworkerset-llm-0"]) == [
        ("leader", 1, {"cpu": "2"}),
        ("workers", 1, {"cpu": "1"}),
    ]
    assert work["leaderworkerset-llm-0"]["priority"] == 1000
    assert sets(work["statefulset-web"]) == [("main", 3, {"cpu": "500m"})]
    assert {w.manifest["metadata"]["namespace"] for w in result.workloads} == {"ns"}
    lines = reported(result)
    assert any("kai.scheduler/preemptibility]: Muster ties preemptibility" in x for x in lines)
    assert any("kai.scheduler/segment-size]" in x for x in lines)
    assert any("muster.dev/disruption-mode]: imported with its groups whole" in x for x in lines)


def test_kai_owner_without_a_queue_and_a_rayjob_on_an_existing_cluster_are_left_out() -> None:
    on_cluster = """
---
apiVersion: ray.io/v1
kind: RayJob
metadata: {name: j, namespace: ns, labels: {kai.scheduler/queue: inference}}
spec: {clusterSelector: {ray.io/cluster: shared}}
"""
    result = run("kai", KAI_QUEUES + serving("Deployment", 1, where="nowhere") + on_cluster)
    assert not result.workloads
    assert reported(result) == [
        "Deployment ns/web: metadata.labels[kai.scheduler/queue]: the Deployment names no KAI "
        "queue: left out",
        "RayJob ns/j: spec.clusterSelector: runs on an existing RayCluster, queued (and "
        "imported) with that cluster: left out",
    ]


@pytest.mark.parametrize(
    ("source", "queue", "admitted"), [("kueue", "cluster-queue", 4), ("kai", "production", 3)]
)
def test_serving_examples_simulate(source: str, queue: str, admitted: int) -> None:
    files = sorted(str(p) for p in (EXAMPLES / source).glob("*.yaml"))
    files += sorted(str(p) for p in (EXAMPLES / source / "serving").glob("*.yaml"))
    done = subprocess.run(
        [sys.executable, "-m", "controllers.main", "import", source, *files, "--simulate"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # The serving queue admits the serving work (one Workload per LWS group, Deployment,
    # StatefulSet and Ray cluster; in KAI's production also its one Job of the base files).
    row = next(line for line in done.stdout.splitlines() if f" {queue} " in line)
    assert row.split("│")[2].strip() == str(admitted)


@pytest.mark.parametrize(
    ("source", "label"),
    [("kueue", "kueue.x-k8s.io/queue-name: lq"), ("kai", "kai.scheduler/queue: inference")],
)
def test_pods_of_an_unknown_owner_are_one_workload_and_a_deployments_are_its_own(
    source: str, label: str
) -> None:
    def owned(name: str, kind: str, owner: str) -> str:
        ref = f"{{kind: {kind}, name: {owner}, controller: true}}"
        return pod(name, f"labels: {{{label}}}, ownerReferences: [{ref}]")

    queues = KUEUE_QUEUES if source == "kueue" else KAI_QUEUES
    pods = owned("a", "Simulation", "sim") + owned("b", "Simulation", "sim")
    pods += owned("c", "Simulation", "other") + owned("web-1", "ReplicaSet", "web-5d")
    work = workloads(run(source, queues + pods))
    assert {name: sets(spec) for name, spec in work.items()} == {
        "simulation-sim": [("main", 2, {"cpu": "1"})],
        "simulation-other": [("main", 1, {"cpu": "1"})],
    }
