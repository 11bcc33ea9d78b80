"""Muster's scheduler loop end to end, driven with kubectl: a queued Job's pods carry
`schedulerName: muster-scheduler` and are bound by the controller, whole gangs at a time,
bin-packed, around pods Muster does not manage, once each across a controller killed while
binding; and a Job no node can ever hold waits with a reason without holding up its queue.

Every test makes nodes of its own (a fresh `muster-e2e/pool` label and the flavor that
selects it) and deletes them at its end, so the shared cluster's other nodes never take
these pods and these nodes never take theirs.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    MUSTER,
    Controller,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    create,
    events_for,
    eviction_reason,
    flavor,
    get,
    local_queue,
    pods_of,
    priority_class,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"


class Pool:
    """Nodes with a label of their own, a flavor selecting them, a queue over the flavor."""

    def __init__(self, cluster: ClusterHandle) -> None:
        self.cluster = cluster
        self.name = unique("sched")
        self.nodes: list[str] = []

    def make(
        self, namespace: str, count: int, *, gpu: int = 8, cpu: str = "32", **cq_spec: Any
    ) -> Pool:
        self.nodes = self.cluster.nodes(
            count, cpu=cpu, memory="256Gi", gpu=gpu, labels={"muster-e2e/pool": self.name}
        )
        quota = {"cpu": str(int(cpu) * count)}
        if gpu:
            quota[GPU] = str(gpu * count)
        cq = self.cq = unique("cq")
        apply(
            self.cluster,
            flavor(self.name, self.name),
            cq_manifest(cq, [{"name": self.name, "quota": quota}], **cq_spec),
            local_queue("team", namespace, cq),
        )
        return self

    def delete(self) -> None:
        if self.nodes:
            self.cluster.kubectl("delete", "node", *self.nodes, "--wait=false", check=False)


@pytest.fixture
def pool(cluster: ClusterHandle) -> Iterator[Pool]:
    made = Pool(cluster)
    try:
        yield made
    finally:
        made.delete()


def gpu_job(
    name: str, namespace: str, parallelism: int, *, gpu: int = 1, cpu: str = "100m"
) -> dict[str, Any]:
    """A queued Job whose pods ask for `gpu` GPUs each (and run until deleted)."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu}}
    if gpu:
        resources = {"requests": {"cpu": cpu, GPU: str(gpu)}, "limits": {GPU: str(gpu)}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"muster.dev/queue-name": "team"},
        },
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "resources": resources}],
                }
            },
        },
    }


def placement(cluster: ClusterHandle, namespace: str, job: str) -> Counter[str]:
    """Node -> pods of the Job bound there."""
    return Counter(
        p["spec"]["nodeName"] for p in pods_of(cluster, namespace, job) if p["spec"].get("nodeName")
    )


def pod_group(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, Any]:
    found = cluster.kubectl("get", "podgroups.muster.dev", name, "-n", namespace, "-o", "json")
    result: dict[str, Any] = json.loads(found.stdout)
    return result


def bound_by(ctl: Controller) -> Counter[str]:
    """Pods each "bound pods" log line of a controller names, counted."""
    return Counter(
        entry.split("@", 1)[0] for record in ctl.logged("bound pods") for entry in record["pods"]
    )


