"""Consolidation: a gang blocked only by fragmentation moves workloads of queues that opt in
to other nodes, with room held for both, and nothing moves unless the gang then fits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import yaml

from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult, Pending
from quota.model.nodes import BoundPod
from quota.model.snapshot import Hold, QueueSpec, Snapshot, Workload
from quota.simulation.report import to_json
from quota.simulation.scenario import parse_scenario
from quota.simulation.simulator import simulate
from tests.unit.strategies import queue, queues_of, workload
from tests.unit.test_preemption_nodes import H100, NOW, gpu_nodes, running

SVC = queue("svc", quota=64, movable=True)
TRAIN = queue("train", quota=64)
FIX = queue("fix", quota=64)
GANG = workload("ml/gang", "train", gpus=8, count=2, priority=0)


def scattered(n: int = 4, priority: int = 0) -> tuple[list[Workload], list[BoundPod]]:
    """One 4-GPU single-pod workload of queue svc on each of h100-0..n-1: half of every node
    is free, no node wholly."""
    ws: list[Workload] = []
    pods: list[BoundPod] = []
    for i in range(n):
        w, bound = running(f"svc/s{i}", "svc", [f"h100-{i}"], priority, gpus=4, admitted_at=i)
        ws.append(w)
        pods.extend(bound)
    return ws, pods


def cycle(
    specs: Sequence[QueueSpec],
    pending: Sequence[Workload],
    admitted: Sequence[Workload],
    pods: Sequence[BoundPod],
    n_nodes: int = 4,
    now: float = NOW,
) -> CycleResult:
    return admission_cycle(
        Snapshot(
            now=now,
            queues=queues_of(*specs),
            flavors={"h100": H100},
            admitted=tuple(admitted),
            pending=tuple(pending),
            nodes=gpu_nodes(n_nodes),
            pods=tuple(pods),
        )
    )


def pending_of(result: CycleResult, key: str) -> Pending:
    (found,) = [p for p in result.pending if p.workload == key]
    return found


def test_a_gang_blocked_by_fragmentation_moves_two_small_jobs_and_holds_the_freed_nodes() -> None:
    ws, pods = scattered()
    result = cycle([SVC, TRAIN], [GANG], ws, pods)
    assert not result.admit
    (decision,) = result.preempt
    assert {v.kind for v in decision.victims} == {"Moved"}
    assert len(decision.victims) == 2
    moved_from = {p.node for p in pods if p.workload in {v.workload for v in decision.victims}}
    waiting = pending_of(result, "ml/gang")
    assert waiting.hold is not None
    gang_nodes = {node for a in waiting.hold.assignments for node, _ in a.nodes}
    assert gang_nodes == moved_from  # the two nodes the moved jobs leave
    # Each moved job has room held on a node the gang does not use, next to another job.
    targets = []
    for v in decision.victims:
        assert v.hold is not None
        ((node, count),) = [pair for a in v.hold.assignments for pair in a.nodes]
        assert count == 1 and node not in gang_nodes
        targets.append(node)
    assert len(set(targets)) == 2
    assert "free room was scattered" in waiting.reason
    assert "moved to other nodes to free node" in decision.victims[0].reason


def test_the_moved_and_the_gang_all_land_where_room_was_held() -> None:
    ws, pods = scattered()
    first = cycle([SVC, TRAIN], [GANG], ws, pods)
    (decision,) = first.preempt
    moved = {v.workload: v for v in decision.victims}
    # The moves complete: the moved jobs are pending again with their holds, their pods gone.
    left = [w for w in ws if w.key not in moved]
    left_pods = [p for p in pods if p.workload not in moved]
    again = [
        replace(w, admission=None, admitted_at=None, hold=moved[w.key].hold)
        for w in ws
        if w.key in moved
    ]
    gang = replace(GANG, hold=pending_of(first, "ml/gang").hold)
    second = cycle([SVC, TRAIN], [*again, gang], left, left_pods, now=NOW + 10)
    admitted = {a.workload: a for a in second.admit}
    assert set(admitted) == {"ml/gang", *moved}
    for key, v in moved.items():
        assert v.hold is not None
        assert admitted[key].assignments[0].nodes == v.hold.assignments[0].nodes
    assert not second.preempt


def test_with_consolidation_off_the_gang_waits_and_nothing_moves() -> None:
    ws, pods = scattered()
    result = cycle([replace(SVC, movable=False), TRAIN], [GANG], ws, pods)
    assert not result.preempt and not result.admit
    assert "cannot be placed" in pending_of(result, "ml/gang").reason


def test_workloads_above_the_gangs_priority_or_the_queues_bound_are_not_moved() -> None:
    ws, pods = scattered(priority=50)
    assert not cycle([SVC, TRAIN], [GANG], ws, pods).preempt  # 50 > the gang's 0
    bounded = replace(SVC, movable_below=50)
    urgent = replace(GANG, priority=100)
    assert not cycle([bounded, TRAIN], [urgent], ws, pods).preempt  # 50 is not below 50
    assert cycle([replace(SVC, movable_below=51), TRAIN], [urgent], ws, pods).preempt


def test_nothing_moves_when_the_moved_would_find_no_room() -> None:
    # Two nodes, a 4-GPU job on each: the gang of two 8-GPU pods would need both nodes
    # empty, and the moved jobs would have nowhere to go.
    ws, pods = scattered(2)
    result = cycle([SVC, TRAIN], [GANG], ws, pods, n_nodes=2)
    assert not result.preempt and not result.admit


def test_a_young_workload_protected_by_min_runtime_is_not_moved() -> None:
    ws, pods = scattered()
    young = [replace(w, admitted_at=NOW - 10) for w in ws]
    protected = replace(SVC, min_runtime_reclaim_s=600.0)
    assert not cycle([protected, TRAIN], [GANG], young, pods).preempt
    assert cycle([protected, TRAIN], [GANG], young, pods, now=NOW + 600).preempt


def one_pod_jobs(
    layout: dict[int, Sequence[tuple[str, int]]],
) -> tuple[list[Workload], list[BoundPod]]:
    """Single-pod running jobs: node index -> (key, GPUs), admitted in the order given."""
    ws: list[Workload] = []
    pods: list[BoundPod] = []
    for node, jobs in layout.items():
        for key, gpus in jobs:
            queue_name = key.split("/")[0]
            w, bound = running(key, queue_name, [f"h100-{node}"], gpus=gpus, admitted_at=len(ws))
            ws.append(w)
            pods.extend(bound)
    return ws, pods


def held_nodes(hold: object) -> set[str]:
    assert isinstance(hold, Hold)
    return {node for a in hold.assignments for node, _ in a.nodes}


def test_one_small_job_moves_where_the_gang_needs_its_room() -> None:
    # Free room 2 on h100-0 and 1 on h100-1; a 3-GPU pod fits neither. Moving svc/w3 (2 GPUs)
    # from h100-1 to h100-0 is the one move that makes room. Placing the gang first on an
    # emptied h100-0 found no plan at all.
    ws, pods = one_pod_jobs(
        {0: [("svc/w0", 4), ("svc/w1", 2)], 1: [("svc/w2", 4), ("svc/w3", 2), ("svc/w4", 1)]}
    )
    pod = workload("ml/p", "train", gpus=3)
    result = cycle([SVC, TRAIN], [pod], ws, pods, n_nodes=2)
    (decision,) = result.preempt
    (moved,) = decision.victims
    assert (moved.workload, moved.kind) == ("svc/w3", "Moved")
    assert held_nodes(moved.hold) == {"h100-0"}
    assert held_nodes(pending_of(result, "ml/p").hold) == {"h100-1"}


def test_the_mover_goes_first_when_the_gang_would_take_its_room() -> None:
    # Free 0, 3, 7, 3. Two 4-GPU pods fit once svc/w0 (5 GPUs) leaves h100-3 for h100-2;
    # placed first, the gang would take one pod's room on h100-2 and leave w0 nowhere.
    ws, pods = one_pod_jobs(
        {0: [("fix/a", 8)], 1: [("fix/b", 5)], 2: [("fix/c", 1)], 3: [("svc/w0", 5)]}
    )
    gang = workload("ml/gang", "train", gpus=4, count=2)
    result = cycle([SVC, FIX, TRAIN], [gang], ws, pods)
    (decision,) = result.preempt
    (moved,) = decision.victims
    assert moved.workload == "svc/w0" and held_nodes(moved.hold) == {"h100-2"}
    assert held_nodes(pending_of(result, "ml/gang").hold) == {"h100-3"}


def test_a_gang_that_may_reclaim_moves_workloads_instead_of_evicting_them() -> None:
    # train may reclaim (the API's default) and the gang outranks the jobs in its way: both
    # a move and an eviction would do, and a move keeps the jobs running.
    ws, pods = scattered()
    urgent = replace(GANG, priority=10)
    result = cycle(
        [SVC, replace(TRAIN, reclaim="Any", within_queue="LowerPriority")], [urgent], ws, pods
    )
    (decision,) = result.preempt
    assert [v.kind for v in decision.victims] == ["Moved", "Moved"]
    # With nothing movable it evicts, as before.
    evicted = cycle(
        [replace(SVC, movable=False), replace(TRAIN, reclaim="Any")], [urgent], ws, pods
    )
    (decision,) = evicted.preempt
    assert {v.kind for v in decision.victims} == {"Reclaimed"}


def test_the_second_pending_gang_is_consolidated_when_the_first_cannot_be() -> None:
    # No moves give three whole nodes to ml/first (the four jobs need two nodes' room), but
    # one move gives ml/second a whole node, in the same cycle. Neither outranks the jobs, so
    # neither may evict them.
    ws, pods = scattered()
    first = workload("ml/first", "train", gpus=8, count=3)
    second = workload("ml/second", "train", gpus=8, arrival=1.0)
    for train in (TRAIN, replace(TRAIN, reclaim="Any")):
        result = cycle([SVC, train], [first, second], ws, pods)
        (decision,) = result.preempt
        assert decision.preemptor == "ml/second"
        assert [v.kind for v in decision.victims] == ["Moved"]
        assert pending_of(result, "ml/first").hold is None


# -- the simulator runs the same consolidation ------------------------------------------------

SCENARIO = """
apiVersion: simulate.muster.dev/v1alpha1
kind: Simulation
metadata: {name: consolidation}
spec: {until: 4h}
---
apiVersion: muster.dev/v1alpha1
kind: ResourceFlavor
metadata: {name: h100}
spec: {nodeLabels: {pool: h100}}
---
apiVersion: simulate.muster.dev/v1alpha1
kind: NodePool
metadata: {name: h100}
spec: {count: 4, labels: {pool: h100}, allocatable: {nvidia.com/gpu: 8}}
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {name: svc}
spec:
  placementStrategy: Spread
  consolidation: {movable: MOVABLE}
  flavors: [{name: h100, quota: {nvidia.com/gpu: 16}}]
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {name: train}
spec:
  flavors: [{name: h100, quota: {nvidia.com/gpu: 16}}]
