"""The metrics endpoint of a running controller, scraped as Prometheus does while a story
runs: the numbers move as the story does. And the health probes: /healthz, /readyz, 404
elsewhere, and the webhook port no longer answers "ok" to a GET."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    flavor,
    job,
    local_queue,
    pods_of,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def fetch(url: str) -> tuple[int, str]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(ctl: Controller) -> Samples:
    code, body = fetch(f"http://127.0.0.1:{ctl.metrics_port}/metrics")
    assert code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum over every series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def test_probes_mean_what_they_say(controller: Controller) -> None:  # noqa: F811
    base = f"http://127.0.0.1:{controller.metrics_port}"
    assert fetch(f"{base}/healthz") == (200, "ok\n")
    assert fetch(f"{base}/readyz") == (200, "ok\n")  # leading: caches synced, cert loaded
    for path in ("/", "/ready", "/healthz/x"):
        assert fetch(f"{base}{path}")[0] == 404
    # The webhook server used to answer "ok" on any GET; health is on the metrics port now.
    code, _ = fetch(f"https://127.0.0.1:{controller.port}/healthz")
    assert code == 404


def test_numbers_move_as_a_story_does(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811
    namespace: str,
) -> None:
    pool = unique("metrics")
    nodes = cluster.nodes(1, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        # A limit, or the queue would borrow the node's fourth cpu.
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "3"}, "limit": {"cpu": "3"}}]),
        local_queue("team", namespace, cq),
    )
    try:
        cluster.wait_for(
            "the queue's quota in /metrics",
            lambda: (
                value(
                    scrape(controller),
                    "muster_cluster_queue_nominal_quota",
                    cluster_queue=cq,
                    flavor=pool,
                    resource="cpu",
                )
                == 3
            ),
        )
        before = scrape(controller)
        assert value(before, "muster_leader") == 1
        assert value(before, "muster_admitted_active_workloads", cluster_queue=cq) == 0

        apply(cluster, job("first", namespace, "team", parallelism=2, cpu="1"))
        cluster.wait_for(
            "2 pods bound",
            lambda: (
                sum(1 for p in pods_of(cluster, namespace, "first") if p["spec"].get("nodeName"))
                == 2
            ),
            timeout=60,
        )
        cluster.wait_for(
            "usage of 2 cpu in /metrics",
            lambda: (
                value(
                    scrape(controller),
                    "muster_cluster_queue_resource_usage",
                    cluster_queue=cq,
                    flavor=pool,
                    resource="cpu",
                )
                == 2
            ),
        )
        after = scrape(controller)
        assert value(after, "muster_admitted_workloads_total", cluster_queue=cq) == 1
        assert value(after, "muster_admission_wait_time_seconds_count", cluster_queue=cq) == 1
        assert value(after, "muster_admitted_active_workloads", cluster_queue=cq) == 1
        assert (
            total(after, "muster_admission_attempts_total", result="success")
            >= total(before, "muster_admission_attempts_total", result="success") + 1
        )
        assert (
            total(after, "muster_placement_attempts_total", result="placed")
            >= total(before, "muster_placement_attempts_total", result="placed") + 1
        )
        assert (
            total(after, "muster_bind_duration_seconds_count", result="bound")
            >= total(before, "muster_bind_duration_seconds_count", result="bound") + 2
        )
        # The queue objects applied above were checked by the queue webhook (labelled Jobs
        # are left to admission policies the apiserver evaluates itself).
        assert (
            total(
                after,
                "muster_webhook_request_duration_seconds_count",
                path="/validate-muster-dev-v1alpha1",
            )
            >= 1
        )

        # Over quota: pending, then admitted once the first Job is gone.
        apply(cluster, job("second", namespace, "team", parallelism=2, cpu="1"))
        cluster.wait_for(
            "one pending workload in /metrics",
            lambda: (
                value(
                    scrape(controller),
                    "muster_pending_workloads",
                    cluster_queue=cq,
                    status="active",
                )
                == 1
            ),
        )
        cluster.kubectl("delete", "job", "first", "-n", namespace, "--wait=false")
        cluster.wait_for(
            "the second Job admitted",
            lambda: any(admitted(w) for w in workloads_of(cluster, namespace, "second")),
            timeout=90,
        )
        cluster.wait_for(
            "pending back to 0 and a second admission counted",
            lambda: (
                lambda s: (
                    value(s, "muster_pending_workloads", cluster_queue=cq, status="active") == 0
                    and value(s, "muster_admitted_workloads_total", cluster_queue=cq) == 2
                )
            )(scrape(controller)),
        )
        history = scrape(controller)
        assert value(history, "muster_history_database_up") == 1
        assert ("muster_informer_last_event_age_seconds", (("informer", "Workload"),)) in history
    finally:
        cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)
