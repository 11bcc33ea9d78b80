"""Preemption, holds and consolidation by topology domain: a gang that must sit in one rack
evicts lower-priority workloads in the one rack whose victims cost least, only there and
each whole; the hold names the rack and the gang lands in it; a gang no rack could ever hold
waits without blocking its queue; the wait reason says how many racks preemption could free.

Nodes form blocks of racks (`fabric`: b<i>-r<j>-n<k>, 8 GPUs each); running gangs have one
8-GPU pod per node. Quota is never short: only the nodes are in question.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from quota.admission.cycle import admission_cycle
from quota.api.names import HOSTNAME_LABEL
from quota.model.decisions import CycleResult, Pending
from quota.model.nodes import BoundPod, Node
from quota.model.snapshot import (
    Assignment,
    Flavor,
    PodSet,
    PodSetTopology,
    QueueSpec,
    Snapshot,
    Workload,
)
from quota.placement.nodes import demand_of, fit_count
from quota.preemption.domains import cost
from quota.preemption.victims import Candidate
from tests.unit.strategies import GPU, queue, queues_of
from tests.unit.test_topology import BLOCK, LEVELS, RACK, fabric

NOW = 10_000.0
FLAVOR = Flavor("h100", {"pool": "h100"}, topology="fabric")
A = queue("a", quota=10_000, reclaim="Any", within_queue="LowerPriority")
B = queue("b", quota=10_000)


def rack(node: str) -> str:
    return node.rsplit("-", 1)[0]


def gang(
    key: str,
    count: int,
    priority: int = 100,
    mode: str = "Required",
    level: str = RACK,
    queue_name: str = "a",
    gpus: int = 8,
) -> Workload:
    return Workload(
        key,
        queue_name,
        priority,
        0.0,
        (PodSet("main", count, {GPU: gpus}, topology=PodSetTopology(mode, level)),),
    )


def running(
    key: str, nodes: Sequence[str], priority: int = 0, started: float = 0.0, queue_name: str = "b"
) -> tuple[Workload, list[BoundPod]]:
    """An admitted workload with one 8-GPU pod bound on each of `nodes`."""
    w = Workload(
        key,
        queue_name,
        priority,
        0.0,
        (PodSet("main", len(nodes), {GPU: 8}),),
        admission=(Assignment("main", len(nodes), {GPU: "h100"}, tuple((n, 1) for n in nodes)),),
        admitted_at=started,
    )
    return w, [BoundPod(f"{key}-{i}", n, {GPU: 8}, key) for i, n in enumerate(nodes)]


Running = tuple[list[Workload], list[BoundPod]]


def fill(groups: Sequence[tuple[Sequence[str], int, float]]) -> Running:
    """Running workloads: (nodes, priority, start) each, keys ns/w0, ns/w1, ..."""
    ws: list[Workload] = []
    pods: list[BoundPod] = []
    for i, (nodes, priority, started) in enumerate(groups):
        w, bound = running(f"ns/w{i}", nodes, priority, started)
        ws.append(w)
        pods.extend(bound)
    return ws, pods


def cycle(
    pending: Sequence[Workload],
    nodes: Sequence[Node],
    admitted: Sequence[Workload],
    pods: Sequence[BoundPod],
    specs: Sequence[QueueSpec] = (A, B),
    now: float = NOW,
) -> CycleResult:
    return admission_cycle(
        Snapshot(
            now=now,
            queues=queues_of(*specs),
            flavors={"h100": FLAVOR},
            admitted=tuple(admitted),
            pending=tuple(pending),
            nodes=tuple(nodes),
            pods=tuple(pods),
            topologies={"fabric": LEVELS},
            hold_timeout_s=300.0,
        )
    )


def victims_of(result: CycleResult) -> list[str]:
    return sorted(v.workload for p in result.preempt for v in p.victims)


def pending_of(result: CycleResult, key: str) -> Pending:
    (found,) = [p for p in result.pending if p.workload == key]
    return found


def held_racks(p: Pending) -> set[str]:
    assert p.hold is not None
    return {rack(node) for a in p.hold.assignments for node, _ in a.nodes}


def full_fabric(priority_of: dict[str, int], blocks: int = 2, racks: int = 3) -> Running:
    """Every rack of 4 nodes full with two 2-node workloads, of the rack's priority (0 when
    not named)."""
    groups = []
    for b in range(blocks):
        for r in range(racks):
            name = f"b{b}-r{r}"
            p = priority_of.get(name, 0)
            groups.append(([f"{name}-n0", f"{name}-n1"], p, 0.0))
            groups.append(([f"{name}-n2", f"{name}-n3"], p, 0.0))
    return fill(groups)


# -- the cheapest rack, and only there ---------------------------------------------------


def test_a_required_gang_evicts_in_one_rack_only_each_victim_whole() -> None:
    nodes = fabric()
    ws, pods = full_fabric({})
    result = cycle([gang("ns/big", 4)], nodes, ws, pods)
    victims = victims_of(result)
    assert len(victims) == 2
    nodes_of = {w.key: {n for a in w.admission or () for n, _ in a.nodes} for w in ws}
    assert len({rack(n) for v in victims for n in nodes_of[v]}) == 1
    waiting = pending_of(result, "ns/big")
    assert held_racks(waiting) == {rack(n) for v in victims for n in nodes_of[v]}


def test_the_rack_with_fewer_victims_is_chosen_over_the_one_the_whole_cluster_search_takes() -> (
    None
):
    # Rack b0-r0: three free nodes and one node of an old workload. Rack b0-r1: two recently
    # started workloads on all four nodes. Victim order takes the recent ones first: a
    # search over the whole cluster frees b0-r1 (2 victims); b0-r0 needs 1.
    nodes = fabric(blocks=1, racks=2)
    ws, pods = fill(
        [
            (["b0-r0-n0"], 0, 0.0),
            (["b0-r1-n0", "b0-r1-n1"], 0, 500.0),
            (["b0-r1-n2", "b0-r1-n3"], 0, 600.0),
        ]
    )
    result = cycle([gang("ns/big", 4)], nodes, ws, pods)
    assert victims_of(result) == ["ns/w0"]
    assert held_racks(pending_of(result, "ns/big")) == {"b0-r0"}


def test_the_rack_whose_victims_have_the_lowest_priority_is_chosen() -> None:
    nodes = fabric(blocks=1, racks=2)
    # One priority-5 victim frees b0-r0; b0-r1 needs two, of priority 1.
    ws, pods = fill(
        [
            (["b0-r0-n0", "b0-r0-n1", "b0-r0-n2", "b0-r0-n3"], 5, 0.0),
            (["b0-r1-n0", "b0-r1-n1"], 1, 0.0),
            (["b0-r1-n2", "b0-r1-n3"], 1, 0.0),
        ]
    )
    result = cycle([gang("ns/big", 4)], nodes, ws, pods)
    assert victims_of(result) == ["ns/w1", "ns/w2"]
    assert held_racks(pending_of(result, "ns/big")) == {"b0-r1"}


def test_a_victim_spanning_two_racks_goes_whole_and_is_the_only_one_outside() -> None:
    nodes = fabric(blocks=1, racks=2)
    # ns/w0 has one pod in each rack; it is the cheapest way to free b0-r0 (with ns/w1).
    ws, pods = fill(
        [
            (["b0-r0-n0", "b0-r1-n0"], 0, 0.0),
            (["b0-r0-n1", "b0-r0-n2", "b0-r0-n3"], 0, 0.0),
            (["b0-r1-n1", "b0-r1-n2", "b0-r1-n3"], 3, 0.0),
        ]
    )
    result = cycle([gang("ns/big", 4)], nodes, ws, pods)
    assert victims_of(result) == ["ns/w0", "ns/w1"]
    (preempt,) = result.preempt
    spanning = next(v for v in preempt.victims if v.workload == "ns/w0")
    assert "in rack b0-r0 of Topology fabric" in spanning.reason


def test_the_hold_and_the_victims_name_the_rack() -> None:
    nodes = fabric(blocks=1, racks=2)
    ws, pods = full_fabric({"b0-r0": 5}, blocks=1, racks=2)
    result = cycle([gang("ns/big", 4)], nodes, ws, pods)
    reason = pending_of(result, "ns/big").reason
    assert "its room is held in rack b0-r1 of Topology fabric: 4 pods planned on" in reason
    for v in result.preempt[0].victims:
        assert "to free nodes b0-r1-" in v.reason and "in rack b0-r1 of Topology fabric" in v.reason


def test_the_preemptor_lands_in_its_held_rack_once_the_victims_are_gone() -> None:
    nodes = fabric(blocks=1, racks=3, nodes=6)
    groups = [
        ([f"b0-r{r}-n{2 * i}", f"b0-r{r}-n{2 * i + 1}"], 0 if r == 1 else 5, 0.0)
        for r in range(3)
        for i in range(3)
    ]
    ws, pods = fill(groups)
    first = cycle([gang("ns/big", 4)], nodes, ws, pods)
    waiting = pending_of(first, "ns/big")
    assert held_racks(waiting) == {"b0-r1"}
    # The victims are gone; meanwhile two workloads of b0-r0 ended too, so b0-r0 has as
    # much room as the held rack and comes first by name: bin-packing alone would take it.
    gone = {*victims_of(first), "ns/w0", "ns/w1"}
    left_ws = [w for w in ws if w.key not in gone]
    left_pods = [p for p in pods if p.workload not in gone]
    later = NOW + 30
    result = cycle(
        [replace(gang("ns/big", 4), hold=waiting.hold)], nodes, left_ws, left_pods, now=later
    )
    (admit,) = result.admit
    assert {rack(n) for a in admit.assignments for n, _ in a.nodes} == {"b0-r1"}
    result = cycle([gang("ns/big", 4)], nodes, left_ws, left_pods, now=later)
    (admit,) = result.admit
    assert {rack(n) for a in admit.assignments for n, _ in a.nodes} == {"b0-r0"}


def test_held_room_is_promised_once_a_second_gang_goes_elsewhere_or_waits() -> None:
    nodes = fabric(blocks=1, racks=2)
    ws, pods = full_fabric({"b0-r0": 5}, blocks=1, racks=2)
    # Two preemptors in one cycle: the second may not take the rack held for the first.
    result = cycle(
        [gang("ns/big", 4), gang("ns/second", 4, priority=50, queue_name="a")], nodes, ws, pods
    )
    first = held_racks(pending_of(result, "ns/big"))
    second = pending_of(result, "ns/second")
    if second.hold is not None:
        assert held_racks(second) != first
    per_node: Counter[str] = Counter()
    for p in result.pending:
        if p.hold is not None:
            for a in p.hold.assignments:
                for node, n in a.nodes:
                    per_node[node] += n
    assert all(n <= 1 for n in per_node.values())  # one 8-GPU pod per 8-GPU node


# -- preferred ----------------------------------------------------------------------------


def test_a_preferred_gang_evicts_in_one_rack_when_one_can_be_freed() -> None:
    nodes = fabric(blocks=2, racks=2)
    ws, pods = full_fabric({}, blocks=2, racks=2)
    result = cycle([gang("ns/big", 4, mode="Preferred")], nodes, ws, pods)
    assert len(victims_of(result)) == 2
    assert len(held_racks(pending_of(result, "ns/big"))) == 1


def test_a_preferred_gang_climbs_to_a_block_only_when_no_rack_can_be_freed() -> None:
    nodes = fabric(blocks=2, racks=2)
    ws, pods = full_fabric({}, blocks=2, racks=2)
    result = cycle([gang("ns/big", 6, mode="Preferred")], nodes, ws, pods)
    waiting = pending_of(result, "ns/big")
    racks = held_racks(waiting)
    assert len(racks) == 2 and len({r.split("-")[0] for r in racks}) == 1  # one block
    assert len(victims_of(result)) == 3  # 6 nodes: three 2-node workloads, not four
    assert "its room is held in block b" in waiting.reason


# -- never, and nothing to evict ------------------------------------------------------------


def test_a_gang_no_rack_could_ever_hold_evicts_no_one_and_does_not_block_its_queue() -> None:
    nodes = fabric(blocks=1, racks=2)
    ws, pods = full_fabric({}, blocks=1, racks=2)
    strict = replace(A, queueing_strategy="StrictFIFO")
    too_big = gang("ns/too-big", 5, priority=100)
    small = replace(gang("ns/small", 2, priority=100), arrival=1.0)
    result = cycle([too_big, small], nodes, ws, pods, specs=(strict, B))
    reason = pending_of(result, "ns/too-big").reason
    assert "no rack of Topology fabric can ever hold gang of 5 pods" in reason
    assert "the largest holds 4 even when empty" in reason
    assert pending_of(result, "ns/too-big").hold is None
    # The small one behind it goes on: it preempts one workload in one rack.
    assert victims_of(result) and len(victims_of(result)) == 1
    assert pending_of(result, "ns/small").hold is not None


def test_without_lower_priority_workloads_the_gang_waits_with_the_plain_reason() -> None:
    nodes = fabric(blocks=1, racks=2)
    ws, pods = full_fabric({}, blocks=1, racks=2)
    result = cycle([gang("ns/big", 4, priority=0)], nodes, ws, pods)
    assert not result.preempt
    reason = pending_of(result, "ns/big").reason
    assert "no rack of Topology fabric can hold gang of 4 pods x 8 nvidia.com/gpu" in reason
    assert "would after evicting" not in reason


def test_the_reason_counts_the_racks_minruntime_keeps_from_being_freed() -> None:
    nodes = fabric(blocks=1, racks=3)
    young = replace(B, min_runtime_reclaim_s=600.0)
    # Racks b0-r0 and b0-r1: lower-priority workloads started a minute ago; b0-r2: one of
    # higher priority than the gang's, never a victim.
    ws, pods = fill(
        [
            (["b0-r0-n0", "b0-r0-n1"], 0, NOW - 60),
            (["b0-r0-n2", "b0-r0-n3"], 0, NOW - 60),
            (["b0-r1-n0", "b0-r1-n1", "b0-r1-n2", "b0-r1-n3"], 0, NOW - 60),
            (["b0-r2-n0", "b0-r2-n1", "b0-r2-n2"], 1_000, 0.0),
        ]
    )
    result = cycle([gang("ns/big", 4)], nodes, ws, pods, specs=(A, young))
    assert not result.preempt
    reason = pending_of(result, "ns/big").reason
    assert reason == (
        "quota is available but the pods cannot be placed on flavor h100: no rack of Topology "
        "fabric can hold gang of 4 pods x 8 nvidia.com/gpu: the roomiest of its 3 racks have "
        "room for 1 (b0-r2), 0 (b0-r0), 0 (b0-r1); 2 racks would after evicting lower-priority "
        "workloads; 3 lower-priority workloads are protected by minRuntime until 02:55:40 UTC "
        "(in 540s): ns/w0, ns/w1, ns/w2"
    )


# -- edge values ----------------------------------------------------------------------------


def test_one_node_racks_each_a_domain() -> None:
    nodes = fabric(blocks=1, racks=3, nodes=1)
    ws, pods = fill([(["b0-r0-n0"], 3, 0.0), (["b0-r1-n0"], 1, 0.0), (["b0-r2-n0"], 2, 0.0)])
    result = cycle([gang("ns/one", 1)], nodes, ws, pods)
    assert victims_of(result) == ["ns/w1"]


def test_a_gang_exactly_the_size_of_a_rack_frees_the_whole_rack() -> None:
    nodes = fabric(blocks=1, racks=2)
    ws, pods = fill([([f"b0-r{r}-n{n}"], r, 0.0) for r in range(2) for n in range(4)])
    result = cycle([gang("ns/big", 4)], nodes, ws, pods)
    assert victims_of(result) == ["ns/w0", "ns/w1", "ns/w2", "ns/w3"]  # rack b0-r0, priority 0


def test_a_rack_with_no_ready_node_is_never_chosen() -> None:
    nodes = [replace(n, ready=False) if n.name.startswith("b0-r0") else n for n in fabric(1, 2)]
    ws, pods = full_fabric({"b0-r1": 5}, blocks=1, racks=2)
    result = cycle([gang("ns/big", 4)], nodes, ws, pods)
    assert held_racks(pending_of(result, "ns/big")) == {"b0-r1"}


# -- consolidation --------------------------------------------------------------------------


def test_consolidation_moves_workloads_out_of_one_rack_to_free_it() -> None:
    nodes = fabric(blocks=1, racks=2)
    movable = replace(B, movable=True)
    # Each rack has two nodes taken by single-pod workloads: no rack holds 4 pods, but the
    # pods of one rack fit in the other's free nodes. Equal priority: no preemption.
    ws, pods = fill(
        [
            (["b0-r0-n0"], 100, 0.0),
            (["b0-r0-n1"], 100, 0.0),
            (["b0-r1-n0"], 100, 0.0),
            (["b0-r1-n1"], 100, 0.0),
        ]
    )
    result = cycle([gang("ns/big", 4)], nodes, ws, pods, specs=(A, movable))
    (preempt,) = result.preempt
    assert all(v.kind == "Moved" for v in preempt.victims)
    assert len(preempt.victims) == 2
    freed = held_racks(pending_of(result, "ns/big"))
    assert len(freed) == 1
    for v in preempt.victims:
        assert v.hold is not None
        assert {rack(n) for a in v.hold.assignments for n, _ in a.nodes} != freed
    assert "in rack" in pending_of(result, "ns/big").reason


def test_a_moved_workload_keeps_its_own_rack_request() -> None:
    nodes = fabric(blocks=1, racks=5)
    movable = replace(B, movable=True)
    # Rack b0-r0 runs ns/pair (which must keep to one rack) and ns/w0; racks b0-r1..r4 have
    # one free node each, the rest run workloads of queue a, which do not move. Freeing
    # b0-r0 needs both moved, and ns/pair has no rack to go to: its two pods would be in
    # two racks.
    pair, pair_pods = running("ns/pair", ["b0-r0-n2", "b0-r0-n3"], priority=100)
    keeps = PodSet("main", 2, {GPU: 8}, topology=PodSetTopology("Required", RACK))
    others, other_pods = fill(
        [
            (["b0-r0-n0", "b0-r0-n1"], 100, 0.0),
            *(([f"b0-r{r}-n{n}" for n in range(3)], 100, 0.0) for r in range(1, 5)),
        ]
    )
    others = [w if w.key == "ns/w0" else replace(w, queue="a") for w in others]
    pending = [gang("ns/big", 4)]
    specs = (A, movable)
    result = cycle(
        pending,
        nodes,
        [replace(pair, pod_sets=(keeps,)), *others],
        [*pair_pods, *other_pods],
        specs,
    )
    assert not result.preempt
    assert pending_of(result, "ns/big").hold is None
    # Were ns/pair free to spread, both would move and the gang would have b0-r0.
    result = cycle(pending, nodes, [pair, *others], [*pair_pods, *other_pods], specs)
    assert sorted(v.workload for v in result.preempt[0].victims) == ["ns/pair", "ns/w0"]
    assert held_racks(pending_of(result, "ns/big")) == {"b0-r0"}


# -- properties ---------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Node], Running, int]:
    """1 or 2 blocks of 1 to 3 racks of 1 to 3 nodes, filled at random by running
    workloads of 1 to 3 pods (some across racks) of priorities 0 to 3, and a gang size."""
    nodes = fabric(
        blocks=draw(st.integers(1, 2)), racks=draw(st.integers(1, 3)), nodes=draw(st.integers(1, 3))
    )
    free = [n.name for n in nodes]
    groups: list[tuple[Sequence[str], int, float]] = []
    while free and draw(st.integers(0, 5)):
        size = min(len(free), draw(st.integers(1, 3)))
        picked = draw(st.permutations(free))[:size]
        for name in picked:
            free.remove(name)
        groups.append((picked, draw(st.integers(0, 3)), float(draw(st.integers(0, 5)))))
    return nodes, fill(groups), draw(st.integers(1, 4))


def _lowest_ceiling(
    nodes: list[Node], ws: list[Workload], pods: list[BoundPod], count: int
) -> int | None:
    """Brute force: the lowest priority P such that removing every workload below the
    gang's priority up to P with a pod in some rack lets that rack hold `count` pods."""
    demand = demand_of({GPU: 8})
    priority = {w.key: w.priority for w in ws}
    best: int | None = None
    for name in sorted({rack(n.name) for n in nodes}):
        inside = [n for n in nodes if rack(n.name) == name]
        touching = {p.workload for p in pods if rack(p.node) == name}
        for ceiling in sorted({priority[k] for k in touching} | {-1}):
            gone = {k for k in touching if priority[k] <= ceiling}
            room = 0
            for n in inside:
                free = dict(n.allocatable)
                for p in pods:
                    if p.node == n.name and p.workload not in gone:
                        free[GPU] -= 8
                        free["pods"] -= 1
                room += fit_count(free, demand)
            if room >= count:
                best = ceiling if best is None else min(best, ceiling)
                break
    return best


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_victims_are_whole_in_the_held_rack_and_of_the_lowest_ceiling(
    drawn: tuple[list[Node], Running, int],
) -> None:
    nodes, (ws, pods), count = drawn
    result = cycle([gang("ns/big", count, priority=10)], nodes, ws, pods)
    waiting = [p for p in result.pending if p.workload == "ns/big"]
    admitted = [a for a in result.admit if a.workload == "ns/big"]
    ceiling = _lowest_ceiling(nodes, ws, pods, count)
    if admitted:
        event("placed without preemption")
        (a,) = admitted
        assert len({rack(n) for x in a.assignments for n, _ in x.nodes}) == 1
        assert ceiling == -1  # it fitted without anyone leaving
        return
    (p,) = waiting
    if p.hold is None:
        event("no rack can be freed")
        assert ceiling is None
        assert not result.preempt
        return
    event("preempted")
    (held,) = held_racks(p)
    victims = victims_of(result)
    assert ceiling is not None and victims
    on = {w.key: {rack(q.node) for q in pods if q.workload == w.key} for w in ws}
    for v in victims:
        assert held in on[v]  # every victim has a pod in the chosen rack
    by_key = {w.key: w for w in ws}
    chosen = [Candidate(by_key[v], "b", {}) for v in victims]
    assert cost(chosen)[0] == ceiling  # KEP-5710's lowest ceiling over every rack
    assert all(by_key[v].priority < 10 for v in victims)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.integers(1, 3))
