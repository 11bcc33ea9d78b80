"""The metrics endpoint: health probes that mean what they say, unknown paths 404, the
scrape-time gauges read from the caches, and Workload transitions counted once."""

from __future__ import annotations

import copy
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from controllers.metrics import definitions as m
from controllers.metrics.collector import Sources, StateCollector, amount
from controllers.metrics.server import MetricsServer
from controllers.metrics.workloads import WorkloadCounters, wait_seconds
from controllers.state.caches import Caches
from quota.model.decisions import CycleResult
from quota.model.snapshot import PodSetTopology
from quota.placement.topology import SPREAD
from tests.unit.controller_fakes import FakeKube
from tests.unit.test_topology import LEVELS, RACK, ask, fabric, topo_cycle
from tests.unit.test_topology_controller import _ask, _scheduler


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def server() -> Iterator[tuple[MetricsServer, dict[str, Any]]]:
    state: dict[str, Any] = {"caches": "informers not synced: Workload", "history": None}
    checks = {name: (lambda name=name: state[name]) for name in state}
    srv = MetricsServer("127.0.0.1", 0, checks)
    srv.start()
    try:
        yield srv, state
    finally:
        srv.stop()


def test_readyz_says_what_is_missing_until_every_check_passes(server: Any) -> None:
    srv, state = server
    assert get(srv.port, "/healthz") == (200, "ok\n")
    code, body = get(srv.port, "/readyz")
    assert code == 503
    assert body == "caches: informers not synced: Workload\n"
    state["caches"] = None
    assert get(srv.port, "/readyz") == (200, "ok\n")


def test_a_check_that_raises_is_not_ready(server: Any) -> None:
    srv, state = server
    state["caches"] = None
    srv._server.checks["database"] = lambda: 1 / 0
    code, body = get(srv.port, "/readyz")
    assert code == 503 and body.startswith("database: check failed: division by zero")


@pytest.mark.parametrize("path", ["/", "/health", "/readyz/extra", "/metricsx", "/ok"])
def test_unknown_paths_are_404(server: Any, path: str) -> None:
    srv, _ = server
    code, body = get(srv.port, path)
    assert code == 404 and "/healthz" in body


def test_metrics_are_prometheus_text(server: Any) -> None:
    srv, _ = server
    m.admission_cycle(CycleResult(), 0.01)
    code, body = get(srv.port, "/metrics")
    assert code == 200
    names = {f.name for f in text_string_to_metric_families(body)}
    assert {"muster_admission_attempts", "muster_admission_attempt_duration_seconds"} <= names


def test_a_port_in_use_is_a_clear_error(server: Any) -> None:
    srv, _ = server
    with pytest.raises(RuntimeError, match=r"cannot serve metrics on 127.0.0.1:\d+.*-port"):
        MetricsServer("127.0.0.1", srv.port, {})


def test_quantities_are_shown_in_cores_bytes_or_counts() -> None:
    assert amount("1500m", "cpu") == 1.5
    assert amount("1Gi", "memory") == 2**30
    assert amount("8", "nvidia.com/gpu") == 8
    assert amount("lots", "cpu") is None


# ------------------------------------------------------------------ the collector


def cq(name: str, active: bool = True, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "ClusterQueue",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"flavors": [{"name": "h100", "quota": {"nvidia.com/gpu": 8, "cpu": "64"}}]},
        "status": {
            "conditions": [{"type": "Active", "status": "True" if active else "False"}],
            **status,
        },
    }


def lq(name: str, namespace: str, target: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
        "spec": {"clusterQueue": target},
    }


def workload(name: str, queue: str, *, admitted_to: str | None = None, rv: str = "1") -> Any:
    wl: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": rv,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"queueName": queue},
        "status": {},
    }
    if admitted_to:
        wl["status"] = {
            "admission": {"clusterQueue": admitted_to, "podSetAssignments": []},
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "lastTransitionTime": "2026-01-01T00:01:30Z",
                }
            ],
        }
    return wl


