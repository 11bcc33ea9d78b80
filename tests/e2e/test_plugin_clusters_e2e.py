"""`kubectl muster clusters` through kubectl's plugin mechanism against the local cluster:
two WorkerClusters created with kubectl, their status written as the controller writes it
(`kubectl patch --subresource=status`), and a ClusterQueue that dispatches to one of them.

No controller runs in this module, so that nothing rewrites the status the test wrote; the
objects have names of their own (the shared cluster may hold other tests' WorkerClusters)
and are deleted at the end."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    apply,
    crds,  # noqa: F401 - fixture
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest
from tests.e2e.test_plugin_e2e import kubectl_muster

pytestmark = pytest.mark.e2e


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def worker(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "WorkerCluster",
        "metadata": {"name": name, "labels": labels},
        "spec": {"kubeconfig": {"name": f"{name}-kubeconfig"}},
    }


@pytest.fixture
def workers(cluster: ClusterHandle, crds: None) -> Iterator[dict[str, str]]:  # noqa: F811
    """Worker west (answering, selected by a dispatching queue), worker east (lost)."""
    tag = uuid.uuid4().hex[:6]
    names = {"west": f"wc-{tag}-west", "east": f"wc-{tag}-east", "cq": f"cq-{tag}"}
    region = f"e2e-{tag}"
    now = datetime.now(UTC)
    try:
        apply(
            cluster,
            worker(names["west"], {"muster-e2e/region": f"{region}-west"}),
            worker(names["east"], {"muster-e2e/region": f"{region}-east"}),
            cq_manifest(
                names["cq"],
                [{"name": f"f-{tag}", "quota": {"cpu": "1"}}],
                dispatch={
                    "clusterSelector": {"matchLabels": {"muster-e2e/region": f"{region}-west"}}
                },
            ),
        )
        statuses = {
            "west": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True",
                        "reason": "Connected",
                        "message": "answers",
                        "lastTransitionTime": _stamp(now),
                    }
                ],
                "lastSeen": _stamp(now - timedelta(seconds=5)),
                "nodes": 3,
                "capacity": {"cpu": "96", "memory": "768Gi", "nvidia.com/gpu": "24", "pods": "330"},
                "usage": {"cpu": "10500m", "memory": "64Gi", "nvidia.com/gpu": "8"},
                "dispatched": 2,
            },
            "east": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "False",
                        "reason": "Lost",
                        "message": "no answer for 5h",
                        "lastTransitionTime": _stamp(now),
                    }
                ],
                "lastSeen": _stamp(now - timedelta(hours=5)),
                "nodes": 0,
                "dispatched": 1,
            },
        }
        for which, status in statuses.items():
            cluster.kubectl(
                "patch",
                "workerclusters.muster.dev",
                names[which],
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": status}),
            )
        yield names
    finally:
        cluster.kubectl(
            "delete",
            "workerclusters.muster.dev",
            names["west"],
            names["east"],
            "--ignore-not-found",
            check=False,
        )
        cluster.kubectl(
            "delete", "clusterqueues.muster.dev", names["cq"], "--ignore-not-found", check=False
        )


def table(out: str) -> dict[str, dict[str, str]]:
    """The plugin's table as {name: {column: cell}} (columns are two or more spaces apart)."""
    lines = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.strip()]
    header = lines[0]
    assert header[0] == "NAME", out
    return {row[0]: dict(zip(header, row, strict=True)) for row in lines[1:]}


def test_clusters_lists_each_worker_with_state_usage_and_the_queues_that_select_it(
    cluster: ClusterHandle, workers: dict[str, str]
) -> None:
    out = kubectl_muster(cluster, "clusters", "--color", "never").stdout
    rows = table(out)
    west, east = rows[workers["west"]], rows[workers["east"]]
    columns = list(west)
    assert columns[:6] == ["NAME", "ACTIVE", "LAST SEEN", "NODES", "CPU", "MEMORY"]
    assert "nvidia.com/gpu" in columns and "pods" not in columns
    assert columns[-2:] == ["DISPATCHED", "CLUSTERQUEUES"]

    assert west["ACTIVE"] == "True (Connected)"
    assert re.fullmatch(r"\d+s ago", west["LAST SEEN"]), west
    assert (west["NODES"], west["CPU"], west["MEMORY"]) == ("3", "10500m/96", "64Gi/768Gi")
    assert west["nvidia.com/gpu"] == "8/24"
    assert west["DISPATCHED"] == "2"
    # Only its own queue is checked: another test's queue selecting every worker may exist.
    assert workers["cq"] in west["CLUSTERQUEUES"].split(", ")

    assert east["ACTIVE"] == "False (Lost)"
    assert re.fullmatch(r"5h(\d+m)? ago", east["LAST SEEN"]), east
    assert (east["NODES"], east["CPU"], east["MEMORY"]) == ("0", "-", "-")
    assert east["nvidia.com/gpu"] == "-"
    assert east["DISPATCHED"] == "1"
    assert workers["cq"] not in east["CLUSTERQUEUES"].split(", ")
