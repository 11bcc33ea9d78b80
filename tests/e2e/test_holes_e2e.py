"""The quota holes of issue 16, each driven as a user would (kubectl against the local
cluster, one controller for the module): what is admitted always counts, and no Job runs
more pods than Muster admitted.

- deleting a running Job holds its quota until its pods are gone (the Workload finalizer);
- deleting it with `--cascade=orphan` too: the orphaned pods hold the quota while they run,
  and it is released once they finish;
- a running non-elastic Job cannot grow (refused, pointing to the elastic annotation);
- removing the queue label lets go of the Job's Workload, so it never holds quota later;
- the elastic annotation cannot be added or removed;
- a ClusterQueue the model rejects (written while the webhook was away) still counts what
  it admitted under its parent's limit;
- a queue with over-quota weight 0 has a fair share of its quota, however much more it asks
  for while capacity is idle (the share the controller writes into its status).
"""

from __future__ import annotations

import json
import time
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
    create,
    flavor,
    get,
    job,
    local_queue,
    pods_of,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

FINALIZER = "muster.dev/resource-in-use"


def _queue(cluster: ClusterHandle, namespace: str, cpu: str, node_cpu: str = "8") -> str:
    """A flavor on one node with `node_cpu`, a ClusterQueue whose quota and limit are `cpu`,
    and LocalQueue `q` in `namespace`; returns the ClusterQueue's name."""
    pool = unique("hole")
    cluster.nodes(1, cpu=node_cpu, memory="32Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": cpu}, "limit": {"cpu": cpu}}]),
        local_queue("q", namespace, cq),
    )
    return cq


def _wl(cluster: ClusterHandle, namespace: str, job_name: str) -> dict[str, Any]:
    found = workloads_of(cluster, namespace, job_name)
    return found[0] if found else {}


def _bound(cluster: ClusterHandle, namespace: str, job_name: str) -> int:
    return sum(1 for p in pods_of(cluster, namespace, job_name) if p["spec"].get("nodeName"))


def _pending_with_reason(cluster: ClusterHandle, namespace: str, job_name: str) -> bool:
    return condition(_wl(cluster, namespace, job_name), "QuotaReserved").get("status") == "False"


