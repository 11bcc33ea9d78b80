"""Properties of fair share on random trees and demands (hypothesis)."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.fairness.fairshare import FairShare, fair_share
from quota.model.snapshot import QueueSpec, Snapshot, queue_tree
from tests.unit.strategies import CPU, GPU, queue, queues_of, snapshots, workload

FLAVORS = ("h100", "a100")
RESOURCES = (GPU, CPU)
KEYS = [(f, r) for f in FLAVORS for r in RESOURCES]

fast = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def groups(
    snapshot: Snapshot, fair: FairShare
) -> list[tuple[list[str], dict[tuple[str, str], int]]]:
    """Every group of siblings with the amount it divided."""
    tree = queue_tree(snapshot.queues)
    out = [(list(tree.roots), dict(fair.amount))]
    for parent, kids in tree.children.items():
        if kids:
            out.append((list(kids), dict(fair[parent])))
    return out


def cap(spec: QueueSpec, demand: int, key: tuple[str, str]) -> int:
    limit = spec.limit_for(*key)
    return demand if limit is None else min(demand, limit)


def most(spec: QueueSpec, demand: int, key: tuple[str, str]) -> int:
    """The most a queue may be given: its capped demand, and with weight 0 no more than its
    quota (it takes no surplus)."""
    wanted = cap(spec, demand, key)
    return wanted if spec.over_quota_weight > 0 else min(wanted, spec.quota_for(*key))


@fast
@given(snapshots(flavors=FLAVORS, resources=RESOURCES, max_workloads=15, min_queues=0))
def test_shares_never_exceed_what_is_divided_nor_limit_nor_demand(snapshot: Snapshot) -> None:
    # Trees may be empty, quotas zero, weights zero.
    fair = fair_share(snapshot)
    for members, available in groups(snapshot, fair):
        for key in KEYS:
            assert sum(fair[m].get(key, 0) for m in members) <= max(0, available.get(key, 0))
            for m in members:
                share = fair[m].get(key, 0)
                assert share <= fair.demand[m].get(key, 0)
                limit = snapshot.queues[m].limit_for(*key)
                assert limit is None or share <= limit


@fast
@given(snapshots(flavors=FLAVORS, resources=RESOURCES, max_workloads=15, min_queues=0))
def test_a_queue_with_weight_zero_never_gets_more_than_its_quota(snapshot: Snapshot) -> None:
    fair = fair_share(snapshot)
    for name, spec in snapshot.queues.items():
        if spec.over_quota_weight == 0:
            for key in KEYS:
                assert fair[name].get(key, 0) <= spec.quota_for(*key)


@fast
@given(snapshots(flavors=FLAVORS, resources=RESOURCES, max_workloads=15, min_queues=0))
def test_all_capacity_is_used_when_demand_exceeds_it(snapshot: Snapshot) -> None:
    # Surplus goes only to queues with a positive weight; what nobody may take stays unused.
    fair = fair_share(snapshot)
    for members, available in groups(snapshot, fair):
        for key in KEYS:
            wanted = sum(most(snapshot.queues[m], fair.demand[m].get(key, 0), key) for m in members)
            given_out = sum(fair[m].get(key, 0) for m in members)
            assert given_out == min(max(0, available.get(key, 0)), wanted)


@fast
@given(snapshots(flavors=FLAVORS, resources=RESOURCES, with_capacity=False, well_formed=True))
def test_a_queue_demanding_no_more_than_its_quota_gets_it(snapshot: Snapshot) -> None:
    # Quota-only mode on a tree whose parents guarantee at least their children's quotas:
    # every guarantee can be honoured at once.
    fair = fair_share(snapshot)
    for name, spec in snapshot.queues.items():
        for key in KEYS:
            demand = fair.demand[name].get(key, 0)
            if demand <= spec.quota_for(*key):
                assert fair[name].get(key, 0) == demand


@fast
@given(snapshots(resources=(GPU,), max_workloads=15))
def test_surplus_follows_weights_within_one_unit_among_equal_priority(snapshot: Snapshot) -> None:
    fair = fair_share(snapshot)
    key = ("h100", GPU)
    for members, available in groups(snapshot, fair):
        specs = [snapshot.queues[m] for m in members]
        caps = [cap(s, fair.demand[s.name].get(key, 0), key) for s in specs]
        quotas = [min(s.quota_for(*key), c) for s, c in zip(specs, caps, strict=True)]
        if sum(quotas) > available.get(key, 0):
            continue  # guarantees were scaled down; no surplus to compare
        hungry = [
            (s, fair[s.name].get(key, 0) - q)
            for s, q, c in zip(specs, quotas, caps, strict=True)
            if fair[s.name].get(key, 0) < c and s.over_quota_weight > 0
        ]
        for a, surplus_a in hungry:
            for b, surplus_b in hungry:
                if a.priority != b.priority:
                    continue
                wa, wb = a.over_quota_weight, b.over_quota_weight
                assert abs(surplus_a / wa - surplus_b / wb) < 1 / wa + 1 / wb


@fast
@given(snapshots(resources=(GPU,), max_workloads=15))
def test_lower_priority_gets_surplus_only_after_higher_priority_is_satisfied(
    snapshot: Snapshot,
) -> None:
    fair = fair_share(snapshot)
    key = ("h100", GPU)
    for members, _ in groups(snapshot, fair):
        specs = [snapshot.queues[m] for m in members]
        for low in specs:
            low_cap = cap(low, fair.demand[low.name].get(key, 0), key)
            got_surplus = fair[low.name].get(key, 0) > min(low.quota_for(*key), low_cap)
            if not got_surplus:
                continue
            for high in specs:
                if high.priority > low.priority:
                    high_cap = most(high, fair.demand[high.name].get(key, 0), key)
                    assert fair[high.name].get(key, 0) == high_cap


@fast
@given(snapshots(flavors=FLAVORS, resources=RESOURCES), st.randoms(use_true_random=False))
def test_same_snapshot_same_shares_whatever_the_listing_order(
    snapshot: Snapshot, rng: random.Random
) -> None:
    names = list(snapshot.queues)
    rng.shuffle(names)
    pending = list(snapshot.pending)
    rng.shuffle(pending)
    shuffled = replace(
        snapshot, queues={n: snapshot.queues[n] for n in names}, pending=tuple(pending)
    )
    a, b = fair_share(snapshot), fair_share(shuffled)
    for name in names:
        assert dict(a[name]) == dict(b[name])


@st.composite
def equal_priority_siblings(draw: st.DrawFn) -> Snapshot:
    """Root queues of one priority with varied weights, all wanting more than there is."""
    n = draw(st.integers(min_value=2, max_value=5))
    specs = [
        replace(
            queue(f"q{i}", quota=draw(st.integers(min_value=0, max_value=3))),
            over_quota_weight=draw(st.sampled_from((0.5, 1.0, 2.0, 3.0, 7.0))),
        )
        for i in range(n)
    ]
    pending = tuple(
        workload(f"ns/w{i}", s.name, gpus=draw(st.integers(min_value=1, max_value=40)))
        for i, s in enumerate(specs)
    )
    capacity = draw(
        st.integers(min_value=sum(s.quota_for("h100", GPU) for s in specs), max_value=60)
    )
    return Snapshot(
        now=0.0,
        queues=queues_of(*specs),
        flavors={},
        capacity={("h100", GPU): capacity},
        pending=pending,
    )


@fast
@given(equal_priority_siblings())
def test_weights_are_respected_within_one_unit(snapshot: Snapshot) -> None:
    fair = fair_share(snapshot)
    key = ("h100", GPU)
    hungry = []
    for name, spec in snapshot.queues.items():
        demand = fair.demand[name].get(key, 0)
        share = fair[name].get(key, 0)
        if share < demand:
            hungry.append((spec.over_quota_weight, share - min(spec.quota_for(*key), demand)))
    for wa, surplus_a in hungry:
        for wb, surplus_b in hungry:
            assert abs(surplus_a / wa - surplus_b / wb) < 1 / wa + 1 / wb
