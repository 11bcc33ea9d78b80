"""`kubectl muster clusters` on fake WorkerCluster and ClusterQueue objects: one row per
worker with its Active state and reason, how long since it answered, used / capacity per
resource in Kubernetes' units, what was dispatched there, and the queues that select it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes.client.exceptions import ApiException
from rich.console import Console

from controllers.plugin.clusters import (
    NO_WORKERS,
    Dispatchers,
    clusters_table,
    human_age,
    notes,
    resources_of,
)
from controllers.plugin.kube import Target
from controllers.plugin.main import main as plugin_main

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def render(table: Any) -> str:
    console = Console(width=400, no_color=True, force_terminal=False)
    with console.capture() as out:
        console.print(table)
    return out.get()


def worker(name: str, labels: dict[str, str] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"kubeconfig": {"name": name, "namespace": "muster-system"}},
        "status": status,
    }


def active(status: str, reason: str) -> list[dict[str, str]]:
    return [{"type": "Active", "status": status, "reason": reason}]


def cq(name: str, selector: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"flavors": []}
    if selector is not None:
        spec["dispatch"] = {"clusterSelector": selector}
    return {"metadata": {"name": name}, "spec": spec}


def rows(text: str) -> dict[str, str]:
    """Each table line by its first word (the worker's name, or NAME for the header)."""
    return {line.split()[0]: line for line in text.splitlines() if line.strip()}


def test_each_worker_shows_state_age_nodes_used_of_capacity_dispatched_and_queues() -> None:
    workers = [
        worker(
            "west",
            {"region": "west", "gpu": "h100"},
            conditions=active("True", "Connected"),
            lastSeen=(NOW - timedelta(seconds=12)).isoformat().replace("+00:00", "Z"),
            nodes=4,
            capacity={"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "32", "pods": "440"},
            usage={"cpu": "40500m", "memory": "100Gi", "nvidia.com/gpu": "12"},
            dispatched=3,
        ),
        worker(
            "east",
            {"region": "east"},
            conditions=active("False", "Lost"),
            lastSeen=(NOW - timedelta(hours=5, minutes=10)).isoformat(),
            nodes=2,
            capacity={"cpu": "64", "memory": "512Gi", "example.com/fpga": "2"},
            usage={},
        ),
    ]
    queues = [
        cq("gpu-west", {"matchLabels": {"region": "west"}}),
        cq("anywhere", {}),
        cq(
            "not-east",
            {"matchExpressions": [{"key": "region", "operator": "NotIn", "values": ["east"]}]},
        ),
        cq("local-only", None),
    ]
    text = render(clusters_table(workers, Dispatchers.of(queues), NOW))
    by_name = rows(text)
    header = by_name["NAME"].split()
    assert header[:5] == ["NAME", "ACTIVE", "LAST", "SEEN", "NODES"]
    # cpu and memory first, then every extended resource any worker has, by name; not pods.
    assert header[5:9] == ["CPU", "MEMORY", "example.com/fpga", "nvidia.com/gpu"]
    assert header[9:] == ["DISPATCHED", "CLUSTERQUEUES"]
    assert "pods" not in text
    west = by_name["west"].split()
    assert west[:6] == ["west", "True", "(Connected)", "12s", "ago", "4"]
    assert west[6:10] == ["40500m/128", "100Gi/1Ti", "-", "12/32"]
    assert west[10] == "3"
    assert " ".join(west[11:]) == "anywhere, gpu-west, not-east"
    east = by_name["east"].split()
    assert east[:6] == ["east", "False", "(Lost)", "5h10m", "ago", "2"]
    # Capacity without usage is nothing used; a resource it does not report at all is "-".
    assert east[6:10] == ["0/64", "0/512Gi", "0/2", "-"]
    assert east[10:] == ["0", "anywhere"]
    # By name, west after east.
    assert text.index("east") < text.index("west ")


def test_a_worker_not_seen_yet_and_one_with_no_queue_selecting_it() -> None:
    text = render(
        clusters_table(
            [worker("fresh", {"region": "north"})],
            Dispatchers.of([cq("west", {"matchLabels": {"region": "west"}})]),
            NOW,
        )
    )
    fresh = rows(text)["fresh"].split()
    assert fresh[:6] == ["fresh", "Unknown", "(not", "seen", "yet)", "never"]
    assert fresh[6:] == ["0", "-", "-", "0", "-"]


def test_unreadable_queues_and_an_unusable_selector_are_said_not_hidden() -> None:
    hidden = Dispatchers.of(None)
    text = render(clusters_table([worker("w")], hidden, NOW))
    assert rows(text)["w"].split()[-1] == "?"
    assert "queue-reader" in notes(hidden)[0]
    bad = Dispatchers.of([cq("odd", {"matchExpressions": [{"key": "k", "operator": "In"}]})])
    assert bad.of_worker(worker("w", {"k": "v"})) == "-"
    assert notes(bad) == [
        "ClusterQueue odd: its spec.dispatch.clusterSelector is not a valid label selector; "
        "it selects no worker here"
    ]


def test_an_amount_that_is_not_a_quantity_is_a_question_mark() -> None:
    status = {"capacity": {"nvidia.com/gpu": "lots"}, "usage": {"nvidia.com/gpu": "1"}}
    text = render(clusters_table([worker("w", **status)], Dispatchers.of([]), NOW))
    assert "1/?" in rows(text)["w"]


def test_resource_columns_are_cpu_memory_then_extended_resources_only() -> None:
    workers = [
        worker("a", capacity={"hugepages-2Mi": "1Gi", "ephemeral-storage": "1Ti", "b.io/x": 1}),
        worker("b", usage={"kubernetes.io/batch-cpu": "1", "a.io/y": 2, "pods": 3}),
    ]
    assert resources_of(workers) == ["cpu", "memory", "a.io/y", "b.io/x"]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600, "3h"),
        (5 * 3600 + 600, "5h10m"),
        (47 * 3600, "47h"),
        (2 * 86400 + 3 * 3600, "2d3h"),
        (9 * 86400, "9d"),
        (3 * 365 * 86400 + 86400 * 4, "3y4d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_ages_read_as_kubectl_prints_them(seconds: int, shown: str) -> None:
    assert human_age(seconds) == shown


def test_the_empty_message_is_one_line() -> None:
    assert "\n" not in NO_WORKERS and NO_WORKERS.startswith("no WorkerClusters")


class FakeKube:
    """What `clusters` asks the apiserver, answered from lists (or refused)."""

    def __init__(self, workers: list[dict[str, Any]] | int, queues: list[Any] | int) -> None:
        self.answers = {"WorkerCluster": workers, "ClusterQueue": queues}

    def list(self, kind: Any, namespace: str | None = None, **_: Any) -> tuple[list[Any], str]:
        answer = self.answers[kind.name]
        if isinstance(answer, int):
            raise ApiException(status=answer, reason="refused")
        return answer, "1"


def invoke(monkeypatch: pytest.MonkeyPatch, kube: FakeKube) -> Any:
    monkeypatch.setattr(Target, "kube", lambda self: kube)
    return CliRunner().invoke(plugin_main, ["clusters", "--color", "never"])


def test_no_workers_is_one_line_and_success(monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(monkeypatch, FakeKube([], []))
    assert result.exit_code == 0
    assert result.output == NO_WORKERS + "\n"


def test_a_cluster_without_the_crd_is_told_to_apply_it(monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(monkeypatch, FakeKube(404, []))
    assert result.exit_code == 1
    assert "does not serve WorkerClusters" in result.output and "crds/" in result.output
    refused = invoke(monkeypatch, FakeKube(403, []))
    assert refused.exit_code == 1
    assert "listing WorkerClusters: refused (HTTP 403)" in refused.output


def test_unreadable_queues_still_list_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(monkeypatch, FakeKube([worker("w", nodes=2)], 403))
    assert result.exit_code == 0, result.output
    line = rows(result.output)["w"]
    assert line.split()[-1] == "?"
    assert "ClusterQueues are not readable with your rights" in result.output
