"""Reclaim across queues: the documented example and every guard."""

from __future__ import annotations

from dataclasses import replace

from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult
from quota.model.snapshot import Assignment, FlavorQuota, PodSet, QueueSpec, Snapshot, Workload
from tests.unit.strategies import CPU, GPU, apply_cycle, queue, queues_of, workload


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
    # Its policy allows reclaim; no set of victims may be taken (issue 25: the words said
    # no reclaim was allowed).
    assert result.pending[0].reason.endswith(
        "its queue may reclaim from queues above their fair share or quota, but no set of "
        "workloads it may evict makes room"
    )


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


# -- the guard is judged on the resources in contention ------------------------------------


def gpu_job(
    key: str,
    queue_name: str,
    gpus: int,
    cpu: int = 4_000,
    priority: int = 0,
    admitted_at: float | None = None,
) -> Workload:
    """A one-pod workload asking for GPUs and cpu (millicores) on flavor h100."""
    requests = {GPU: gpus, CPU: cpu} if gpus else {CPU: cpu}
    admission = None
    if admitted_at is not None:
        admission = (Assignment("main", 1, dict.fromkeys(requests, "h100")),)
    return Workload(
        key,
        queue_name,
        priority,
        0.0,
        (PodSet("main", 1, requests),),
        admission=admission,
        admitted_at=admitted_at,
    )


def gpu_and_cpu_queue(name: str, gpus: int, cpu: int) -> QueueSpec:
    return QueueSpec(name, flavors=(FlavorQuota("h100", {GPU: gpus, CPU: cpu}),), reclaim="Any")


def borrowed_gpus_cycle(asks: int) -> CycleResult:
    """16 GPUs. b (GPU quota 4, cpu well within its quota of 64) borrows 12 GPUs: four
    2-GPU jobs at priority 0 and four 1-GPU jobs at priority 1, plus a cpu-only job at
    priority -1. a (GPU quota 8) asks for `asks` GPUs."""
    admitted = [gpu_job(f"ns/b-two{i}", "b", 2, admitted_at=float(i)) for i in range(4)]
    admitted += [
        gpu_job(f"ns/b-one{i}", "b", 1, priority=1, admitted_at=10.0 + i) for i in range(4)
    ]
    admitted.append(gpu_job("ns/b-cpu", "b", 0, cpu=8_000, priority=-1, admitted_at=20.0))
    return admission_cycle(
        Snapshot(
            now=1_000.0,
            queues=queues_of(gpu_and_cpu_queue("a", 8, 32_000), gpu_and_cpu_queue("b", 4, 64_000)),
            flavors={},
            capacity={("h100", GPU): 16, ("h100", CPU): 128_000},
            admitted=tuple(admitted),
            pending=(gpu_job("ns/a-train", "a", asks, cpu=16_000),),
        )
    )


def test_gpus_borrowed_beyond_quota_are_reclaimed_though_cpu_is_within_quota() -> None:
    # Fair shares of GPUs: a=8, b=8. 4 GPUs are free, a needs 4 more: b's two newest
    # lowest-priority GPU jobs go, b keeps exactly its fair share of 8, and its cpu-only job
    # (holding nothing a is short of) is left alone even though it is the least important.
    result = borrowed_gpus_cycle(asks=8)
    assert victims(result) == ["ns/b-two3", "ns/b-two2"]
    assert [p.preemptor for p in result.preempt] == ["ns/a-train"]
    reason = result.preempt[0].victims[0].reason
    assert "above its fair share of nvidia.com/gpu in flavor h100 (12 in use, keeps 8)" in reason


def test_reclaim_frees_no_more_than_the_preemptor_is_short_of() -> None:
    # 4 free, a asks for 6: one 2-GPU job is enough, and a 1-GPU job of higher priority
    # is not taken instead.
    assert victims(borrowed_gpus_cycle(asks=6)) == ["ns/b-two3"]
    # 4 free, a asks for 4: nothing to reclaim, a is admitted at once.
    result = borrowed_gpus_cycle(asks=4)
    assert [a.workload for a in result.admit] == ["ns/a-train"]
    assert result.preempt == ()


def test_workloads_admitted_in_the_same_cycle_are_never_reclaimed_in_it() -> None:
    # 6 GPUs and cpus, a and c guaranteed 4 of each: overcommitted, so their fair shares are
    # 3 each and b (no quota) has none. Everything asked is beyond fair share. c (priority
    # 6) fails to find room for a job bigger than the cluster; b (priority 5) borrows 3;
    # then a wants 4, within its quota. b holds more than its quota, but what it holds was
    # admitted in this very cycle: nothing is taken back before it even started.
    def spec(name: str, quota: int, priority: int) -> QueueSpec:
        flavors = (FlavorQuota("h100", {GPU: quota, CPU: quota * 1_000}),)
        return QueueSpec(name, priority=priority, flavors=flavors, reclaim="Any")

    result = admission_cycle(
        Snapshot(
            now=1_000.0,
            queues=queues_of(spec("a", 4, 0), spec("b", 0, 5), spec("c", 4, 6)),
            flavors={},
            capacity={("h100", GPU): 6, ("h100", CPU): 6_000},
            pending=(
                gpu_job("ns/a-new", "a", 4, cpu=4_000),
                gpu_job("ns/b-new", "b", 3, cpu=3_000),
                gpu_job("ns/c-huge", "c", 7, cpu=7_000),
            ),
        )
    )
    assert [a.workload for a in result.admit] == ["ns/b-new"]
    assert result.preempt == ()
    assert {p.workload for p in result.pending} == {"ns/a-new", "ns/c-huge"}


