"""Min-runtime protection (KAI): a queue's minimum runtimes are inherited down the tree, a
protected workload is never a victim, and the waiting workload is told until when."""

from __future__ import annotations

from typing import Any

from quota.admission.cycle import admission_cycle
from quota.api import parse_manifest
from quota.api.clusterqueue import ClusterQueue
from quota.model.queues import inherit_min_runtimes, queue_spec
from quota.model.snapshot import Snapshot
from tests.unit.strategies import workload
from tests.unit.test_preemption_nodes import H100, NOW, gangs, gpu_nodes


def cluster_queue(
    name: str, parent: str | None = None, gpus: int = 80, **preemption: str
) -> ClusterQueue:
    spec: dict[str, Any] = {"flavors": [{"name": "h100", "quota": {"nvidia.com/gpu": gpus}}]}
    if parent:
        spec["parent"] = parent
    if preemption:
        spec["preemption"] = preemption
    doc = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }
    model = parse_manifest(doc, 0)
    assert isinstance(model, ClusterQueue)
    return model


def specs(*cqs: ClusterQueue) -> dict[str, Any]:
    return inherit_min_runtimes({cq.name: queue_spec(cq) for cq in cqs}, list(cqs))


def test_a_team_inherits_its_departments_min_runtimes_unless_it_sets_its_own() -> None:
    queues = specs(
        cluster_queue("org", preemptMinRuntime="10m", reclaimMinRuntime="1h"),
        cluster_queue("dept", "org", reclaimMinRuntime="30m"),
        cluster_queue("team-a", "dept"),
        cluster_queue("team-b", "dept", preemptMinRuntime="0s"),
        cluster_queue("other"),
    )
    assert (queues["team-a"].min_runtime_preempt_s, queues["team-a"].min_runtime_reclaim_s) == (
        600.0,
        1800.0,
    )
    # "0s" opts out of the inherited protection.
    assert queues["team-b"].min_runtime_preempt_s == 0.0
    assert queues["team-b"].min_runtime_reclaim_s == 1800.0
    assert queues["other"].min_runtime_preempt_s == queues["other"].min_runtime_reclaim_s == 0.0


def test_a_missing_parent_or_a_cycle_inherits_nothing_and_does_not_loop() -> None:
    queues = specs(
        cluster_queue("x", "y", preemptMinRuntime="5m"),
        cluster_queue("y", "x"),
        cluster_queue("orphan", "gone"),
    )
    assert queues["y"].min_runtime_preempt_s == 300.0
    assert queues["orphan"].min_runtime_preempt_s == 0.0


def test_protection_inherited_from_the_parent_spares_young_victims_until_it_ends() -> None:
    queues = specs(
        cluster_queue("lab", reclaimMinRuntime="10m"),
        cluster_queue("b", "lab"),
        cluster_queue("a", gpus=64, reclaim="Any"),
    )
    # Quota is plenty (no capacity in the snapshot): only the nodes are in question.
    big = workload("ns/big", "a", gpus=8, count=4, priority=100)
    ws, pods = gangs([0] * 5, admitted_at=[NOW - 100] * 5)

    def decide(now: float) -> Any:
        return admission_cycle(
            Snapshot(
                now=now,
                queues=queues,
                flavors={"h100": H100},
                admitted=tuple(ws),
                pending=(big,),
                nodes=gpu_nodes(10),
                pods=tuple(pods),
            )
        )

    young = decide(NOW)
    assert not young.preempt
    (reason,) = [p.reason for p in young.pending]
    assert "protected by minRuntime until 02:55:00 UTC (in 500s)" in reason
    old = decide(NOW + 500)
    assert len({v.workload for p in old.preempt for v in p.victims}) == 2


def test_a_quota_preemption_blocked_only_by_protection_says_until_when() -> None:
    queues = specs(
        cluster_queue("team", gpus=8, withinQueue="LowerPriority", preemptMinRuntime="10m")
    )
    young = workload("ns/young", "team", gpus=8, flavor="h100", admitted_at=NOW - 100)
    urgent = workload("ns/urgent", "team", gpus=8, priority=100)

    def decide(now: float) -> Any:
        return admission_cycle(
            Snapshot(
                now=now,
                queues=queues,
                flavors={"h100": H100},
                admitted=(young,),
                pending=(urgent,),
            )
        )

    first = decide(NOW)
    assert not first.preempt
    (reason,) = [p.reason for p in first.pending]
    assert reason.startswith("insufficient quota for nvidia.com/gpu in flavor h100")
    assert "1 lower-priority workload is protected by minRuntime until 02:55:00 UTC" in reason
    assert [v.workload for p in decide(NOW + 500).preempt for v in p.victims] == ["ns/young"]


def test_the_simulator_inherits_min_runtimes_as_the_controller_does() -> None:
    import yaml

    from quota.simulation.scenario import parse_scenario

    text = """
apiVersion: muster.dev/v1alpha1
kind: ResourceFlavor
metadata: {name: h100}
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {name: lab}
spec:
  preemption: {reclaimMinRuntime: 10m}
  flavors: [{name: h100, quota: {nvidia.com/gpu: 8}}]
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {name: team}
spec:
  parent: lab
  flavors: [{name: h100, quota: {nvidia.com/gpu: 8}}]
"""
    scenario = parse_scenario(list(yaml.safe_load_all(text)))
    assert scenario.queues["team"].min_runtime_reclaim_s == 600.0
