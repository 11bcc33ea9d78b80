"""Which ClusterQueue a Workload counts in, as every part that shows it says: the admission
loop's snapshot, the metrics, the history feed and `muster fairshare` / `muster admit` must
agree with the one rule (quota.model.queues.cluster_queue_of), also after a LocalQueue was
pointed at another ClusterQueue."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from controllers.admission.view import ViewBuilder
from controllers.history.feed import HistoryFeed
from controllers.metrics.collector import Sources, StateCollector
from controllers.runtime.events import EventRecorder
from controllers.runtime.resources import (
    CLUSTER_QUEUE,
    LOCAL_QUEUE,
    RESOURCE_FLAVOR,
    WORKLOAD,
    Kind,
)
from controllers.state.caches import Caches, Context
from quota.manifests.cluster import cluster_state
from quota.model.queues import cluster_queue_of
from tests.unit.controller_fakes import FakeKube

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
API = "muster.dev/v1alpha1"


def cluster_queue(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {"flavors": [{"name": "pool", "quota": {"cpu": "4"}}]},
    }


def local_queue(target: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": "team", "namespace": "ns"},
        "spec": {"clusterQueue": target},
    }


def workload(name: str, admitted_to: str | None = None) -> dict[str, Any]:
    wl: dict[str, Any] = {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-01-01T11:00:00Z",
        },
        "spec": {
            "queueName": "team",
            "podSets": [{"name": "main", "count": 1, "requests": {"cpu": "1"}}],
        },
    }
    if admitted_to is not None:
        at = "2026-01-01T11:30:00Z"
        wl["status"] = {
            "admission": {
                "clusterQueue": admitted_to,
                "podSetAssignments": [{"name": "main", "count": 1, "flavors": {"cpu": "pool"}}],
            },
            "conditions": [
                {"type": t, "status": "True", "reason": t, "lastTransitionTime": at}
                for t in ("QuotaReserved", "Admitted")
            ],
        }
    return wl


class Cluster:
    """The caches of a controller, and the same objects as a cluster file."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        self.caches = Caches.create(self.kube)
        self.records: list[Any] = []
        self.ctx = Context(
            kube=self.kube,
            caches=self.caches,
            events=EventRecorder(None, "test"),
            identity="test",
            now=lambda: NOW,
            recorder=self,
        )
        self.written: dict[tuple[str, str], dict[str, Any]] = {}

    def record_later(self, make: Callable[[], Iterable[Any]]) -> None:
        self.records.extend(make())

    def put(self, kind: Kind, obj: dict[str, Any]) -> None:
        cache = {
            "ResourceFlavor": self.caches.flavors,
            "ClusterQueue": self.caches.cluster_queues,
            "LocalQueue": self.caches.local_queues,
            "Workload": self.caches.workloads,
        }[kind.name]
        cache.write_through(self.kube.put(kind, copy.deepcopy(obj)))
        self.written[(obj["kind"], obj["metadata"]["name"])] = obj


def scrape(collector: StateCollector) -> dict[tuple[str, str], float]:
    """Workload gauges by (metric, ClusterQueue), summed over their other labels."""
    registry = CollectorRegistry()
    registry.register(collector)
    out: dict[tuple[str, str], float] = {}
    for family in registry.collect():
        for sample in family.samples:
            queue = sample.labels.get("cluster_queue")
            if sample.name.endswith("_workloads") and queue:
                key = (sample.name, queue)
                out[key] = out.get(key, 0.0) + sample.value
    return out


def test_every_part_counts_an_admitted_and_a_pending_workload_in_the_same_queue() -> None:
    cluster = Cluster()
    flavor = {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": "pool"}}
    cluster.put(RESOURCE_FLAVOR, flavor)
    for name in ("gpu", "cpu"):
        cluster.put(CLUSTER_QUEUE, cluster_queue(name))
    cluster.put(LOCAL_QUEUE, local_queue("gpu"))
    cluster.put(WORKLOAD, workload("running", admitted_to="gpu"))
    cluster.put(WORKLOAD, workload("waiting"))
    # The LocalQueue is pointed elsewhere: the running workload stays where its quota is,
    # the waiting one moves with its LocalQueue.
    cluster.put(LOCAL_QUEUE, local_queue("cpu"))
    expected = {"ns/running": "gpu", "ns/waiting": "cpu"}

    rule = {
        f"ns/{wl['metadata']['name']}": cluster_queue_of(wl, cluster.caches.local_queues.get)
        for wl in cluster.caches.workloads.objects()
    }
    assert rule == expected

    snapshot = ViewBuilder(cluster.ctx, use_node_capacity=False).build().snapshot
    assert {w.key: w.queue for w in (*snapshot.admitted, *snapshot.pending)} == expected

    gauges = scrape(StateCollector(Sources(cluster.caches, lambda: True)))
    assert gauges[("muster_admitted_active_workloads", "gpu")] == 1
    assert gauges[("muster_admitted_active_workloads", "cpu")] == 0
    assert gauges[("muster_pending_workloads", "cpu")] == 1
    assert gauges[("muster_pending_workloads", "gpu")] == 0

    feed = HistoryFeed(cluster.ctx, lambda: True)
    feed.recording = True
    for wl in cluster.caches.workloads.objects():
        feed.on_workload("ADDED", None, wl)
    recorded = {(f"{t.namespace}/{t.name}", t.cluster_queue) for t in cluster.records}
    assert ("ns/running", "gpu") in recorded and ("ns/waiting", "cpu") in recorded
    assert recorded <= set(expected.items()), "every record names where the workload counts"

    file = cluster_state(list(cluster.written.values()), now=NOW.timestamp())
    both = (*file.snapshot.admitted, *file.snapshot.pending)
    assert {w.key: w.queue for w in both} == expected
