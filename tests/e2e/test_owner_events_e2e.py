"""Eviction and preemption Events reach the owner of every kind, with the real JobSet and
Trainer controllers: a low-priority Job, JobSet and TrainJob fill their queue, a
high-priority JobSet preempts all three, and each of them is told so on its own object, in
the same words a Job is (`controllers/jobs/ownerevents.py`); the preemptor is told whom it
preempts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    crds,  # noqa: F401 - fixture
    create,
    events_on,
    flavor,
    job,
    local_queue,
    priority_class,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest
from tests.e2e.test_jobset_e2e import jobset

# Its controller fixture: Muster started after the JobSet and Trainer controllers (`PEERS`).
from tests.e2e.test_trainjob_e2e import controller, role, trainjob  # noqa: F401

pytestmark = pytest.mark.e2e

PEERS = "trainer"


def told(cluster: ClusterHandle, namespace: str, kind: str, name: str) -> dict[str, str]:
    """Reason -> message of the Events on one object."""
    return {e["reason"]: e["message"] for e in events_on(cluster, namespace, kind, name)}


def with_priority(obj: dict[str, Any], name: str) -> dict[str, Any]:
    for rj in obj["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["template"]["spec"]["priorityClassName"] = name
    return obj


def test_a_jobset_and_a_trainjob_are_told_of_their_preemption_as_a_job_is(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811 - fixture
) -> None:
    pool = unique("oep")
    cluster.nodes(1, cpu="8", memory="32Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    low, high, runtime_name = unique("low"), unique("high"), unique("rt")
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": runtime_name},
        "spec": {
            "mlPolicy": {"numNodes": 1},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        role("launcher", None, "600s"),
                        role("node", "trainer", "600s"),
                    ]
                }
            },
        },
    }
    with_priority(runtime["spec"]["template"], low)
    apply(
        cluster,
        priority_class(low, 10),
        priority_class(high, 1000),
        flavor(pool, pool),
        cq_manifest(
            cq,
            [{"name": pool, "quota": {"cpu": "6"}, "limit": {"cpu": "6"}}],
            preemption={"withinQueue": "LowerPriority"},
        ),
        local_queue("team", namespace, cq),
        runtime,
    )
    # Three victims of 2 cpu each fill the queue: one of each kind.
    victims = {"Job": "low-job", "JobSet": "low-jobset", "TrainJob": "low-trainjob"}
    create(
        cluster,
        job("low-job", namespace, "team", parallelism=2, runs_for="600s", priority_class=low),
    )
    create(cluster, with_priority(jobset("low-jobset", namespace, "team", 1, "600s"), low))
    create(cluster, trainjob("low-trainjob", namespace, "team", runtime_name, 1))
    cluster.wait_for(
        "the three low-priority objects to be admitted",
        lambda: all(
            any(admitted(w) for w in workloads_of(cluster, namespace, name))
            for name in victims.values()
        ),
        timeout=120,
    )
    # A JobSet that needs the whole queue preempts all three.
    create(cluster, with_priority(jobset("urgent", namespace, "team", 5, "2s"), high))

    def preempted() -> bool:
        return all(
            "Preempted" in told(cluster, namespace, kind, name) for kind, name in victims.items()
        )

    cluster.wait_for("every victim to be told it was preempted", preempted, timeout=120)
    said = {kind: told(cluster, namespace, kind, name) for kind, name in victims.items()}
    for kind, events in said.items():
        # The words name the preemptor, the same for every kind.
        assert "urgent" in events["Preempted"], (kind, events)
    cluster.wait_for(
        "every victim to be suspended",
        lambda: all("Stopped" in told(cluster, namespace, k, n) for k, n in victims.items()),
        timeout=120,
    )
    preemptor = told(cluster, namespace, "JobSet", "urgent")
    assert "Preempting" in preemptor, preemptor
    for name in victims.values():
        wl = workloads_of(cluster, namespace, name)[0]
        assert wl["metadata"]["name"] in preemptor["Preempting"], preemptor
