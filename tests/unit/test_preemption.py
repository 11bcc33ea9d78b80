"""Preemption within a queue: who is chosen, who is spared, and what happens next."""

from __future__ import annotations

from dataclasses import replace

from quota.admission.cycle import admission_cycle
from quota.api.names import LAST_CHECKPOINT_ANNOTATION
from quota.model.convert import last_checkpoint
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


# -- reclaim: the victim search tries every sufficient set in victim order ------------------


def reclaim_snapshot(admitted: list[Workload], want: int) -> Snapshot:
    """10 GPUs: `a` (no quota, weight 9, reclaim Any) below its fair share of 9 asks for
    `want`; `b` (no quota, weight 1, fair share 1) runs `admitted`."""
    return Snapshot(
        now=1_000.0,
        queues=queues_of(
            queue("root", quota=10),
            queue("a", parent="root", over_quota_weight=9.0, reclaim="Any"),
            queue("b", parent="root", over_quota_weight=1.0),
        ),
        flavors={},
        admitted=tuple(admitted),
        pending=(workload("ns/want", "a", gpus=want, arrival=900.0),),
    )


def in_b(key: str, gpus: int, started: float) -> Workload:
    return workload(key, "b", gpus=gpus, flavor="h100", admitted_at=started)


def test_reclaim_takes_the_one_larger_victim_a_newer_small_one_would_block() -> None:
    # The newer 1-GPU job comes first in victim order, but taking it leaves b only 4 above
    # its share of 1: the older 5-GPU job alone frees 4 + 5 = 9 and leaves b at its share.
    admitted = [in_b("ns/large", 5, started=100.0), in_b("ns/small", 1, started=200.0)]
    result = admission_cycle(reclaim_snapshot(admitted, want=9))
    assert victims(result) == ["ns/large"]
    assert result.preempt[0].victims[0].kind == "Reclaimed"
    assert "above its fair share" in result.preempt[0].victims[0].reason


def test_reclaim_finds_the_oldest_of_three_when_only_it_suffices() -> None:
    # b runs 6 + 1 + 1 of 10 GPUs; `a` asks for 8, so the fair shares are a=8, b=2 and b may
    # give 6. The two newer jobs come first in victim order and would use 2 of those 6,
    # freeing only 4 with the 2 idle; the oldest alone frees 2 + 6 = 8 and leaves b at 2.
    admitted = [
        in_b("ns/oldest", 6, started=100.0),
        in_b("ns/middle", 1, started=200.0),
        in_b("ns/newest", 1, started=300.0),
    ]
    result = admission_cycle(reclaim_snapshot(admitted, want=8))
    assert victims(result) == ["ns/oldest"]


def test_a_failed_reclaim_says_what_the_policies_allow_and_that_no_set_makes_room() -> None:
    # a asks for 10, more than its fair share of 9: no victim set may be taken.
    result = admission_cycle(reclaim_snapshot([in_b("ns/large", 5, started=100.0)], want=10))
    assert victims(result) == []
    (pending,) = result.pending
    assert pending.reason.endswith(
        "its queue may reclaim from queues above their fair share or quota, but no set of "
        "workloads it may evict makes room"
    )


# -- the cost of preemption: least work lost first -------------------------------------------


def test_the_victim_that_checkpointed_most_recently_goes_first() -> None:
    # Both started long ago; ns/newer would lose 600s of work, ns/older only 60s since its
    # checkpoint: without checkpoints the newer one would go.
    spec = queue("a", quota=2, within_queue="LowerPriority")
    admitted = [
        replace(running("ns/older", 1, started=100.0), checkpointed_at=940.0),
        running("ns/newer", 1, started=400.0),
    ]
    result = admission_cycle(snapshot(spec, admitted, [workload("ns/p", "a", gpus=1, priority=5)]))
    assert victims(result) == ["ns/older"]


def test_priority_comes_before_lost_work_and_an_old_checkpoint_does_not_count() -> None:
    spec = queue("a", quota=3, within_queue="LowerPriority")
    admitted = [
        # Checkpointed a moment ago, but of a higher priority: spared.
        replace(running("ns/saved", 1, priority=1, started=100.0), checkpointed_at=999.0),
        # A checkpoint from before it started (an earlier run) saves nothing of this one.
        replace(running("ns/stale", 1, started=300.0), checkpointed_at=50.0),
        running("ns/fresh", 1, started=500.0),
    ]
    result = admission_cycle(snapshot(spec, admitted, [workload("ns/p", "a", gpus=1, priority=5)]))
    assert victims(result) == ["ns/fresh"]


def test_last_checkpoint_annotation_is_read_as_a_time_and_nonsense_as_none() -> None:
    assert last_checkpoint({LAST_CHECKPOINT_ANNOTATION: "2026-01-01T00:00:10Z"}) == 1767225610.0
    assert last_checkpoint({LAST_CHECKPOINT_ANNOTATION: "yesterday"}) is None
    assert last_checkpoint({LAST_CHECKPOINT_ANNOTATION: "2026-01-01T00:00:10"}) is None  # no zone
    assert last_checkpoint({}) is None
