"""Properties of gang placement on random small clusters (hypothesis).

Edge values are drawn on purpose: no nodes, nodes with nothing allocatable or no pod slots,
pods requesting nothing, minimum counts of 0, 1 and all, not-Ready and cordoned nodes.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.model.nodes import Taint, Toleration
from quota.placement import (
    BoundPod,
    GangRequest,
    Node,
    NodeView,
    Placement,
    PodSetRequest,
    PodShape,
    Requirement,
    SelectorTerm,
    Strategy,
    Unplaceable,
    place_gang,
)
from quota.placement.nodes import demand_of, fit_count
from quota.placement.profiles import FILTERS

GPU = "nvidia.com/gpu"
HOSTNAME = "kubernetes.io/hostname"
TAINT = Taint("gpu", "true", "NoSchedule")

fast = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
strategies: st.SearchStrategy[Strategy] = st.sampled_from(("BinPack", "Spread"))


@st.composite
def clusters(draw: st.DrawFn, max_nodes: int = 6) -> tuple[list[Node], list[BoundPod]]:
    """Up to `max_nodes` nodes and some pods of other owners bound to them."""
    nodes = []
    for i in range(draw(st.integers(0, max_nodes))):
        allocatable = {
            GPU: draw(st.sampled_from((0, 1, 2, 4, 8))),
            "cpu": draw(st.sampled_from((0, 1_000, 4_000))),
            "pods": draw(st.sampled_from((0, 1, 2, 4, 110))),
        }
        labels = {HOSTNAME: f"n{i}"}
        if draw(st.booleans()):
            labels["pool"] = draw(st.sampled_from(("a", "b")))
        nodes.append(
            Node(
                f"n{i}",
                allocatable,
                labels,
                (TAINT,) if draw(st.integers(0, 4)) == 0 else (),
                unschedulable=draw(st.integers(0, 5)) == 0,
                ready=draw(st.integers(0, 5)) != 0,
            )
        )
    pods = []
    if nodes:
        for i in range(draw(st.integers(0, 8))):
            on = draw(st.sampled_from(nodes)).name
            requests = {
                GPU: draw(st.sampled_from((0, 1, 2, 4))),
                "cpu": draw(st.sampled_from((0, 500, 1_000))),
            }
            pods.append(BoundPod(f"other/p{i}", on, requests))
    return nodes, pods


@st.composite
def shapes(draw: st.DrawFn) -> PodShape:
    selector = {}
    pool = draw(st.sampled_from((None, "a", "b")))
    if pool:
        selector["pool"] = pool
    if draw(st.integers(0, 5)) == 0:
        selector[HOSTNAME] = "n1"  # one node, matched node by node
    terms = [
        SelectorTerm((Requirement("pool", "NotIn", ("a",)),)),
        SelectorTerm((Requirement(HOSTNAME, "NotIn", ("n0",)),)),
        SelectorTerm((Requirement("metadata.name", "In", ("n2", "n3"), field=True),)),
    ]
    affinity = tuple(draw(st.lists(st.sampled_from(terms), max_size=2, unique=True)))
    gpus = draw(st.sampled_from((0, 1, 2, 8, 9)))
    return PodShape(
        {GPU: gpus, "cpu": draw(st.sampled_from((0, 500, 2_000)))},
        selector,
        affinity,
        (Toleration("gpu", "Exists"),) if draw(st.booleans()) else (),
    )


def _minimum(draw: st.DrawFn, count: int) -> int | None:
    return draw(st.sampled_from((None, 0, min(1, count), count)))


@st.composite
def gangs(draw: st.DrawFn, max_sets: int = 3) -> GangRequest:
    pod_sets = []
    for i in range(draw(st.integers(1, max_sets))):
        count = draw(st.integers(0, 6))
        pod_sets.append(PodSetRequest(f"s{i}", count, draw(shapes()), _minimum(draw, count)))
    total = sum(ps.count for ps in pod_sets)
    return GangRequest(tuple(pod_sets), _minimum(draw, total))


def floors(request: GangRequest) -> tuple[dict[str, int], int]:
    """The minimums a placement must meet, spelled out from the GangRequest docstring."""
    out = {}
    for ps in request.pod_sets:
        if ps.min_count is not None:
            out[ps.name] = ps.min_count
        else:
            out[ps.name] = ps.count if request.min_count is None else 0
    return out, max(request.min_count or 0, sum(out.values()))


def usable(node: Node, shape: PodShape) -> bool:
    """Node by node, every filter of the profiles (placement runs them once per node class)."""
    return all(f.passes(node, shape) for f in FILTERS)


def room_for(nodes: list[Node], free: dict[str, dict[str, int]], shape: PodShape) -> int:
    """Brute force: how many pods of `shape` the nodes could take, node by node."""
    demand = demand_of(shape.requests)
    return sum(fit_count(free[n.name], demand) for n in nodes if usable(n, shape))


def with_bound(pods: list[BoundPod], placement: Placement, tag: str) -> list[BoundPod]:
    """`pods` plus the placement's pods as if they had been bound."""
    out = list(pods)
    for pod_set, pairs in placement.nodes.items():
        for node_name, count in pairs:
            for i in range(count):
                key = f"{tag}/{pod_set}-{node_name}-{i}"
                out.append(BoundPod(key, node_name, placement.requests[pod_set]))
    return out