def test_no_room_is_promised_twice(drawn: tuple[list[Node], Running, int], second: int) -> None:
    nodes, (ws, pods), count = drawn
    pending = [gang("ns/big", count, priority=10), gang("ns/next", second, priority=5)]
    result = cycle(pending, nodes, ws, pods)
    leaving = set(victims_of(result))
    taken: Counter[str] = Counter(p.node for p in pods if p.workload not in leaving)
    for a in result.admit:
        for x in a.assignments:
            taken.update({n: c for n, c in x.nodes})
    for p in result.pending:
        if p.hold is not None:
            event("a hold")
            for x in p.hold.assignments:
                taken.update({n: c for n, c in x.nodes})
    assert all(n <= 1 for n in taken.values()), taken  # one 8-GPU pod per 8-GPU node


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_a_preferred_gang_climbs_past_a_rack_only_when_no_rack_can_be_freed(
    drawn: tuple[list[Node], Running, int],
) -> None:
    nodes, (ws, pods), count = drawn
    result = cycle([gang("ns/big", count, priority=10, mode="Preferred")], nodes, ws, pods)
    waiting = [p for p in result.pending if p.workload == "ns/big" and p.hold is not None]
    if not waiting:
        return
    racks = held_racks(waiting[0])
    event(f"held in {min(len(racks), 2)} rack(s)")
    if len(racks) > 1:
        assert _lowest_ceiling(nodes, ws, pods, count) is None