# Runs first: it needs the Lease to itself, before the module's controller starts.
def test_a_controller_killed_while_binding_binds_each_remaining_pod_once_after_restart(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,
    crds: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    pool.make(namespace, 2, gpu=0, cpu="32")
    # Slow binding (5 per second, one at a time), so that the kill lands in the middle.
    first = Controller(
        cluster, tmp_path, unique("bind-a"), "--bind-qps", "5", "--bind-workers", "1"
    )
    second = Controller(cluster, tmp_path, unique("bind-b"))
    try:
        first.start().wait_leading()
        create(cluster, gpu_job("big", namespace, 24, gpu=0, cpu="1"))
        cluster.wait_for(
            "the first pods to be bound", lambda: bool(first.logged("bound pods")), 60, 0.05
        )
        first.kill()
        time.sleep(1.0)  # let bindings already sent land
        pods = pods_of(cluster, namespace, "big")
        before = {f"{namespace}/{p['metadata']['name']}" for p in pods if p["spec"].get("nodeName")}
        assert 0 < len(before) < 24, f"the kill should cut the binding short: {len(before)} bound"

        second.start().wait_leading()
        cluster.wait_for(
            "every pod of the gang bound",
            lambda: sum(placement(cluster, namespace, "big").values()) == 24,
            60,
        )
        first_bound, second_bound = bound_by(first), bound_by(second)
        # Each pod bound by exactly one of them, once; the second bound only what was left.
        assert all(n == 1 for n in (first_bound + second_bound).values())
        assert set(second_bound) == {f"{namespace}/{p['metadata']['name']}" for p in pods} - before
        assert not set(first_bound) & set(second_bound)
        # Bin-packed: all 24 on one of the two 32-cpu nodes, before and after the restart.
        assert sorted(placement(cluster, namespace, "big").values()) == [24]
    finally:
        first.kill()
        second.stop()


def test_sixteen_one_gpu_pods_land_on_two_of_four_empty_nodes(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,
    controller: Controller,  # noqa: F811
) -> None:
    pool.make(namespace, 4)
    job = create(cluster, gpu_job("pack", namespace, 16))
    assert job["spec"]["template"]["spec"]["schedulerName"] == "muster-scheduler"
    cluster.wait_for(
        "16 pods bound", lambda: sum(placement(cluster, namespace, "pack").values()) == 16, 60
    )
    assert sorted(placement(cluster, namespace, "pack").values()) == [8, 8]
    assert set(placement(cluster, namespace, "pack")) <= set(pool.nodes)

    [wl] = workloads_of(cluster, namespace, "pack")
    name = wl["metadata"]["name"]
    cluster.wait_for(
        "the PodGroup to say Scheduled",
        lambda: (
            condition(pod_group(cluster, namespace, name), "PodGroupInitiallyScheduled").get(
                "reason"
            )
            == "Scheduled"
        ),
    )
    pg = pod_group(cluster, namespace, name)
    assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": 16}}
    assert pg["metadata"]["ownerReferences"][0]["uid"] == wl["metadata"]["uid"]
    assert "Placed" in events_for(cluster, namespace, "Job", "pack")
    assert "Placed" in events_for(cluster, namespace, "Workload", name)

    # The history store tells where the pods went (the recorder writes in batches).
    url = f"sqlite:///{controller.log_path.parent / 'history.db'}"

    def story() -> list[dict[str, Any]]:
        out = subprocess.run(
            [
                MUSTER,
                "history",
                "workload",
                f"{namespace}/{name}",
                "--database-url",
                url,
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return json.loads(out.stdout) if out.returncode == 0 else []

    cluster.wait_for(
        "the placement in the history",
        lambda: any(e["event"] == "placed" for e in story()),
        30,
        1.0,
    )
    [placed] = [e for e in story() if e["event"] == "placed"]
    assert sorted(placed["detail"]["nodes"].values()) == [8, 8]
    assert "after admission" in placed["reason"]


def test_a_node_full_of_pods_muster_does_not_manage_is_not_used(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,
    controller: Controller,  # noqa: F811
) -> None:
    pool.make(namespace, 2)
    full = pool.nodes[0]  # first by name: bin-packing would pick it if it looked empty
    foreign = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "foreign", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": full},
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {GPU: "8"}, "limits": {GPU: "8"}},
                }
            ],
        },
    }
    apply(cluster, foreign)
    cluster.wait_for(
        "kube-scheduler to bind the foreign pod",
        lambda: get(cluster, "pod", "foreign", "-n", namespace)["spec"].get("nodeName") == full,
    )
    create(cluster, gpu_job("beside", namespace, 8))
    cluster.wait_for(
        "8 pods bound", lambda: sum(placement(cluster, namespace, "beside").values()) == 8, 60
    )
    assert placement(cluster, namespace, "beside") == {pool.nodes[1]: 8}


def test_a_job_no_node_can_hold_waits_with_a_reason_and_blocks_nothing(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,
    controller: Controller,  # noqa: F811
) -> None:
    pool.make(namespace, 2)  # 8 GPUs per node; quota for 16
    create(cluster, gpu_job("huge", namespace, 1, gpu=9))
    create(cluster, gpu_job("later", namespace, 2))
    cluster.wait_for(
        "the later Job bound", lambda: sum(placement(cluster, namespace, "later").values()) == 2, 60
    )
    assert not placement(cluster, namespace, "huge"), "no pod of the huge Job may be bound"
    [wl] = workloads_of(cluster, namespace, "huge")
    # Admission consults placement, so the Job is never admitted, and its Workload says why
    # in words naming the resource.
    waiting = condition(wl, "QuotaReserved")
    assert not admitted(wl), waiting
    assert waiting.get("status") == "False" and GPU in waiting.get("message", ""), waiting


def foreign_pod(namespace: str, name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod Muster does not manage, pinned to `node` and bound by kube-scheduler."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}},
                }
            ],
        },
    }


