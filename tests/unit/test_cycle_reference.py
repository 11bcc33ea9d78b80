"""The admission cycle's shortcuts decide exactly what the plain search decides.

Each shortcut taken for speed (issue 14) has a plain counterpart here, the behaviour before
it. `admission_cycle` is run twice on random contended snapshots (full clusters, preemption
and reclaim on, minimum runtimes, zero weights and quotas, empty trees): as it is, and with
the plain counterparts put in place of the shortcuts; both must return the same decisions,
reasons included.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.admission import candidates, decide
from quota.admission.candidates import VictimLists
from quota.admission.cycle import admission_cycle
from quota.admission.state import CycleState
from quota.fairness.fairshare import fair_share
from quota.model.flavorassign import (
    UNEXPLAINED,
    Fit,
    FitFailure,
    PodSetPlan,
    assign_flavors,
    assign_flavors_pair,
    plan_pod_set,
)
from quota.model.ledger import Ledger
from quota.model.resources import FlavorResource
from quota.model.snapshot import FlavorQuota, PodSet, QueueSpec, Snapshot, Workload, queue_tree
from quota.preemption.reclaim import ReclaimIndex
from quota.preemption.victims import Candidate, VictimKey, started_at, victim_order
from tests.unit.strategies import CPU, GPU, apply_cycle, snapshots
from tests.unit.test_reclaim_properties import contended as reclaim_cases

checked = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _PlainIndex(ReclaimIndex):
    """The reclaim figures built leaf by leaf, every ancestor again for each leaf below it."""

    def build(self) -> None:
        for leaf in sorted(self.leaves):
            self.refresh(leaf)


def _plain_young(lists: VictimLists) -> list[Candidate]:
    """Every admitted workload is asked whether minRuntime protects it."""
    return lists.everyone()


def _plain_in_victim_order(
    workloads: Sequence[tuple[Workload, Mapping[FlavorResource, int]]], queue: str
) -> tuple[list[Candidate], list[VictimKey]]:
    """A queue's victims sorted with `victim_order`, one call each."""
    found = sorted((Candidate(w, queue, usage) for w, usage in workloads), key=victim_order)
    return found, [victim_order(c) for c in found]


def _plain_within_queue(
    lists: VictimLists, spec: QueueSpec, w: Workload, contended: set[FlavorResource]
) -> list[Candidate]:
    """Within-queue candidates picked from the whole sorted queue."""
    if spec.within_queue == "Never":
        return []
    out: list[Candidate] = []
    equal_ok = spec.within_queue == "LowerOrNewerEqualPriority"
    state = lists.state
    for c in lists.of_queue(spec.name):
        v = c.workload
        if v.priority >= w.priority:
            if v.priority > w.priority or not equal_ok:
                break  # victim order is by priority: nothing further is allowed
            if v.arrival <= w.arrival:
                continue
        if v.key in state.taken or contended.isdisjoint(c.usage):
            continue
        runtime = spec.min_runtime_preempt_s
        if runtime and state.snapshot.now - started_at(v) < runtime:
            continue
        out.append(c)
    return out


def _plain_pair(
    queue: str,
    plans: Sequence[PodSetPlan],
    counts: Sequence[int],
    held: Ledger,
    planned: Ledger,
) -> tuple[Fit | FitFailure, Fit | FitFailure | None]:
    """Flavors assigned in both ledgers, then in the planned one, by two calls."""
    both = assign_flavors(queue, plans, counts, (held, planned))
    if isinstance(both, Fit):
        return both, None
    alone = assign_flavors(queue, plans, counts, (planned,))
    return both, alone if isinstance(alone, Fit) else UNEXPLAINED


