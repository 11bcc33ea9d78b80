"""Gang placement on nodes: what an operator of a GPU cluster sees the core decide, and why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from quota.api import ManifestError
from quota.model.nodeconvert import bound_pod_from_manifest, node_from_manifest, pod_shape_from_spec
from quota.model.nodes import Taint, Toleration
from quota.placement import (
    PROFILES,
    STRATEGIES,
    BoundPod,
    GangRequest,
    Node,
    NodeView,
    Placement,
    PodSetRequest,
    PodShape,
    Profile,
    Refusals,
    Requirement,
    SelectorTerm,
    Unplaceable,
    place_gang,
)

GPU = "nvidia.com/gpu"
GI = 1 << 30


def node(name: str, gpus: int = 8, pods: int = 110, **fields: Any) -> Node:
    return Node(name, {GPU: gpus, "cpu": 64_000, "memory": 512 * GI, "pods": pods}, **fields)


def gang(count: int, gpus: int = 0, min_count: int | None = None, **shape: Any) -> GangRequest:
    requests = shape.pop("requests", {GPU: gpus} if gpus else {})
    return GangRequest((PodSetRequest("workers", count, PodShape(requests, **shape), min_count),))


def placed(result: Placement | Unplaceable, pod_set: str = "workers") -> dict[str, int]:
    assert isinstance(result, Placement), result
    return dict(result.nodes[pod_set])


def refused(result: Placement | Unplaceable) -> Unplaceable:
    assert isinstance(result, Unplaceable), result
    return result


# -- the stories ------------------------------------------------------------------------


def test_a_fragmented_cluster_refuses_a_whole_node_gang_and_shows_the_free_gpus() -> None:
    nodes = [node(f"h100-{i}") for i in range(8)]
    small = [BoundPod(f"other/small-{i}", f"h100-{i}", {GPU: 4}) for i in range(8)]
    view = NodeView(nodes, small)
    request = gang(4, gpus=8)

    result = refused(place_gang(view, request))
    assert not result.never  # emptying nodes would help: preemption may
    assert result.reason == (
        "gang of 4 pods x 8 nvidia.com/gpu: no node has 8 free; "
        "the nodes have 4, 4, 4, 4, 4, 4, 4, 4 (32 free in total)"
    )

    for pod in small:
        view.remove_pod(pod.key)
    nodes_used = placed(place_gang(view, request))
    assert len(nodes_used) == 4 and set(nodes_used.values()) == {1}


def test_a_reason_names_the_nodes_that_do_have_room() -> None:
    view = NodeView(
        [node(f"n{i}") for i in range(5)],
        [
            BoundPod("a/x", "n2", {GPU: 4}),
            BoundPod("a/y", "n3", {GPU: 4}),
            BoundPod("a/z", "n4", {GPU: 6}),
        ],
    )
    result = refused(place_gang(view, gang(4, gpus=8)))
    assert result.reason == (
        "gang of 4 pods x 8 nvidia.com/gpu: 2 nodes have 8 free; "
        "the others have 4, 4, 2 (26 free in total)"
    )


def test_binpack_fills_nodes_before_opening_new_ones_and_spread_does_the_opposite() -> None:
    view = NodeView([node(f"n{i}") for i in range(4)])
    request = gang(16, gpus=1)

    binpack = placed(place_gang(view, request))
    assert sorted(binpack.values()) == [8, 8]
    spread = placed(place_gang(view, request, "Spread"))
    assert sorted(spread.values()) == [4, 4, 4, 4]


def test_spread_moves_on_as_soon_as_another_node_is_as_free() -> None:
    view = NodeView([node("a"), node("b", gpus=4)])
    # a: 8 -> 6 -> 4, now level with b; b has more pod slots free, so b is the less used.
    assert placed(place_gang(view, gang(3, gpus=2), "Spread")) == {"a": 2, "b": 1}
    assert placed(place_gang(view, gang(5, gpus=2), "Spread")) == {"a": 3, "b": 2}


def test_binpack_puts_a_small_pod_on_the_fullest_node_that_fits() -> None:
    view = NodeView(
        [node("empty"), node("half"), node("almost-full")],
        [BoundPod("a/half", "half", {GPU: 4}), BoundPod("a/full", "almost-full", {GPU: 7})],
    )
    assert placed(place_gang(view, gang(1, gpus=1))) == {"almost-full": 1}
    assert placed(place_gang(view, gang(1, gpus=2))) == {"half": 1}
    assert placed(place_gang(view, gang(1, gpus=1), "Spread")) == {"empty": 1}


def test_binpack_keeps_whole_nodes_free_for_the_next_big_gang() -> None:
    view = NodeView([node(f"n{i}") for i in range(4)])
    for _ in range(12):
        one = place_gang(view, gang(1, gpus=1))
        assert isinstance(one, Placement)
        view.assume(one)
    assert isinstance(place_gang(view, gang(2, gpus=8)), Placement)


def test_pods_of_other_owners_take_room_too() -> None:
    view = NodeView([node("n0")], [BoundPod("kube-system/dcgm", "n0", {GPU: 6, "cpu": 500})])
    result = refused(place_gang(view, gang(1, gpus=4)))
    assert "2 free" in result.reason or "the node has 2" in result.reason
    assert view.free("n0")[GPU] == 2 and view.free("n0")["pods"] == 109


def test_a_pod_larger_than_any_node_can_never_be_placed() -> None:
    view = NodeView([node(f"n{i}") for i in range(3)])
    result = refused(place_gang(view, gang(1, gpus=9)))
    assert result.never
    assert result.reason == "pod needs 9 nvidia.com/gpu; the largest node has 8 allocatable"


def test_a_gang_larger_than_the_emptied_cluster_can_never_be_placed() -> None:
    view = NodeView([node(f"n{i}") for i in range(4)], [BoundPod("a/b", "n0", {GPU: 8})])
    assert refused(place_gang(view, gang(5, gpus=8))).never
    busy = refused(place_gang(view, gang(4, gpus=8)))
    assert not busy.never  # fits once the bound pod is gone


def test_an_empty_cluster_and_an_empty_gang() -> None:
    view = NodeView([])
    result = refused(place_gang(view, gang(1)))
    assert result.never and result.reason == "there are no nodes"
    nothing = place_gang(view, gang(0, gpus=8))
    assert isinstance(nothing, Placement) and nothing.total == 0


# -- filters ------------------------------------------------------------------------------


def test_node_selector_picks_the_pool_and_explains_a_missing_one() -> None:
    view = NodeView([node("a1", labels={"pool": "a100"}), node("h1", labels={"pool": "h100"})])
    assert placed(place_gang(view, gang(1, gpus=1, node_selector={"pool": "h100"}))) == {"h1": 1}
    result = refused(place_gang(view, gang(1, gpus=1, node_selector={"pool": "b200"})))
    assert result.reason == "no Ready node carries labels pool=b200" and result.never


def test_not_ready_and_cordoned_nodes_are_skipped_and_counted_in_the_reason() -> None:
    view = NodeView(
        [
            node("h1", labels={"pool": "h100"}, ready=False),
            node("h2", labels={"pool": "h100"}, unschedulable=True),
            node("a1", labels={"pool": "a100"}),
        ]
    )
    result = refused(place_gang(view, gang(1, node_selector={"pool": "h100"})))
    assert result.reason == (
        "no Ready node carries labels pool=h100 (1 node not Ready, 1 node cordoned)"
    )
    assert placed(place_gang(view, gang(1))) == {"a1": 1}


@pytest.mark.parametrize(
    ("requirement", "labels", "matches"),
    [
        (Requirement("zone", "In", ("a", "b")), {"zone": "b"}, True),
        (Requirement("zone", "In", ("a", "b")), {"zone": "c"}, False),
        (Requirement("zone", "In", ("a",)), {}, False),
        (Requirement("zone", "NotIn", ("a",)), {"zone": "b"}, True),
        (Requirement("zone", "NotIn", ("a",)), {}, True),  # a missing label is not in any set
        (Requirement("zone", "NotIn", ("a",)), {"zone": "a"}, False),
        (Requirement("gpu", "Exists"), {"gpu": ""}, True),
        (Requirement("gpu", "Exists"), {}, False),
        (Requirement("gpu", "DoesNotExist"), {}, True),
        (Requirement("gpu", "DoesNotExist"), {"gpu": "x"}, False),
        (Requirement("rank", "Gt", ("3",)), {"rank": "10"}, True),  # integers, not strings
        (Requirement("rank", "Gt", ("3",)), {"rank": "3"}, False),
        (Requirement("rank", "Lt", ("3",)), {"rank": "-1"}, True),
        (Requirement("rank", "Lt", ("3",)), {"rank": "two"}, False),
        (Requirement("rank", "Gt", ("3",)), {}, False),
    ],
)
def test_node_affinity_operators_follow_kubernetes(
    requirement: Requirement, labels: dict[str, str], matches: bool
) -> None:
    view = NodeView([node("n", labels=labels)])
    result = place_gang(view, gang(1, affinity=(SelectorTerm((requirement,)),)))
    assert isinstance(result, Placement) is matches
    if not matches:
        assert str(requirement) in refused(result).reason


def test_affinity_terms_are_ored_and_an_empty_term_matches_nothing() -> None:
    view = NodeView([node("a", labels={"zone": "a"}), node("b", labels={"zone": "b"})])
    either = (
        SelectorTerm((Requirement("zone", "In", ("x",)),)),
        SelectorTerm((Requirement("zone", "In", ("b",)),)),
    )
    assert placed(place_gang(view, gang(1, affinity=either))) == {"b": 1}
    assert isinstance(place_gang(view, gang(1, affinity=(SelectorTerm(),))), Unplaceable)


def test_a_node_named_by_hostname_or_by_field_is_the_only_choice() -> None:
    nodes = [node(f"n{i}", labels={"kubernetes.io/hostname": f"n{i}"}) for i in range(30)]
    view = NodeView(nodes)
    assert placed(place_gang(view, gang(2, node_selector={"kubernetes.io/hostname": "n7"}))) == {
        "n7": 2
    }
    by_name = (SelectorTerm((Requirement("metadata.name", "In", ("n12",), field=True),)),)
    assert placed(place_gang(view, gang(1, affinity=by_name))) == {"n12": 1}


def test_a_node_avoided_by_hostname_is_neither_chosen_nor_counted() -> None:
    nodes = [node(f"n{i:02d}", labels={"kubernetes.io/hostname": f"n{i:02d}"}) for i in range(16)]
    busy = [BoundPod(f"a/p{i}", f"n{i:02d}", {GPU: 4}) for i in range(1, 16)]
    view = NodeView(nodes, busy)
    avoid = (SelectorTerm((Requirement("kubernetes.io/hostname", "NotIn", ("n00",)),)),)
    assert placed(place_gang(view, gang(1, gpus=8))) == {"n00": 1}
    result = refused(place_gang(view, gang(1, gpus=8, affinity=avoid)))
    assert result.reason == (
        "gang of 1 pod x 8 nvidia.com/gpu: no node has 8 free; 15 nodes have 4 (60 free in total)"
    )
    assert placed(place_gang(view, gang(2, gpus=4, affinity=avoid))) == {"n01": 1, "n02": 1}


def test_taints_must_be_tolerated_unless_only_preferred() -> None:
    taint = Taint("gpu", "true", "NoSchedule")
    view = NodeView([node("h1", taints=(taint,))])
    result = refused(place_gang(view, gang(1)))
    assert result.reason == "taint gpu=true:NoSchedule not tolerated (1 node)"
    tolerant = (Toleration("gpu", "Equal", "true", "NoSchedule"),)
    assert placed(place_gang(view, gang(1, tolerations=tolerant))) == {"h1": 1}
    wrong_value = (Toleration("gpu", "Equal", "false"),)
    assert isinstance(place_gang(view, gang(1, tolerations=wrong_value)), Unplaceable)
    everything = (Toleration("", "Exists"),)
    assert isinstance(place_gang(view, gang(1, tolerations=everything)), Placement)

    soft = NodeView([node("s1", taints=(Taint("spot", "", "PreferNoSchedule"),))])
    assert isinstance(place_gang(soft, gang(1)), Placement)
    evicting = NodeView([node("e1", taints=(Taint("maint", "", "NoExecute"),))])
    assert "maint:NoExecute" in refused(place_gang(evicting, gang(1))).reason


def test_pod_slots_limit_how_many_pods_a_node_takes() -> None:
    view = NodeView([node("n0", pods=2), node("n1", pods=2), node("n2", pods=2)])
    used = placed(place_gang(view, gang(5)))  # no resources requested: only pod slots count
    assert sorted(used.values()) == [1, 2, 2]
    result = refused(place_gang(view, gang(7)))
    assert result.reason == "gang of 7 pods: the 3 nodes hold 6 even when empty" and result.never

    full = NodeView([node("n0", pods=1)], [BoundPod("a/b", "n0", {})])
    assert not refused(place_gang(full, gang(1))).never


# -- partial placement and pod sets -------------------------------------------------------


def test_min_count_places_as_many_as_fit_but_at_least_the_minimum() -> None:
    view = NodeView([node(f"n{i}") for i in range(4)])
    result = place_gang(view, gang(8, gpus=8, min_count=3))
    assert isinstance(result, Placement) and result.total == 4 and result.count("workers") == 4
    short = refused(place_gang(view, gang(8, gpus=8, min_count=5)))
    assert short.never and short.reason == (
        "gang of 8 pods (at least 5) x 8 nvidia.com/gpu: the 4 nodes hold 4 even when empty"
    )


def test_gang_min_count_counts_pods_across_pod_sets() -> None:
    view = NodeView([node("n0"), node("n1")])
    request = GangRequest(
        (
            PodSetRequest("launcher", 1, PodShape({"cpu": 1_000})),
            PodSetRequest("workers", 4, PodShape({GPU: 8})),
        ),
        min_count=3,
    )
    result = place_gang(view, request)
    assert isinstance(result, Placement) and result.total == 3
    assert result.count("launcher") == 1 and result.count("workers") == 2
    too_many = GangRequest(request.pod_sets, min_count=4)
    assert refused(place_gang(view, too_many)).reason.startswith(
        "gang needs at least 4 of its 5 pods; room for 3"
    )


def test_big_pods_are_placed_before_small_ones() -> None:
    # Spread would scatter the small pods onto the only node the big pod fits on.
    view = NodeView([node("big"), node("small", gpus=4)])
    request = GangRequest(
        (
            PodSetRequest("a-small", 2, PodShape({GPU: 2})),
            PodSetRequest("b-big", 1, PodShape({GPU: 8})),
        )
    )
    result = place_gang(view, request, "Spread")
    assert isinstance(result, Placement)
    assert dict(result.nodes["b-big"]) == {"big": 1}
    assert dict(result.nodes["a-small"]) == {"small": 2}
    assert result.pod_nodes("a-small") == ("small", "small")


def test_a_bad_request_is_refused_with_the_pod_set_named() -> None:
    view = NodeView([node("n0")])
    with pytest.raises(ValueError, match="pod set workers: min_count 3 is not between 0 and"):
        place_gang(view, gang(2, min_count=3))
    with pytest.raises(ValueError, match="unknown placement strategy"):
        place_gang(view, gang(1), "Random")  # type: ignore[arg-type]


# -- the view -----------------------------------------------------------------------------


def test_placing_leaves_the_view_alone_until_the_placement_is_assumed() -> None:
    view = NodeView([node("n0"), node("n1")], [BoundPod("a/b", "n0", {GPU: 2})])
    before = view.free_by_node()
    first = place_gang(view, gang(3, gpus=2))
    assert isinstance(first, Placement) and view.free_by_node() == before
    second = place_gang(view, gang(3, gpus=2))
    assert second == first
    assert isinstance(place_gang(view, gang(3, gpus=8)), Unplaceable)
    assert view.free_by_node() == before

    view.assume(first)
    assert sum(f[GPU] for f in view.free_by_node().values()) == 14 - 6
    after = place_gang(view, gang(3, gpus=2))
    assert isinstance(after, Placement) and after != first
    view.forget(first)
    assert view.free_by_node() == before


def test_a_found_placement_assumed_later_takes_its_room_once() -> None:
    view = NodeView([node("n0")])
    first = place_gang(view, gang(1, gpus=3))
    other = place_gang(view, gang(1, gpus=1))
    assert isinstance(first, Placement) and isinstance(other, Placement)
    view.assume(first)
    assert view.free("n0")[GPU] == 5
    view.assume(first)  # assuming twice takes twice: the caller asked for it
    assert view.free("n0")[GPU] == 2


def test_removing_and_adding_pods_is_a_what_if_that_can_be_undone() -> None:
    view = NodeView([node("n0")], [BoundPod("a/x", "n0", {GPU: 8, "cpu": 1_000})])
    before = view.free_by_node()
    assert isinstance(place_gang(view, gang(1, gpus=8)), Unplaceable)
    pod = view.remove_pod("a/x")
    assert isinstance(place_gang(view, gang(1, gpus=8)), Placement)
    view.add_pod(pod)
    assert view.free_by_node() == before and view.pods_on("n0") == (pod,)
    with pytest.raises(ValueError, match="already bound"):
        view.add_pod(pod)


# -- from Kubernetes objects --------------------------------------------------------------


def node_manifest(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "h100-0", "labels": {"pool": "h100"}},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": "63500m", "memory": "500Gi", GPU: "8", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_node_manifest_becomes_a_node() -> None:
    parsed = node_from_manifest(
        node_manifest(taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}])
    )
    assert parsed == Node(
        "h100-0",
        {"cpu": 63_500, "memory": 500 * GI, GPU: 8, "pods": 110},
        {"pool": "h100"},
        (Taint("gpu", "true", "NoSchedule"),),
        unschedulable=False,
        ready=True,
    )
    cordoned = node_from_manifest(node_manifest(unschedulable=True))
    assert cordoned.unschedulable
    sick = node_manifest()
    sick["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    assert not node_from_manifest(sick).ready


def test_a_malformed_node_names_the_node_the_field_and_the_rule() -> None:
    bad = node_manifest()
    bad["status"]["allocatable"]["cpu"] = "lots"
    with pytest.raises(ManifestError, match=r"Node h100-0\): status.allocatable\[cpu\]: 'lots'"):
        node_from_manifest(bad)
    with pytest.raises(ManifestError, match=r"spec.taints\[0\].effect: must be one of"):
        node_from_manifest(node_manifest(taints=[{"key": "a", "effect": "Sometimes"}]))


def pod_manifest(node_name: str | None = "h100-0", phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {GPU: "2"}}},
            {"resources": {"requests": {"cpu": "500m"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
        "overhead": {"cpu": "100m"},
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": "p", "namespace": "ml"}, "spec": spec, "status": {"phase": phase}}


def test_a_bound_pod_holds_what_kube_scheduler_counts() -> None:
    pod = bound_pod_from_manifest(pod_manifest())
    # max(1.5 cpu of containers, 4 of the init container) + 100m overhead; GPU from limits
    assert pod == BoundPod("ml/p", "h100-0", {"cpu": 4_100, "memory": GI, GPU: 2})
    assert bound_pod_from_manifest(pod_manifest(node_name=None)) is None
    assert bound_pod_from_manifest(pod_manifest(phase="Succeeded")) is None
    assert bound_pod_from_manifest(pod_manifest(phase="Failed")) is None


def test_a_pod_spec_becomes_a_shape_with_affinity_and_tolerations() -> None:
    term = {
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
            {"key": "rank", "operator": "Gt", "values": ["3"]},
        ],
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["bad-node"]}],
    }
    spec = {
        "nodeSelector": {"pool": "h100"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        },
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"resources": {"limits": {GPU: "8"}}}],
    }
    shape = pod_shape_from_spec(spec)
    assert shape == PodShape(
        {GPU: 8},
        {"pool": "h100"},
        (
            SelectorTerm(
                (
                    Requirement("zone", "In", ("a", "b")),
                    Requirement("rank", "Gt", ("3",)),
                    Requirement("metadata.name", "NotIn", ("bad-node",), field=True),
                )
            ),
        ),
        (Toleration("gpu", "Exists", "", "NoSchedule"),),
    )


@pytest.mark.parametrize(
    ("expression", "field", "rule"),
    [
        ({"key": "rank", "operator": "Gt", "values": ["three"]}, "values[0]", "compares integers"),
        ({"key": "zone", "operator": "In", "values": []}, "values", "at least one value"),
        ({"key": "zone", "operator": "Exists", "values": ["a"]}, "values", "takes no values"),
        ({"key": "zone", "operator": "Near", "values": ["a"]}, "operator", "must be one of"),
    ],
)
def test_a_malformed_affinity_names_the_job_the_field_and_the_rule(
    expression: dict[str, Any], field: str, rule: str
) -> None:
    required = {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
    spec = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    }
    with pytest.raises(ManifestError) as error:
        pod_shape_from_spec(spec, subject="Job ml/train", where="spec.template.spec")
    message = str(error.value)
    assert "(Job ml/train)" in message
    assert f"nodeSelectorTerms[0].matchExpressions[0].{field}: " in message and rule in message


# -- the extension points -----------------------------------------------------------------


class Draining:
    """A filter of the kind a new one would be: nodes labelled for draining take no pods."""

    name = "Draining"
    per_node = False

    def passes(self, node: Node, shape: PodShape) -> bool:
        return node.labels.get("drain") != "soon"

    def summary(self, refused: Sequence[tuple[Node, int]], shape: PodShape) -> Refusals:
        return Refusals(nodes=(f"{sum(n for _, n in refused)} draining",))


def test_a_filter_added_to_a_profile_rules_nodes_out_and_says_so() -> None:
    nodes = [node("n0"), node("n1", labels={"drain": "soon"}), node("n2", labels={"drain": "soon"})]
    view = NodeView(nodes, [BoundPod("a/b", "n0", {GPU: 4})])
    binpack = PROFILES["BinPack"]
    guarded = Profile("BinPack+Draining", (*binpack.filters, Draining()), binpack.score)

    # BinPack alone takes the fullest node that fits, n0 then a draining one.
    assert placed(place_gang(view, gang(2, gpus=4))) == {"n0": 1, "n1": 1}
    assert placed(place_gang(view, gang(1, gpus=4), guarded)) == {"n0": 1}
    # The draining nodes' free GPUs no longer count.
    assert refused(place_gang(view, gang(2, gpus=4), guarded)).reason == (
        "gang of 2 pods x 4 nvidia.com/gpu: 1 node has 4 free (4 free in total)"
    )
    # Nothing but the draining nodes match: the filter's own words make the reason.
    only_draining = gang(1, gpus=1, node_selector={"drain": "soon"})
    assert refused(place_gang(view, only_draining, guarded)).reason == (
        "no Ready node carries labels drain=soon (2 draining)"
    )


def test_a_strategy_and_its_profile_place_alike() -> None:
    nodes = [node(f"n{i}") for i in range(4)]
    bound = [BoundPod(f"a/p{i}", f"n{i}", {GPU: i}) for i in range(4)]
    for strategy in STRATEGIES:
        by_name = place_gang(NodeView(nodes, bound), gang(6, gpus=2), strategy)
        by_profile = place_gang(NodeView(nodes, bound), gang(6, gpus=2), PROFILES[strategy])
        assert by_name == by_profile
    assert placed(place_gang(NodeView(nodes, bound), gang(1, gpus=2), "Spread")) == {"n0": 1}