def test_block_level_labels_name_the_blocks() -> None:
    # The property above draws racks; the block level is one label too: a gang that must
    # sit in one block evicts in one block only.
    nodes = fabric(blocks=2, racks=2)
    ws, pods = full_fabric({"b0-r0": 2, "b0-r1": 2}, blocks=2, racks=2)
    result = cycle([gang("ns/big", 8, level=BLOCK)], nodes, ws, pods)
    assert {r.split("-")[0] for r in held_racks(pending_of(result, "ns/big"))} == {"b1"}
    assert len(victims_of(result)) == 4


def test_at_one_ceiling_a_rack_whose_victims_keep_their_budgets_is_chosen() -> None:
    nodes = fabric(blocks=1, racks=2)
    ws, pods = full_fabric({}, blocks=1, racks=2)
    # b0-r0 sorts first by name; its workloads' eviction would break a PodDisruptionBudget.
    guarded = {"ns/w0", "ns/w1"}
    ws = [replace(w, disrupts_budget=w.key in guarded) for w in ws]
    result = cycle([gang("ns/big", 4)], nodes, ws, pods)
    assert victims_of(result) == ["ns/w2", "ns/w3"]
    assert held_racks(pending_of(result, "ns/big")) == {"b0-r1"}
    # Without budgets, the tie goes to the rack first by name.
    ws = [replace(w, disrupts_budget=False) for w in ws]
    assert victims_of(cycle([gang("ns/big", 4)], nodes, ws, pods)) == ["ns/w0", "ns/w1"]


