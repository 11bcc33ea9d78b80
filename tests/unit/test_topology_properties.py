"""Properties of placement inside topology domains, on random blocks of racks (hypothesis).

The oracle is brute force: a domain takes as many pods of one shape as the sum over its
nodes of free // request, counted from the nodes and the bound pods directly. Edge values are
drawn on purpose: one-node racks, racks whose nodes are all busy or not Ready (empty
levels), gangs exactly the size of a rack, pods asking for nothing, labels per node.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.api.names import HOSTNAME_LABEL
from quota.model.nodes import BoundPod, Node
from quota.placement import (
    GangRequest,
    NodeView,
    Placement,
    PodSetRequest,
    PodShape,
    Strategy,
    place_gang,
)
from quota.placement.nodes import demand_of, fit_count
from quota.placement.topology import DomainRequest, domain_request

GPU = "nvidia.com/gpu"
BLOCK = "example.com/block"
RACK = "example.com/rack"
LEVELS = (BLOCK, RACK, HOSTNAME_LABEL)
DEPTH = {BLOCK: 0, RACK: 1, HOSTNAME_LABEL: 2}

fast = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
strategies: st.SearchStrategy[Strategy] = st.sampled_from(("BinPack", "Spread"))

Cluster = tuple[list[Node], list[BoundPod], bool]


@st.composite
def fabrics(draw: st.DrawFn) -> Cluster:
    """Blocks of racks of nodes (1 to 3 of each), other owners' pods, some nodes not Ready or
    without the labels, and sometimes the rack label per node (each its own class)."""
    nodes = []
    for b in range(draw(st.integers(1, 3))):
        for r in range(draw(st.integers(1, 3))):
            for n in range(draw(st.integers(1, 3))):
                labels = {BLOCK: f"b{b}", RACK: f"b{b}-r{r}"}
                if draw(st.integers(0, 9)) == 0:
                    labels.pop(draw(st.sampled_from((BLOCK, RACK))))
                nodes.append(
                    Node(
                        f"b{b}-r{r}-n{n}",
                        {GPU: draw(st.sampled_from((0, 2, 4, 8))), "pods": 110},
                        labels,
                        ready=draw(st.integers(0, 7)) != 0,
                    )
                )
    pods = [
        BoundPod(
            f"other/p{i}",
            draw(st.sampled_from(nodes)).name,
            {GPU: draw(st.sampled_from((1, 2, 4)))},
        )
        for i in range(draw(st.integers(0, 10)))
    ]
    return nodes, pods, draw(st.booleans())


@st.composite
def requests(draw: st.DrawFn) -> tuple[DomainRequest, int, int]:
    """A request, a pod count and the GPUs per pod (0: pods asking for nothing)."""
    mode = draw(st.sampled_from(("Required", "Preferred", "Unconstrained")))
    level = None if mode == "Unconstrained" else draw(st.sampled_from(LEVELS))
    size: int | None = None
    slice_level: str | None = None
    count = draw(st.integers(0, 12))
    if draw(st.booleans()):
        size = draw(st.integers(1, 4))
        count = count // size * size
        deeper = [x for x in LEVELS if level is None or DEPTH[x] >= DEPTH[level]]
        slice_level = draw(st.sampled_from(deeper))
    found = domain_request("fabric", LEVELS, mode, level, size, slice_level)
    assert isinstance(found, DomainRequest)
    return found, count, draw(st.sampled_from((0, 1, 2, 4, 8)))


def view_of(cluster: Cluster) -> NodeView:
    nodes, pods, rack_per_node = cluster
    per_node = (HOSTNAME_LABEL, RACK) if rack_per_node else (HOSTNAME_LABEL,)
    return NodeView(nodes, pods, per_node_labels=per_node)


def domain_of(node: Node, depth: int) -> tuple[str, ...] | None:
    """The node's domain at `depth` (its path of label values), None outside the topology."""
    path = []
    for label in LEVELS[: depth + 1]:
        value = node.name if label == HOSTNAME_LABEL else node.labels.get(label)
        if value is None:
            return None
        path.append(value)
    return tuple(path)


def room(cluster: Cluster, gpus: int) -> dict[str, int]:
    """Pods of `gpus` GPUs each Ready node takes, from the nodes and bound pods directly."""
    nodes, pods, _ = cluster
    used: Counter[str] = Counter()
    slots: Counter[str] = Counter()
    for pod in pods:
        used[pod.node] += pod.requests[GPU]
        slots[pod.node] += 1
    demand = demand_of({GPU: gpus})
    return {
        n.name: fit_count(
            {GPU: n.allocatable[GPU] - used[n.name], "pods": 110 - slots[n.name]}, demand
        )
        for n in nodes
        if n.ready and domain_of(n, 1) is not None
    }