def test_a_gang_waits_on_fragmented_gpus_and_takes_whole_nodes_once_they_free_up(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,
    controller: Controller,  # noqa: F811
) -> None:
    pool.make(namespace, 8)  # 64 GPUs of quota: quota is never what stops the gang
    small = [f"small-{i}" for i in range(len(pool.nodes))]
    apply(
        cluster,
        *[foreign_pod(namespace, n, node, 4) for n, node in zip(small, pool.nodes, strict=True)],
    )
    cluster.wait_for(
        "4 GPUs taken on every node by pods Muster does not manage",
        lambda: all(get(cluster, "pod", n, "-n", namespace)["spec"].get("nodeName") for n in small),
        60,
    )
    create(cluster, gpu_job("gang", namespace, 4, gpu=8))
    cluster.wait_for(
        "the gang's Workload to say why it waits",
        lambda: any(
            "cannot be placed" in condition(w, "QuotaReserved").get("message", "")
            for w in workloads_of(cluster, namespace, "gang")
        ),
        60,
    )
    [wl] = workloads_of(cluster, namespace, "gang")
    why = condition(wl, "QuotaReserved")["message"]
    assert f"flavor {pool.name}" in why and "8" in why and "4" in why, why
    assert not admitted(wl)
    assert not placement(cluster, namespace, "gang"), "no pod of the gang may be bound"

    cluster.kubectl("delete", "pod", *small, "-n", namespace, "--wait=true", "--timeout=60s")
    cluster.wait_for(
        "the gang bound",
        lambda: sum(placement(cluster, namespace, "gang").values()) == 4,
        90,
    )
    placed = placement(cluster, namespace, "gang")
    assert len(placed) == 4 and set(placed.values()) == {1}, placed  # four whole nodes


def test_spread_puts_sixteen_one_gpu_pods_on_all_four_nodes(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,
    controller: Controller,  # noqa: F811
) -> None:
    pool.make(namespace, 4, placementStrategy="Spread")
    create(cluster, gpu_job("spread", namespace, 16))
    cluster.wait_for(
        "16 pods bound", lambda: sum(placement(cluster, namespace, "spread").values()) == 16, 60
    )
    assert sorted(placement(cluster, namespace, "spread").values()) == [4, 4, 4, 4]


def test_a_job_on_a_flavor_no_node_carries_waits_with_a_reason_naming_the_flavor(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,
    controller: Controller,  # noqa: F811
) -> None:
    pool.make(namespace, 1)  # the cluster has nodes, just none of the next flavor
    lonely, cq = unique("nowhere"), unique("cq")
    apply(
        cluster,
        flavor(lonely, lonely),
        cq_manifest(cq, [{"name": lonely, "quota": {"cpu": "8", GPU: "8"}}]),
        local_queue("lonely", namespace, cq),
    )
    job = gpu_job("stranded", namespace, 1)
    job["metadata"]["labels"]["muster.dev/queue-name"] = "lonely"
    create(cluster, job)
    cluster.wait_for(
        "the Workload to say why it waits",
        lambda: any(
            f"flavor {lonely}" in condition(w, "QuotaReserved").get("message", "")
            for w in workloads_of(cluster, namespace, "stranded")
        ),
        60,
    )
    [wl] = workloads_of(cluster, namespace, "stranded")
    message = condition(wl, "QuotaReserved")["message"]
    assert f"muster-e2e/pool={lonely}" in message, message


def test_a_high_priority_job_evicts_just_enough_lower_priority_work_to_fit_on_nodes(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,
    controller: Controller,  # noqa: F811
) -> None:
    # Quota for 64 GPUs on 2 nodes of 8: quota never stops anyone, the nodes do.
    low, high = unique("low"), unique("high")
    apply(cluster, priority_class(low, 10), priority_class(high, 1000))
    pool.make(namespace, 2, preemption={"withinQueue": "LowerPriority"})
    cluster.kubectl(
        "patch",
        "clusterqueue",
        pool.cq,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"flavors": [{"name": pool.name, "quota": {"cpu": "64", GPU: "64"}}]}}),
    )
    for name in ("low-a", "low-b"):
        create(cluster, with_priority(gpu_job(name, namespace, 1, gpu=8), low))
    cluster.wait_for(
        "both low-priority Jobs bound, one per node",
        lambda: all(
            sum(placement(cluster, namespace, n).values()) == 1 for n in ("low-a", "low-b")
        ),
        60,
    )
    create(cluster, with_priority(gpu_job("urgent", namespace, 1, gpu=8), high))
    cluster.wait_for(
        "the urgent Job bound",
        lambda: sum(placement(cluster, namespace, "urgent").values()) == 1,
        90,
    )
    # Exactly one victim: the other low-priority Job keeps running where it was.
    evicted = [
        n
        for n in ("low-a", "low-b")
        if any(eviction_reason(w) for w in workloads_of(cluster, namespace, n))
    ]
    assert len(evicted) == 1, evicted
    [kept] = {"low-a", "low-b"} - set(evicted)
    assert sum(placement(cluster, namespace, kept).values()) == 1


def with_priority(job: dict[str, Any], priority_class_name: str) -> dict[str, Any]:
    job["spec"]["template"]["spec"]["priorityClassName"] = priority_class_name
    return job
