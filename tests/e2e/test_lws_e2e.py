"""LeaderWorkerSet end to end with the real LWS controller (built from the Go module proxy,
started as `local-cluster up --with lws` starts it) and Muster's controller: each replica
group is one gang (leader and workers, all or nothing), admitted and placed group by group;
scaling the set waits for quota with the new groups' pods gated, then places whole groups;
a higher-priority gang preempts exactly one whole replica of a set that cannot serve
degraded, and only single workers (never a leader) of one that can, which get them back
through a slice once there is room.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    LabelledPool,
    admitted,
    apply,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    create,
    gated,
    get,
    job,
    live,
    priority_class,
    unique,
)

pytestmark = pytest.mark.e2e

PEERS = "lws"
QUEUE = "muster.dev/queue-name"
LWS = "leaderworkerset.sigs.k8s.io"


@pytest.fixture
def pool(cluster: ClusterHandle, namespace: str) -> Iterator[LabelledPool]:
    made = LabelledPool(cluster, namespace, "lws")
    try:
        yield made
    finally:
        made.delete()


def lws(
    name: str,
    namespace: str,
    replicas: int,
    size: int,
    *,
    priority_class: str | None = None,
    annotations: dict[str, str] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
        ],
    }
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    template: dict[str, Any] = {"size": size, "workerTemplate": {"spec": pod_spec}}
    if restart_policy:
        template["restartPolicy"] = restart_policy
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {QUEUE: "lq"},
            "annotations": annotations or {},
        },
        "spec": {"replicas": replicas, "leaderWorkerTemplate": template},
    }


def pods_of(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    return live(get(cluster, "pods", "-n", namespace, "-l", f"{LWS}/name={name}")["items"])


def by_group(pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        out.setdefault(pod["metadata"]["labels"][f"{LWS}/group-index"], []).append(pod)
    return out


def group_workloads(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    stem = f"/LeaderWorkerSet:{namespace}/{name}#"
    return [
        w
        for w in get(cluster, "workloads.muster.dev", "-n", namespace)["items"]
        if stem in ((w["metadata"].get("annotations") or {}).get("muster.dev/owner-group") or "")
    ]


def active(workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        w
        for w in workloads
        if not any(
            c["type"] == "Finished" and c["status"] == "True"
            for c in (w.get("status") or {}).get("conditions") or []
        )
    ]


def whole_groups_bound(pods: list[dict[str, Any]], groups: int, size: int) -> bool:
    grouped = by_group(pods)
    return len(grouped) == groups and all(
        len(members) == size and all(p["spec"].get("nodeName") for p in members)
        for members in grouped.values()
    )


def test_groups_are_admitted_whole_and_a_scale_up_waits_gated_then_places_whole_groups(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811 - fixture
    namespace: str,
    pool: LabelledPool,
) -> None:
    pool.add_nodes(5, cpu="4")
    pool.queue("12")
    apply(cluster, lws("infer", namespace, 3, 4))
    stored = get(cluster, "leaderworkersets.leaderworkerset.x-k8s.io", "infer", "-n", namespace)
    labels = stored["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    assert labels[QUEUE] == "lq"  # Muster's admission carried the queue into the template
    cluster.wait_for(
        "three groups of four, each bound whole",
        lambda: whole_groups_bound(pods_of(cluster, namespace, "infer"), 3, 4),
        timeout=120,
    )
    workloads = active(group_workloads(cluster, namespace, "infer"))
    assert len(workloads) == 3 and all(admitted(w) for w in workloads)
    for wl in workloads:
        sets = {ps["name"]: ps["count"] for ps in wl["spec"]["podSets"]}
        assert sets == {"leader": 1, "workers": 3}, sets
    for pod in pods_of(cluster, namespace, "infer"):
        assert pod["spec"]["schedulerName"] == "muster-scheduler"
        assert pod["spec"]["nodeName"] in pool.nodes

    # Five replicas, room in the quota for three: the new groups' pods wait gated.
    cluster.kubectl(
        "patch",
        "leaderworkersets.leaderworkerset.x-k8s.io",
        "infer",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec": {"replicas": 5}}',
    )

    def two_groups_wait() -> bool:
        pending = [
            w for w in active(group_workloads(cluster, namespace, "infer")) if not admitted(w)
        ]
        return len(pending) == 2

    cluster.wait_for("two new groups queued", two_groups_wait, timeout=60)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        grouped = by_group(pods_of(cluster, namespace, "infer"))
        for index in ("3", "4"):
            assert all(gated(p) for p in grouped.get(index, [])), index
        time.sleep(0.5)
    pool.queue("20")
    cluster.wait_for(
        "five groups of four, each bound whole",
        lambda: whole_groups_bound(pods_of(cluster, namespace, "infer"), 5, 4),
        timeout=120,
    )
    assert (
        len([w for w in active(group_workloads(cluster, namespace, "infer")) if admitted(w)]) == 5
    )


def full_cluster(cluster: ClusterHandle, pool: LabelledPool) -> tuple[str, str]:
    """Three nodes of 4 CPUs, for 3 groups of 4 one-CPU pods, and a low and a high
    PriorityClass. The queue's quota is more than the nodes hold, so what it may use is
    their capacity (the amount at the root): full nodes are a full queue, which a
    higher-priority gang preempts in, and on the nodes."""
    low, high = unique("low"), unique("high")
    apply(cluster, priority_class(low, 10), priority_class(high, 1000))
    pool.add_nodes(3, cpu="4")
    pool.queue("100", preemption={"withinQueue": "LowerPriority", "waitBeforeEvicting": "0s"})
    return low, high


def test_a_higher_priority_gang_preempts_exactly_one_whole_replica(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811 - fixture
    namespace: str,
    pool: LabelledPool,
) -> None:
    low, high = full_cluster(cluster, pool)
    apply(cluster, lws("serve", namespace, 3, 4, priority_class=low))
    cluster.wait_for(
        "three groups bound whole",
        lambda: whole_groups_bound(pods_of(cluster, namespace, "serve"), 3, 4),
        timeout=120,
    )
    before = {p["metadata"]["uid"]: p for p in pods_of(cluster, namespace, "serve")}
    urgent = job("urgent", namespace, "lq", parallelism=4, priority_class=high)
    create(cluster, urgent)

    def urgent_bound() -> bool:
        found = get(cluster, "pods", "-n", namespace, "-l", "batch.kubernetes.io/job-name=urgent")
        return len([p for p in found["items"] if p["spec"].get("nodeName")]) == 4

    cluster.wait_for("the urgent gang bound", urgent_bound, timeout=120)
    # Exactly one group lost its pods, all of them; the other two kept every pod.
    after = pods_of(cluster, namespace, "serve")
    kept = by_group([p for p in after if p["metadata"]["uid"] in before])
    lost = {
        p["metadata"]["labels"][f"{LWS}/group-index"]
        for uid, p in before.items()
        if uid not in {q["metadata"]["uid"] for q in after}
    }
    assert len(lost) == 1, lost
    assert sorted(len(m) for m in kept.values()) == [4, 4], kept
    evicted = [
        w
        for w in group_workloads(cluster, namespace, "serve")
        if any(
            c["type"] == "Evicted" and c.get("reason") == "Preempted"
            for c in (w.get("status") or {}).get("conditions") or []
        )
        or ((w.get("status") or {}).get("requeueState") or {}).get("count")
    ]
    assert len(evicted) == 1, [w["metadata"]["name"] for w in evicted]
    # The preempted group comes back gated, waiting whole for room.
    [index] = lost
    cluster.wait_for(
        "the preempted group's pods made again, gated",
        lambda: (
            len(by_group(pods_of(cluster, namespace, "serve")).get(index, [])) == 4
            and all(gated(p) for p in by_group(pods_of(cluster, namespace, "serve"))[index])
        ),
        timeout=60,
    )


def test_a_degradable_set_loses_single_workers_never_a_leader_and_gets_them_back(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811 - fixture
    namespace: str,
    pool: LabelledPool,
) -> None:
    low, high = full_cluster(cluster, pool)
    degraded = {"muster.dev/disruption-mode": "single"}
    apply(
        cluster,
        lws(
            "degr", namespace, 3, 4, priority_class=low, annotations=degraded, restart_policy="None"
        ),
    )
    cluster.wait_for(
        "three groups bound whole",
        lambda: whole_groups_bound(pods_of(cluster, namespace, "degr"), 3, 4),
        timeout=120,
    )
    workloads = active(group_workloads(cluster, namespace, "degr"))
    assert {w["spec"].get("disruptionMode") for w in workloads} == {"Single"}
    before = {p["metadata"]["uid"]: p for p in pods_of(cluster, namespace, "degr")}
    leaders = {
        u for u, p in before.items() if p["metadata"]["labels"].get(f"{LWS}/worker-index") == "0"
    }
    assert len(leaders) == 3
    # Every node is full: a gang of two one-CPU pods needs two pods' room.
    create(cluster, job("urgent", namespace, "lq", parallelism=2, priority_class=high))

    def urgent_bound() -> bool:
        found = get(cluster, "pods", "-n", namespace, "-l", "batch.kubernetes.io/job-name=urgent")
        return len([p for p in found["items"] if p["spec"].get("nodeName")]) == 2

    cluster.wait_for("the urgent gang bound", urgent_bound, timeout=120)
    after = {p["metadata"]["uid"] for p in pods_of(cluster, namespace, "degr")}
    lost = [p for uid, p in before.items() if uid not in after]
    # Exactly the two workers in its way went; every leader kept running.
    assert len(lost) == 2, [p["metadata"]["name"] for p in lost]
    assert leaders <= after
    assert all(p["metadata"]["labels"][f"{LWS}/worker-index"] != "0" for p in lost)
    # No group was evicted: the victims' admissions shrank in place, saying which pods.
    groups = group_workloads(cluster, namespace, "degr")
    assert not any(
        c["type"] == "Evicted" and c["status"] == "True"
        for w in groups
        for c in (w.get("status") or {}).get("conditions") or []
    )
    taken = {n for w in groups for n in (w.get("status") or {}).get("preemptedPods") or ()}
    assert taken == {p["metadata"]["name"] for p in lost}
    events = get(cluster, "events", "-n", namespace, "--field-selector", "reason=PodsPreempted")[
        "items"
    ]
    assert events and all("disruptionMode Single" in e["message"] for e in events)

    # The lost workers come back gated, their groups asking for them by a slice that waits.
    def lost_back_gated() -> bool:
        now = pods_of(cluster, namespace, "degr")
        back = [p for p in now if p["metadata"]["uid"] not in before]
        return len(now) == 12 and len(back) == 2 and all(gated(p) for p in back)

    cluster.wait_for("the lost workers made again, gated", lost_back_gated, timeout=60)

    def slices_wait() -> bool:
        pending = [
            w for w in active(group_workloads(cluster, namespace, "degr")) if not admitted(w)
        ]
        return bool(pending) and all(w["spec"].get("replaces") for w in pending)

    cluster.wait_for("a slice per degraded group, waiting", slices_wait, timeout=60)
    # Room returns: the workers are placed again, and no leader was ever restarted.
    cluster.kubectl("delete", "job", "urgent", "-n", namespace, "--wait=false")
    cluster.wait_for(
        "three groups whole again",
        lambda: whole_groups_bound(pods_of(cluster, namespace, "degr"), 3, 4),
        timeout=120,
    )
    assert leaders <= {p["metadata"]["uid"] for p in pods_of(cluster, namespace, "degr")}


def test_a_set_naming_a_missing_queue_is_told_why_and_nothing_runs(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811 - fixture
    namespace: str,
    pool: LabelledPool,
) -> None:
    pool.add_nodes(1)
    doc = lws("lost", namespace, 1, 2)
    doc["metadata"]["labels"][QUEUE] = "nowhere"
    apply(cluster, doc)

    def told() -> bool:
        events = get(
            cluster,
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.kind=LeaderWorkerSet,involvedObject.name=lost",
        )["items"]
        return any(e["reason"] == "QueueNotFound" and "nowhere" in e["message"] for e in events)

    cluster.wait_for("the LeaderWorkerSet told its queue does not exist", told)
    assert all(gated(p) for p in pods_of(cluster, namespace, "lost"))
    assert not active(group_workloads(cluster, namespace, "lost"))
