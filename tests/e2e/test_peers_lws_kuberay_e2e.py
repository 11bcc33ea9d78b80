"""LeaderWorkerSet and KubeRay as peers, end to end: both built from exact versions on the Go
module proxy and run by `muster local-cluster up --with lws,kuberay`'s code against the local
cluster, with no Muster controller in the way. An LWS of 2 replicas x 3 makes its leader
StatefulSet and one worker StatefulSet per group, 6 pods carrying LWS's labels; a RayCluster
with a head and a worker group of 2 makes 3 pods carrying KubeRay's labels, none while it is
suspended. kube-scheduler binds them all to kwok nodes: the controllers really run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import create, get

pytestmark = pytest.mark.e2e

PEERS = "lws,kuberay"

LWS = "leaderworkerset.sigs.k8s.io"
POOL = "muster-e2e/pool"


def pod_spec(namespace: str, image: str) -> dict[str, Any]:
    """One container, on this test's own nodes (the session's cluster has others')."""
    container = {"name": "main", "image": image, "resources": {"requests": {"cpu": "100m"}}}
    return {"nodeSelector": {POOL: namespace}, "containers": [container]}


def bound(pods: list[dict[str, Any]]) -> bool:
    return all(p["spec"].get("nodeName") for p in pods)


def test_leaderworkerset_makes_one_leader_and_its_workers_per_group(
    cluster: ClusterHandle, namespace: str, peers: list[str]
) -> None:
    assert peers == ["lws", "kuberay"]
    nodes = cluster.nodes(2, cpu="8", memory="16Gi", labels={POOL: namespace})
    create(
        cluster,
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": "infer", "namespace": namespace},
            "spec": {
                "replicas": 2,
                "leaderWorkerTemplate": {
                    "size": 3,
                    "workerTemplate": {"spec": pod_spec(namespace, "busybox")},
                },
            },
        },
    )

    def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = get(
            cluster, "pods", "-n", namespace, "-l", f"{LWS}/name=infer"
        )["items"]
        return items

    cluster.wait_for("6 pods of the LWS, all bound", lambda: len(pods()) == 6 and bound(pods()))
    found = pods()
    assert {p["spec"]["nodeName"] for p in found} <= set(nodes)
    assert {p["spec"]["schedulerName"] for p in found} == {"default-scheduler"}
    by_name = {p["metadata"]["name"]: p for p in found}
    assert sorted(by_name) == [
        "infer-0",
        "infer-0-1",
        "infer-0-2",
        "infer-1",
        "infer-1-1",
        "infer-1-2",
    ]
    for name, pod in by_name.items():
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        group, _, worker = name.removeprefix("infer-").partition("-")
        assert labels[f"{LWS}/name"] == "infer"
        assert labels[f"{LWS}/group-index"] == group
        assert labels[f"{LWS}/worker-index"] == (worker or "0")
        assert labels[f"{LWS}/group-key"]  # the same for a leader and its workers
        assert annotations[f"{LWS}/size"] == "3"
        if worker:
            assert annotations[f"{LWS}/leader-name"] == f"infer-{group}"
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == (
            "StatefulSet",
            f"infer-{group}" if worker else "infer",
        )
    assert len({by_name[f"infer-{g}"]["metadata"]["labels"][f"{LWS}/group-key"] for g in "01"}) == 2

    sets = {
        s["metadata"]["name"]: s["spec"]["replicas"]
        for s in get(cluster, "statefulsets", "-n", namespace)["items"]
    }
    assert sets == {"infer": 2, "infer-0": 2, "infer-1": 2}


def raycluster(name: str, namespace: str, suspend: bool) -> dict[str, Any]:
    def template() -> dict[str, Any]:
        return {"spec": pod_spec(namespace, "rayproject/ray")}

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "suspend": suspend,
            "headGroupSpec": {"rayStartParams": {}, "template": template()},
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": 2,
                    "minReplicas": 0,
                    "maxReplicas": 4,
                    "rayStartParams": {},
                    "template": template(),
                }
            ],
        },
    }


def test_raycluster_makes_its_head_and_workers_once_unsuspended(
    cluster: ClusterHandle, namespace: str, peers: list[str]
) -> None:
    nodes = cluster.nodes(2, cpu="8", memory="16Gi", labels={POOL: namespace})
    create(cluster, raycluster("rc", namespace, suspend=True))

    def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = get(
            cluster, "pods", "-n", namespace, "-l", "ray.io/cluster=rc"
        )["items"]
        return items

    # Suspended: KubeRay records it and creates nothing.
    cluster.wait_for(
        "KubeRay to mark the RayCluster suspended",
        lambda: any(
            c.get("type") == "RayClusterSuspended" and c.get("status") == "True"
            for c in (get(cluster, "raycluster", "rc", "-n", namespace).get("status") or {}).get(
                "conditions"
            )
            or []
        ),
    )
    assert pods() == []

    cluster.kubectl(
        "patch",
        "raycluster",
        "rc",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"suspend":false}}',
    )
    cluster.wait_for(
        "3 pods of the RayCluster, all bound", lambda: len(pods()) == 3 and bound(pods())
    )
    found = pods()
    assert {p["spec"]["nodeName"] for p in found} <= set(nodes)
    roles = sorted(
        (p["metadata"]["labels"]["ray.io/node-type"], p["metadata"]["labels"]["ray.io/group"])
        for p in found
    )
    assert roles == [("head", "headgroup"), ("worker", "gpu"), ("worker", "gpu")]
