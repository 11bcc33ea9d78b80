"""No reclaim cycle: once a queue reclaims from another, the other never reclaims back."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.admission.cycle import admission_cycle
from quota.model.snapshot import FlavorQuota, PodSet, QueueSpec, Snapshot, Workload
from tests.unit.strategies import CPU, GPU, apply_cycle, snapshots

checked = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def contended(draw: st.DrawFn, with_cpu: bool = False) -> tuple[Snapshot, set[str]]:
    """A few sibling queues (perhaps under one parent) fighting over one GPU pool, and the
    queues whose work arrives late (after the others borrowed their quota).

    `with_cpu` adds cpu to the flavor, with its own quotas and capacity, and workloads that
    ask for cpu, GPUs or both: a reclaim is then judged on whichever the preemptor is short
    of, while the queues stand differently on the other.
    """
    n = draw(st.integers(min_value=2, max_value=3))
    nested = draw(st.booleans())
    resources = (GPU, CPU) if with_cpu else (GPU,)
    queues: dict[str, QueueSpec] = {}
    if nested:
        org = (FlavorQuota("h100", dict.fromkeys(resources, 0)),)
        queues["org"] = QueueSpec("org", flavors=org)
    for i in range(n):
        name = f"q{i}"
        quota = {r: draw(st.integers(min_value=0, max_value=4)) for r in resources}
        queues[name] = QueueSpec(
            name,
            parent="org" if nested else None,
            priority=draw(st.integers(min_value=0, max_value=1)),
            over_quota_weight=draw(st.sampled_from((1.0, 2.0, 3.0))),
            flavors=(FlavorQuota("h100", quota),),
            reclaim="Any",
        )
    pending = []
    for i in range(n):
        for j in range(draw(st.integers(min_value=1, max_value=6))):
            gpus = draw(st.integers(min_value=0 if with_cpu else 1, max_value=3))
            requests = {GPU: gpus} if gpus else {}
            if with_cpu:
                requests[CPU] = draw(st.integers(min_value=0 if gpus else 1, max_value=3))
            pending.append(
                Workload(
                    f"ns/q{i}-{j}",
                    f"q{i}",
                    draw(st.integers(min_value=0, max_value=2)),
                    float(len(pending)),
                    (PodSet("main", 1, {r: a for r, a in requests.items() if a}),),
                )
            )
    capacity = {("h100", r): draw(st.integers(min_value=2, max_value=12)) for r in resources}
    late = draw(st.sets(st.sampled_from([f"q{i}" for i in range(n)]), min_size=1, max_size=n - 1))
    snapshot = Snapshot(
        now=1_000.0,
        queues=queues,
        flavors={},
        capacity=capacity,
        pending=tuple(pending),
    )
    return snapshot, late


def assert_no_ping_pong(snapshot: Snapshot, late: set[str], cycles: int = 6) -> None:
    early = replace(snapshot, pending=tuple(w for w in snapshot.pending if w.queue not in late))
    state = apply_cycle(early, admission_cycle(early))
    arrivals = tuple(w for w in snapshot.pending if w.queue in late)
    state = replace(state, pending=state.pending + arrivals)
    queue_of = {w.key: w.queue for w in snapshot.pending}
    took: set[tuple[str, str]] = set()  # (reclaiming queue, victim queue)
    for step in range(cycles):
        result = admission_cycle(state)
        for p in result.preempt:
            for v in p.victims:
                if v.kind != "Reclaimed":
                    continue
                pair = (queue_of[p.preemptor], v.queue)
                assert (pair[1], pair[0]) not in took, f"{pair[1]} reclaimed back from {pair[0]}"
                took.add(pair)
        state = apply_cycle(state, result, now=state.now + 1_000 * (step + 1))


@checked
@given(contended())
def test_no_ping_pong_among_siblings(case: tuple[Snapshot, set[str]]) -> None:
    assert_no_ping_pong(*case)


@checked
@given(contended(with_cpu=True))
def test_no_ping_pong_when_queues_contend_for_gpus_and_cpu(case: tuple[Snapshot, set[str]]) -> None:
    assert_no_ping_pong(*case)


@checked
@given(snapshots(with_capacity=True, policies=True, max_workloads=20), st.data())
def test_no_ping_pong_on_random_trees(snapshot: Snapshot, data: st.DataObject) -> None:
    queues = {
        n: replace(s, reclaim="Any", within_queue="Never") for n, s in snapshot.queues.items()
    }
    snapshot = replace(snapshot, queues=queues)
    leaves = sorted({w.queue for w in snapshot.pending})
    late = data.draw(st.sets(st.sampled_from(leaves)) if leaves else st.just(set()))
    assert_no_ping_pong(snapshot, late)
