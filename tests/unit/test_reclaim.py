"""Reclaim across queues: the documented example and every guard."""

from __future__ import annotations

from quota.admission import admission_cycle
from quota.decisions import CycleResult
from quota.snapshot import QueueSpec, Snapshot, Workload
from tests.unit.strategies import GPU, apply_cycle, queue, queues_of, workload


def borrower_runs(
    n: int, queue_name: str = "b", priority: int = 0, started: float = 0.0
) -> list[Workload]:
    return [
        workload(
            f"ns/{queue_name}{i}",
            queue_name,
            gpus=1,
            flavor="h100",
            priority=priority,
            admitted_at=started + i,
        )
        for i in range(n)
    ]


def run(
    specs: list[QueueSpec], admitted: list[Workload], pending: list[Workload], capacity: int = 8
) -> CycleResult:
    return admission_cycle(
        Snapshot(
            now=1_000.0,
            queues=queues_of(*specs),
            flavors={},
            capacity={("h100", GPU): capacity},
            admitted=tuple(admitted),
            pending=tuple(pending),
        )
    )


def victims(result: CycleResult) -> list[str]:
    return [v.workload for p in result.preempt for v in p.victims]


def test_documented_example_reclaims_down_to_the_victims_fair_share() -> None:
    specs = [queue("a", quota=4, reclaim="Any"), queue("b", quota=4, reclaim="Any")]
    result = run(specs, borrower_runs(8), [workload("ns/a1", "a", gpus=2)])
    assert victims(result) == ["ns/b7", "ns/b6"]  # most recently started first
    victim = result.preempt[0].victims[0]
    assert victim.kind == "Reclaimed"
    assert victim.reason == (
        "reclaimed by queue a, below its fair share, for ns/a1: queue b is above its fair "
        "share of nvidia.com/gpu in flavor h100 (8 in use, keeps 6)"
    )


def test_a_workload_above_both_fair_share_and_quota_reclaims_nothing() -> None:
    specs = [queue("a", quota=4, reclaim="Any"), queue("b", quota=4)]
    result = run(specs, borrower_runs(8), [workload("ns/a1", "a", gpus=5)])
    assert result.preempt == ()
    assert "no preemption or reclaim allowed" in result.pending[0].reason


def test_in_quota_usage_is_never_reclaimed() -> None:
    # b uses exactly its quota; a is idle but capacity is full with a third queue's in-quota
    # work, so nothing may be taken.
    specs = [queue("a", quota=2, reclaim="Any"), queue("b", quota=3), queue("c", quota=3)]
    admitted = borrower_runs(3, "b") + borrower_runs(3, "c")
    result = run(specs, admitted, [workload("ns/a1", "a", gpus=2)], capacity=6)
    assert result.preempt == ()


def test_policy_never_and_lower_priority() -> None:
    base = [queue("b", quota=4)]
    pending = [workload("ns/a1", "a", gpus=2, priority=1)]
    never = run([queue("a", quota=4), *base], borrower_runs(8, priority=1), pending)
    assert never.preempt == ()
    lower = run(
        [queue("a", quota=4, reclaim="LowerPriority"), *base], borrower_runs(8, priority=1), pending
    )
    assert lower.preempt == ()
    lower_ok = run(
        [queue("a", quota=4, reclaim="LowerPriority"), *base], borrower_runs(8, priority=0), pending
    )
    assert len(victims(lower_ok)) == 2


def test_minimum_runtime_of_the_victim_queue_protects_young_workloads() -> None:
    specs = [queue("a", quota=4, reclaim="Any"), queue("b", quota=4, min_runtime_reclaim_s=300)]
    # b0..b5 started long ago, b6 and b7 only 10 s before now.
    admitted = borrower_runs(6, started=0.0) + [
        workload(f"ns/b{i}", "b", gpus=1, flavor="h100", admitted_at=990.0) for i in (6, 7)
    ]
    result = run(specs, admitted, [workload("ns/a1", "a", gpus=2)])
    assert sorted(victims(result)) == ["ns/b4", "ns/b5"]


def test_reclaim_across_departments_respects_every_level() -> None:
    specs = [
        queue("x", quota=4, reclaim="Any"),
        queue("x1", "x", quota=4, reclaim="Any"),
        queue("y", quota=4),
        queue("y1", "y", quota=2),
        queue("y2", "y", quota=2),
    ]
    # y borrowed all of x's quota; inside y, y1 is far above its share, y2 at its quota.
    admitted = borrower_runs(6, "y1") + borrower_runs(2, "y2")
    result = run(specs, admitted, [workload("ns/x", "x1", gpus=4)])
    assert sorted(victims(result)) == ["ns/y12", "ns/y13", "ns/y14", "ns/y15"]


def test_victim_can_not_reclaim_back_in_the_next_cycle() -> None:
    specs = [queue("a", quota=4, reclaim="Any"), queue("b", quota=4, reclaim="Any")]
    snapshot = Snapshot(
        now=1_000.0,
        queues=queues_of(*specs),
        flavors={},
        capacity={("h100", GPU): 8},
        admitted=tuple(borrower_runs(8)),
        pending=(workload("ns/a1", "a", gpus=3),),
    )
    first = admission_cycle(snapshot)
    assert len(victims(first)) == 3
    second = admission_cycle(apply_cycle(snapshot, first, now=2_000.0))
    assert [a.workload for a in second.admit] == ["ns/a1"]
    assert second.preempt == ()
