"""Dispatch to many clusters: an admitted gang goes, whole, to the one worker cluster where it
fits now (the fullest such), or waits with every cluster and why it does not fit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.dispatch import (
    NO_WORKERS,
    Dispatched,
    NoCluster,
    WorkerState,
    admitted_gang,
    choose_cluster,
    worker_view,
)
from quota.model.nodes import BoundPod, Node, PodShape, Taint, Toleration
from quota.model.snapshot import Assignment, Flavor, PodSet, PodSetTopology, Workload
from quota.placement import GangRequest, NodeView, Placement, PodSetRequest, place_gang
from quota.placement.nodes import HOSTNAME_LABEL

GPU = "nvidia.com/gpu"
CPU = "cpu"
FLAVOR_LABEL = "example.com/gpu"
BLOCK = "example.com/block"
H100 = Flavor("h100", {FLAVOR_LABEL: "h100"})
CPU_FLAVOR = Flavor("cpu", {FLAVOR_LABEL: "none"})
FLAVORS: Mapping[str, Flavor] = {"h100": H100, "cpu": CPU_FLAVOR}


def node(
    name: str,
    gpus: int = 8,
    cpu: int = 64_000,
    pods: int = 110,
    flavor: str = "h100",
    labels: Mapping[str, str] | None = None,
) -> Node:
    allocatable = {CPU: cpu, "pods": pods}
    if gpus:
        allocatable[GPU] = gpus
    return Node(
        name,
        allocatable,
        {FLAVOR_LABEL: flavor, HOSTNAME_LABEL: name, **(labels or {})},
    )


def gang(
    key: str = "ns/train",
    *sets: tuple[str, int, Mapping[str, int], str],
    **fields: object,
) -> Workload:
    """An admitted workload: (pod set, pods, per-pod requests, flavor) each."""
    sets = sets or (("workers", 4, {GPU: 1}, "h100"),)
    pod_sets = tuple(PodSet(name, count, dict(req)) for name, count, req, _ in sets)
    admission = tuple(
        Assignment(name, count, {r: flavor for r in req}) for name, count, req, flavor in sets
    )
    return Workload(key, "team", 0, 0.0, pod_sets, admission=admission, **fields)  # type: ignore[arg-type]


def pods_on(
    node_name: str, n: int, gpus: int, prefix: str, workload: str | None = None
) -> tuple[BoundPod, ...]:
    return tuple(
        BoundPod(f"ns/{prefix}-{node_name}-{i}", node_name, {GPU: gpus}, workload) for i in range(n)
    )


def sent(pod_set: str, requests: Mapping[str, int], *pairs: tuple[str, int]) -> Placement:
    """The placement a gang was sent with."""
    return Placement({pod_set: tuple(pairs)}, sum(n for _, n in pairs), {pod_set: dict(requests)})


def dispatched(result: Dispatched | NoCluster) -> Dispatched:
    assert isinstance(result, Dispatched), result
    return result


def refused(result: Dispatched | NoCluster) -> NoCluster:
    assert isinstance(result, NoCluster), result
    return result


# -- no cluster ---------------------------------------------------------------------------


def test_no_worker_cluster_at_all_says_the_selector_picks_none() -> None:
    out = refused(choose_cluster(gang(), FLAVORS, []))
    assert out.reason == NO_WORKERS
    assert out.clusters == ()


def test_unavailable_workers_are_never_chosen_and_are_named_with_why() -> None:
    workers = [
        WorkerState("east", (node("e1"),), available=False, why="unreachable for 40s"),
        WorkerState("west", (node("w1"),), available=False, why="lost (no answer for 2m)"),
    ]
    out = refused(choose_cluster(gang(), FLAVORS, workers))
    assert "east: unreachable for 40s" in out.reason
    assert "west: lost (no answer for 2m)" in out.reason
    assert not out.never, "an unreachable worker may come back"


def test_an_available_worker_is_chosen_over_an_unavailable_emptier_one() -> None:
    workers = [
        WorkerState("big", (node("b1"), node("b2")), available=False, why="unreachable for 40s"),
        WorkerState("small", (node("s1", gpus=4),)),
    ]
    assert dispatched(choose_cluster(gang(), FLAVORS, workers)).cluster == "small"


def test_a_worker_without_nodes_does_not_fit_and_says_so() -> None:
    workers = [WorkerState("empty", ()), WorkerState("one", (node("o1", gpus=4),))]
    out = dispatched(choose_cluster(gang(), FLAVORS, workers))
    assert out.cluster == "one"
    alone = refused(choose_cluster(gang(), FLAVORS, [WorkerState("empty", ())]))
    assert (
        alone.reason
        == "no worker cluster can take the whole gang of 4 pods now: empty: there are no nodes"
    )


def test_a_gang_that_fits_only_split_across_two_clusters_is_not_sent() -> None:
    workers = [WorkerState("a", (node("a1", gpus=4),)), WorkerState("b", (node("b1", gpus=4),))]
    out = refused(
        choose_cluster(gang("ns/big", ("workers", 8, {GPU: 1}, "h100")), FLAVORS, workers)
    )
    assert "a, b: gang of 8 pods" in out.reason, "same reason, named together"
    assert dict(out.clusters).keys() == {"a", "b"}
    assert out.never, "neither could ever hold 8 GPUs"


def test_reasons_go_shortest_first_and_stay_bounded() -> None:
    workers = [WorkerState(f"w{i:03}", (), available=False, why="x" * (i + 1)) for i in range(300)]
    out = refused(choose_cluster(gang(), FLAVORS, workers))
    assert len(out.reason) < 2000
    assert out.reason.index("w000: x;") < out.reason.index("w001: xx;")
    assert "more: longer reasons, left out here" in out.reason
    assert len(out.clusters) == 300, "every cluster's own reason is kept apart"


def test_one_reason_for_many_workers_names_a_few_and_counts_the_rest() -> None:
    workers = [WorkerState(f"w{i:02}", ()) for i in range(20)]
    out = refused(choose_cluster(gang(), FLAVORS, workers))
    assert out.reason.endswith("w00, w01, w02, w03, w04, w05 and 14 more: there are no nodes")


# -- bin-packing among clusters -------------------------------------------------------------


def test_the_fullest_cluster_that_fits_is_chosen_so_big_gangs_find_empty_ones() -> None:
    busy = WorkerState("busy", (node("b1"),), pods_on("b1", 4, 1, "other"))
    empty = WorkerState("empty", (node("e1"),))
    out = dispatched(choose_cluster(gang(), FLAVORS, [empty, busy]))
    assert out.cluster == "busy"
    assert out.placement.nodes == {"workers": (("b1", 4),)}
    assert "leaves 0 nvidia.com/gpu free" in out.reason
    assert "next: empty, which would leave 4 nvidia.com/gpu" in out.reason
    # Now busy is full; the next gang of 8 still finds the whole empty cluster.
    full = WorkerState("busy", busy.nodes, busy.pods, {"ns/train": out.placement})
    big = gang("ns/big", ("workers", 8, {GPU: 1}, "h100"))
    assert dispatched(choose_cluster(big, FLAVORS, [empty, full])).cluster == "empty"


def test_equal_room_left_goes_by_cluster_name() -> None:
    workers = [WorkerState(name, (node(f"{name}1"),)) for name in ("zeta", "alpha", "mid")]
    assert dispatched(choose_cluster(gang(), FLAVORS, workers)).cluster == "alpha"


def test_room_is_measured_on_the_nodes_the_gang_may_use() -> None:
    # "cpu-heavy" has many GPUs on nodes of another flavor: they do not make it emptier.
    heavy = WorkerState("cpu-heavy", (node("c1", gpus=4), node("c2", gpus=64, flavor="a100")))
    roomy = WorkerState("roomy", (node("r1", gpus=6),))
    out = dispatched(choose_cluster(gang(), FLAVORS, [roomy, heavy]))
    assert out.cluster == "cpu-heavy"


# -- reservations of gangs sent before ------------------------------------------------------


def test_room_of_a_gang_sent_and_not_bound_yet_stays_taken() -> None:
    earlier = sent("workers", {GPU: 1}, ("a1", 8))
    a = WorkerState("a", (node("a1"),), (), {"ns/earlier": earlier})
    b = WorkerState("b", (node("b1", gpus=4),))
    assert dispatched(choose_cluster(gang(), FLAVORS, [a, b])).cluster == "b"
    out = refused(choose_cluster(gang(), FLAVORS, [a]))
    assert out.reason.startswith("no worker cluster can take the whole gang of 4 pods now: a: ")


def test_part_bound_gangs_reserve_only_their_unbound_rest() -> None:
    earlier = sent("workers", {GPU: 1}, ("a1", 8))
    half = pods_on("a1", 4, 1, "earlier", "ns/earlier")
    a = WorkerState("a", (node("a1"),), half, {"ns/earlier": earlier})
    # 4 bound + 4 reserved: the node is full, not overfull by double counting.
    assert isinstance(choose_cluster(gang(), FLAVORS, [a]), NoCluster)
    view = worker_view(a)
    assert view.free("a1")[GPU] == 0


def test_pods_once_bound_are_not_counted_again_with_their_reservation() -> None:
    earlier = sent("workers", {GPU: 1}, ("a1", 4))
    bound = pods_on("a1", 4, 1, "earlier", "ns/earlier")
    a = WorkerState("a", (node("a1"),), bound, {"ns/earlier": earlier})
    out = dispatched(choose_cluster(gang(), FLAVORS, [a]))
    assert out.placement.nodes == {"workers": (("a1", 4),)}


def test_a_gang_bound_off_its_plan_shortens_the_reservation() -> None:
    # The worker's scheduler placed the earlier gang's pods elsewhere than planned.
    earlier = sent("workers", {GPU: 1}, ("a1", 4))
    moved = pods_on("a2", 4, 1, "earlier", "ns/earlier")
    a = WorkerState("a", (node("a1", gpus=4), node("a2", gpus=4)), moved, {"ns/earlier": earlier})
    out = dispatched(choose_cluster(gang(), FLAVORS, [a]))
    assert out.placement.nodes == {"workers": (("a1", 4),)}


def test_the_gang_being_sent_does_not_reserve_against_itself() -> None:
    own = sent("workers", {GPU: 1}, ("a1", 4))
    a = WorkerState("a", (node("a1", gpus=4),), (), {"ns/train": own})
    assert dispatched(choose_cluster(gang(), FLAVORS, [a])).cluster == "a"


# -- the gang as one cluster places it -------------------------------------------------------


def test_every_pod_set_goes_to_the_same_cluster() -> None:
    two = gang(
        "ns/mpi",
        ("launcher", 1, {CPU: 8_000}, "cpu"),
        ("workers", 4, {GPU: 2}, "h100"),
    )
    gpus_only = WorkerState("gpus-only", (node("g1"),))
    both = WorkerState("both", (node("n1"), node("c1", gpus=0, flavor="none")))
    out = dispatched(choose_cluster(two, FLAVORS, [gpus_only, both]))
    assert out.cluster == "both"
    assert out.placement.nodes == {"launcher": (("c1", 1),), "workers": (("n1", 4),)}
    alone = refused(choose_cluster(two, FLAVORS, [gpus_only]))
    assert "pod set launcher" in alone.reason


def test_flavor_taints_tolerations_and_pod_selectors_apply_in_each_cluster() -> None:
    tainted = Flavor(
        "h100",
        {FLAVOR_LABEL: "h100"},
        (Taint(GPU, "", "NoSchedule"),),
        (Toleration(GPU, "Exists", effect="NoSchedule"),),
    )
    tainted_node = Node("t1", {GPU: 8, "pods": 10}, {FLAVOR_LABEL: "h100"}, (Taint(GPU),))
    other_taint = Node("x1", {GPU: 8, "pods": 10}, {FLAVOR_LABEL: "h100"}, (Taint("dedicated"),))
    workers = [WorkerState("t", (tainted_node,)), WorkerState("x", (other_taint,))]
    out = choose_cluster(gang(), {"h100": tainted}, workers)
    assert dispatched(out).cluster == "t"
    # The pod's own selector: only a cluster with nodes in zone b fits.
    w = gang()
    zoned = Workload(
        w.key,
        w.queue,
        0,
        0.0,
        (PodSet("workers", 4, {GPU: 1}, node_selector={"zone": "b"}),),
        admission=w.admission,
    )
    workers = [
        WorkerState("za", (node("a1", labels={"zone": "a"}),)),
        WorkerState("zb", (node("b1", labels={"zone": "b"}),)),
    ]
    assert dispatched(choose_cluster(zoned, FLAVORS, workers)).cluster == "zb"


def test_topology_requests_are_kept_inside_one_domain_of_one_cluster() -> None:
    topo = Flavor("h100", {FLAVOR_LABEL: "h100"}, topology="gpu-blocks")
    topologies = {"gpu-blocks": (BLOCK, HOSTNAME_LABEL)}
    w = gang("ns/tight", ("workers", 8, {GPU: 1}, "h100"))
    block = PodSetTopology("Required", BLOCK)
    w = Workload(
        w.key,
        w.queue,
        0,
        0.0,
        (PodSet("workers", 8, {GPU: 1}, topology=block),),
        admission=w.admission,
    )
    split = WorkerState(
        "split",
        (node("s1", gpus=4, labels={BLOCK: "b1"}), node("s2", gpus=4, labels={BLOCK: "b2"})),
    )
    whole = WorkerState(
        "whole",
        (
            node("w1", gpus=4, labels={BLOCK: "b1"}),
            node("w2", gpus=4, labels={BLOCK: "b1"}),
            node("w3", gpus=4, labels={BLOCK: "b2"}),
        ),
    )
    flat = WorkerState("flat", (node("f1", gpus=16),))  # no block labels: outside the topology
    out = dispatched(choose_cluster(w, {"h100": topo}, [split, flat, whole], topologies=topologies))
    assert out.cluster == "whole"
    assert {n for n, _ in out.placement.nodes["workers"]} == {"w1", "w2"}
    none = refused(choose_cluster(w, {"h100": topo}, [split, flat], topologies=topologies))
    assert {"split", "flat"} == dict(none.clusters).keys()
    # A flavor naming a Topology no one knows: no cluster can honour it.
    unknown = refused(choose_cluster(w, {"h100": topo}, [whole]))
    assert "names Topology gpu-blocks, which does not exist" in unknown.reason
    assert unknown.never


def test_spread_strategy_spreads_pods_inside_the_chosen_cluster() -> None:
    workers = [WorkerState("a", (node("a1"), node("a2")))]
    out = dispatched(choose_cluster(gang(), FLAVORS, workers, strategy="Spread"))
    assert out.placement.nodes == {"workers": (("a1", 2), ("a2", 2))} or out.placement.nodes == {
        "workers": (("a2", 2), ("a1", 2))
    }


def test_partial_admission_places_the_admitted_count() -> None:
    w = gang()
    fewer = Workload(
        w.key,
        w.queue,
        0,
        0.0,
        (PodSet("workers", 8, {GPU: 1}, min_count=2),),
        admission=(Assignment("workers", 3, {GPU: "h100"}),),
    )
    out = dispatched(choose_cluster(fewer, FLAVORS, [WorkerState("a", (node("a1", gpus=3),))]))
    assert out.placement.count("workers") == 3


def test_bad_input_is_refused_with_the_rule() -> None:
    w = gang()
    pending = Workload(w.key, w.queue, 0, 0.0, w.pod_sets)
    with pytest.raises(ValueError, match="ns/train is not admitted"):
        choose_cluster(pending, FLAVORS, [WorkerState("a", (node("a1"),))])
    with pytest.raises(ValueError, match="worker cluster a is listed twice"):
        choose_cluster(w, FLAVORS, [WorkerState("a"), WorkerState("a")])
    with pytest.raises(ValueError, match="unknown placement strategy"):
        choose_cluster(w, FLAVORS, [WorkerState("a")], strategy="Tight")  # type: ignore[arg-type]


def test_a_worker_whose_state_is_inconsistent_is_skipped_with_the_error() -> None:
    twice = WorkerState("bad", (node("n1"), node("n1")))
    good = WorkerState("good", (node("g1"),))
    assert dispatched(choose_cluster(gang(), FLAVORS, [twice, good])).cluster == "good"
    out = refused(choose_cluster(gang(), FLAVORS, [twice]))
    assert "bad: its nodes and pods cannot be read: node n1 appears twice" in out.reason


# -- properties -------------------------------------------------------------------------------

REQUESTS = (GPU, CPU, "pods")


@st.composite
def workers(draw: st.DrawFn, roomy: bool = False) -> list[WorkerState]:
    """0-4 workers of 0-4 nodes, with bound pods and gangs sent there part bound; `roomy`:
    at least two, all available, with nodes that take pods (for the choice among fits)."""
    out = []
    pod_slots = [8, 16] if roomy else [0, 2, 4, 8, 16]
    for c in range(draw(st.integers(2, 4) if roomy else st.integers(0, 4))):
        name = f"c{c}"
        nodes = []
        for n in range(draw(st.integers(0, 4))):
            nodes.append(
                node(
                    f"{name}n{n}",
                    gpus=draw(st.sampled_from([0, 1, 2, 4, 8])),
                    cpu=draw(st.sampled_from([0, 4_000, 16_000, 64_000])),
                    pods=draw(st.sampled_from(pod_slots)),
                    flavor=draw(st.sampled_from(["h100", "h100", "none"])),
                )
            )
        pods: list[BoundPod] = []
        for i in range(draw(st.integers(0, 4))):
            if nodes:
                on = draw(st.sampled_from(nodes)).name
                req = {GPU: draw(st.integers(0, 2)), CPU: draw(st.sampled_from([0, 500]))}
                pods.append(BoundPod(f"ns/{name}-other-{i}", on, req))
        sent_there: dict[str, Placement] = {}
        for d in range(draw(st.integers(0, 2)) if nodes else 0):
            key = f"ns/{name}-d{d}"
            req = {GPU: draw(st.integers(0, 2)), CPU: draw(st.sampled_from([0, 1_000]))}
            where = draw(
                st.lists(st.sampled_from(nodes), min_size=1, max_size=2, unique_by=lambda x: x.name)
            )
            pairs = tuple((n.name, draw(st.integers(1, 3))) for n in where)
            sent_there[key] = sent("main", req, *pairs)
            for node_name, planned in pairs:
                for i in range(draw(st.integers(0, planned))):
                    pods.append(BoundPod(f"ns/{key[3:]}-{node_name}-{i}", node_name, req, key))
        available = roomy or draw(st.booleans()) or draw(st.booleans())
        out.append(
            WorkerState(
                name, tuple(nodes), tuple(pods), sent_there, available, "" if available else "lost"
            )
        )
    return out


@st.composite
def gangs(draw: st.DrawFn) -> Workload:
    sets = []
    for i in range(draw(st.integers(1, 2))):
        flavor = draw(st.sampled_from(["h100", "cpu"]))
        req = {CPU: draw(st.sampled_from([0, 500, 2_000]))}
        if flavor == "h100":
            req[GPU] = draw(st.integers(0, 4))
        sets.append((f"ps{i}", draw(st.integers(1, 5)), req, flavor))
    return gang("ns/gang", *sets)


def used_by_node(worker: WorkerState) -> dict[str, dict[str, int]]:
    """What bound pods and the unbound rest of gangs sent there take, node by node (the draw
    binds a sent gang's pods only on its planned nodes, at most as many as planned)."""
    out: dict[str, dict[str, int]] = {}

    def add(node_name: str, requests: Mapping[str, int], n: int) -> None:
        room = out.setdefault(node_name, {})
        for r, v in requests.items():
            room[r] = room.get(r, 0) + v * n
        room["pods"] = room.get("pods", 0) + n

    for pod in worker.pods:
        add(pod.node, {r: v for r, v in pod.requests.items() if r != "pods"}, 1)
    for key, placement in worker.dispatched.items():
        for pod_set, pairs in placement.nodes.items():
            for node_name, planned in pairs:
                bound = sum(1 for p in worker.pods if p.workload == key and p.node == node_name)
                add(node_name, placement.requests[pod_set], planned - bound)
    return out


def hand_gang(w: Workload) -> GangRequest:
    """The gang as a person reads the workload: its pods on their flavor's labelled nodes."""
    assert w.admission is not None
    sets = []
    for ps, a in zip(w.pod_sets, w.admission, strict=True):
        labels: dict[str, str] = {}
        for flavor in set(a.flavors.values()):
            labels.update(FLAVORS[flavor].node_labels)
        sets.append(PodSetRequest(ps.name, a.count, PodShape(dict(ps.per_pod), labels)))
    return GangRequest(tuple(sets))


def hand_view(worker: WorkerState) -> NodeView:
    used = used_by_node(worker)
    fillers = [
        BoundPod(f"filler/{name}", name, {r: v for r, v in room.items() if r != "pods"})
        for name, room in used.items()
        if room.get("pods", 0)
    ]
    # One filler per node takes everything but the pod slots; pod slots by more fillers.
    extra = [
        BoundPod(f"slot/{name}-{i}", name, {})
        for name, room in used.items()
        for i in range(room.get("pods", 0) - 1)
    ]
    nodes = {n.name for n in worker.nodes}
    return NodeView(worker.nodes, [p for p in [*fillers, *extra] if p.node in nodes])


@settings(max_examples=300, deadline=None)
@given(workers(), gangs())
def test_a_dispatched_gang_is_whole_in_one_cluster_and_overfills_no_node(
    states: Sequence[WorkerState], w: Workload
) -> None:
    out = choose_cluster(w, FLAVORS, states)
    by_name = {s.name: s for s in states}
    if isinstance(out, Dispatched):
        worker = by_name[out.cluster]
        assert worker.available
        nodes = {n.name: n for n in worker.nodes}
        used = used_by_node(worker)
        assert w.admission is not None
        for a in w.admission:
            assert out.placement.count(a.pod_set) == a.count, "the whole gang, no fewer"
            flavor_labels = FLAVORS[next(iter(a.flavors.values()))].node_labels if a.flavors else {}
            for node_name, _ in out.placement.nodes[a.pod_set]:
                assert node_name in nodes, "only nodes of the chosen cluster"
                labels = nodes[node_name].labels
                assert all(labels.get(k) == v for k, v in flavor_labels.items())
        for node_name, taken in out.placement.usage().items():
            allocatable = nodes[node_name].allocatable
            for r, v in taken.items():
                have = used.get(node_name, {}).get(r, 0)
                assert have + v <= allocatable.get(r, 0), (node_name, r)
    else:
        if not states:
            assert out.reason == NO_WORKERS
        assert dict(out.clusters).keys() == {s.name for s in states}
        for s in states:
            assert f"{s.name}: " in out.reason or f"{s.name}, " in out.reason
            if s.available:
                found = place_gang(hand_view(s), hand_gang(w))
                assert not isinstance(found, Placement), f"{s.name} had room"


@settings(max_examples=200, deadline=None)
@given(workers(), gangs())
def test_the_view_reserves_what_the_hand_count_says(
    states: Sequence[WorkerState], w: Workload
) -> None:
    for s in states:
        assert worker_view(s).free_by_node() == hand_view(s).free_by_node()
    assert admitted_gang(w, FLAVORS) is not None


@settings(max_examples=200, deadline=None)
@given(workers(roomy=True), gangs())
def test_the_chosen_cluster_is_the_fullest_that_fits(
    states: Sequence[WorkerState], w: Workload
) -> None:
    out = choose_cluster(w, FLAVORS, states)
    gang_request = hand_gang(w)
    fitting = [s for s in states if isinstance(place_gang(hand_view(s), gang_request), Placement)]
    if not isinstance(out, Dispatched):
        assert not fitting
        return
    assert out.cluster in {s.name for s in fitting}
    asked = {
        r: sum(ps.count * ps.shape.requests.get(r, 0) for ps in gang_request.pod_sets)
        for r in REQUESTS
    }
    asked["pods"] = gang_request.count
    for s in fitting:
        # Free on the nodes of the gang's flavors, less what the gang takes: wherever the
        # pods go inside the cluster, the room left is the same.
        labels = [ps.shape.node_selector for ps in gang_request.pod_sets]
        usable = [
            n
            for n in s.nodes
            if any(all(n.labels.get(k) == v for k, v in sel.items()) for sel in labels)
        ]
        free = hand_view(s).free_by_node()
        left = sum(max(0, free[n.name].get(out.resource, 0)) for n in usable) - asked[out.resource]
        if s.name == out.cluster:
            assert left == out.left
        else:
            assert (out.left, out.cluster) < (left, s.name), f"{s.name} is fuller"
