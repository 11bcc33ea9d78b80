"""The plain Job path, end to end: a labelled Job is suspended on creation, admitted under
its queue's quota, runs only on nodes of the assigned flavor, completes, and its quota
returns so the next Job is admitted."""

from __future__ import annotations

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
    create,
    events_for,
    finished,
    flavor,
    get,
    job,
    local_queue,
    pods_of,
    unique,
    wait_told_missing_queue,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e


def test_labelled_job_is_suspended_admitted_placed_on_its_flavor_and_releases_quota(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    pool = unique("plain")
    pool_nodes = cluster.nodes(2, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    # Nodes of another pool, with room to spare, that the Job must not use.
    cluster.nodes(2, cpu="16", memory="64Gi", labels={"muster-e2e/pool": pool + "-other"})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}]),
        local_queue("team", namespace, cq),
    )
    first = job("first", namespace, "team", parallelism=4, completions=4, runs_for="6s")
    second = job("second", namespace, "team", parallelism=2, completions=2, runs_for="2s")
    # Suspended by the webhook at creation: the user did not set spec.suspend.
    assert "suspend" not in first["spec"]
    assert create(cluster, first)["spec"]["suspend"] is True

    cluster.wait_for(
        "the Workload of job first to be admitted",
        lambda: any(admitted(w) for w in workloads_of(cluster, namespace, "first")),
    )
    [wl] = workloads_of(cluster, namespace, "first")
    assert wl["status"]["admission"]["clusterQueue"] == cq
    assert wl["metadata"]["ownerReferences"][0]["name"] == "first"

    # The second Job needs 2 more cpu: over the limit while the first runs, so it waits and
    # says which limit.
    apply(cluster, second)
    cluster.wait_for(
        "the second Job to wait with a reason",
        lambda: (
            condition(workloads_of(cluster, namespace, "second")[0], "QuotaReserved").get("reason")
            == "Pending"
            if workloads_of(cluster, namespace, "second")
            else False
        ),
    )
    waiting = condition(workloads_of(cluster, namespace, "second")[0], "QuotaReserved")
    assert "cpu" in waiting["message"] and "limit" in waiting["message"], waiting
    assert get(cluster, "job", "second", "-n", namespace)["spec"]["suspend"] is True

    # The first Job's pods run, and only on the flavor's nodes.
    cluster.wait_for(
        "4 pods of job first bound to nodes",
        lambda: (
            sum(1 for p in pods_of(cluster, namespace, "first") if p["spec"].get("nodeName")) == 4
        ),
    )
    for pod in pods_of(cluster, namespace, "first"):
        assert pod["spec"]["nodeName"] in pool_nodes
        assert pod["spec"]["nodeSelector"]["muster-e2e/pool"] == pool
    # Queue status is written coalesced, at most once a second per queue.
    cluster.wait_for(
        "the queue's status to show 4 cpu in use by 1 workload",
        lambda: (
            cq_status(cluster, cq).get("usage") == {pool: {"cpu": "4"}}
            and cq_status(cluster, cq).get("admittedWorkloads") == 1
        ),
        timeout=15,
    )

    # It completes; its Workload is Finished and the quota goes to the second Job.
    cluster.wait_for(
        "job first to complete",
        lambda: any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in get(cluster, "job", "first", "-n", namespace)["status"].get("conditions", [])
        ),
        timeout=90,
    )
    cluster.wait_for(
        "the first Workload to be Finished",
        lambda: finished(workloads_of(cluster, namespace, "first")[0]),
    )
    assert condition(workloads_of(cluster, namespace, "first")[0], "Finished")["reason"] == (
        "Succeeded"
    )
    cluster.wait_for(
        "the second Job to be admitted once quota returns",
        lambda: admitted(workloads_of(cluster, namespace, "second")[0]),
    )
    cluster.wait_for(
        "job second to complete and quota to return to zero",
        lambda: (
            finished(workloads_of(cluster, namespace, "second")[0])
            and not cq_status(cluster, cq).get("usage")
            and cq_status(cluster, cq).get("admittedWorkloads") == 0
        ),
        timeout=90,
    )
    assert "Started" in events_for(cluster, namespace, "Job", "first")
    wl_name = workloads_of(cluster, namespace, "first")[0]["metadata"]["name"]
    assert "Admitted" in events_for(cluster, namespace, "Workload", wl_name)


def test_job_naming_a_missing_local_queue_is_accepted_and_its_workload_says_why(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    assert create(cluster, job("lost", namespace, "no-such-queue"))["spec"]["suspend"] is True
    wait_told_missing_queue(cluster, namespace, "lost", "no-such-queue")


def test_elastic_job_with_partial_admission_is_refused_with_a_clear_message(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    bad = job(
        "both",
        namespace,
        "team",
        parallelism=2,
        elastic=True,
        annotations={"muster.dev/min-parallelism": "1"},
    )
    import yaml

    result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert result.returncode != 0
    assert "muster.dev/elastic-job and muster.dev/min-parallelism cannot be combined" in (
        result.stderr
    )


def test_unlabelled_job_is_left_alone(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    apply(cluster, job("plain", namespace, None))
    assert not get(cluster, "job", "plain", "-n", namespace)["spec"].get("suspend")
    assert get(cluster, "workloads.muster.dev", "-n", namespace)["items"] == []


def test_partial_admission_runs_the_pods_that_fit(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    pool = unique("partial")
    cluster.nodes(1, cpu="16", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}]),
        local_queue("team", namespace, cq),
    )
    apply(
        cluster,
        job(
            "wide",
            namespace,
            "team",
            parallelism=6,
            annotations={"muster.dev/min-parallelism": "2"},
        ),
    )
    cluster.wait_for(
        "wide admitted with 4 of its 6 pods",
        lambda: (
            bool(workloads_of(cluster, namespace, "wide"))
            and admitted(workloads_of(cluster, namespace, "wide")[0])
        ),
    )
    [wl] = workloads_of(cluster, namespace, "wide")
    assert wl["status"]["admission"]["podSetAssignments"][0]["count"] == 4
    assert "partial admission" in condition(wl, "QuotaReserved")["message"]
    cluster.wait_for(
        "4 pods running",
        lambda: (
            sum(1 for p in pods_of(cluster, namespace, "wide") if p["spec"].get("nodeName")) == 4
        ),
    )
    assert get(cluster, "job", "wide", "-n", namespace)["spec"]["parallelism"] == 4
