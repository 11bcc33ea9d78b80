"""Preemption on nodes end to end (issue: KEP-5710 shapes, delayed eviction, min-runtime),
driven with kubectl against the local cluster with Muster's scheduler loop binding pods.

- kube-scheduler's GangPreemptionPodGroups shape scaled to this machine: 100 nodes full of
  low-priority 20-pod gangs; a 100-pod gang evicts exactly the 5 gangs it needs, each whole.
- A gang that would not fit even with every lower-priority victim gone evicts nothing.
- Delayed eviction: while the victims' pods terminate, the room is held (the preemptor's
  `status.nomination`) and a group of another queue that goes first does not take it.
- Min-runtime: a victim younger than its queue's protection is not evicted; after, it is.
- A controller killed mid-preemption and restarted neither evicts more nor loses the hold.
- Consolidation: two small Jobs of a queue that allows moves go to other nodes so that a gang
  blocked by fragmentation runs; with consolidation off it waits.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
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
    get,
    local_queue,
    priority_class,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest
from tests.e2e.test_scheduler_e2e import (  # noqa: F401 - pool is a fixture
    GPU,
    Pool,
    gpu_job,
    placement,
    pool,
    with_priority,
)

pytestmark = pytest.mark.e2e

DELETE_DELAY = "pod-delete.stage.kwok.x-k8s.io/delay"


def slow_to_stop(job: dict[str, Any], delay: str) -> dict[str, Any]:
    """Its pods take `delay` to terminate once deleted (kwok), as containers in their grace
    period do."""
    meta = job["spec"]["template"].setdefault("metadata", {})
    meta.setdefault("annotations", {})[DELETE_DELAY] = delay
    return job


def set_quota(cluster: ClusterHandle, target: Pool, quota: dict[str, str]) -> None:
    cluster.kubectl(
        "patch",
        "clusterqueue",
        target.cq,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"flavors": [{"name": target.name, "quota": quota}]}}),
    )


def bound_per_job(cluster: ClusterHandle, namespace: str) -> Counter[str]:
    """Job name -> its pods bound to a node and not being deleted (one kubectl call)."""
    pods = get(cluster, "pods", "-n", namespace)["items"]
    return Counter(
        p["metadata"]["labels"].get("job-name", "")
        for p in pods
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    )


def evicted(cluster: ClusterHandle, namespace: str, job: str) -> bool:
    """Whether any Workload of the Job was ever evicted (Evicted, or requeued after it)."""
    return any(
        condition(w, "Evicted").get("status") == "True"
        or (w.get("status") or {}).get("requeueState", {}).get("count", 0) > 0
        for w in workloads_of(cluster, namespace, job)
    )


def waiting_reason(cluster: ClusterHandle, namespace: str, job: str) -> str:
    found = workloads_of(cluster, namespace, job)
    return str(condition(found[-1], "QuotaReserved").get("message", "")) if found else ""


def nomination(cluster: ClusterHandle, namespace: str, job: str) -> dict[str, Any]:
    found = workloads_of(cluster, namespace, job)
    return dict((found[-1].get("status") or {}).get("nomination") or {}) if found else {}


# Runs first: it needs the Lease to itself, before the module's controller starts.
def test_a_controller_killed_mid_preemption_neither_evicts_more_nor_loses_the_hold(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,  # noqa: F811
    crds: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    low, high = unique("low"), unique("high")
    apply(cluster, priority_class(low, 10), priority_class(high, 1000))
    pool.make(namespace, 3, preemption={"withinQueue": "LowerPriority"})
    set_quota(cluster, pool, {"cpu": "96", GPU: "64"})  # quota never stops anyone
    first = Controller(cluster, tmp_path, unique("pre-a"))
    second = Controller(cluster, tmp_path, unique("pre-b"))
    lows = ["low-a", "low-b", "low-c"]
    try:
        first.start().wait_leading()
        for name in lows:
            create(
                cluster, slow_to_stop(with_priority(gpu_job(name, namespace, 1, gpu=8), low), "40s")
            )
        cluster.wait_for(
            "three low-priority Jobs bound, one per node",
            lambda: all(bound_per_job(cluster, namespace)[n] == 1 for n in lows),
            90,
        )
        create(cluster, with_priority(gpu_job("urgent", namespace, 2, gpu=8), high))
        cluster.wait_for(
            "the hold written and two victims evicted",
            lambda: (
                bool(nomination(cluster, namespace, "urgent"))
                and sum(evicted(cluster, namespace, n) for n in lows) == 2
            ),
            60,
            0.2,
        )
        held = nomination(cluster, namespace, "urgent")
        first.kill()  # the victims' pods are still terminating (40s)
        victims = {n for n in lows if evicted(cluster, namespace, n)}
        assert sorted(held["victims"]) == sorted(
            w["metadata"]["namespace"] + "/" + w["metadata"]["name"]
            for n in victims
            for w in workloads_of(cluster, namespace, n)[-1:]
        )

        second.start().wait_leading()
        # The new leader keeps the hold as it was while the victims leave.
        time.sleep(3)
        if not placement(cluster, namespace, "urgent"):
            again = nomination(cluster, namespace, "urgent")
            assert again.get("since") == held["since"], (held, again)
        cluster.wait_for(
            "the urgent Job bound on the two freed nodes",
            lambda: sum(placement(cluster, namespace, "urgent").values()) == 2,
            120,
        )
        [kept] = set(lows) - victims
        assert not evicted(cluster, namespace, kept)
        assert bound_per_job(cluster, namespace)[kept] == 1
        assert not second.logged("evicting workload")  # no one more
        assert not nomination(cluster, namespace, "urgent")  # cleared on admission
    finally:
        first.kill()
        second.stop()


def test_gang_preemption_evicts_exactly_the_five_gangs_it_needs_each_whole(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,  # noqa: F811
    controller: Controller,  # noqa: F811
) -> None:
    # 100 nodes x 4 cpu, filled by 20 gangs of 20 one-cpu pods (bin-packed: 5 nodes each).
    low, high = unique("low"), unique("high")
    apply(cluster, priority_class(low, 10), priority_class(high, 1000))
    pool.make(namespace, 100, gpu=0, cpu="4", preemption={"withinQueue": "LowerPriority"})
    set_quota(cluster, pool, {"cpu": "1000"})  # quota never stops anyone: only the nodes do
    gangs = [f"low-{i:02d}" for i in range(20)]
    apply(
        cluster,
        *(with_priority(gpu_job(g, namespace, 20, gpu=0, cpu="1"), low) for g in gangs),
    )
    cluster.wait_for(
        "400 low-priority pods bound",
        lambda: sum(bound_per_job(cluster, namespace)[g] for g in gangs) == 400,
        240,
        1.0,
    )
    create(cluster, with_priority(gpu_job("big", namespace, 100, gpu=0, cpu="1"), high))
    cluster.wait_for(
        "the 100-pod gang bound",
        lambda: bound_per_job(cluster, namespace)["big"] == 100,
        240,
        1.0,
    )
    per_job = bound_per_job(cluster, namespace)
    gone = sorted(g for g in gangs if per_job[g] == 0)
    assert len(gone) == 5, per_job
    # Whole gangs (disruptionMode all): every other gang keeps all 20 pods, the victims none.
    assert all(per_job[g] == 20 for g in gangs if g not in gone), per_job
    for g in gone:
        assert evicted(cluster, namespace, g)
        assert get(cluster, "job", g, "-n", namespace)["spec"]["suspend"] is True


def test_a_gang_that_would_not_fit_with_every_lower_priority_victim_gone_evicts_nothing(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,  # noqa: F811
    controller: Controller,  # noqa: F811
) -> None:
    # 4 nodes of 8 GPUs. A top-priority Job holds 6 GPUs on each (4 pods of 6), a
    # low-priority one 2 GPUs on one node: no node has 8 free, and evicting the low one
    # would free its 2 GPUs of quota but still leave no node with 8 for the 8-GPU pod.
    low, mid, top = unique("low"), unique("mid"), unique("top")
    apply(cluster, priority_class(low, 10), priority_class(mid, 1000), priority_class(top, 5000))
    pool.make(namespace, 4, preemption={"withinQueue": "LowerPriority"})
    create(cluster, with_priority(gpu_job("top", namespace, 4, gpu=6), top))
    cluster.wait_for("the top Job bound", lambda: bound_per_job(cluster, namespace)["top"] == 4, 90)
    create(cluster, with_priority(gpu_job("low", namespace, 2, gpu=1), low))
    cluster.wait_for("the low Job bound", lambda: bound_per_job(cluster, namespace)["low"] == 2, 90)
    create(cluster, with_priority(gpu_job("eight", namespace, 1, gpu=8), mid))
    cluster.wait_for(
        "the reason why evicting would not help",
        lambda: "no node has 8 free" in waiting_reason(cluster, namespace, "eight"),
        60,
    )
    reason = waiting_reason(cluster, namespace, "eight")
    assert "no one is evicted" in reason or "even if every lower-priority workload" in reason
    time.sleep(3)  # a few more cycles: still no one evicted
    assert not evicted(cluster, namespace, "low")
    assert bound_per_job(cluster, namespace)["low"] == 2
    assert not nomination(cluster, namespace, "eight")


def test_held_room_is_not_taken_by_a_group_that_arrives_while_the_victim_terminates(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,  # noqa: F811
    controller: Controller,  # noqa: F811
) -> None:
    low, medium, high = unique("low"), unique("medium"), unique("high")
    apply(cluster, priority_class(low, 10), priority_class(medium, 500), priority_class(high, 1000))
    pool.make(namespace, 2, preemption={"withinQueue": "LowerPriority"})
    set_quota(cluster, pool, {"cpu": "64", GPU: "64"})
    # A second queue over the same nodes with nothing running: it goes first in every cycle.
    # It may not preempt, so the only room it could take is the room held for `urgent`.
    other = unique("cq")
    apply(
        cluster,
        cq_manifest(
            other,
            [{"name": pool.name, "quota": {"cpu": "64", GPU: "64"}}],
            preemption={"withinQueue": "Never", "reclaim": "Never"},
        ),
        local_queue("other", namespace, other),
    )
    for name in ("low-a", "low-b"):
        create(cluster, slow_to_stop(with_priority(gpu_job(name, namespace, 1, gpu=8), low), "20s"))
    cluster.wait_for(
        "both low-priority Jobs bound",
        lambda: all(bound_per_job(cluster, namespace)[n] == 1 for n in ("low-a", "low-b")),
        90,
    )
    create(cluster, with_priority(gpu_job("urgent", namespace, 1, gpu=8), high))
    cluster.wait_for(
        "one victim evicted and the room held",
        lambda: (
            bool(nomination(cluster, namespace, "urgent"))
            and any(evicted(cluster, namespace, n) for n in ("low-a", "low-b"))
        ),
        60,
        0.2,
    )
    arriving = with_priority(gpu_job("medium", namespace, 1, gpu=8), medium)
    arriving["metadata"]["labels"]["muster.dev/queue-name"] = "other"
    create(cluster, arriving)
    cluster.wait_for(
        "the urgent Job bound once its victim is gone",
        lambda: sum(placement(cluster, namespace, "urgent").values()) == 1,
        90,
    )
    assert not placement(cluster, namespace, "medium")
    assert not any(admitted(w) for w in workloads_of(cluster, namespace, "medium"))
    assert waiting_reason(cluster, namespace, "medium")  # it says why it waits
    # Told as a person would look: an Event on the preemptor's Job, and the history store.
    assert "Preempting" in events_for(cluster, namespace, "Job", "urgent")
    database = f"sqlite:///{controller.log_path.parent / 'history.db'}"

    def recorded() -> list[dict[str, Any]]:
        out = subprocess.run(
            [MUSTER, "history", "preemptions", "--database-url", database, "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
        )
        found: list[dict[str, Any]] = json.loads(out.stdout)
        return [d for d in found if d.get("namespace") == namespace]

    cluster.wait_for("the preemption in the history store", lambda: bool(recorded()), 30)
    (decision,) = recorded()
    assert "room held on" in decision["reason"], decision
    assert len(decision["victims"]) == 1
    # The other low-priority Job was never touched.
    assert sum(evicted(cluster, namespace, n) for n in ("low-a", "low-b")) == 1


def test_a_victim_younger_than_its_min_runtime_is_spared_until_then(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,  # noqa: F811
    controller: Controller,  # noqa: F811
) -> None:
    low, high = unique("low"), unique("high")
    apply(cluster, priority_class(low, 10), priority_class(high, 1000))
    pool.make(
        namespace,
        1,
        preemption={"withinQueue": "LowerPriority", "preemptMinRuntime": "20s"},
    )
    set_quota(cluster, pool, {"cpu": "64", GPU: "64"})
    create(cluster, with_priority(gpu_job("young", namespace, 1, gpu=8), low))
    cluster.wait_for(
        "the low-priority Job bound", lambda: bound_per_job(cluster, namespace)["young"] == 1, 60
    )
    admitted_at = condition(workloads_of(cluster, namespace, "young")[-1], "QuotaReserved")[
        "lastTransitionTime"
    ]
    create(cluster, with_priority(gpu_job("urgent", namespace, 1, gpu=8), high))
    cluster.wait_for(
        "the reason naming the protection",
        lambda: "protected by minRuntime until" in waiting_reason(cluster, namespace, "urgent"),
        30,
    )
    assert not evicted(cluster, namespace, "young")
    cluster.wait_for(
        "the urgent Job bound once the protection ended",
        lambda: sum(placement(cluster, namespace, "urgent").values()) == 1,
        90,
    )
    evicted_at = condition(workloads_of(cluster, namespace, "young")[-1], "Evicted").get(
        "lastTransitionTime"
    ) or condition(workloads_of(cluster, namespace, "young")[-1], "Requeued").get(
        "lastTransitionTime", ""
    )
    assert evicted_at, workloads_of(cluster, namespace, "young")[-1].get("status")
    started = time.mktime(time.strptime(admitted_at, "%Y-%m-%dT%H:%M:%SZ"))
    ended = time.mktime(time.strptime(evicted_at, "%Y-%m-%dT%H:%M:%SZ"))
    assert ended - started >= 19, (admitted_at, evicted_at)


def test_consolidation_moves_two_small_jobs_so_that_a_fragmented_gang_runs(
    cluster: ClusterHandle,
    namespace: str,
    pool: Pool,  # noqa: F811
    controller: Controller,  # noqa: F811
) -> None:
    # 4 nodes x 8 GPUs. Queue svc spreads four 4-GPU replicas, one per node: 16 GPUs free,
    # but no node wholly, so training's gang of two 8-GPU pods cannot be placed.
    pool.make(namespace, 4)
    set_quota(cluster, pool, {"cpu": "64", GPU: "16"})  # the pool's queue: training
    svc = unique("cq")
    apply(
        cluster,
        cq_manifest(
            svc,
            [{"name": pool.name, "quota": {"cpu": "64", GPU: "16"}}],
            placementStrategy="Spread",
        ),
        local_queue("svc", namespace, svc),
    )
    replicas = [f"replica-{i}" for i in range(4)]
    for name in replicas:
        job = gpu_job(name, namespace, 1, gpu=4)
        job["metadata"]["labels"]["muster.dev/queue-name"] = "svc"
        create(cluster, job)
    cluster.wait_for(
        "four replicas bound, one per node",
        lambda: len({n for r in replicas for n in placement(cluster, namespace, r)}) == 4,
        90,
    )
    create(cluster, gpu_job("gang", namespace, 2, gpu=8))
    cluster.wait_for(
        "the gang waiting for nodes",
        lambda: "cannot be placed" in waiting_reason(cluster, namespace, "gang"),
        60,
    )
    time.sleep(3)  # consolidation is off: nothing moves
    assert not any(evicted(cluster, namespace, r) for r in replicas)
    assert not placement(cluster, namespace, "gang")

    cluster.kubectl(
        "patch",
        "clusterqueue",
        svc,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"consolidation": {"movable": True}}}),
    )
    cluster.wait_for(
        "the gang bound on two whole nodes",
        lambda: sorted(placement(cluster, namespace, "gang").values()) == [1, 1],
        120,
    )
    cluster.wait_for(
        "every replica running again",
        lambda: all(bound_per_job(cluster, namespace)[r] == 1 for r in replicas),
        120,
    )
    moved = [r for r in replicas if "Moved" in events_for(cluster, namespace, "Job", r)]
    assert len(moved) == 2, moved
    gang_nodes = set(placement(cluster, namespace, "gang"))
    for r in replicas:
        assert not set(placement(cluster, namespace, r)) & gang_nodes