@fast
@given(clusters(), gangs(), strategies)
def test_a_placement_fits_the_free_room_and_meets_every_minimum(
    cluster: tuple[list[Node], list[BoundPod]], request: GangRequest, strategy: Strategy
) -> None:
    nodes, pods = cluster
    view = NodeView(nodes, pods)
    before = view.free_by_node()
    result = place_gang(view, request, strategy)
    assert view.free_by_node() == before  # placing alone never takes room
    if isinstance(result, Unplaceable):
        assert result.reason
        return
    for node_name, used in result.usage().items():
        for resource, amount in used.items():
            assert amount <= before[node_name].get(resource, 0), (node_name, resource)
    pod_floors, gang_floor = floors(request)
    for ps in request.pod_sets:
        assert pod_floors[ps.name] <= result.count(ps.name) <= ps.count
        for node_name, count in result.nodes[ps.name]:
            assert count > 0 and usable(view.node(node_name), ps.shape)
    assert result.total == sum(result.count(ps.name) for ps in request.pod_sets)
    assert result.total >= gang_floor
    if request.min_count is None and all(ps.min_count is None for ps in request.pod_sets):
        assert result.total == request.count


@fast
@given(clusters(), shapes(), st.integers(0, 12), st.booleans(), strategies)
def test_one_pod_set_is_refused_only_when_the_nodes_really_lack_room(
    cluster: tuple[list[Node], list[BoundPod]],
    shape: PodShape,
    count: int,
    partial: bool,
    strategy: Strategy,
) -> None:
    nodes, pods = cluster
    view = NodeView(nodes, pods)
    room = room_for(nodes, view.free_by_node(), shape)
    minimum = min(1, count) if partial else None
    result = place_gang(view, GangRequest((PodSetRequest("w", count, shape, minimum),)), strategy)
    if partial:
        # Partial placement takes as many pods as there is room for, up to all of them.
        assert isinstance(result, Placement) == (room >= (minimum or 0))
        if isinstance(result, Placement):
            assert result.total == min(count, room)
    else:
        assert isinstance(result, Placement) == (room >= count), (room, result)


@fast
@given(clusters(), gangs(), strategies)
def test_never_means_not_even_on_emptied_nodes(
    cluster: tuple[list[Node], list[BoundPod]], request: GangRequest, strategy: Strategy
) -> None:
    nodes, pods = cluster
    result = place_gang(NodeView(nodes, pods), request, strategy)
    if isinstance(result, Unplaceable) and result.never:
        assert isinstance(place_gang(NodeView(nodes), request, strategy), Unplaceable)


@fast
@given(clusters(), gangs(), gangs(), strategies)
def test_assume_then_forget_restores_the_view_and_its_order(
    cluster: tuple[list[Node], list[BoundPod]],
    request: GangRequest,
    probe: GangRequest,
    strategy: Strategy,
) -> None:
    nodes, pods = cluster
    view = NodeView(nodes, pods)
    before = view.free_by_node()
    result = place_gang(view, request, strategy)
    if not isinstance(result, Placement):
        return
    view.assume(result)
    # After assuming, the view decides as one built with those pods bound would.
    bound = NodeView(nodes, with_bound(pods, result, "assumed"))
    assert view.free_by_node() == bound.free_by_node()
    assert place_gang(view, probe, strategy) == place_gang(bound, probe, strategy)
    view.forget(result)
    assert view.free_by_node() == before
    assert place_gang(view, probe, strategy) == place_gang(NodeView(nodes, pods), probe, strategy)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), gangs(max_sets=2), strategies),
        st.tuples(st.just("forget"), st.integers(0, 5)),
        st.tuples(st.just("remove"), st.integers(0, 10)),
        st.tuples(st.just("place-and-drop"), gangs(max_sets=2), strategies),
    ),
    max_size=8,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), operations, gangs(), strategies)
