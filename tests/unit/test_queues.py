"""The snapshot's queues from the API's, and which ClusterQueue a Workload counts in: one rule
for the controller, its metrics and history, `muster fairshare` and the simulator."""

from __future__ import annotations

from typing import Any

from quota.api import ClusterQueue, parse_manifest
from quota.api.queuetree import check_queue_tree
from quota.model.queues import admitted_to, cluster_queue_of, queue_spec, queue_specs

GPU = "nvidia.com/gpu"
GI = 1 << 30


def model(doc: dict[str, Any]) -> Any:
    return parse_manifest({"apiVersion": "muster.dev/v1alpha1", **doc}, 0)


def cluster_queue(name: str, **spec: Any) -> ClusterQueue:
    cq = model({"kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec})
    assert isinstance(cq, ClusterQueue)
    return cq


def test_a_cluster_queue_keeps_its_tree_place_quotas_and_policies() -> None:
    cq = model(
        {
            "kind": "ClusterQueue",
            "metadata": {"name": "team-a"},
            "spec": {
                "parent": "research",
                "priority": 3,
                "overQuotaWeight": 2,
                "queueingStrategy": "StrictFIFO",
                "preemption": {
                    "withinQueue": "LowerPriority",
                    "reclaim": "Never",
                    "preemptMinRuntime": "10m",
                    "reclaimMinRuntime": "1h",
                },
                "flavors": [
                    {"name": "h100", "quota": {GPU: 8, "cpu": "500m"}, "limit": {GPU: 16}},
                    {"name": "a100", "quota": {GPU: 4, "memory": "64Gi"}},
                ],
            },
        }
    )
    assert isinstance(cq, ClusterQueue)
    spec = queue_spec(cq)
    assert (spec.name, spec.parent, spec.priority, spec.over_quota_weight) == (
        "team-a",
        "research",
        3,
        2.0,
    )
    assert [f.flavor for f in spec.flavors] == ["h100", "a100"]  # preference order kept
    assert spec.quota_for("h100", "cpu") == 500
    assert spec.quota_for("a100", "memory") == 64 * GI
    assert spec.limit_for("h100", GPU) == 16 and spec.limit_for("a100", GPU) is None
    assert spec.queueing_strategy == "StrictFIFO"
    assert (spec.within_queue, spec.reclaim) == ("LowerPriority", "Never")
    assert (spec.min_runtime_preempt_s, spec.min_runtime_reclaim_s) == (600.0, 3600.0)
    inactive = queue_spec(cq, active=False, reason="parent missing")
    assert not inactive.active and inactive.inactive_reason == "parent missing"


def test_a_broken_parent_detaches_the_queue_and_an_unreadable_one_still_counts() -> None:
    cqs = [
        cluster_queue("org", preemption={"preemptMinRuntime": "5m"}),
        cluster_queue("team", parent="org", flavors=[{"name": "pool", "quota": {"cpu": 4}}]),
        cluster_queue("lost", parent="nowhere", flavors=[{"name": "pool", "quota": {"cpu": 1}}]),
    ]
    tree = check_queue_tree(cqs, ["pool"])
    specs = queue_specs(cqs, tree, {"broken": ("org", "spec.flavors: bad quantity")})
    assert specs["team"].parent == "org" and specs["team"].active
    assert specs["team"].min_runtime_preempt_s == 300.0  # protection flows down the tree
    assert specs["lost"].parent is None and not specs["lost"].active
    assert "nowhere" in specs["lost"].inactive_reason
    broken = specs["broken"]
    assert (broken.parent, broken.active) == ("org", False)
    assert broken.inactive_reason == "invalid: spec.flavors: bad quantity"
    assert broken.min_runtime_preempt_s == 300.0


def workload(queue: str = "team", admitted: str | None = None, **meta: Any) -> dict[str, Any]:
    wl: dict[str, Any] = {
        "metadata": {"name": "train", "namespace": "ns", **meta},
        "spec": {"queueName": queue},
    }
    if admitted is not None:
        wl["status"] = {"admission": {"clusterQueue": admitted, "podSetAssignments": []}}
    return wl


def local_queues(**targets: str) -> Any:
    """LocalQueues of namespace ns by name, pointing at ClusterQueues."""
    by_key = {f"ns/{name}": {"spec": {"clusterQueue": cq}} for name, cq in targets.items()}
    return by_key.get


def test_a_pending_workload_counts_where_its_local_queue_points_now() -> None:
    assert cluster_queue_of(workload(), local_queues(team="gpu")) == "gpu"
    assert cluster_queue_of(workload(), local_queues(team="cpu")) == "cpu"
    assert cluster_queue_of(workload(), local_queues(other="gpu")) is None
    assert admitted_to(workload()) is None


def test_an_admitted_workload_counts_where_it_was_admitted_whatever_its_local_queue_says() -> None:
    moved = local_queues(team="cpu")  # the LocalQueue was pointed elsewhere since
    assert cluster_queue_of(workload(admitted="gpu"), moved) == "gpu"
    assert cluster_queue_of(workload(admitted="gpu"), local_queues()) == "gpu"  # or deleted
    assert admitted_to(workload(admitted="gpu")) == "gpu"


def test_a_workload_without_a_namespace_is_in_default() -> None:
    wl = workload()
    del wl["metadata"]["namespace"]
    assert cluster_queue_of(wl, {"default/team": {"spec": {"clusterQueue": "gpu"}}}.get) == "gpu"