def scrape(collector: StateCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for family in registry.collect():
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_collector_reads_pending_admitted_usage_and_quota_from_the_caches() -> None:
    caches = Caches.create(FakeKube())
    caches.cluster_queues.write_through(
        cq("team-a", usage={"h100": {"nvidia.com/gpu": "2"}}, fairShare={"h100": {"cpu": "500m"}})
    )
    caches.cluster_queues.write_through(cq("team-b", active=False))
    caches.local_queues.write_through(lq("a", "ns", "team-a"))
    caches.local_queues.write_through(lq("b", "ns", "team-b"))
    caches.workloads.write_through(workload("w1", "a", admitted_to="team-a"))
    caches.workloads.write_through(workload("w2", "a"))
    caches.workloads.write_through(workload("w3", "b"))
    caches.workloads.write_through(workload("w4", "nowhere"))  # no LocalQueue: not counted
    leading = [True]
    got = scrape(StateCollector(Sources(caches, lambda: leading[0], history=lambda: (7, 3, False))))

    def val(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert val("muster_pending_workloads", cluster_queue="team-a", status="active") == 1
    assert val("muster_pending_workloads", cluster_queue="team-a", status="inadmissible") == 0
    assert val("muster_pending_workloads", cluster_queue="team-b", status="inadmissible") == 1
    assert val("muster_admitted_active_workloads", cluster_queue="team-a") == 1
    assert val("muster_admitted_active_workloads", cluster_queue="team-b") == 0
    fr = {"cluster_queue": "team-a", "flavor": "h100"}
    assert val("muster_cluster_queue_resource_usage", resource="nvidia.com/gpu", **fr) == 2
    assert val("muster_cluster_queue_nominal_quota", resource="cpu", **fr) == 64
    assert val("muster_cluster_queue_fair_share", resource="cpu", **fr) == 0.5
    assert val("muster_cluster_queue_status", cluster_queue="team-b", status="inactive") == 1
    assert val("muster_leader") == 1
    assert val("muster_history_backlog") == 7
    assert val("muster_history_spooled_records") == 3
    assert val("muster_history_database_up") == 0
    assert val("muster_informer_synced", informer="Workload") == 0  # never listed
    leading[0] = False
    assert scrape(StateCollector(Sources(caches, lambda: leading[0])))[("muster_leader", ())] == 0


def test_a_deleted_queue_leaves_no_series_behind() -> None:
    caches = Caches.create(FakeKube())
    caches.cluster_queues.write_through(cq("gone"))
    collector = StateCollector(Sources(caches, lambda: True))
    assert any(labels == (("cluster_queue", "gone"),) for _, labels in scrape(collector))
    caches.cluster_queues.forget("gone")
    assert not any(("cluster_queue", "gone") in labels for _, labels in scrape(collector))


# ------------------------------------------------------------ workload transitions


def sample(name: str, **labels: str) -> float:
    value = m.REGISTRY.get_sample_value(name, labels)
    return value or 0.0


def test_admission_is_counted_once_with_its_wait_and_only_by_the_leader() -> None:
    caches = Caches.create(FakeKube())
    caches.local_queues.write_through(lq("q", "ns", "count-cq"))
    leading = [False]
    counters = WorkloadCounters(caches.local_queues, lambda: leading[0])
    caches.workloads.add_handler(counters.on_workload)
    before = sample("muster_admitted_workloads_total", cluster_queue="count-cq")
    waits = sample("muster_admission_wait_time_seconds_count", cluster_queue="count-cq")

    caches.workloads.write_through(workload("w", "q", rv="1"))
    caches.workloads.write_through(workload("w", "q", admitted_to="count-cq", rv="2"))
    assert sample("muster_admitted_workloads_total", cluster_queue="count-cq") == before

    leading[0] = True
    caches.workloads.write_through(workload("v", "q", rv="1"))
    caches.workloads.write_through(workload("v", "q", admitted_to="count-cq", rv="2"))
    # The same admission seen again (a status write that changed something else).
    again = workload("v", "q", admitted_to="count-cq", rv="3")
    caches.workloads.write_through(again)
    assert sample("muster_admitted_workloads_total", cluster_queue="count-cq") == before + 1
    assert sample("muster_admission_wait_time_seconds_count", cluster_queue="count-cq") == waits + 1
    assert wait_seconds(again) == 90


def test_eviction_and_preemption_are_counted_with_their_reasons() -> None:
    caches = Caches.create(FakeKube())
    counters = WorkloadCounters(caches.local_queues, lambda: True)
    caches.workloads.add_handler(counters.on_workload)
    admitted = workload("p", "q", admitted_to="evict-cq", rv="1")
    caches.workloads.write_through(admitted)
    evicted = workload("p", "q", admitted_to="evict-cq", rv="2")
    evicted["status"]["conditions"] += [
        {"type": "Evicted", "status": "True", "reason": "Preempted", "lastTransitionTime": "t"},
        {"type": "Preempted", "status": "True", "reason": "Reclaim", "lastTransitionTime": "t"},
    ]
    caches.workloads.write_through(evicted)
    labels = {"cluster_queue": "evict-cq", "reason": "Preempted"}
    assert sample("muster_evicted_workloads_total", **labels) == 1
    labels["reason"] = "Reclaim"
    assert sample("muster_preempted_workloads_total", **labels) == 1


def test_pods_taken_by_single_pod_preemption_are_counted_not_as_an_eviction() -> None:
    from controllers.state import workloads as wls

    caches = Caches.create(FakeKube())
    counters = WorkloadCounters(caches.local_queues, lambda: True)
    caches.workloads.add_handler(counters.on_workload)
    labels = {"cluster_queue": "shed-cq"}
    before = sample("muster_preempted_pods_total", **labels) or 0
    wl = workload("s", "q", admitted_to="shed-cq", rv="1")
    wl["status"]["admission"]["podSetAssignments"] = [
        {"name": "leader", "count": 1, "resourceUsage": {"cpu": "1"}},
        {"name": "workers", "count": 3, "resourceUsage": {"cpu": "3"}},
    ]
    caches.workloads.write_through(wl)
    shed = copy.deepcopy(wl)
    shed["metadata"]["resourceVersion"] = "2"
    assert wls.shed_pods(shed, (("workers", 2),), ("ns/s-0-1", "ns/s-0-2"))
    assert shed["status"]["preemptedPods"] == ["s-0-1", "s-0-2"]
    assert shed["status"]["admission"]["podSetAssignments"][1]["resourceUsage"] == {"cpu": "1"}
    caches.workloads.write_through(shed)
    assert sample("muster_preempted_pods_total", **labels) == before + 2
    # Another change of the shrunk Workload counts nothing more.
    later = copy.deepcopy(shed)
    later["metadata"]["resourceVersion"] = "3"
    later["status"]["admission"]["podSetAssignments"][1]["count"] = 0
    caches.workloads.write_through(later)
    assert sample("muster_preempted_pods_total", **labels) == before + 2
    assert not sample("muster_evicted_workloads_total", cluster_queue="shed-cq", reason="Preempted")
    # Never to nothing: taking every pod of a pod set is an eviction, not a shed.
    assert not wls.shed_pods(copy.deepcopy(wl), (("workers", 3),), ())


def test_the_end_of_an_eviction_is_not_counted_as_another_one() -> None:
    """Issue 25: once the pods are gone, Evicted and Preempted turn False (the workload is
    queued again); that flip, and Requeued turning True, count nothing. The next eviction
    counts once."""
    from datetime import UTC, datetime, timedelta

    from controllers.state import workloads as wls

    caches = Caches.create(FakeKube())
    counters = WorkloadCounters(caches.local_queues, lambda: True)
    caches.workloads.add_handler(counters.on_workload)
    labels = {"cluster_queue": "flip-cq", "reason": "Reclaimed"}
    preempted = {"cluster_queue": "flip-cq", "reason": "Reclaim"}
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    wl = workload("f", "q", admitted_to="flip-cq", rv="1")
    caches.workloads.write_through(wl)
    versions = 1

    def write(change: Any, at: datetime) -> None:
        nonlocal wl, versions
        wl = {**wl, "status": {**wl["status"]}}
        wl["metadata"] = {**wl["metadata"], "resourceVersion": str(versions := versions + 1)}
        assert change(wl, at)
        caches.workloads.write_through(wl)

    for round_ in (1, 2):
        write(lambda w, t: wls.mark_evicted(w, "Reclaimed", "reclaimed", t, "ns/x"), now)
        assert sample("muster_evicted_workloads_total", **labels) == round_
        write(wls.release_quota, now + timedelta(seconds=1))
        write(wls.settle_requeue, now + timedelta(seconds=60))
        assert sample("muster_evicted_workloads_total", **labels) == round_
        assert sample("muster_preempted_workloads_total", **preempted) == round_
        admission = {"clusterQueue": "flip-cq", "podSetAssignments": []}
        write(lambda w, t, a=admission: wls.mark_admitted(w, a, "fits", t), now)
        now += timedelta(minutes=5)


# ------------------------------------------------------------------------ topology


def waiting_for(name: str, queue: str, reason: str, message: str) -> Any:
    wl = workload(name, queue)
    wl["status"]["conditions"] = [
        {"type": "QuotaReserved", "status": "False", "reason": reason, "message": message}
    ]
    return wl


def test_workloads_no_domain_can_hold_are_counted_by_queue_and_level() -> None:
    # The reason the admission cycle itself gives a gang no rack can hold.
    _, (no_rack,) = topo_cycle(
        PodSetTopology("Required", RACK), topologies={"fabric": LEVELS}, count=5
    )
    caches = Caches.create(FakeKube())
    caches.cluster_queues.write_through(cq("team-a"))
    caches.local_queues.write_through(lq("a", "ns", "team-a"))
    caches.workloads.write_through(waiting_for("w1", "a", "Pending", no_rack.reason))
    caches.workloads.write_through(waiting_for("w2", "a", "Pending", no_rack.reason))
    quota = "insufficient quota for nvidia.com/gpu in flavor h100: requested 8, available 2"
    caches.workloads.write_through(waiting_for("w3", "a", "Pending", quota))
    got = scrape(StateCollector(Sources(caches, lambda: True)))
    waits = {
        labels: value
        for (name, labels), value in got.items()
        if name == "muster_topology_waiting_workloads"
    }
    assert waits == {(("cluster_queue", "team-a"), ("level", "rack")): 2}
    # Admitted, it no longer waits.
    caches.workloads.write_through(workload("w1", "a", admitted_to="team-a", rv="2"))
    got = scrape(StateCollector(Sources(caches, lambda: True)))
    assert (
        got[("muster_topology_waiting_workloads", (("cluster_queue", "team-a"), ("level", "rack")))]
        == 1
    )


def test_a_topology_placement_counts_at_the_level_it_landed() -> None:
    by_name = {n.name: n for n in fabric()}
    required, preferred = ask("Required", RACK), ask("Preferred", RACK)
    unconstrained = ask("Unconstrained", None)

    def count(level: str, mode: str) -> float:
        return sample(
            "muster_topology_placements_total", cluster_queue="topo-cq", level=level, mode=mode
        )

    watched = [("rack", "required"), ("block", "preferred"), (SPREAD, "preferred")]
    watched.append(("node", "unconstrained"))
    before = {k: count(*k) for k in watched}
    m.topology_placements(
        "topo-cq",
        [
            (required, ["b0-r0-n0", "b0-r0-n1", "b0-r0-n1"]),
            # A preferred rack that had to climb to a block counts at the block, one that
            # spread over blocks as spread.
            (preferred, ["b0-r0-n0", "b0-r1-n0"]),
            (preferred, ["b0-r0-n0", "b1-r1-n0"]),
            (unconstrained, ["b1-r1-n0"]),
        ],
        by_name.__getitem__,
    )
    assert {k: count(*k) - before[k] for k in watched} == dict.fromkeys(watched, 1)


def test_the_scheduler_loop_counts_the_gang_it_binds_inside_one_rack() -> None:
    h = _scheduler()
    h.job("gang", 4, gpu=8, pods=0)
    _ask(h, "gang", {"required": RACK})
    for i in range(4):
        h.pod(f"gang-{i}", "uid-gang", gpu=8)
    before = sample(
        "muster_topology_placements_total", cluster_queue="cq", level="rack", mode="required"
    )
    h.run()
    assert sum(h.placement("gang").values()) == 4
    after = sample(
        "muster_topology_placements_total", cluster_queue="cq", level="rack", mode="required"
    )
    assert after == before + 1