---
apiVersion: muster.dev/v1alpha1
kind: LocalQueue
metadata: {name: q, namespace: svc}
spec: {clusterQueue: svc}
---
apiVersion: muster.dev/v1alpha1
kind: LocalQueue
metadata: {name: q, namespace: train}
spec: {clusterQueue: train}
---
apiVersion: simulate.muster.dev/v1alpha1
kind: WorkloadGenerator
metadata: {name: svc}
spec:
  targets: [svc/q]
  classes:
  - {name: replica, count: 4, interval: 1s, runtime: 2h, pods: 1,
     requests: {nvidia.com/gpu: 4}}
---
apiVersion: simulate.muster.dev/v1alpha1
kind: WorkloadGenerator
metadata: {name: train}
spec:
  targets: [train/q]
  classes:
  - {name: gang, count: 1, startAt: 10m, interval: 1m, runtime: 30m, pods: 2,
     requests: {nvidia.com/gpu: 8}}
"""


def test_the_simulator_moves_spread_replicas_so_that_the_gang_runs_at_once() -> None:
    def run(movable: bool) -> dict[str, dict[str, object]]:
        text = SCENARIO.replace("MOVABLE", "true" if movable else "false")
        result = to_json(simulate(parse_scenario(list(yaml.safe_load_all(text)))))
        return {w["name"]: w for w in result["workloads"]}

    on = run(True)
    assert on["train/train-gang-1"]["admittedAt"] == 600.0  # admitted in the minute it came
    moved = [name for name, w in on.items() if w["evictions"]]
    assert len(moved) == 2 and all(name.startswith("svc/") for name in moved)
    assert all(w["finishedAt"] is not None for w in on.values())  # the moved still finish
    off = run(False)
    assert off["train/train-gang-1"]["admittedAt"] >= 7200.0  # waits for the replicas to end
    assert not any(w["evictions"] for w in off.values())