def test_deleting_a_running_job_holds_its_quota_until_its_pods_are_gone(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    # The node has room for both Jobs; the queue's limit of 4 cpu is what must hold.
    cq = _queue(cluster, namespace, cpu="4")
    first = job("first", namespace, "q", parallelism=4, cpu="1")
    # Its pods take 20 s to terminate once deleted, as containers do in their grace period.
    first["spec"]["template"]["metadata"] = {
        "annotations": {"pod-delete.stage.kwok.x-k8s.io/delay": "20s"}
    }
    create(cluster, first)
    cluster.wait_for("4 pods of first bound", lambda: _bound(cluster, namespace, "first") == 4)
    apply(cluster, job("second", namespace, "q", parallelism=4, cpu="1"))
    cluster.wait_for(
        "second to wait for quota", lambda: _pending_with_reason(cluster, namespace, "second")
    )

    cluster.kubectl("delete", "job", "first", "-n", namespace, "--wait=false")
    cluster.wait_for(
        "first's pods to be terminating",
        lambda: (
            all(
                p["metadata"].get("deletionTimestamp") for p in pods_of(cluster, namespace, "first")
            )
            and bool(pods_of(cluster, namespace, "first"))
        ),
    )
    # While they terminate, the Workload stays (deleted, held by its finalizer) and counts.
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        assert not admitted(_wl(cluster, namespace, "second")), "admitted onto cpu still in use"
        if pods_of(cluster, namespace, "first"):
            assert _wl(cluster, namespace, "first"), "the Workload went before its pods"
        time.sleep(0.5)
    assert pods_of(cluster, namespace, "first"), "the pods take 20 s to go"
    held = _wl(cluster, namespace, "first")
    assert held["metadata"].get("deletionTimestamp"), held["metadata"]
    assert FINALIZER in held["metadata"]["finalizers"]
    assert cq_status(cluster, cq).get("admittedWorkloads") == 1

    # Once the pods are gone, the Workload goes and the quota passes to the next Job.
    try:
        cluster.wait_for(
            "second to be admitted after first's pods are gone",
            lambda: admitted(_wl(cluster, namespace, "second")),
            timeout=60,
        )
    except AssertionError as error:
        waiting = condition(_wl(cluster, namespace, "second"), "QuotaReserved")
        raise AssertionError(f"{error}; second says {waiting}") from None
    assert not pods_of(cluster, namespace, "first")
    assert not workloads_of(cluster, namespace, "first")


def test_a_job_deleted_with_cascade_orphan_holds_quota_only_while_its_pods_run(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    cq = _queue(cluster, namespace, cpu="4")
    first = job("first", namespace, "q", parallelism=4, cpu="1")
    # Its pods finish 25 s after they start, whatever happens to the Job.
    first["spec"]["template"]["metadata"] = {
        "annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "25s"}
    }
    create(cluster, first)
    cluster.wait_for("4 pods of first bound", lambda: _bound(cluster, namespace, "first") == 4)
    apply(cluster, job("second", namespace, "q", parallelism=4, cpu="1"))
    cluster.wait_for(
        "second to wait for quota", lambda: _pending_with_reason(cluster, namespace, "second")
    )
    cluster.kubectl("delete", "job", "first", "-n", namespace, "--cascade=orphan")
    # The Job is gone, its pods run on unowned; they still use the cpu the quota stands for.
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        running = [
            p
            for p in pods_of(cluster, namespace, "first")
            if (p.get("status") or {}).get("phase") == "Running"
        ]
        if not running:
            break
        assert not admitted(_wl(cluster, namespace, "second")), "admitted onto cpu still in use"
        time.sleep(0.5)
    # Once they have finished, the orphaned Workload goes and the quota passes on.
    cluster.wait_for(
        "second to be admitted after first's orphaned pods finished",
        lambda: admitted(_wl(cluster, namespace, "second")),
        timeout=90,
    )
    assert not workloads_of(cluster, namespace, "first")
    cluster.wait_for(
        "the queue to count one admitted Workload",
        lambda: cq_status(cluster, cq).get("admittedWorkloads") == 1,
    )


def test_a_running_job_cannot_grow_past_what_was_admitted(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    cq = _queue(cluster, namespace, cpu="2")
    create(cluster, job("resize", namespace, "q", parallelism=2, cpu="1"))
    cluster.wait_for("2 pods of resize bound", lambda: _bound(cluster, namespace, "resize") == 2)

    grown = cluster.kubectl(
        "patch",
        "job",
        "resize",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"parallelism":40}}',
        check=False,
    )
    assert grown.returncode != 0
    assert "muster.dev/elastic-job" in grown.stderr, grown.stderr
    assert "parallelism" in grown.stderr
    assert get(cluster, "job", "resize", "-n", namespace)["spec"]["parallelism"] == 2
    time.sleep(2)
    assert len(pods_of(cluster, namespace, "resize")) == 2
    cluster.wait_for(
        "the queue to show the 2 cpu admitted",
        lambda: cq_status(cluster, cq).get("usage", {}) and _cpu_used(cluster, cq) == "2",
        timeout=15,
    )

    # Shrinking is allowed: fewer pods than admitted never exceeds the quota.
    cluster.kubectl(
        "patch",
        "job",
        "resize",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"parallelism":1}}',
    )
    cluster.wait_for(
        "1 pod of resize left", lambda: len(pods_of(cluster, namespace, "resize")) == 1
    )


def _cpu_used(cluster: ClusterHandle, cq: str) -> str | None:
    usage = cq_status(cluster, cq).get("usage") or {}
    return next((per.get("cpu") for per in usage.values()), None)


