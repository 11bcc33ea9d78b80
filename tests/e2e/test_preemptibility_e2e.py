"""Preemptibility end to end, as a user drives it (kubectl and `kubectl muster explain`):
a Job at or above its queue's preemptibleBelowPriority (default 100) never borrows, and a
Job annotated muster.dev/preemptible: "false" is never reclaimed, while a preemptible one of
the same queue is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    create,
    eviction_reason,
    flavor,
    local_queue,
    priority_class,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest
from tests.e2e.test_plugin_e2e import kubectl_muster
from tests.e2e.test_scheduler_e2e import GPU, gpu_job, with_priority

pytestmark = pytest.mark.e2e

PREEMPTIBLE = "muster.dev/preemptible"


class Cohort:
    """Two GPU nodes (16 GPUs), a flavor over them, and a parent queue holding them all with
    two children: serve (4 GPUs guaranteed) and train (12), each with a LocalQueue."""

    def __init__(self, cluster: ClusterHandle, namespace: str) -> None:
        self.pool = unique("np")
        self.nodes = cluster.nodes(
            2, cpu="32", memory="256Gi", gpu=8, labels={"muster-e2e/pool": self.pool}
        )
        org, self.serve, self.train = unique("org"), unique("serve"), unique("train")

        def quota(gpus: int) -> list[dict[str, Any]]:
            return [{"name": self.pool, "quota": {"cpu": str(4 * gpus), GPU: str(gpus)}}]

        apply(
            cluster,
            flavor(self.pool, self.pool),
            cq_manifest(org, quota(16)),
            cq_manifest(self.serve, quota(4), parent=org),
            cq_manifest(self.train, quota(12), parent=org),
            local_queue("serve", namespace, self.serve),
            local_queue("train", namespace, self.train),
        )


@pytest.fixture
def cohort(cluster: ClusterHandle, namespace: str) -> Iterator[Cohort]:
    made = Cohort(cluster, namespace)
    try:
        yield made
    finally:
        cluster.kubectl("delete", "node", *made.nodes, "--wait=false", check=False)


def queued(job: dict[str, Any], queue: str, *, preemptible: str | None = None) -> dict[str, Any]:
    """`job` in LocalQueue `queue`, annotated muster.dev/preemptible when asked."""
    meta = job["metadata"]
    meta["labels"]["muster.dev/queue-name"] = queue
    if preemptible is not None:
        meta.setdefault("annotations", {})[PREEMPTIBLE] = preemptible
    return job


def workload(cluster: ClusterHandle, namespace: str, job: str) -> dict[str, Any]:
    found = workloads_of(cluster, namespace, job)
    return found[-1] if found else {}


def message(cluster: ClusterHandle, namespace: str, job: str) -> str:
    return str(condition(workload(cluster, namespace, job), "QuotaReserved").get("message", ""))


def test_a_non_preemptible_job_never_borrows_and_says_why(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
    cohort: Cohort,
) -> None:
    serving, batch = unique("serving"), unique("batch")
    apply(cluster, priority_class(serving, 150), priority_class(batch, 50))
    # 8 GPUs at priority 150 in a queue guaranteed 4, whose cohort has 12 idle: it waits.
    create(cluster, with_priority(queued(gpu_job("chat", namespace, 1, gpu=8), "serve"), serving))
    expected = (
        f"non-preemptible (priority 150 >= 100 in queue {cohort.serve}): admitted only within "
        f"the queue's guaranteed quota of {GPU} in flavor {cohort.pool}: requested 8, quota left 4"
    )
    cluster.wait_for(
        "the priority-150 Job to wait within its quota",
        lambda: message(cluster, namespace, "chat").startswith(expected),
    )
    out = kubectl_muster(cluster, "explain", "chat", "-n", namespace, "--color", "never").stdout
    assert "non-preemptible (priority 150 >= 100" in " ".join(out.split())
    # The same 8 GPUs at priority 50 borrow the idle cohort's at once.
    create(cluster, with_priority(queued(gpu_job("sweep", namespace, 1, gpu=8), "serve"), batch))
    cluster.wait_for(
        "the priority-50 Job to borrow", lambda: admitted(workload(cluster, namespace, "sweep"))
    )
    assert "borrows" in message(cluster, namespace, "sweep")
    assert not admitted(workload(cluster, namespace, "chat"))


def test_reclaim_takes_the_preemptible_job_and_never_the_non_preemptible_one(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
    cohort: Cohort,
) -> None:
    low, batch = unique("low"), unique("batch")
    apply(cluster, priority_class(low, 0), priority_class(batch, 50))
    # serve runs two 4-GPU Jobs: "kept" within its quota, annotated non-preemptible although
    # its priority (0) makes it the first victim otherwise; "borrower" above its quota.
    kept = queued(gpu_job("kept", namespace, 1, gpu=4), "serve", preemptible="false")
    create(cluster, with_priority(kept, low))
    cluster.wait_for("kept admitted", lambda: admitted(workload(cluster, namespace, "kept")))
    assert workload(cluster, namespace, "kept")["metadata"]["annotations"][PREEMPTIBLE] == "false"
    create(cluster, with_priority(queued(gpu_job("borrower", namespace, 1, gpu=4), "serve"), batch))
    cluster.wait_for(
        "borrower admitted", lambda: admitted(workload(cluster, namespace, "borrower"))
    )
    # train, below its fair share, wants its 12 GPUs: 8 are free, 4 must be reclaimed.
    create(cluster, with_priority(queued(gpu_job("train", namespace, 3, gpu=4), "train"), batch))
    cluster.wait_for(
        "train admitted after reclaiming the borrower",
        lambda: admitted(workload(cluster, namespace, "train")),
        timeout=120,
    )
    assert eviction_reason(workload(cluster, namespace, "borrower")) == "Reclaimed"
    assert admitted(workload(cluster, namespace, "kept"))
    assert not eviction_reason(workload(cluster, namespace, "kept"))