def test_a_gang_requiring_one_node_evicts_on_the_cheapest_node() -> None:
    nodes = fabric(blocks=1, racks=1, nodes=3)
    ws, pods = fill([(["b0-r0-n0"], 3, 0.0), (["b0-r0-n1"], 1, 0.0), (["b0-r0-n2"], 2, 0.0)])
    two_halves = gang("ns/pair", 2, gpus=4, level=HOSTNAME_LABEL)
    result = cycle([two_halves], nodes, ws, pods)
    assert victims_of(result) == ["ns/w1"]
    waiting = pending_of(result, "ns/pair")
    assert waiting.hold is not None
    assert [n for a in waiting.hold.assignments for n, _ in a.nodes] == ["b0-r0-n1"]
    assert "its room is held in node b0-r0-n1 of Topology fabric" in waiting.reason


def test_the_reason_counts_the_racks_the_queues_policies_keep_from_being_freed() -> None:
    nodes = fabric(blocks=1, racks=2)
    # The gang's own queue runs the lower-priority workloads, and may not preempt in itself.
    own: list[Workload] = []
    pods: list[BoundPod] = []
    for i, group in enumerate((["b0-r0-n0", "b0-r0-n1", "b0-r0-n2"], ["b0-r1-n0", "b0-r1-n1"])):
        w, bound = running(f"ns/own{i}", group, priority=0, queue_name="a")
        own.append(w)
        pods.extend(bound)
    full, full_pods = fill([(["b0-r0-n3"], 500, 0.0), (["b0-r1-n2", "b0-r1-n3"], 500, 0.0)])
    no_within = replace(A, within_queue="Never")
    result = cycle([gang("ns/big", 4)], nodes, [*own, *full], [*pods, *full_pods], (no_within, B))
    assert not result.preempt
    reason = pending_of(result, "ns/big").reason
    assert "no rack of Topology fabric can hold gang of 4 pods" in reason
    # Each rack keeps a priority-500 workload: evicting the spared ones frees neither.
    assert "would after evicting" not in reason
    # With the priority-500 workload of b0-r1 gone, that rack would do.
    result = cycle(
        [gang("ns/big", 4)], nodes, [*own, full[0]], [*pods, *full_pods[:1]], (no_within, B)
    )
    reason = pending_of(result, "ns/big").reason
    assert reason.endswith(
        "; 1 rack would after evicting lower-priority workloads; queue a's policies spare 2 of "
        "them (withinQueue: Never)"
    ), reason
    # A queue that may evict no one is not told (one reason per shape, whatever the priority).
    never = replace(A, within_queue="Never", reclaim="Never")
    result = cycle([gang("ns/big", 4)], nodes, [*own, full[0]], [*pods, *full_pods[:1]], (never, B))
    assert "would after evicting" not in pending_of(result, "ns/big").reason