def test_removing_the_queue_label_lets_go_of_the_workload(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    cq = _queue(cluster, namespace, cpu="1")
    create(cluster, job("runs", namespace, "q", cpu="1"))
    cluster.wait_for("runs admitted", lambda: admitted(_wl(cluster, namespace, "runs")))
    create(cluster, job("leaves", namespace, "q", cpu="1"))
    cluster.wait_for(
        "leaves to wait for quota", lambda: _pending_with_reason(cluster, namespace, "leaves")
    )

    # Allowed on a suspended Job: it leaves Muster, and its Workload with it.
    cluster.kubectl("label", "job", "leaves", "-n", namespace, "muster.dev/queue-name-")
    cluster.wait_for(
        "the Workload of leaves to be gone",
        lambda: not workloads_of(cluster, namespace, "leaves"),
        timeout=30,
    )
    assert get(cluster, "job", "leaves", "-n", namespace)["spec"]["suspend"] is True

    # The quota that frees up is not taken by the Job that left: the queue goes idle.
    cluster.kubectl("delete", "job", "runs", "-n", namespace, "--wait=false")
    cluster.wait_for(
        "the queue to hold nothing",
        lambda: (
            cq_status(cluster, cq).get("admittedWorkloads") == 0
            and not cq_status(cluster, cq).get("usage")
        ),
        timeout=30,
    )
    assert not workloads_of(cluster, namespace, "leaves")

    # Labelled again, it is queued afresh and runs.
    cluster.kubectl("label", "job", "leaves", "-n", namespace, "muster.dev/queue-name=q")
    cluster.wait_for(
        "leaves to be admitted once labelled again",
        lambda: admitted(_wl(cluster, namespace, "leaves")),
        timeout=30,
    )


def test_the_elastic_annotation_cannot_be_added_or_removed(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    _queue(cluster, namespace, cpu="1")
    create(cluster, job("hold", namespace, "q", cpu="1"))
    cluster.wait_for("hold admitted", lambda: admitted(_wl(cluster, namespace, "hold")))
    # Waits suspended: the queue is full.
    create(cluster, job("elastic", namespace, "q", cpu="1", elastic=True))
    cluster.wait_for(
        "elastic to wait for quota", lambda: _pending_with_reason(cluster, namespace, "elastic")
    )
    dropped = cluster.kubectl(
        "annotate", "job", "elastic", "-n", namespace, "muster.dev/elastic-job-", check=False
    )
    assert dropped.returncode != 0
    assert "muster.dev/elastic-job cannot be added or removed" in dropped.stderr, dropped.stderr

    create(cluster, job("plain", namespace, "q", cpu="1"))
    added = cluster.kubectl(
        "annotate", "job", "plain", "-n", namespace, "muster.dev/elastic-job=true", check=False
    )
    assert added.returncode != 0
    assert "create a new Job" in added.stderr, added.stderr


def test_a_queue_the_model_rejects_still_counts_what_it_admitted(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    # A parent with a 4-cpu limit; team a borrows all 4, then its queue is rewritten with a
    # quantity the apiserver accepts and the model refuses, while the controller is away.
    pool = unique("invalid")
    cluster.nodes(1, cpu="16", memory="32Gi", labels={"muster-e2e/pool": pool})
    org, team_a, team_b = unique("org"), unique("a"), unique("b")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(org, [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}]),
        cq_manifest(team_a, [{"name": pool, "quota": {"cpu": "2"}}], parent=org),
        cq_manifest(team_b, [{"name": pool, "quota": {"cpu": "2"}}], parent=org),
        local_queue("a", namespace, team_a),
        local_queue("b", namespace, team_b),
    )
    create(cluster, job("a-main", namespace, "a", parallelism=4, cpu="1"))
    cluster.wait_for("a-main admitted", lambda: admitted(_wl(cluster, namespace, "a-main")))

    controller.stop()  # its webhook (failure policy Ignore for queues) is away
    broken = [{"name": pool, "quota": {"cpu": "2000500u"}}]
    cluster.kubectl(
        "patch",
        "clusterqueues.muster.dev",
        team_a,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"flavors": broken}}),
    )
    controller.start()
    controller.wait_leading()

    create(cluster, job("b-main", namespace, "b", parallelism=4, cpu="1"))
    cluster.wait_for(
        "b-main to wait under the parent's limit",
        lambda: _pending_with_reason(cluster, namespace, "b-main"),
    )
    time.sleep(3)
    assert not admitted(_wl(cluster, namespace, "b-main")), "8 cpu admitted under a 4-cpu limit"
    assert admitted(_wl(cluster, namespace, "a-main"))
    message = condition(_wl(cluster, namespace, "b-main"), "QuotaReserved")["message"]
    assert "limit" in message, message


def test_a_queue_with_weight_zero_has_a_fair_share_of_its_quota(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    # Capacity 7, quota 3 at weight 0, demand 5: the share used to be 5 (all demand fits).
    pool = unique("w0")
    cluster.nodes(1, cpu="7", memory="32Gi", labels={"muster-e2e/pool": pool})
    zero, other = unique("cq"), unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(zero, [{"name": pool, "quota": {"cpu": "3"}}], overQuotaWeight=0),
        cq_manifest(other, [{"name": pool, "quota": {"cpu": "4"}}]),
        local_queue("q", namespace, zero),
    )
    create(cluster, job("wants-five", namespace, "q", parallelism=5, cpu="1"))

    def share() -> str | None:
        return ((cq_status(cluster, zero).get("fairShare") or {}).get(pool) or {}).get("cpu")

    cluster.wait_for("a fair share in the queue's status", lambda: share() is not None)
    time.sleep(3)  # a later cycle with the demand counted must not raise it
    assert share() == "3", cq_status(cluster, zero)
