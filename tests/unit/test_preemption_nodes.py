"""Preemption on nodes (KEP-5710): a gang that fits quota but not nodes evicts lower-priority
workloads, the fewest and least important that make room, whole, and never more than needed
when it is reconsidered while they leave.

Quota here is the sum of the queues' quotas (no capacity in the snapshot), larger than the
nodes: every preemptor fits by quota, so only the nodes are in question.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult
from quota.model.nodes import BoundPod, Node, PodShape
from quota.model.snapshot import Assignment, Flavor, PodSet, QueueSpec, Snapshot, Workload
from quota.placement.gang import GangRequest, Placement, PodSetRequest, Unplaceable, place_gang
from quota.placement.nodes import NodeView
from quota.preemption.nodes import preempt_on_nodes
from quota.preemption.victims import Candidate, victim_order
from tests.unit.strategies import GPU, queue, queues_of, workload

H100 = Flavor("h100", {"pool": "h100"})
NOW = 10_000.0


def gpu_nodes(n: int, gpus: int = 8) -> tuple[Node, ...]:
    return tuple(
        Node(f"h100-{i}", {GPU: gpus, "cpu": 64_000, "pods": 110}, {"pool": "h100"})
        for i in range(n)
    )


def running(
    key: str,
    queue_name: str,
    nodes: Sequence[str],
    priority: int = 0,
    gpus: int = 8,
    admitted_at: float = 0.0,
) -> tuple[Workload, tuple[BoundPod, ...]]:
    """An admitted gang with one bound pod on each of `nodes`."""
    placed = tuple((n, 1) for n in nodes)
    w = Workload(
        key,
        queue_name,
        priority,
        0.0,
        (PodSet("main", len(nodes), {GPU: gpus}),),
        admission=(Assignment("main", len(nodes), {GPU: "h100"}, placed),),
        admitted_at=admitted_at,
    )
    return w, tuple(BoundPod(f"{key}-{i}", n, {GPU: gpus}, key) for i, n in enumerate(nodes))


def gangs(
    priorities: Sequence[int], queue_name: str = "b", admitted_at: Sequence[float] | None = None
) -> tuple[list[Workload], list[BoundPod]]:
    """2-pod gangs of 8-GPU pods, gang i on nodes h100-2i and h100-2i+1."""
    ws: list[Workload] = []
    pods: list[BoundPod] = []
    for i, p in enumerate(priorities):
        at = admitted_at[i] if admitted_at is not None else float(i)
        w, bound = running(
            f"ns/g{i}", queue_name, [f"h100-{2 * i}", f"h100-{2 * i + 1}"], p, admitted_at=at
        )
        ws.append(w)
        pods.extend(bound)
    return ws, pods


def cycle(
    specs: list[QueueSpec],
    pending: list[Workload],
    nodes: tuple[Node, ...],
    admitted: Sequence[Workload],
    pods: Sequence[BoundPod],
) -> CycleResult:
    return admission_cycle(
        Snapshot(
            now=NOW,
            queues=queues_of(*specs),
            flavors={"h100": H100},
            admitted=tuple(admitted),
            pending=tuple(pending),
            nodes=nodes,
            pods=tuple(pods),
        )
    )


def victims_of(result: CycleResult) -> list[str]:
    return sorted(v.workload for p in result.preempt for v in p.victims)


def pending_reason(result: CycleResult, key: str) -> str:
    (reason,) = [p.reason for p in result.pending if p.workload == key]
    return reason


A = queue("a", quota=64, reclaim="Any")
B = queue("b", quota=80)
BIG = workload("ns/big", "a", gpus=8, count=4, priority=100)


def test_a_high_priority_gang_evicts_exactly_the_gangs_on_the_nodes_it_needs() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    result = cycle([A, B], [BIG], nodes, ws, pods)
    assert not result.admit
    (preempt,) = result.preempt
    assert preempt.preemptor == "ns/big"
    assert len(preempt.victims) == 2  # 4 nodes = 2 two-node gangs, not more
    for v in preempt.victims:
        assert v.kind == "Reclaimed"  # another queue
        assert "to free nodes h100-" in v.reason and "ns/big (priority 100)" in v.reason
    reason = pending_reason(result, "ns/big")
    assert reason.startswith("waiting for 2 preempted workloads to leave nodes")
    assert "its room is held" in reason


def test_a_gang_needing_part_of_a_victim_takes_that_victim_whole() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    three = workload("ns/three", "a", gpus=8, count=3, priority=100)
    result = cycle([A, B], [three], nodes, ws, pods)
    # disruptionMode all: 3 nodes need 2 gangs, each evicted with both its pods.
    assert len(victims_of(result)) == 2


def test_with_mixed_priorities_the_lowest_are_chosen() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([5, 1, 5, 1, 3])
    result = cycle([A, B], [BIG], nodes, ws, pods)
    assert victims_of(result) == ["ns/g1", "ns/g3"]


def test_victims_under_the_priority_ceiling_that_are_not_needed_are_reprieved() -> None:
    nodes = gpu_nodes(10)
    # The ceiling is 2 (priority 1 alone frees 2 nodes): three gangs under it, two needed.
    ws, pods = gangs([1, 2, 2, 3, 3])
    result = cycle([A, B], [BIG], nodes, ws, pods)
    victims = victims_of(result)
    assert len(victims) == 2
    assert "ns/g0" in victims  # the priority-1 gang is evicted before any priority-2 one


def test_a_gang_that_would_not_fit_even_with_every_victim_gone_evicts_nothing() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0, 0, 0, 200, 200])  # 6 nodes of lower priority, 4 of higher
    eight = workload("ns/eight", "a", gpus=8, count=8, priority=100)
    result = cycle([A, B], [eight], nodes, ws, pods)
    assert not result.preempt and not result.admit
    reason = pending_reason(result, "ns/eight")
    assert "even if every lower-priority workload on its flavor's nodes" in reason
    assert "6 of 8" in reason or "6" in reason  # says how far it still is


def test_equal_and_higher_priority_workloads_are_never_victims() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([100, 100, 200, 100, 300])
    result = cycle([A, B], [BIG], nodes, ws, pods)
    assert not result.preempt
    assert "cannot be placed" in pending_reason(result, "ns/big")


def test_queue_policy_never_means_no_preemption_on_nodes() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    never = queue("a", quota=64)  # withinQueue and reclaim Never
    result = cycle([never, B], [BIG], nodes, ws, pods)
    assert not result.preempt
    # Reclaim Never but withinQueue allowed: victims of its own queue only.
    own = queue("a", quota=144, within_queue="LowerPriority")
    mine, my_pods = gangs([0] * 5, queue_name="a")
    result = cycle([own], [BIG], nodes, mine, my_pods)
    assert len(victims_of(result)) == 2
    assert {v.kind for p in result.preempt for v in p.victims} == {"Preempted"}
    result = cycle([own, B], [BIG], nodes, ws, pods)  # all in b: out of reach
    assert not result.preempt


def test_a_preemptor_reconsidered_while_its_victims_leave_evicts_no_one_more() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    first = cycle([A, B], [BIG], nodes, ws, pods)
    victims = set(victims_of(first))
    assert len(victims) == 2
    # The shell marks them evicting; their pods are still bound.
    leaving = [replace(w, evicting=True) if w.key in victims else w for w in ws]
    second = cycle([A, B], [BIG], nodes, leaving, pods)
    assert not second.preempt and not second.admit
    assert pending_reason(second, "ns/big").startswith(
        "waiting for preempted workloads to leave nodes; its room is held"
    )
    # And a third time, the same.
    assert not cycle([A, B], [BIG], nodes, leaving, pods).preempt


def test_held_room_is_not_taken_by_a_later_preemptor_in_the_same_cycle() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    twin = workload("ns/twin", "a", gpus=8, count=4, priority=100, arrival=1.0)
    result = cycle([A, B], [BIG, twin], nodes, ws, pods)
    assert len(result.preempt) == 2
    first, second = ({v.workload for v in p.victims} for p in result.preempt)
    assert len(first) == 2 and len(second) == 2 and not first & second


def test_held_room_is_not_admitted_to_a_small_workload_in_the_same_cycle() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 4)  # h100-8 and h100-9 are free
    ws_pods = [*pods, BoundPod("other/x", "h100-9", {GPU: 8})]
    six = workload("ns/six", "a", gpus=8, count=5, priority=100)
    small = workload("ns/small", "a", gpus=8, count=1, priority=0, arrival=1.0)
    result = cycle([A, B], [six, small], nodes, ws, ws_pods)
    assert len(victims_of(result)) == 2  # h100-8 + 4 freed nodes
    assert not result.admit  # the one free node is part of the held room


def test_a_victim_younger_than_its_queues_min_runtime_is_skipped_with_a_reason() -> None:
    nodes = gpu_nodes(10)
    protected = queue("b", quota=80, min_runtime_reclaim_s=600.0)
    # g3 and g4 started 100s ago (the least important by start time), the others long ago.
    ws, pods = gangs([0] * 5, admitted_at=[0.0, 1.0, 2.0, NOW - 100, NOW - 100])
    result = cycle([A, protected], [BIG], nodes, ws, pods)
    assert victims_of(result) == ["ns/g1", "ns/g2"]  # most recently started of the old ones
    # All young: nothing is evicted and the reason says until when.
    young, _ = gangs([0] * 5, admitted_at=[NOW - 100] * 5)
    result = cycle([A, protected], [BIG], nodes, young, pods)
    assert not result.preempt
    reason = pending_reason(result, "ns/big")
    assert "5 lower-priority workloads are protected by minRuntime until" in reason
    assert "(in 500s)" in reason


def test_a_failed_search_leaves_the_room_for_others() -> None:
    nodes = gpu_nodes(4)
    ws, pods = gangs([0, 200])
    huge = workload("ns/huge", "a", gpus=8, count=4, priority=100)
    small = workload("ns/small", "a", gpus=8, count=1, priority=0, arrival=1.0)
    # Nothing is free: small waits; huge cannot evict enough and must not hold anything.
    result = cycle([A, B], [huge, small], nodes, ws, pods)
    assert not result.preempt and not result.admit
    ws2, pods2 = gangs([0, 200])
    result = cycle([A, B], [huge, small], gpu_nodes(5), ws2, pods2)
    assert [a.workload for a in result.admit] == ["ns/small"]  # h100-4 was not kept


# -- the search on its own: a failed one changes nothing ------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Node], list[BoundPod], list[Candidate], GangRequest]:
    n = draw(st.integers(1, 6))
    nodes = [Node(f"n{i}", {GPU: 8, "pods": 4}) for i in range(n)]
    pods: list[BoundPod] = []
    candidates: list[Candidate] = []
    for j in range(draw(st.integers(0, 6))):
        key = f"ns/w{j}"
        count = draw(st.integers(1, 3))
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        w = Workload(key, "b", draw(st.integers(0, 3)), 0.0, (PodSet("main", count, {GPU: gpus}),))
        for k in range(count):
            node = draw(st.integers(0, n - 1))
            pods.append(BoundPod(f"{key}-{k}", f"n{node}", {GPU: gpus}, key))
        if draw(st.booleans()):
            candidates.append(Candidate(w, "b", {}))
    candidates.sort(key=victim_order)
    gang = GangRequest(
        (
            PodSetRequest(
                "main",
                draw(st.integers(1, 6)),
                PodShape({GPU: draw(st.sampled_from([2, 4, 8]))}),
            ),
        )
    )
    return nodes, pods, candidates, gang


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(clusters(), st.data())
def test_a_failed_search_leaves_the_view_exactly_as_it_was(
    cluster: tuple[list[Node], list[BoundPod], list[Candidate], GangRequest],
    data: st.DataObject,
) -> None:
    nodes, pods, candidates, gang = cluster
    view = NodeView(nodes, pods)
    pods_of: dict[str, list[str]] = {}
    for p in pods:
        assert p.workload is not None
        pods_of.setdefault(p.workload, []).append(p.key)
    keys = sorted(pods_of)
    leaving = data.draw(st.lists(st.sampled_from(keys), unique=True) if keys else st.just([]))
    leaving = [k for k in leaving if k not in {c.workload.key for c in candidates}]
    before = (view.free_by_node(), dict(view.pods))
    plan = preempt_on_nodes(view, candidates, pods_of, leaving, lambda: place_gang(view, gang))
    if isinstance(plan, Unplaceable):
        assert (view.free_by_node(), dict(view.pods)) == before
        return
    # Success: the victims and the leaving, and nothing else, make room for the gang.
    assert all(c in candidates for c in plan.victims)
    gone = set(leaving) | {c.workload.key for c in plan.victims}
    fresh = NodeView(nodes, [p for p in pods if p.workload not in gone])
    assert isinstance(place_gang(fresh, gang), Placement)
    # ... and the held placement never overcommits a node beyond what was already there.
    for name, free in view.free_by_node().items():
        for r, v in free.items():
            assert v >= min(0, before[0][name].get(r, 0))
