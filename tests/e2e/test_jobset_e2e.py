"""JobSet end to end, with the real JobSet controller (built from its module, run by
`muster local-cluster up --with jobset`'s code): a labelled JobSet with two replicated jobs is
suspended on creation, admitted whole under its queue's quota while a second one waits,
its pods are placed all-or-nothing by Muster's scheduler on the flavor's nodes, they
complete, and the quota goes to the second."""

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
    events_for,
    finished,
    flavor,
    get,
    local_queue,
    preempting_queue,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

PEERS = "jobset"


@pytest.fixture(scope="module")
def controller(
    cluster: ClusterHandle,
    crds: None,  # noqa: F811
    peers: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Controller]:
    """Started after the peers: Muster integrates the kinds whose CRDs it finds served."""
    ctl = Controller(cluster, tmp_path_factory.mktemp("controller"), "ctl-" + uuid.uuid4().hex[:6])
    ctl.start()
    try:
        ctl.wait_leading()
        yield ctl
    finally:
        ctl.stop()


def replicated_job(name: str, replicas: int, runs_for: str) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": 1,
                "completions": 1,
                "backoffLimit": 0,
                "template": {
                    "metadata": {
                        "annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": runs_for}
                    },
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "resources": {"requests": {"cpu": "1"}},
                            }
                        ],
                    },
                },
            }
        },
    }


def jobset(name: str, namespace: str, queue: str, workers: int, runs_for: str) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"muster.dev/queue-name": queue},
        },
        "spec": {
            "replicatedJobs": [
                replicated_job("leader", 1, runs_for),
                replicated_job("workers", workers, runs_for),
            ]
        },
    }


def pods_of_jobset(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    data = get(cluster, "pods", "-n", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={name}")
    items: list[dict[str, Any]] = data["items"]
    return items


def test_jobset_is_admitted_whole_placed_all_or_nothing_and_releases_quota(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,
) -> None:
    pool = unique("js")
    pool_nodes = cluster.nodes(2, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}]),
        local_queue("team", namespace, cq),
    )
    # 1 leader + 3 workers, 1 cpu each: the whole quota.
    first = jobset("first", namespace, "team", workers=3, runs_for="8s")
    assert "suspend" not in first["spec"]
    assert create(cluster, first)["spec"]["suspend"] is True

    cluster.wait_for(
        "the JobSet's Workload to be admitted",
        lambda: any(admitted(w) for w in workloads_of(cluster, namespace, "first")),
    )
    [wl] = workloads_of(cluster, namespace, "first")
    owner = wl["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("JobSet", "first")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [
        ("leader", 1),
        ("workers", 3),
    ]

    # A second JobSet (2 cpu) waits while the first holds the whole quota.
    create(cluster, jobset("second", namespace, "team", workers=1, runs_for="2s"))
    cluster.wait_for(
        "the second JobSet to wait for quota",
        lambda: (
            bool(workloads_of(cluster, namespace, "second"))
            and condition(workloads_of(cluster, namespace, "second")[0], "QuotaReserved").get(
                "reason"
            )
            == "Pending"
        ),
    )
    waiting = condition(workloads_of(cluster, namespace, "second")[0], "QuotaReserved")
    assert "cpu" in waiting["message"], waiting
    assert get(cluster, "jobset", "second", "-n", namespace)["spec"]["suspend"] is True

    # The first runs: every one of its 4 pods, of both replicated jobs, bound by Muster's
    # scheduler to the flavor's nodes.
    def all_bound() -> bool:
        pods = pods_of_jobset(cluster, namespace, "first")
        return len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods)

    cluster.wait_for("all 4 pods of the first JobSet to be bound", all_bound, timeout=90)
    pods = pods_of_jobset(cluster, namespace, "first")
    assert {p["spec"]["schedulerName"] for p in pods} == {"muster-scheduler"}
    assert {p["spec"]["nodeName"] for p in pods} <= set(pool_nodes)
    assert {p["spec"]["nodeSelector"]["muster-e2e/pool"] for p in pods} == {pool}
    roles = sorted(p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] for p in pods)
    assert roles == ["leader", "workers", "workers", "workers"]

    # Its pods complete (kwok), the JobSet completes, its Workload finishes and releases the
    # quota: the second is admitted, runs and completes too.
    cluster.wait_for(
        "the first JobSet's Workload to finish",
        lambda: finished(workloads_of(cluster, namespace, "first")[0]),
        timeout=90,
    )
    cluster.wait_for(
        "the second JobSet's Workload to be admitted and finish",
        lambda: finished(workloads_of(cluster, namespace, "second")[0]),
        timeout=90,
    )
    second_pods = pods_of_jobset(cluster, namespace, "second")
    assert len(second_pods) == 2
    assert {p["spec"]["schedulerName"] for p in second_pods} == {"muster-scheduler"}
    done = condition(get(cluster, "jobset", "second", "-n", namespace), "Completed")
    assert done.get("status") == "True", done


def test_a_running_jobset_is_evicted_by_suspension_and_queued_again(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,
) -> None:
    pool = unique("jsp")
    cluster.nodes(1, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    low, high = preempting_queue(cluster, namespace, pool, "4")

    def with_priority(obj: dict[str, Any], name: str) -> dict[str, Any]:
        for rj in obj["spec"]["replicatedJobs"]:
            rj["template"]["spec"]["template"]["spec"]["priorityClassName"] = name
        return obj

    create(cluster, with_priority(jobset("long", namespace, "team", 3, "600s"), low))

    def bound(name: str) -> set[str]:
        return {
            p["metadata"]["name"]
            for p in pods_of_jobset(cluster, namespace, name)
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        }

    cluster.wait_for(
        "all 4 pods of the low-priority JobSet to be bound",
        lambda: len(bound("long")) == 4,
        timeout=90,
    )
    first_run = bound("long")
    create(cluster, with_priority(jobset("urgent", namespace, "team", 3, "2s"), high))

    # Evicted whole by suspension; the urgent one runs to completion in its place, and the
    # evicted one is admitted again and runs anew (new pods, all 4 bound together).
    cluster.wait_for(
        "the low-priority JobSet to be suspended",
        lambda: get(cluster, "jobset", "long", "-n", namespace)["spec"]["suspend"] is True,
        timeout=90,
    )
    cluster.wait_for(
        "the urgent JobSet's Workload to finish",
        lambda: (
            bool(workloads_of(cluster, namespace, "urgent"))
            and finished(workloads_of(cluster, namespace, "urgent")[0])
        ),
        timeout=120,
    )
    cluster.wait_for(
        "the evicted JobSet to run again",
        lambda: len(bound("long")) == 4 and not bound("long") & first_run,
        timeout=90,
    )
    assert "Stopped" in events_for(cluster, namespace, "JobSet", "long")
    [wl] = workloads_of(cluster, namespace, "long")
    assert admitted(wl)
