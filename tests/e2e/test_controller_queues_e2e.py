"""Queues end to end: two teams under one parent borrow and reclaim, priority preempts
inside a queue, limits hold, queue status stays current, stop policies and deletion behave,
and a broken queue tree stops admission without touching what runs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    cq_status,
    crds,  # noqa: F401 - fixture
    events_for,
    eviction_reason,
    flavor,
    get,
    job,
    local_queue,
    priority_class,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e


def _wl(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, Any]:
    found = workloads_of(cluster, namespace, name)
    return found[-1] if found else {}


def _suspended(cluster: ClusterHandle, namespace: str, name: str) -> bool:
    return bool(get(cluster, "job", name, "-n", namespace)["spec"].get("suspend"))


def test_two_teams_borrow_reclaim_preempt_and_hit_limits(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    pool = unique("teams")
    cluster.nodes(2, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    org, team_a, team_b = unique("org"), unique("team-a"), unique("team-b")
    low, high = unique("low"), unique("high")
    apply(
        cluster,
        priority_class(low, 10),
        priority_class(high, 1000),
        flavor(pool, pool),
        cq_manifest(org, [{"name": pool, "quota": {"cpu": "8"}}]),
        cq_manifest(
            team_a,
            [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "6"}}],
            parent=org,
        ),
        cq_manifest(
            team_b,
            [{"name": pool, "quota": {"cpu": "4"}}],
            parent=org,
            preemption={"withinQueue": "LowerPriority"},
        ),
        local_queue("a", namespace, team_a),
        local_queue("b", namespace, team_b),
    )

    # Team A within its quota: admitted at once.
    apply(cluster, job("a-big", namespace, "a", parallelism=4, cpu="1"))
    cluster.wait_for("a-big admitted", lambda: admitted(_wl(cluster, namespace, "a-big")))

    # Team A over its quota: borrows team B's idle quota.
    apply(cluster, job("a-extra", namespace, "a", parallelism=2, cpu="1", priority_class=low))
    cluster.wait_for("a-extra admitted", lambda: admitted(_wl(cluster, namespace, "a-extra")))
    assert "borrows" in condition(_wl(cluster, namespace, "a-extra"), "QuotaReserved")["message"]
    cluster.wait_for(
        "team A's status to show 2 cpu borrowed",
        lambda: cq_status(cluster, team_a).get("borrowed") == {pool: {"cpu": "2"}},
    )

    # Over team A's limit (6 cpu): waits, and the reason names the limit.
    apply(cluster, job("a-over", namespace, "a", parallelism=1, cpu="1"))
    cluster.wait_for(
        "a-over to wait naming the limit",
        lambda: (
            "limit"
            in condition(_wl(cluster, namespace, "a-over"), "QuotaReserved").get("message", "")
        ),
    )
    assert not admitted(_wl(cluster, namespace, "a-over"))
    # It must not wait on a later cycle's luck: remove it so it does not take freed quota.
    cluster.kubectl("delete", "job", "a-over", "-n", namespace)

    # Team B's demand returns: team A's lowest-priority, newest workload is reclaimed.
    apply(cluster, job("b-main", namespace, "b", parallelism=4, cpu="1", priority_class=low))
    cluster.wait_for(
        "a-extra to be reclaimed and suspended",
        lambda: (
            eviction_reason(_wl(cluster, namespace, "a-extra")) == "Reclaimed"
            or (
                _suspended(cluster, namespace, "a-extra")
                and not admitted(_wl(cluster, namespace, "a-extra"))
            )
        ),
    )
    cluster.wait_for("b-main admitted", lambda: admitted(_wl(cluster, namespace, "b-main")))
    assert _suspended(cluster, namespace, "a-extra")
    assert admitted(_wl(cluster, namespace, "a-big")), "the within-quota workload keeps running"
    assert not _suspended(cluster, namespace, "a-big")
    assert "Reclaimed" in events_for(cluster, namespace, "Job", "a-extra")

    # Inside team B, a higher-priority Job preempts the lower one.
    apply(cluster, job("b-urgent", namespace, "b", parallelism=4, cpu="1", priority_class=high))
    cluster.wait_for(
        "b-urgent admitted after preempting b-main",
        lambda: admitted(_wl(cluster, namespace, "b-urgent")),
        timeout=90,
    )
    assert _suspended(cluster, namespace, "b-main")
    b_main = _wl(cluster, namespace, "b-main")
    assert eviction_reason(b_main) == "Preempted"
    assert condition(b_main, "Preempted").get("reason") in ("WithinQueue", "QuotaReleased")
    assert "Preempted" in events_for(cluster, namespace, "Job", "b-main")
    # The reclaimed workload is still pending, not lost.
    assert not admitted(_wl(cluster, namespace, "a-extra"))
    cluster.wait_for(
        "the parent's status to show all 8 cpu in use",
        lambda: cq_status(cluster, org).get("usage") == {pool: {"cpu": "8"}},
        timeout=15,
    )


def test_stop_policies_deletion_guard_and_broken_tree(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    pool = unique("stop")
    cluster.nodes(1, cpu="8", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "8"}}]),
        local_queue("q", namespace, cq),
    )
    apply(cluster, job("running", namespace, "q", parallelism=2, cpu="1"))
    cluster.wait_for("running admitted", lambda: admitted(_wl(cluster, namespace, "running")))

    # Hold: nothing new is admitted; what runs keeps running.
    cluster.kubectl(
        "patch",
        "clusterqueues.muster.dev",
        cq,
        "--type=merge",
        "-p",
        '{"spec":{"stopPolicy":"Hold"}}',
    )
    cluster.wait_for(
        "the queue to report Active=False/Stopped",
        lambda: condition({"status": cq_status(cluster, cq)}, "Active").get("reason") == "Stopped",
    )
    apply(cluster, job("held", namespace, "q", parallelism=1, cpu="1"))
    cluster.wait_for(
        "held to wait because the queue is stopped",
        lambda: (
            "stop" in condition(_wl(cluster, namespace, "held"), "QuotaReserved").get("message", "")
        ),
    )
    assert admitted(_wl(cluster, namespace, "running"))

    # Deleting a queue with admitted work is held by the finalizer.
    cluster.kubectl("delete", "clusterqueues.muster.dev", cq, "--wait=false")
    still = get(cluster, "clusterqueues.muster.dev", cq)
    assert "muster.dev/resource-in-use" in still["metadata"]["finalizers"]
    assert still["metadata"].get("deletionTimestamp")

    # HoldAndDrain: admitted work is evicted; once drained, the deletion completes.
    cluster.kubectl(
        "patch",
        "clusterqueues.muster.dev",
        cq,
        "--type=merge",
        "-p",
        '{"spec":{"stopPolicy":"HoldAndDrain"}}',
    )
    cluster.wait_for(
        "running to be drained (suspended)",
        lambda: (
            _suspended(cluster, namespace, "running")
            and not admitted(_wl(cluster, namespace, "running"))
        ),
        timeout=90,
    )
    cluster.wait_for(
        "the drained queue to be deleted",
        lambda: cluster.kubectl("get", "clusterqueues.muster.dev", cq, check=False).returncode != 0,
        timeout=60,
    )


def test_broken_queue_tree_is_reported_and_admits_nothing_new(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    pool = unique("tree")
    cluster.nodes(1, cpu="8", memory="16Gi", labels={"muster-e2e/pool": pool})
    parent, child = unique("parent"), unique("child")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(parent, [{"name": pool, "quota": {"cpu": "8"}}]),
        cq_manifest(child, [{"name": pool, "quota": {"cpu": "8"}}], parent=parent),
        local_queue("q", namespace, child),
        local_queue("at-parent", namespace, parent),
    )
    apply(cluster, job("runs", namespace, "q", parallelism=1, cpu="1"))
    cluster.wait_for("runs admitted", lambda: admitted(_wl(cluster, namespace, "runs")))

    # A LocalQueue pointing at a parent queue says so, and its Jobs wait.
    cluster.wait_for(
        "at-parent to report ClusterQueueNotLeaf",
        lambda: (
            condition(
                get(cluster, "localqueues.muster.dev", "at-parent", "-n", namespace), "Active"
            ).get("reason")
            == "ClusterQueueNotLeaf"
        ),
    )
    apply(cluster, job("misrouted", namespace, "at-parent", parallelism=1, cpu="1"))
    cluster.wait_for(
        "misrouted to be inadmissible",
        lambda: (
            condition(_wl(cluster, namespace, "misrouted"), "QuotaReserved").get("reason")
            == "Inadmissible"
        ),
    )

    # The child's parent goes missing: the child is inactive and admits nothing new, but
    # the admitted Job keeps running.
    cluster.kubectl(
        "patch",
        "clusterqueues.muster.dev",
        child,
        "--type=merge",
        "-p",
        '{"spec":{"parent":"no-such-parent"}}',
    )
    cluster.wait_for(
        "the child to report ParentNotFound",
        lambda: (
            condition({"status": cq_status(cluster, child)}, "Active").get("reason")
            == "ParentNotFound"
        ),
    )
    apply(cluster, job("blocked", namespace, "q", parallelism=1, cpu="1"))
    cluster.wait_for(
        "blocked to wait on the inactive queue",
        lambda: (
            condition(_wl(cluster, namespace, "blocked"), "QuotaReserved").get("reason")
            == "Inadmissible"
        ),
    )
    assert admitted(_wl(cluster, namespace, "runs"))
    assert not _suspended(cluster, namespace, "runs")
