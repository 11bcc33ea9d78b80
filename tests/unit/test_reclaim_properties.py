"""Reclaim on random trees: once a queue reclaims from another, the other never reclaims
back; a single sufficient victim is always found; victims keep their queues' floors and the
reclaimer its ceiling."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.admission.cycle import admission_cycle
from quota.fairness.fairshare import FairShare, fair_share
from quota.model.decisions import CycleResult
from quota.model.snapshot import FlavorQuota, PodSet, QueueSpec, Snapshot, Workload, queue_tree
from quota.preemption.reclaim import below, lowest_common_ancestor
from tests.unit.strategies import CPU, GPU, apply_cycle, snapshots, workload

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


# -- one pending workload against the admitted ones: the victim search ----------------------

KEY = ("h100", GPU)


@st.composite
def one_reclaimer(draw: st.DrawFn) -> Snapshot:
    """Two or three departments (perhaps with teams) sharing a GPU pool, GPU workloads
    admitted in their leaves, and one pending workload in a leaf that may reclaim."""
    queues: dict[str, QueueSpec] = {}
    leaves: list[str] = []

    def add(name: str, parent: str | None) -> None:
        queues[name] = QueueSpec(
            name,
            parent=parent,
            over_quota_weight=draw(st.sampled_from((0.0, 1.0, 2.0, 3.0))),
            flavors=(FlavorQuota("h100", {GPU: draw(st.integers(0, 4))}),),
            reclaim="Any",
        )

    for d in range(draw(st.integers(2, 3))):
        add(f"d{d}", None)
        teams = draw(st.integers(0, 2))
        for t in range(teams):
            add(f"d{d}t{t}", f"d{d}")
            leaves.append(f"d{d}t{t}")
        if not teams:
            leaves.append(f"d{d}")
    reclaimer = draw(st.sampled_from(leaves))
    others = [leaf for leaf in leaves if leaf != reclaimer]
    capacity = draw(st.integers(4, 12))
    admitted: list[Workload] = []
    used = 0
    for i in range(draw(st.integers(1, 8))):
        gpus = draw(st.integers(1, 5))
        if used + gpus > capacity:
            break
        used += gpus
        # Mostly in other queues: those are the ones a reclaim takes from.
        leaf = draw(st.sampled_from(others if others and i % 4 else leaves))
        admitted.append(workload(f"ns/r{i}", leaf, gpus=gpus, flavor="h100", admitted_at=float(i)))
    want = draw(st.integers(1, capacity))
    return Snapshot(
        now=1_000.0,
        queues=queues,
        flavors={},
        capacity={KEY: capacity},
        admitted=tuple(admitted),
        pending=(workload("ns/want", reclaimer, gpus=want, arrival=500.0),),
    )


def subtree_used(snapshot: Snapshot) -> dict[str, int]:
    tree = queue_tree(snapshot.queues)
    used = dict.fromkeys(snapshot.queues, 0)
    for w in snapshot.admitted:
        for name in tree.paths[w.queue]:
            used[name] += w.pod_sets[0].per_pod[GPU]
    return used


def floor(snapshot: Snapshot, fair: FairShare, rule: str, name: str) -> int:
    quota = snapshot.queues[name].quota_for(*KEY)
    return quota if rule == "quota" else max(quota, fair.shares.get(name, {}).get(KEY, 0))


def ceiling(snapshot: Snapshot, fair: FairShare, rule: str, name: str) -> int:
    if rule == "quota":
        return snapshot.queues[name].quota_for(*KEY)
    return fair.shares.get(name, {}).get(KEY, 0)


def within_levels(snapshot: Snapshot, fair: FairShare, rule: str, victims: list[Workload]) -> bool:
    """Whether taking `victims` for the pending workload keeps, under `rule`, every queue on
    their side at or above its floor and every queue on the reclaimer's side at or below its
    ceiling, below the point where the two sides meet."""
    tree = queue_tree(snapshot.queues)
    (want,) = snapshot.pending
    need = want.pod_sets[0].per_pod[GPU]
    used = subtree_used(snapshot)
    for v in victims:
        for name in tree.paths[v.queue]:
            used[name] -= v.pod_sets[0].per_pod[GPU]
    for v in victims:
        meet = lowest_common_ancestor(tree, want.queue, v.queue)
        if any(used[n] < floor(snapshot, fair, rule, n) for n in below(tree, v.queue, meet)):
            return False
        mine = below(tree, want.queue, meet)
        if any(used[n] + need > ceiling(snapshot, fair, rule, n) for n in mine):
            return False
    return True


def rule_of(reason: str) -> str:
    return "fair share" if "below its fair share" in reason else "quota"


@checked
@given(one_reclaimer())
def test_a_single_sufficient_victim_is_always_found(snapshot: Snapshot) -> None:
    fair = fair_share(snapshot)
    result = admission_cycle(snapshot, fair)
    (want,) = snapshot.pending
    if any(a.workload == want.key for a in result.admit):
        return  # it fits without evicting anyone
    for v in snapshot.admitted:
        if v.queue == want.queue:
            continue
        alone = replace(snapshot, admitted=tuple(w for w in snapshot.admitted if w is not v))
        if not any(a.workload == want.key for a in admission_cycle(alone, fair).admit):
            continue  # evicting it would not make room
        if any(within_levels(snapshot, fair, rule, [v]) for rule in ("fair share", "quota")):
            assert result.preempt, f"{v.key} alone would do: {result.pending[0].reason}"
            return


def reclaimed(result: CycleResult) -> list[tuple[str, list[str]]]:
    return [
        (rule_of(v.reason), [v.workload for v in p.victims])
        for p in result.preempt
        for v in p.victims[:1]
    ]


@checked
@given(one_reclaimer())
def test_victims_keep_their_floors_and_the_reclaimer_its_ceiling(snapshot: Snapshot) -> None:
    fair = fair_share(snapshot)
    by_key = {w.key: w for w in snapshot.admitted}
    for rule, keys in reclaimed(admission_cycle(snapshot, fair)):
        assert within_levels(snapshot, fair, rule, [by_key[k] for k in keys]), (rule, keys)
