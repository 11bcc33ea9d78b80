"""Ray end to end, with the real KubeRay operator (built from its module, run by `muster
local-cluster up --with kuberay`'s code) and Muster's controller: a labelled RayCluster with
a head and two worker groups is created suspended, waits whole while its queue is too small
(nothing created, nothing bound), and once the quota is raised is admitted and placed as one
gang by Muster's scheduler on the flavor's nodes. A RayCluster naming a LocalQueue that does
not exist is told why on its Workload. An autoscaled RayCluster resizes through slices."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from quota.api.names import POD_SET_POD_LABEL
from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    create,
    events_for,
    flavor,
    get,
    local_queue,
    preempting_queue,
    unique,
    wait_told_missing_queue,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

PEERS = "kuberay"


def template() -> dict[str, Any]:
    container = {"name": "ray", "image": "rayproject/ray", "resources": {"requests": {"cpu": "1"}}}
    return {"spec": {"containers": [container]}}


def raycluster(name: str, namespace: str, queue: str) -> dict[str, Any]:
    def group(name: str, replicas: int) -> dict[str, Any]:
        return {
            "groupName": name,
            "replicas": replicas,
            "minReplicas": 0,
            "maxReplicas": 4,
            "rayStartParams": {},
            "template": template(),
        }

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"muster.dev/queue-name": queue},
        },
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": template()},
            "workerGroupSpecs": [group("small", 2), group("large", 2)],
        },
    }


def pods_of_cluster(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(
        cluster, "pods", "-n", namespace, "-l", f"ray.io/cluster={name}"
    )["items"]
    return items


def quota(cq: str, pool: str, cpu: str, **more: str) -> dict[str, Any]:
    room = {"cpu": cpu, **more}
    return cq_manifest(cq, [{"name": pool, "quota": room, "limit": room}])


def test_a_raycluster_waits_whole_then_runs_as_one_gang_on_the_flavor(
    cluster: ClusterHandle,
    namespace: str,
    peers: list[str],
    controller: Controller,  # noqa: F811 - fixture
) -> None:
    pool = unique("ray")
    pool_nodes = cluster.nodes(3, cpu="2", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    # 1 head + 2 + 2 workers, 1 cpu each: 5 cpu, the queue holds 4.
    apply(cluster, flavor(pool, pool), quota(cq, pool, "4"), local_queue("team", namespace, cq))
    created = create(cluster, raycluster("rc", namespace, "team"))
    assert created["spec"]["suspend"] is True

    cluster.wait_for(
        "the RayCluster's Workload to wait for quota",
        lambda: (
            bool(workloads_of(cluster, namespace, "rc"))
            and condition(workloads_of(cluster, namespace, "rc")[0], "QuotaReserved").get("reason")
            == "Pending"
        ),
    )
    [wl] = workloads_of(cluster, namespace, "rc")
    owner = wl["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("RayCluster", "rc")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [
        ("head", 1),
        ("small", 2),
        ("large", 2),
    ]
    # Not a part of it runs while the whole does not fit.
    time.sleep(5)
    assert get(cluster, "raycluster", "rc", "-n", namespace)["spec"]["suspend"] is True
    assert pods_of_cluster(cluster, namespace, "rc") == []

    apply(cluster, quota(cq, pool, "6"))
    cluster.wait_for(
        "the RayCluster's Workload to be admitted",
        lambda: admitted(workloads_of(cluster, namespace, "rc")[0]),
        timeout=60,
    )

    def all_bound() -> bool:
        pods = pods_of_cluster(cluster, namespace, "rc")
        return len(pods) == 5 and all(p["spec"].get("nodeName") for p in pods)

    cluster.wait_for("all 5 pods of the RayCluster to be bound", all_bound, timeout=120)
    pods = pods_of_cluster(cluster, namespace, "rc")
    assert {p["spec"]["schedulerName"] for p in pods} == {"muster-scheduler"}
    assert {p["spec"]["nodeName"] for p in pods} <= set(pool_nodes)
    assert {p["spec"]["nodeSelector"]["muster-e2e/pool"] for p in pods} == {pool}
    sets = sorted(
        (p["metadata"]["labels"][POD_SET_POD_LABEL], p["metadata"]["labels"]["ray.io/node-type"])
        for p in pods
    )
    assert sets == [
        ("head", "head"),
        ("large", "worker"),
        ("large", "worker"),
        ("small", "worker"),
        ("small", "worker"),
    ]
    started = get(cluster, "raycluster", "rc", "-n", namespace)
    assert started["spec"]["suspend"] is False
    # Gang placement: the scheduler bound the whole set in one go, never a part first —
    # every pod was bound after the last one was created.
    created_last = max(p["metadata"]["creationTimestamp"] for p in pods)
    for pod in pods:
        scheduled = condition(pod, "PodScheduled")
        assert scheduled.get("status") == "True"
        assert scheduled["lastTransitionTime"] >= created_last


def test_a_raycluster_naming_a_missing_local_queue_is_told_why(
    cluster: ClusterHandle,
    namespace: str,
    peers: list[str],
    controller: Controller,  # noqa: F811 - fixture
) -> None:
    assert create(cluster, raycluster("lost", namespace, "no-such-queue"))["spec"]["suspend"]
    wait_told_missing_queue(cluster, namespace, "lost", "no-such-queue")
    assert pods_of_cluster(cluster, namespace, "lost") == []


def test_a_rayjob_is_one_workload_its_cluster_and_submitter_placed_by_muster(
    cluster: ClusterHandle,
    namespace: str,
    peers: list[str],
    controller: Controller,  # noqa: F811 - fixture
) -> None:
    pool = unique("rayjob")
    pool_nodes = cluster.nodes(2, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        quota(cq, pool, "8", memory="1Gi"),
        local_queue("team", namespace, cq),
    )
    spec = raycluster("unused", namespace, "team")["spec"]
    spec["workerGroupSpecs"] = spec["workerGroupSpecs"][:1]
    created = create(
        cluster,
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": {
                "name": "rj",
                "namespace": namespace,
                "labels": {"muster.dev/queue-name": "team"},
            },
            "spec": {
                "entrypoint": "python -c pass",
                "shutdownAfterJobFinishes": True,
                "rayClusterSpec": spec,
            },
        },
    )
    assert created["spec"]["suspend"] is True
    cluster.wait_for(
        "the RayJob's Workload to be admitted",
        lambda: (
            bool(workloads_of(cluster, namespace, "rj"))
            and admitted(workloads_of(cluster, namespace, "rj")[0])
        ),
        timeout=60,
    )
    [wl] = workloads_of(cluster, namespace, "rj")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [
        ("head", 1),
        ("small", 2),
        ("submitter", 1),
    ]

    # KubeRay makes the RayCluster (with the RayJob's labels, the queue's too): it runs at
    # once, under the RayJob's admission, and is never queued on its own.
    def cluster_name() -> str:
        status = get(cluster, "rayjob", "rj", "-n", namespace).get("status") or {}
        return str(status.get("rayClusterName") or "")

    cluster.wait_for("KubeRay to make the RayJob's RayCluster", lambda: bool(cluster_name()))
    name = cluster_name()

    def all_bound() -> bool:
        pods = pods_of_cluster(cluster, namespace, name)
        return len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods)

    cluster.wait_for("the RayJob's 3 cluster pods to be bound", all_bound, timeout=120)
    rc = get(cluster, "raycluster", name, "-n", namespace)
    assert rc["metadata"]["labels"]["muster.dev/queue-name"] == "team"
    assert not rc["spec"].get("suspend")
    items = get(cluster, "workloads.muster.dev", "-n", namespace)["items"]
    assert [w["metadata"]["name"] for w in items] == [wl["metadata"]["name"]]
    pods = pods_of_cluster(cluster, namespace, name)
    assert {p["spec"]["schedulerName"] for p in pods} == {"muster-scheduler"}
    assert {p["spec"]["nodeName"] for p in pods} <= set(pool_nodes)

    # Once the cluster is up, KubeRay submits from a Job's pod: the Workload's `submitter`.
    def submitter() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = get(
            cluster, "pods", "-n", namespace, "-l", f"{POD_SET_POD_LABEL}=submitter"
        )["items"]
        return items

    cluster.wait_for(
        "the submitter pod to be bound",
        lambda: len(submitter()) == 1 and bool(submitter()[0]["spec"].get("nodeName")),
        timeout=120,
    )
    [pod] = submitter()
    assert pod["spec"]["schedulerName"] == "muster-scheduler"
    assert pod["spec"]["nodeName"] in pool_nodes


def test_an_evicted_raycluster_is_suspended_its_pods_go_and_it_queues_again_as_written(
    cluster: ClusterHandle,
    namespace: str,
    peers: list[str],
    controller: Controller,  # noqa: F811 - fixture
) -> None:
    pool = unique("rayp")
    cluster.nodes(1, cpu="6", memory="16Gi", labels={"muster-e2e/pool": pool})
    low, high = preempting_queue(cluster, namespace, pool, "5")

    def with_priority(obj: dict[str, Any], name: str) -> dict[str, Any]:
        spec = obj["spec"]
        for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
            group["template"]["spec"]["priorityClassName"] = name
        return obj

    create(cluster, with_priority(raycluster("long", namespace, "team"), low))

    def bound(name: str) -> set[str]:
        return {
            p["metadata"]["name"]
            for p in pods_of_cluster(cluster, namespace, name)
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        }

    cluster.wait_for("the low-priority RayCluster to run", lambda: len(bound("long")) == 5)
    running = get(cluster, "raycluster", "long", "-n", namespace)
    assert "muster.dev/original-scheduling" in running["metadata"]["annotations"]

    create(cluster, with_priority(raycluster("urgent", namespace, "team"), high))
    cluster.wait_for(
        "the urgent RayCluster to run in the evicted one's place",
        lambda: len(bound("urgent")) == 5,
        timeout=120,
    )
    # KubeRay deleted the evicted one's pods; its templates are as its user wrote them, and
    # it waits again for quota, suspended.
    cluster.wait_for(
        "the evicted RayCluster to be restored and waiting",
        lambda: (
            not pods_of_cluster(cluster, namespace, "long")
            and "muster.dev/original-scheduling"
            not in (
                get(cluster, "raycluster", "long", "-n", namespace)["metadata"].get("annotations")
                or {}
            )
            and condition(workloads_of(cluster, namespace, "long")[0], "QuotaReserved").get(
                "reason"
            )
            == "Pending"
        ),
        timeout=90,
    )
    evicted = get(cluster, "raycluster", "long", "-n", namespace)
    assert evicted["spec"]["suspend"] is True
    head = evicted["spec"]["headGroupSpec"]["template"]["spec"]
    assert "nodeSelector" not in head
    assert "Stopped" in events_for(cluster, namespace, "RayCluster", "long")


def test_an_elastic_raycluster_resizes_its_worker_groups_through_slices_never_restarting(
    cluster: ClusterHandle,
    namespace: str,
    peers: list[str],
    controller: Controller,  # noqa: F811 - fixture
) -> None:
    """What Ray's autoscaler does (it sets a group's replicas) on a RayCluster that scales:
    the new workers wait gated for a slice while the quota is short, run once it is
    admitted, and a scale-down shrinks the admission in place; the cluster is never
    suspended and its head never restarted."""
    pool = unique("ray")
    cluster.nodes(4, cpu="2", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        quota(cq, pool, "5", memory="64Gi"),
        local_queue("team", namespace, cq),
    )
    doc = raycluster("auto", namespace, "team")
    doc["spec"]["enableInTreeAutoscaling"] = True
    doc["spec"]["workerGroupSpecs"] = doc["spec"]["workerGroupSpecs"][:1]  # "small", 2
    create(cluster, doc)

    def running(count: int) -> bool:
        pods = pods_of_cluster(cluster, namespace, "auto")
        return len(pods) == count and all(p["spec"].get("nodeName") for p in pods)

    cluster.wait_for("head and two workers bound", lambda: running(3), timeout=120)
    head = next(
        p["metadata"]["uid"]
        for p in pods_of_cluster(cluster, namespace, "auto")
        if p["metadata"]["labels"]["ray.io/node-type"] == "head"
    )

    def scale(replicas: int, delete: list[str] | None = None) -> None:
        """As Ray's autoscaler scales a group: its replicas, and (down) the workers to go,
        for KubeRay deletes none at random in an autoscaled cluster."""
        group = "/spec/workerGroupSpecs/0"
        patch: list[dict[str, Any]] = [
            {"op": "replace", "path": f"{group}/replicas", "value": replicas}
        ]
        if delete is not None:
            strategy = {"workersToDelete": delete}
            patch.append({"op": "add", "path": f"{group}/scaleStrategy", "value": strategy})
        cluster.kubectl(
            "patch", "raycluster", "auto", "-n", namespace, "--type=json", "-p", json.dumps(patch)
        )

    # The head (1 cpu, and Ray's autoscaler beside it: 0.5 cpu and 512Mi, which the queue
    # must have quota for) and four workers (the group's maxReplicas) ask for 5.5 cpu; the
    # queue holds 5.
    scale(4)

    def slice_waits() -> bool:
        pending = [w for w in workloads_of(cluster, namespace, "auto") if not admitted(w)]
        gated = [
            p
            for p in pods_of_cluster(cluster, namespace, "auto")
            if any(
                g["name"] == "muster.dev/admission" for g in p["spec"].get("schedulingGates") or []
            )
        ]
        return len(pending) == 1 and bool(pending[0]["spec"].get("replaces")) and len(gated) == 2

    cluster.wait_for("a slice for 4 workers waits, the 2 new ones gated", slice_waits, timeout=60)
    assert not get(cluster, "raycluster", "auto", "-n", namespace)["spec"].get("suspend")
    apply(cluster, quota(cq, pool, "6", memory="64Gi"))
    cluster.wait_for("head and four workers bound", lambda: running(5), timeout=120)
    live = [w for w in workloads_of(cluster, namespace, "auto") if admitted(w)]
    assert len(live) == 1
    assert {ps["name"]: ps["count"] for ps in live[0]["spec"]["podSets"]} == {"head": 1, "small": 4}

    workers = sorted(
        p["metadata"]["name"]
        for p in pods_of_cluster(cluster, namespace, "auto")
        if p["metadata"]["labels"]["ray.io/node-type"] == "worker"
    )
    scale(1, delete=workers[1:])

    def shrunk() -> bool:
        [wl] = [w for w in workloads_of(cluster, namespace, "auto") if admitted(w)]
        counts = {a["name"]: a["count"] for a in wl["status"]["admission"]["podSetAssignments"]}
        return counts.get("small") == 1 and running(2)

    cluster.wait_for("the admission shrunk in place to one worker", shrunk, timeout=60)
    pods = pods_of_cluster(cluster, namespace, "auto")
    assert head in {p["metadata"]["uid"] for p in pods}
    assert not get(cluster, "raycluster", "auto", "-n", namespace)["spec"].get("suspend")
