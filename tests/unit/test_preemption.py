"""Preemption within a queue: who is chosen, who is spared, and what happens next."""

from __future__ import annotations

from dataclasses import replace

from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult
from quota.model.snapshot import QueueSpec, Snapshot, Workload
from tests.unit.strategies import apply_cycle, queue, queues_of, workload


def snapshot(spec: QueueSpec, admitted: list[Workload], pending: list[Workload]) -> Snapshot:
    return Snapshot(
        now=1_000.0,
        queues=queues_of(spec),
        flavors={},
        admitted=tuple(admitted),
        pending=tuple(pending),
    )


def victims(result: CycleResult) -> list[str]:
    return [v.workload for p in result.preempt for v in p.victims]


def running(
    key: str, gpus: int, priority: int = 0, started: float = 0.0, arrival: float = 0.0
) -> Workload:
    return workload(
        key, "a", gpus=gpus, priority=priority, flavor="h100", admitted_at=started, arrival=arrival
    )


def test_lowest_priority_most_recently_started_goes_first() -> None:
    spec = queue("a", quota=4, within_queue="LowerPriority")
    admitted = [
        running("ns/old-low", 1, priority=0, started=10),
        running("ns/new-low", 1, priority=0, started=20),
        running("ns/mid", 2, priority=1, started=30),
    ]
    result = admission_cycle(snapshot(spec, admitted, [workload("ns/p", "a", gpus=1, priority=5)]))
    assert victims(result) == ["ns/new-low"]
    (pending,) = result.pending
    assert pending.reason == "waiting for 1 preempted workload to release quota: ns/new-low"
    assert result.preempt[0].victims[0].kind == "Preempted"
    assert "lower priority (0 < 5)" in result.preempt[0].victims[0].reason


def test_victims_not_needed_are_reprieved() -> None:
    # Greedy removes the 1-GPU workload first, then the 2-GPU one; the 2 GPUs alone suffice,
    # so the first is put back.
    spec = queue("a", quota=3, within_queue="LowerPriority")
    admitted = [running("ns/small", 1, started=20), running("ns/large", 2, started=10)]
    result = admission_cycle(snapshot(spec, admitted, [workload("ns/p", "a", gpus=2, priority=1)]))
    assert victims(result) == ["ns/large"]


def test_policy_never_and_equal_priority_are_not_preempted() -> None:
    admitted = [running("ns/r", 4, priority=1, arrival=5)]
    pending = [workload("ns/p", "a", gpus=2, priority=1, arrival=1)]
    for policy in ("Never", "LowerPriority"):
        result = admission_cycle(
            snapshot(queue("a", quota=4, within_queue=policy), admitted, pending)
        )
        assert result.preempt == ()
    newer = admission_cycle(
        snapshot(queue("a", quota=4, within_queue="LowerOrNewerEqualPriority"), admitted, pending)
    )
    assert victims(newer) == ["ns/r"]
    older = admission_cycle(
        snapshot(
            queue("a", quota=4, within_queue="LowerOrNewerEqualPriority"),
            [running("ns/r", 4, priority=1, arrival=0)],
            pending,
        )
    )
    assert older.preempt == ()


def test_minimum_runtime_protects_young_workloads() -> None:
    spec = queue("a", quota=2, within_queue="LowerPriority", min_runtime_preempt_s=600)
    young = [running("ns/young", 2, started=900)]  # now is 1000: ran 100 s
    result = admission_cycle(snapshot(spec, young, [workload("ns/p", "a", gpus=2, priority=1)]))
    assert result.preempt == ()
    old = [running("ns/old", 2, started=100)]
    result = admission_cycle(snapshot(spec, old, [workload("ns/p", "a", gpus=2, priority=1)]))
    assert victims(result) == ["ns/old"]


def test_a_victim_is_never_chosen_twice_and_reserved_room_is_not_taken() -> None:
    spec = queue("a", quota=2, within_queue="LowerPriority")
    admitted = [running("ns/low", 2)]
    pending = [
        workload("ns/p1", "a", gpus=2, priority=5, arrival=0),
        workload("ns/p2", "a", gpus=2, priority=5, arrival=1),
    ]
    result = admission_cycle(snapshot(spec, admitted, pending))
    assert [p.preemptor for p in result.preempt] == ["ns/p1"]
    assert victims(result) == ["ns/low"]
    assert not result.admit


def test_preemptor_is_admitted_once_victims_are_gone() -> None:
    spec = queue("a", quota=2, within_queue="LowerPriority")
    first = snapshot(spec, [running("ns/low", 2)], [workload("ns/p", "a", gpus=2, priority=5)])
    r1 = admission_cycle(first)
    assert victims(r1) == ["ns/low"]
    # The shell marks the victim as evicting; until it is gone the preemptor waits and
    # nothing new is preempted.
    evicting = replace(first, admitted=(replace(first.admitted[0], evicting=True),))
    r2 = admission_cycle(evicting)
    assert r2.preempt == () and r2.admit == ()
    assert r2.pending[0].reason.startswith("waiting for preempted workloads to release quota")
    r3 = admission_cycle(apply_cycle(first, r1))
    assert [a.workload for a in r3.admit] == ["ns/p"]
    assert "ns/low" in [p.workload for p in r3.pending]