# -- no churn once the late queue has its share ---------------------------------------------


def play(snapshot: Snapshot, late: set[str], cycles: int = 6) -> list[CycleResult]:
    """Queues outside `late` get a cycle to themselves, then every queue competes."""
    early = replace(snapshot, pending=tuple(w for w in snapshot.pending if w.queue not in late))
    state = apply_cycle(early, admission_cycle(early))
    arrivals = tuple(w for w in snapshot.pending if w.queue in late)
    state = replace(state, pending=state.pending + arrivals)
    results = []
    for step in range(cycles):
        results.append(admission_cycle(state))
        state = apply_cycle(state, results[-1], now=state.now + 1_000 * (step + 1))
    return results


def test_room_a_reclaim_frees_beyond_the_need_is_not_borrowed_by_the_reclaimer() -> None:
    # 8 GPUs; fair shares a=3, b=4, c=1. b and c fill the cluster, then a arrives and
    # reclaims, for a 1-GPU job, one of b's 3-GPU jobs: 2 GPUs more than it needs come free.
    # They go to b, back below its share, not to a's 2-GPU job, which would take a beyond
    # its share and be reclaimed by b in turn.
    specs = [
        queue("a", quota=2, reclaim="Any"),
        queue("b", quota=3, reclaim="Any"),
        queue("c", quota=0, reclaim="Any"),
    ]
    asks = {"a": [1, 1, 2, 1, 1, 1], "b": [3, 3, 1, 1, 1, 1], "c": [1, 1, 1]}
    pending = [
        workload(f"ns/{name}{i}", name, gpus=gpus, arrival=10.0 * ord(name) + i)
        for name, sizes in asks.items()
        for i, gpus in enumerate(sizes)
    ]
    snapshot = Snapshot(
        now=1_000.0,
        queues=queues_of(*specs),
        flavors={},
        capacity={("h100", GPU): 8},
        pending=tuple(pending),
    )
    results = play(snapshot, late={"a"})
    assert [[p.preemptor for p in r.preempt] for r in results[:3]] == [["ns/a0", "ns/a1"], [], []]
    admitted_late = [a.workload for r in results[1:] for a in r.admit]
    assert admitted_late == ["ns/a0", "ns/a1", "ns/a3", "ns/b2"]


def test_a_reclaim_on_one_resource_does_not_start_an_endless_exchange_on_another() -> None:
    # 2 GPUs and 2 cpus, three queues without quota. b runs a GPU+cpu job, a cpu job and a
    # GPU job; a (cpu only) and c (GPU only) arrive and reclaim their shares. b's evicted
    # cpu job then waits behind its higher-priority GPU job: the cpu a reclaimed must not
    # flow back and forth between a and b every cycle.
    def zero(name: str) -> QueueSpec:
        flavors = (FlavorQuota("h100", {GPU: 0, CPU: 0}),)
        return QueueSpec(name, flavors=flavors, reclaim="Any")

    def job(
        key: str, queue_name: str, arrival: float, priority: int = 0, **requests: int
    ) -> Workload:
        per_pod = {GPU if r == "gpu" else CPU: n for r, n in requests.items()}
        return Workload(key, queue_name, priority, arrival, (PodSet("main", 1, per_pod),))

    pending = [job(f"ns/a{i}", "a", float(i), cpu=1) for i in range(5)]
    pending += [job("ns/b0", "b", 5.0, priority=1, gpu=1, cpu=1)]
    pending += [job(f"ns/b{i}", "b", 5.0 + i, cpu=1) for i in range(1, 5)]
    pending += [job("ns/b5", "b", 10.0, priority=1, gpu=1), job("ns/c0", "c", 11.0, gpu=1)]
    snapshot = Snapshot(
        now=1_000.0,
        queues=queues_of(zero("a"), zero("b"), zero("c")),
        flavors={},
        capacity={("h100", GPU): 2, ("h100", CPU): 2},
        pending=tuple(pending),
    )
    results = play(snapshot, late={"a", "c"})
    assert [len(r.preempt) for r in results] == [2, 0, 0, 0, 0, 0]
    assert all(r.admit == () for r in results[2:])  # settled: nothing moves any more
