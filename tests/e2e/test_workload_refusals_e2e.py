"""Refuse what cannot be right, on a real apiserver with the controller running (issue 24,
item 5): a Job naming a PriorityClass that does not exist waits, its Workload's Pending
condition naming the class, and is admitted once the class is created; an admission that
assigns no pod set is refused by the Workload CRD's schema."""

from __future__ import annotations

import json

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
    flavor,
    job,
    local_queue,
    priority_class,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e


def test_a_job_naming_a_missing_priority_class_waits_until_the_class_exists(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    pool = unique("prio")
    cluster.nodes(1, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "4"}}]),
        local_queue("team", namespace, cq),
    )
    missing = unique("urgent")
    create(cluster, job("named", namespace, "team", priority_class=missing))

    def message() -> str:
        found = workloads_of(cluster, namespace, "named")
        return str(condition(found[0], "QuotaReserved").get("message", "")) if found else ""

    cluster.wait_for("the Workload to say which PriorityClass it waits for", lambda: message())
    assert f"waits for PriorityClass '{missing}', which does not exist" in message()
    [wl] = workloads_of(cluster, namespace, "named")
    assert condition(wl, "QuotaReserved")["reason"] == "Inadmissible"
    assert not admitted(wl) and "priority" not in wl["spec"]

    apply(cluster, priority_class(missing, 1000))
    cluster.wait_for(
        "the Workload to be admitted once its PriorityClass exists",
        lambda: admitted(workloads_of(cluster, namespace, "named")[0]),
    )


def test_the_schema_refuses_an_admission_that_assigns_no_pod_set(
    cluster: ClusterHandle,
    namespace: str,
    crds: None,  # noqa: F811
) -> None:
    name = unique("wl")
    create(
        cluster,
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "queueName": "team",
                "podSets": [{"name": "main", "count": 1, "requests": {"cpu": "1"}}],
            },
        },
    )
    patch = json.dumps({"status": {"admission": {"clusterQueue": "cq", "podSetAssignments": []}}})
    refused = cluster.kubectl(
        "patch",
        "wl",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
        check=False,
    )
    assert refused.returncode != 0
    assert "status.admission.podSetAssignments" in refused.stderr
    assert "should have at least 1 items" in refused.stderr
