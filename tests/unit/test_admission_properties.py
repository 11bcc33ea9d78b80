"""Properties of the admission cycle on random trees and workloads (hypothesis)."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.admission.cycle import admission_cycle
from quota.model.snapshot import Snapshot, pod_set_usage, queue_tree
from tests.unit.strategies import CPU, GPU, apply_cycle, snapshots

FLAVORS = ("h100", "a100")
RESOURCES = (GPU, CPU)

fast = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def subtree_usage(snapshot: Snapshot) -> dict[str, dict[tuple[str, str], int]]:
    tree = queue_tree(snapshot.queues)
    usage: dict[str, dict[tuple[str, str], int]] = {name: {} for name in snapshot.queues}
    for w in snapshot.admitted:
        for key, amount in pod_set_usage(w).items():
            for name in tree.paths[w.queue]:
                usage[name][key] = usage[name].get(key, 0) + amount
    return usage


def check_bounds(snapshot: Snapshot) -> None:
    usage = subtree_usage(snapshot)
    tree = queue_tree(snapshot.queues)
    for name, spec in snapshot.queues.items():
        for key, used in usage[name].items():
            limit = spec.limit_for(*key)
            assert limit is None or used <= limit, f"{name} exceeds its limit on {key}"
    totals: dict[tuple[str, str], int] = {}
    for root in tree.roots:
        for key, used in usage[root].items():
            totals[key] = totals.get(key, 0) + used
    for key, used in totals.items():
        if snapshot.capacity is not None:
            bound = snapshot.capacity.get(key, 0)
        else:
            bound = sum(snapshot.queues[r].quota_for(*key) for r in tree.roots)
        assert used <= bound, f"{key}: {used} admitted, only {bound} at the root"


@fast
@given(snapshots(flavors=FLAVORS, resources=RESOURCES, policies=True, max_workloads=20))
def test_no_limit_or_capacity_is_exceeded_over_several_cycles(snapshot: Snapshot) -> None:
    for step in range(3):
        result = admission_cycle(snapshot)
        snapshot = apply_cycle(snapshot, result, now=snapshot.now + 1_000 * (step + 1))
        check_bounds(snapshot)


@fast
@given(snapshots(flavors=FLAVORS, resources=RESOURCES, policies=True, max_workloads=20))
def test_every_pending_workload_is_decided_once_and_victims_are_admitted_ones(
    snapshot: Snapshot,
) -> None:
    snapshot = apply_cycle(snapshot, admission_cycle(snapshot))
    # New arrivals, some of higher priority, against the admitted state.
    extra = tuple(
        replace(w, key=w.key + "-late", priority=w.priority + 3, arrival=w.arrival + 100)
        for w in snapshot.admitted
    )
    snapshot = replace(snapshot, pending=snapshot.pending + extra, now=snapshot.now + 5_000)
    result = admission_cycle(snapshot)
    decided = [a.workload for a in result.admit] + [p.workload for p in result.pending]
    assert sorted(decided) == sorted(w.key for w in snapshot.pending)
    pod_sets = {w.key: w.pod_sets for w in snapshot.pending}
    for a in result.admit:
        for ps, assignment in zip(pod_sets[a.workload], a.assignments, strict=True):
            low = ps.min_count if ps.min_count is not None else ps.count
            assert low <= assignment.count <= ps.count
    admitted = {w.key for w in snapshot.admitted}
    chosen = [v.workload for p in result.preempt for v in p.victims]
    assert len(chosen) == len(set(chosen)), "a victim was chosen twice"
    assert set(chosen) <= admitted
    waiting = {p.workload for p in result.pending}
    assert {p.preemptor for p in result.preempt} <= waiting


@fast
@given(
    snapshots(flavors=FLAVORS, resources=RESOURCES, policies=True, max_workloads=20),
    st.randoms(use_true_random=False),
)
def test_same_snapshot_same_decisions(snapshot: Snapshot, rng: random.Random) -> None:
    snapshot = apply_cycle(snapshot, admission_cycle(snapshot))
    extra = tuple(
        replace(w, key=w.key + "-late", priority=w.priority + 1, arrival=w.arrival + 50)
        for w in snapshot.admitted
    )
    snapshot = replace(snapshot, pending=snapshot.pending + extra, now=snapshot.now + 5_000)
    names = list(snapshot.queues)
    rng.shuffle(names)
    pending, admitted = list(snapshot.pending), list(snapshot.admitted)
    rng.shuffle(pending)
    rng.shuffle(admitted)
    shuffled = replace(
        snapshot,
        queues={n: snapshot.queues[n] for n in names},
        pending=tuple(pending),
        admitted=tuple(admitted),
    )
    assert admission_cycle(snapshot) == admission_cycle(snapshot)
    assert admission_cycle(shuffled) == admission_cycle(snapshot)