@contextmanager
def _plain_cycle() -> Iterator[None]:
    """`admission_cycle` as it was before its shortcuts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VictimLists, "young", _plain_young)
        patch.setattr(VictimLists, "within_queue", _plain_within_queue)
        patch.setattr(candidates, "in_victim_order", _plain_in_victim_order)
        patch.setattr(candidates, "ReclaimIndex", _PlainIndex)
        patch.setattr(decide, "assign_flavors_pair", _plain_pair)
        yield


@st.composite
def contended(draw: st.DrawFn) -> Snapshot:
    """A cluster filled by one cycle, then more important work arriving in queues that may
    preempt and reclaim, with minimum runtimes some of the running work has not reached."""
    resources = draw(st.sampled_from(((GPU,), (GPU, CPU))))
    first = draw(
        snapshots(
            flavors=draw(st.sampled_from((("h100",), ("h100", "a100")))),
            resources=resources,
            policies=True,
            max_workloads=16,
            min_queues=0,
        )
    )
    running = apply_cycle(first, admission_cycle(first))
    admitted = tuple(
        replace(w, admitted_at=draw(st.sampled_from((400.0, 900.0, 990.0, 1_000.0))))
        for w in running.admitted
    )
    queues = {
        name: replace(
            spec,
            min_runtime_preempt_s=draw(st.sampled_from((0.0, 0.0, 60.0, 300.0))),
            min_runtime_reclaim_s=draw(st.sampled_from((0.0, 0.0, 60.0, 300.0))),
        )
        for name, spec in running.queues.items()
    }
    # Late work in its own queue or another leaf (an idle queue's arrivals reclaim).
    tree = queue_tree(queues)
    leaves = sorted(name for name in queues if tree.is_leaf(name))
    arrivals: list[Workload] = []
    for i, w in enumerate(running.pending + admitted):
        if draw(st.booleans()):
            arrivals.append(
                replace(
                    w,
                    key=f"{w.key}-late{i}",
                    queue=draw(st.sampled_from((w.queue, *leaves))),
                    priority=w.priority + draw(st.integers(min_value=0, max_value=3)),
                    arrival=w.arrival + 500.0,
                    admission=None,
                    admitted_at=None,
                )
            )
    return replace(
        running,
        queues=queues,
        admitted=admitted,
        pending=running.pending + tuple(arrivals),
    )


@st.composite
def reclaiming(draw: st.DrawFn) -> Snapshot:
    """Sibling queues that borrowed an idle queue's quota, and that queue's work arriving:
    reclaim under both rules, with minimum runtimes some borrowers have not reached."""
    snapshot, late = draw(reclaim_cases(with_cpu=draw(st.booleans())))
    early = replace(snapshot, pending=tuple(w for w in snapshot.pending if w.queue not in late))
    running = apply_cycle(early, admission_cycle(early))
    queues = {
        name: replace(
            spec,
            min_runtime_reclaim_s=draw(st.sampled_from((0.0, 0.0, 300.0))),
            within_queue=draw(st.sampled_from(("Never", "LowerPriority"))),
        )
        for name, spec in running.queues.items()
    }
    admitted = tuple(
        replace(w, admitted_at=draw(st.sampled_from((400.0, 900.0)))) for w in running.admitted
    )
    arrivals = tuple(w for w in snapshot.pending if w.queue in late)
    return replace(running, queues=queues, admitted=admitted, pending=running.pending + arrivals)


@checked
@given(st.one_of(contended(), reclaiming()))
def test_the_cycle_decides_as_the_plain_search_does(snapshot: Snapshot) -> None:
    fair = fair_share(snapshot)
    # The plain cycle works out the usage of the admitted workloads itself, as it does with
    # a fair share computed from another snapshot.
    unshared = replace(fair, queue_workloads={}, snapshot=None)
    fast = admission_cycle(snapshot, fair)
    with _plain_cycle():
        plain = admission_cycle(snapshot, unshared)
    assert fast == plain


def _ledger_after(snapshot: Snapshot, charges: Sequence[int]) -> tuple[Ledger, list[str]]:
    """The planned ledger of a cycle over `snapshot`, with some admitted workloads released
    (as victims would be) by the `charges` drawn."""
    fair = fair_share(snapshot)
    state = CycleState(snapshot, fair)
    ledger = state.planned
    running = list(state.running().values())
    for i in charges:
        if running:
            w, usage = running[i % len(running)]
            ledger.release(w.queue, usage)
    return ledger, sorted(state.admitted_by_queue)


@checked
@given(
    st.one_of(contended(), reclaiming()),
    st.lists(st.integers(min_value=0, max_value=50), max_size=6),
)
def test_reclaim_figures_built_at_once_equal_those_built_leaf_by_leaf(
    snapshot: Snapshot, charges: list[int]
) -> None:
    fair = fair_share(snapshot)
    tree = queue_tree(snapshot.queues)
    quotas = {name: spec.quotas for name, spec in snapshot.queues.items()}
    built: list[ReclaimIndex] = []
    for kind in (ReclaimIndex, _PlainIndex):
        ledger, leaves = _ledger_after(snapshot, charges)
        built.append(
            kind(leaves, lambda leaf: (), lambda leaf: (), ledger, tree, fair.shares, quotas)
        )
    fast, plain = built

    def nonzero(figures: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        return {k: v for k, v in figures.items() if v}

    for rule in ("fair share", "quota"):
        assert fast.available(rule) == plain.available(rule)
        assert fast.giving[rule] == plain.giving[rule]
        assert {q: s for q, s in fast.giving_below[rule].items() if s} == {
            q: s for q, s in plain.giving_below[rule].items() if s
        }
        for name in snapshot.queues:
            for key in {k for q in quotas.values() for k in q}:
                assert fast.freeable(rule, name, [key], len(tree.paths[name])) == (
                    plain.freeable(rule, name, [key], len(tree.paths[name]))
                )
        assert nonzero(fast.top[rule]) == nonzero(plain.top[rule])


@checked
@given(st.data())
def test_flavors_in_both_ledgers_then_the_planned_one_as_two_calls_would(
    data: st.DataObject,
) -> None:
    flavors = data.draw(
        st.lists(st.sampled_from(("a", "b", "c")), min_size=1, max_size=3, unique=True)
    )
    resources = ("cpu", "gpu")
    spec = QueueSpec(
        name="q",
        parent=None,
        flavors=tuple(FlavorQuota(f, dict.fromkeys(resources, 10)) for f in flavors),
    )
    small = st.integers(min_value=0, max_value=12)
    limits = {("a", "gpu"): data.draw(small)} if data.draw(st.booleans()) else {}
    held = Ledger(
        {"q": ("q",)}, {"q": limits}, {(f, r): data.draw(small) for f in "abc" for r in resources}
    )
    planned = held.copy()
    for ledger in (held, planned):
        ledger.charge("q", {(f, r): data.draw(small) for f in "abc" for r in resources})
    per_pod = {r: data.draw(st.integers(min_value=0, max_value=3)) for r in resources}
    pod_set = PodSet("main", data.draw(st.integers(min_value=0, max_value=3)), per_pod)
    # Pinned as a scale-up slice's plan is, or not.
    pinned = (
        {r: data.draw(st.sampled_from("abc")) for r in resources}
        if data.draw(st.booleans())
        else None
    )
    plan = plan_pod_set(spec, {}, pod_set).pinned(pinned)
    counts = (pod_set.count,)
    both = assign_flavors("q", (plan,), counts, (held, planned))
    alone = (
        None
        if isinstance(both, Fit)
        else assign_flavors("q", (plan,), counts, (planned,), explain=False)
    )
    assert assign_flavors_pair("q", (plan,), counts, held, planned) == (both, alone)


@settings(max_examples=30)
@given(st.one_of(contended(), reclaiming()))
def test_the_cycle_leaves_no_cyclic_garbage(snapshot: Snapshot) -> None:
    # The controller and the bench pause the collector during a cycle; what the cycle made
    # must be freed by reference counting as it returns, not left for the collector's next
    # pass to walk (tens of milliseconds on the bench's contended snapshot).
    gc.collect()
    gc.disable()
    try:
        result = admission_cycle(snapshot)
        del result
        assert gc.collect() == 0
    finally:
        gc.enable()
