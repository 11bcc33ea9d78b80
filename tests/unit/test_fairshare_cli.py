"""`muster fairshare` and `muster admit`: the documented JSON, and malformed files refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from controllers.main import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "fairshare.yaml"
GPU = "h100/nvidia.com/gpu"
NOW = "2025-01-06T09:00:00Z"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_fairshare_json_has_every_queue_with_shares_usage_demand_quota_and_limit() -> None:
    code, output = invoke("fairshare", str(EXAMPLE), "--output", "json")
    assert code == 0, output
    queues = json.loads(output)["queues"]
    assert set(queues) == {"production", "research", "vision", "language"}
    assert set(queues["language"][GPU]) == {"fairShare", "usage", "demand", "quota", "limit"}
    # Base units: cpu in millicores, devices as counts; limit null when unlimited.
    assert queues["production"]["h100/cpu"]["quota"] == 96_000
    assert queues["language"][GPU]["limit"] == 6
    assert queues["vision"][GPU]["limit"] is None
    # vision runs 6 GPUs (2 beyond its quota of 4) and wants 2 more; its parent sums both.
    assert (queues["vision"][GPU]["usage"], queues["vision"][GPU]["demand"]) == (6, 8)
    assert queues["research"][GPU]["usage"] == 6
    assert queues["research"][GPU]["demand"] == 12
    # 16 GPUs on two nodes, each root guaranteed 8 and demanding at least that.
    assert queues["production"][GPU]["fairShare"] + queues["research"][GPU]["fairShare"] == 16
    assert queues["language"][GPU]["fairShare"] == 4  # its demand, within its quota


def test_fairshare_table_shows_the_tree() -> None:
    code, output = invoke("fairshare", str(EXAMPLE))
    assert code == 0, output
    assert "Fair share" in output
    assert "  language" in output and "  vision" in output  # children indented under research


def test_admit_json_lists_admissions_preemptions_and_pending_reasons() -> None:
    code, output = invoke("admit", str(EXAMPLE), "--output", "json", "--now", NOW)
    assert code == 0, output
    decisions = json.loads(output)
    assert set(decisions) >= {"admit", "preempt", "pending"}
    admitted = {a["workload"]: a for a in decisions["admit"]}
    # Production (4 of its 8 GPUs) is further below its share than research (6 of 8), so its
    # subtree is served first; language, idle but inside a research org at 6 of 8, waits.
    assert set(admitted) == {"prod/serve-search", "vision/eval-detector"}
    (pod_set,) = admitted["prod/serve-search"]["podSets"]
    assert pod_set == {
        "name": "main",
        "count": 4,
        "flavors": {"cpu": "h100", "nvidia.com/gpu": "h100"},
    }
    (pending,) = decisions["pending"]
    assert pending["workload"] == "language/finetune-llm"
    assert "nvidia.com/gpu" in pending["reason"] and "requested 4" in pending["reason"]


def test_admit_with_preemption_names_preemptor_and_victims(tmp_path: Path) -> None:
    # Production (withinQueue LowerPriority) now runs a low-priority workload and gets an
    # urgent one for all 8 of its GPUs that only fits if that one is evicted; the urgent one
    # goes first.
    text = EXAMPLE.read_text().replace(
        "priority: 1000\n  podSets:\n  - {name: main, count: 4",
        "priority: 10\n  podSets:\n  - {name: main, count: 4",
    )
    text += """
---
apiVersion: muster.dev/v1alpha1
kind: Workload
metadata: {name: page-oncall, namespace: prod, creationTimestamp: "2025-01-06T08:50:00Z"}
spec:
  queueName: serving
  priority: 5000
  podSets:
  - {name: main, count: 8, requests: {nvidia.com/gpu: 1, cpu: 8}}
"""
    path = tmp_path / "urgent.yaml"
    path.write_text(text)
    code, output = invoke("admit", str(path), "-o", "json", "--now", NOW)
    assert code == 0, output
    decisions = json.loads(output)
    (preempt,) = decisions["preempt"]
    assert preempt["preemptor"] == "prod/page-oncall"
    assert [v["workload"] for v in preempt["victims"]] == ["prod/serve-chat"]
    assert preempt["victims"][0]["kind"] == "Preempted"


BASE = """
apiVersion: muster.dev/v1alpha1
kind: ResourceFlavor
metadata: {name: gpu}
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {name: team}
spec:
  flavors: [{name: gpu, quota: {nvidia.com/gpu: 8}}]
