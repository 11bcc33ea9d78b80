"""Kubeflow TrainJob end to end, with the real Trainer and JobSet controllers (built from
their modules, run by `muster local-cluster up --with trainer`'s code): a labelled TrainJob
whose runtime has two roles is suspended on creation, admitted whole under quota (one pod
set per role, the trainer's sized by `numNodes` and `resourcesPerNode`) while a second one
waits, its pods are placed all-or-nothing by Muster's scheduler on the flavor's nodes,
they complete, and the quota goes to the second."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    crds,  # noqa: F401 - fixture
    create,
    finished,
    flavor,
    get,
    local_queue,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

PEERS = "trainer"


@pytest.fixture(scope="module")
def controller(
    cluster: ClusterHandle,
    crds: None,  # noqa: F811
    peers: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Controller]:
    """Started after the peers: Muster integrates the kinds whose CRDs it finds served."""
    assert peers == ["jobset", "trainer"]
    ctl = Controller(cluster, tmp_path_factory.mktemp("controller"), "ctl-" + uuid.uuid4().hex[:6])
    ctl.start()
    try:
        ctl.wait_leading()
        yield ctl
    finally:
        ctl.stop()


def role(name: str, ancestor: str | None, runs_for: str) -> dict[str, Any]:
    job_meta: dict[str, Any] = {}
    if ancestor:
        job_meta["labels"] = {"trainer.kubeflow.org/trainjob-ancestor-step": ancestor}
    return {
        "name": name,
        "template": {
            "metadata": job_meta,
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {
                        "annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": runs_for}
                    },
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "node",
                                "image": "busybox",
                                "resources": {"requests": {"cpu": "1"}},
                            }
                        ],
                    },
                },
            },
        },
    }


def runtime(name: str, runs_for: str) -> dict[str, Any]:
    """Two roles, started together: a launcher and the trainer nodes."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"numNodes": 1},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        role("launcher", None, runs_for),
                        role("node", "trainer", runs_for),
                    ]
                }
            },
        },
    }


def trainjob(
    name: str, namespace: str, queue: str, runtime_name: str, nodes: int
) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"muster.dev/queue-name": queue},
        },
        "spec": {
            "runtimeRef": {"name": runtime_name},
            "trainer": {
                "numNodes": nodes,
                "resourcesPerNode": {"requests": {"cpu": "1"}},
            },
        },
    }


def pods_of_trainjob(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    # The Trainer runs a TrainJob as a JobSet of the same name.
    data = get(cluster, "pods", "-n", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={name}")
    items: list[dict[str, Any]] = data["items"]
    return items


def test_trainjob_is_admitted_whole_placed_all_or_nothing_and_releases_quota(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,
) -> None:
    pool = unique("tj")
    pool_nodes = cluster.nodes(2, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    rt = unique("rt")
    apply(
        cluster,
        runtime(rt, "8s"),
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}]),
        local_queue("team", namespace, cq),
    )
    # 1 launcher + 2 nodes, 1 cpu each: 3 of the 4 cpu.
    first = trainjob("first", namespace, "team", rt, nodes=2)
    assert "suspend" not in first["spec"]
    assert create(cluster, first)["spec"]["suspend"] is True

    cluster.wait_for(
        "the TrainJob's Workload to be admitted",
        lambda: any(admitted(w) for w in workloads_of(cluster, namespace, "first")),
    )
    [wl] = workloads_of(cluster, namespace, "first")
    owner = wl["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("TrainJob", "first")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [
        ("launcher", 1),
        ("node", 2),
    ]

    # A second one (3 cpu) waits while the first holds 3 of 4.
    create(cluster, trainjob("second", namespace, "team", rt, nodes=2))
    cluster.wait_for(
        "the second TrainJob to wait for quota",
        lambda: (
            bool(workloads_of(cluster, namespace, "second"))
            and condition(workloads_of(cluster, namespace, "second")[0], "QuotaReserved").get(
                "reason"
            )
            == "Pending"
        ),
    )
    assert get(cluster, "trainjob", "second", "-n", namespace)["spec"]["suspend"] is True

    def all_bound() -> bool:
        pods = pods_of_trainjob(cluster, namespace, "first")
        return len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods)

    cluster.wait_for("all 3 pods of the first TrainJob to be bound", all_bound, timeout=90)
    pods = pods_of_trainjob(cluster, namespace, "first")
    assert {p["spec"]["schedulerName"] for p in pods} == {"muster-scheduler"}
    assert {p["spec"]["nodeName"] for p in pods} <= set(pool_nodes)
    assert {p["spec"]["nodeSelector"]["muster-e2e/pool"] for p in pods} == {pool}

    cluster.wait_for(
        "the first TrainJob's Workload to finish",
        lambda: finished(workloads_of(cluster, namespace, "first")[0]),
        timeout=90,
    )
    cluster.wait_for(
        "the second TrainJob's Workload to be admitted and finish",
        lambda: finished(workloads_of(cluster, namespace, "second")[0]),
        timeout=90,
    )
    assert len(pods_of_trainjob(cluster, namespace, "second")) == 3


def test_a_trainjob_whose_nodes_wait_for_an_initializer_runs_in_stages(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,
) -> None:
    pool = unique("tji")
    pool_nodes = cluster.nodes(1, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    rt = runtime(unique("rt-init"), "3s")
    initializer = role("dataset-initializer", "dataset-initializer", "2s")
    initializer_pod = initializer["template"]["spec"]["template"]["spec"]
    initializer_pod["containers"][0]["name"] = "dataset-initializer"
    nodes = rt["spec"]["template"]["spec"]["replicatedJobs"][1]
    nodes["dependsOn"] = [{"name": "dataset-initializer", "status": "Complete"}]
    rt["spec"]["template"]["spec"]["replicatedJobs"] = [initializer, nodes]
    apply(
        cluster,
        rt,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}]),
        local_queue("team", namespace, cq),
    )
    create(cluster, trainjob("staged", namespace, "team", rt["metadata"]["name"], nodes=2))

    # Admitted whole (quota for every role at once); the initializer's pod is placed first,
    # the nodes' pods (created by JobSet only once it completed) after it, all by Muster.
    cluster.wait_for(
        "the staged TrainJob's Workload to finish",
        lambda: (
            bool(workloads_of(cluster, namespace, "staged"))
            and finished(workloads_of(cluster, namespace, "staged")[0])
        ),
        timeout=120,
    )
    [wl] = workloads_of(cluster, namespace, "staged")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [
        ("dataset-initializer", 1),
        ("node", 2),
    ]
    pods = pods_of_trainjob(cluster, namespace, "staged")
    roles = sorted(p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] for p in pods)
    assert roles == ["dataset-initializer", "node", "node"]
    assert {p["spec"]["schedulerName"] for p in pods} == {"muster-scheduler"}
    assert {p["spec"]["nodeName"] for p in pods} <= set(pool_nodes)
    done = condition(get(cluster, "trainjob", "staged", "-n", namespace), "Complete")
    assert done.get("status") == "True", done