def capacities(
    cluster: Cluster, gpus: int, depth: int, request: DomainRequest
) -> Counter[tuple[str, ...]]:
    """Pods each domain at `depth` (-1: the whole topology) takes as the request counts
    them: in whole slices, each counted in its domain at the slice level."""
    by_node = {n.name: n for n in cluster[0]}
    size = request.slice_size or 1
    at = depth if request.slice_level is None else request.slice_level
    per_slice_domain: Counter[tuple[str, ...]] = Counter()
    for name, pods in room(cluster, gpus).items():
        path = domain_of(by_node[name], at)
        assert path is not None
        per_slice_domain[path] += pods
    out: Counter[tuple[str, ...]] = Counter()
    for path, pods in per_slice_domain.items():
        out[path[: depth + 1]] += pods // size * size
    return out


def gang(request: DomainRequest, count: int, gpus: int) -> GangRequest:
    shape = PodShape({GPU: gpus} if gpus else {})
    return GangRequest((PodSetRequest("main", count, shape, None, request),))


def domains_used(cluster: Cluster, placed: Placement, depth: int) -> set[tuple[str, ...] | None]:
    by_node = {n.name: n for n in cluster[0]}
    return {domain_of(by_node[name], depth) for name, _ in placed.nodes["main"]}


@fast
@given(fabrics(), requests(), strategies)
def test_placement_keeps_every_promise_of_the_request(
    cluster: Cluster, asked: tuple[DomainRequest, int, int], strategy: Strategy
) -> None:
    request, count, gpus = asked
    placed = place_gang(view_of(cluster), gang(request, count, gpus), strategy)
    level = request.level
    required = level if request.required and level is not None else None
    fits = capacities(cluster, gpus, -1 if required is None else required, request)
    # Placed exactly when the brute-force count says some domain can hold the gang.
    assert isinstance(placed, Placement) == (not count or max(fits.values(), default=0) >= count)
    if not isinstance(placed, Placement) or not count:
        return
    assert placed.total == count
    free = room(cluster, gpus)
    for name, n in placed.nodes["main"]:
        assert n <= free[name]  # others' bound pods counted; only Ready nodes in the topology
    if required is not None:
        # Every pod in one domain at the level, and the fullest domain that fits.
        (used,) = domains_used(cluster, placed, required)
        assert used is not None
        assert fits[used] == min(c for c in fits.values() if c >= count)
    elif level is not None:
        # Preferred: in one domain at the lowest level that has one holding them all.
        for depth in range(level, -1, -1):
            if max(capacities(cluster, gpus, depth, request).values(), default=0) >= count:
                assert len(domains_used(cluster, placed, depth)) == 1
                break
    if request.slice_level is not None:
        size = request.slice_size or 1
        by_node = {n.name: n for n in cluster[0]}
        order = [domain_of(by_node[name], request.slice_level) for name in placed.pod_nodes("main")]
        for start in range(0, count, size):
            assert len(set(order[start : start + size])) == 1  # each slice in one domain


@fast
@given(fabrics(), st.lists(requests(), min_size=1, max_size=4))
def test_gangs_placed_one_after_another_never_share_room(
    cluster: Cluster, asks: list[tuple[DomainRequest, int, int]]
) -> None:
    view = view_of(cluster)
    taken: Counter[str] = Counter()
    ours: set[str] = set()
    for request, count, gpus in asks:
        placed = place_gang(view, gang(request, count, gpus))
        if isinstance(placed, Placement):
            view.assume(placed)
            for name, n in placed.nodes["main"]:
                taken[name] += n * gpus
                ours.add(name)
    nodes, pods, _ = cluster
    for pod in pods:
        taken[pod.node] += pod.requests[GPU]
    for node in nodes:
        left = view.free(node.name)[GPU]
        assert left == node.allocatable[GPU] - taken[node.name]  # every pod counted once
        if node.name in ours:
            # No room promised twice: what the gangs took was free beside the bound pods.
            assert view.free(node.name)["pods"] >= 0
            assert left >= 0 or taken[node.name] == sum(
                p.requests[GPU] for p in pods if p.node == node.name
            )