"""


@pytest.mark.parametrize("command", ["fairshare", "admit"])
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("apiVersion: v1\nkind: Service\nmetadata: {name: s}", ["document 2", "kind", "Service"]),
        (
            "apiVersion: muster.dev/v1alpha1\nkind: ClusterQueue\nmetadata: {name: bad}\n"
            "spec:\n  flavors: [{name: gpu, quota: {nvidia.com/gpu: 2x}}]",
            ["document 2", "spec.flavors[0].quota[nvidia.com/gpu]", "not a Kubernetes quantity"],
        ),
        (
            "apiVersion: muster.dev/v1alpha1\nkind: Workload\nmetadata: {name: w, namespace: n}\n"
            "spec:\n  queueName: ghost\n  podSets: [{count: 1, requests: {nvidia.com/gpu: 1}}]",
            ["document 2", "spec.queueName", "'ghost' does not exist"],
        ),
        (
            "apiVersion: muster.dev/v1alpha1\nkind: ClusterQueue\nmetadata: {name: x}\n"
            "spec: {parent: y}\n---\napiVersion: muster.dev/v1alpha1\nkind: ClusterQueue\n"
            "metadata: {name: y}\nspec: {parent: x}",
            ["document 2", "spec.parent", "cycle"],
        ),
        ("kind: [unclosed", ["not valid YAML", "line"]),
    ],
)
def test_malformed_files_are_refused_with_index_field_and_rule(
    tmp_path: Path, command: str, extra: str, expected: list[str]
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(BASE + "---\n" + extra + "\n")
    code, output = invoke(command, str(path), "-o", "json")
    assert code != 0
    for text in expected:
        assert text in output, output


def _node(name: str) -> str:
    return f"""
apiVersion: v1
kind: Node
metadata: {{name: {name}, labels: {{pool: gpu}}}}
status: {{allocatable: {{nvidia.com/gpu: "4", cpu: "32"}}}}
"""


# BASE's queue on a flavor of labelled nodes, and a pending Workload of one 6-GPU pod.
PLACED = (
    BASE.replace(
        "metadata: {name: gpu}\n", "metadata: {name: gpu}\nspec: {nodeLabels: {pool: gpu}}\n"
    )
    + """---
apiVersion: muster.dev/v1alpha1
kind: Workload
metadata: {name: big, namespace: n}
spec:
  queueName: team
  podSets: [{name: main, count: 1, requests: {nvidia.com/gpu: 6}}]
"""
)

RUNNING = """
apiVersion: muster.dev/v1alpha1
kind: Workload
metadata: {name: small, namespace: n, creationTimestamp: "2025-01-06T08:00:00Z"}
spec:
  queueName: team
  podSets: [{name: main, count: 1, requests: {nvidia.com/gpu: 1}}]
status:
  admission:
    clusterQueue: team
    podSetAssignments: [{name: main, count: 1, flavors: {nvidia.com/gpu: gpu}NODES}]
  conditions:
  - {type: QuotaReserved, status: "True", reason: QuotaReserved,
     lastTransitionTime: "2025-01-06T08:00:05Z"}
"""


def _admit(tmp_path: Path, *documents: str) -> tuple[int, str]:
    path = tmp_path / "cluster.yaml"
    path.write_text("\n---\n".join(documents))
    return invoke("admit", str(path), "-o", "json", "--now", NOW)


def test_admit_places_on_the_files_nodes_and_trusts_quota_alone_without_them(
    tmp_path: Path,
) -> None:
    """Issue 25: 6 GPUs fit the queue's quota of 8, but no 4-GPU node holds the pod: with
    the Nodes in the file `muster admit` places, as the controller does, and it waits."""
    code, output = _admit(tmp_path, PLACED, _node("a"), _node("b"))
    assert code == 0, output
    decisions = json.loads(output)
    assert decisions["admit"] == []
    (pending,) = decisions["pending"]
    assert pending["workload"] == "n/big"
    assert "the largest node has 4 allocatable" in pending["reason"], pending["reason"]

    code, output = _admit(tmp_path, PLACED)  # no Nodes: quota alone, as the docs say
    assert code == 0, output
    assert [a["workload"] for a in json.loads(output)["admit"]] == ["n/big"]


def test_admit_counts_the_room_a_running_workload_takes_on_the_node_it_names(
    tmp_path: Path,
) -> None:
    small = PLACED.replace("nvidia.com/gpu: 6", "nvidia.com/gpu: 4")
    running = RUNNING.replace("NODES", ", nodes: [{name: a, count: 1}]")
    code, output = _admit(tmp_path, small, running, _node("a"), _node("b"))
    assert code == 0, output
    (admitted,) = json.loads(output)["admit"]
    assert "planned on b" in admitted["reason"], admitted["reason"]  # a has 3 GPUs left


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        ("", ["podSetAssignments[0].nodes", "required when the file has Nodes", "no Pods"]),
        (", nodes: [{name: c, count: 1}]", ["nodes[0].name", "no Node 'c' in the file"]),
        (", nodes: [{name: a, count: 2}]", ["2 pods placed, but 1 admitted"]),
    ],
)
def test_admit_refuses_a_running_workload_whose_nodes_it_cannot_read(
    tmp_path: Path, running: str, expected: list[str]
) -> None:
    documents = (PLACED, RUNNING.replace("NODES", running), _node("a"))
    code, output = _admit(tmp_path, *documents)
    assert code != 0
    for text in expected:
        assert text in output, output
    # fairshare places nothing: the same file is read.
    code, output = invoke("fairshare", str(tmp_path / "cluster.yaml"), "-o", "json")
    assert code == 0, output


def test_admit_refuses_pods_naming_the_kind(tmp_path: Path) -> None:
    pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: n}\nspec: {nodeName: a}"
    code, output = _admit(tmp_path, PLACED, _node("a"), pod)
    assert code != 0
    assert "'Pod' is not accepted" in output, output