def test_a_long_lived_view_decides_like_a_fresh_one(
    cluster: tuple[list[Node], list[BoundPod]],
    ops: list[tuple[object, ...]],
    probe: GangRequest,
    strategy: Strategy,
) -> None:
    nodes, pods = cluster
    view = NodeView(nodes, pods)
    bound = list(pods)
    assumed: list[Placement] = []
    for step, op in enumerate(ops):
        if op[0] == "place":
            request, how = op[1], op[2]
            assert isinstance(request, GangRequest) and how in ("BinPack", "Spread")
            result = place_gang(view, request, how)
            if isinstance(result, Placement):
                view.assume(result)
                assumed.append(result)
        elif op[0] == "place-and-drop":
            request, how = op[1], op[2]
            assert isinstance(request, GangRequest) and how in ("BinPack", "Spread")
            place_gang(view, request, how)  # found, never assumed: must leave no trace
        elif op[0] == "forget" and assumed:
            assert isinstance(op[1], int)
            view.forget(assumed.pop(op[1] % len(assumed)))
        elif op[0] == "remove" and bound:
            assert isinstance(op[1], int)
            pod = bound.pop(op[1] % len(bound))
            assert view.remove_pod(pod.key) == pod
        fresh_pods = list(bound)
        for i, placement in enumerate(assumed):
            fresh_pods = with_bound(fresh_pods, placement, f"a{step}-{i}")
        fresh = NodeView(nodes, fresh_pods)
        assert view.free_by_node() == fresh.free_by_node()
        assert place_gang(view, probe, strategy) == place_gang(fresh, probe, strategy)


@fast
@given(clusters(max_nodes=12), st.sampled_from((1, 2, 4)), st.booleans(), strategies)
def test_binpack_takes_the_fullest_fitting_node_and_spread_the_emptiest(
    cluster: tuple[list[Node], list[BoundPod]], gpus: int, avoid_n0: bool, strategy: Strategy
) -> None:
    nodes, pods = cluster
    # Plenty of pod slots, so GPUs are what is scarce; one class, so order is all that counts.
    nodes = [Node(n.name, {**n.allocatable, "pods": 110}, {HOSTNAME: n.name}) for n in nodes]
    view = NodeView(nodes, pods)
    # Naming a node in the affinity makes placement skip it in the class index (8 nodes or
    # more) or judge the others one by one (fewer).
    avoid = (SelectorTerm((Requirement(HOSTNAME, "NotIn", ("n0",)),)),)
    shape = PodShape({GPU: gpus}, affinity=avoid if avoid_n0 else ())
    result = place_gang(view, GangRequest((PodSetRequest("w", 1, shape),)), strategy)
    free = view.free_by_node()
    fitting = [
        free[n.name][GPU]
        for n in nodes
        if usable(n, shape) and fit_count(free[n.name], demand_of(shape.requests))
    ]
    if not fitting:
        assert isinstance(result, Unplaceable)
        return
    assert isinstance(result, Placement)
    ((chosen, _),) = result.nodes["w"]
    expected = min(fitting) if strategy == "BinPack" else max(fitting)
    assert free[chosen][GPU] == expected


@fast
@given(clusters(), st.sampled_from(("n0", "n1", "n9")), st.booleans(), strategies)
def test_a_pod_pinned_to_a_node_lands_there_or_nowhere(
    cluster: tuple[list[Node], list[BoundPod]], target: str, by_field: bool, strategy: Strategy
) -> None:
    nodes, pods = cluster
    # Alike but for their names: every node shares one class.
    nodes = [Node(n.name, n.allocatable, {HOSTNAME: n.name}) for n in nodes]
    if by_field:
        pin = Requirement("metadata.name", "In", (target,), field=True)
        shape = PodShape({GPU: 1}, affinity=(SelectorTerm((pin,)),))
    else:
        shape = PodShape({GPU: 1}, {HOSTNAME: target})
    view = NodeView(nodes, pods)
    result = place_gang(view, GangRequest((PodSetRequest("w", 2, shape),)), strategy)
    if isinstance(result, Placement):
        assert result.nodes["w"] == ((target, 2),)
    else:
        free = view.free_by_node().get(target)
        assert free is None or fit_count(free, demand_of(shape.requests)) < 2


@fast
@given(clusters(), st.sampled_from((1, 2, 3)), st.integers(1, 16), strategies)
def test_a_gang_lands_where_its_pods_would_one_at_a_time(
    cluster: tuple[list[Node], list[BoundPod]], gpus: int, count: int, strategy: Strategy
) -> None:
    nodes, pods = cluster
    # GPUs stay the scarcest resource throughout, so each lone pod is judged as the gang is.
    nodes = [Node(n.name, {**n.allocatable, "pods": 110}, n.labels) for n in nodes]
    shape = PodShape({GPU: gpus})
    view = NodeView(nodes, pods)
    whole = place_gang(view, GangRequest((PodSetRequest("w", count, shape),)), strategy)
    one_by_one: dict[str, int] = {}
    for _ in range(count):
        single = place_gang(view, GangRequest((PodSetRequest("w", 1, shape),)), strategy)
        if not isinstance(single, Placement):
            assert isinstance(whole, Unplaceable)
            return
        view.assume(single)
        ((node_name, _),) = single.nodes["w"]
        one_by_one[node_name] = one_by_one.get(node_name, 0) + 1
    assert isinstance(whole, Placement)
    assert dict(whole.nodes["w"]) == one_by_one
