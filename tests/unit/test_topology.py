"""Topology-aware gangs: the Topology kind, topology requests, and placement inside domains.

Nodes here form blocks of racks (labels BLOCK and RACK; the hostname is the last level), so
a gang asking for one rack must land in one rack, or wait with a reason naming the racks.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from quota.admission.cycle import admission_cycle
from quota.api import ManifestError, ResourceFlavor, Topology, parse_manifest
from quota.api import Workload as WorkloadModel
from quota.api.names import (
    HOSTNAME_LABEL,
    REQUIRED_TOPOLOGY_ANNOTATION,
    SLICE_SIZE_ANNOTATION,
    SLICE_TOPOLOGY_ANNOTATION,
)
from quota.model import convert
from quota.model.nodes import BoundPod, Node
from quota.model.snapshot import (
    Assignment,
    Flavor,
    PodSet,
    PodSetTopology,
    Snapshot,
    Workload,
)
from quota.placement import (
    GangRequest,
    NodeView,
    Placement,
    PodSetRequest,
    PodShape,
    Unplaceable,
    place_gang,
)
from quota.placement.topology import DomainRequest, domain_of, domain_request
from tests.unit.strategies import GPU, queue, queues_of

BLOCK = "example.com/block"
RACK = "example.com/rack"
LEVELS = (BLOCK, RACK, HOSTNAME_LABEL)


def fabric(blocks: int = 2, racks: int = 3, nodes: int = 4, gpus: int = 8) -> list[Node]:
    """`blocks` x `racks` x `nodes` nodes named b<i>-r<j>-n<k>, in rack b<i>-r<j>."""
    return [
        Node(
            f"b{b}-r{r}-n{n}",
            {GPU: gpus, "cpu": 64_000, "pods": 110},
            {BLOCK: f"b{b}", RACK: f"b{b}-r{r}", "pool": "h100"},
        )
        for b in range(blocks)
        for r in range(racks)
        for n in range(nodes)
    ]


def ask(
    mode: str = "Required",
    level: str | None = RACK,
    slice_size: int | None = None,
    slice_level: str | None = None,
) -> DomainRequest:
    found = domain_request("fabric", LEVELS, mode, level, slice_size, slice_level)
    assert isinstance(found, DomainRequest), found
    return found


def gang(
    count: int, domain: DomainRequest | None, gpus: int = 8, floor: int | None = None
) -> GangRequest:
    return GangRequest((PodSetRequest("main", count, PodShape({GPU: gpus}), floor, domain),))


def racks_of(placed: Placement) -> Counter[str]:
    out: Counter[str] = Counter()
    for node, n in placed.nodes["main"]:
        out[node.rsplit("-", 1)[0]] += n
    return out


def busy(nodes: list[Node], per_node: dict[str, int]) -> list[BoundPod]:
    """Pods of other owners: `per_node[name]` GPUs on each named node."""
    return [BoundPod(f"other/{name}", name, {GPU: g}) for name, g in per_node.items()]


# -- the API ------------------------------------------------------------------------------


def topology_doc(*labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": "fabric"},
        "spec": {"levels": [{"nodeLabel": x} for x in labels]},
    }


def test_a_topology_lists_levels_widest_first() -> None:
    model = parse_manifest(topology_doc(BLOCK, RACK, HOSTNAME_LABEL), 0)
    assert isinstance(model, Topology)
    assert model.spec.labels == LEVELS


@pytest.mark.parametrize(
    ("labels", "rule"),
    [
        ((BLOCK, RACK, BLOCK), "levels must be unique"),
        ((HOSTNAME_LABEL, RACK), "kubernetes.io/hostname may only be the last level"),
        ((), "at least 1 item"),
    ],
)
def test_a_topology_with_bad_levels_is_refused_naming_the_rule(
    labels: tuple[str, ...], rule: str
) -> None:
    with pytest.raises(ManifestError, match="Topology fabric") as error:
        parse_manifest(topology_doc(*labels), 0)
    assert rule in str(error.value)


def test_a_flavor_names_its_topology() -> None:
    rf = parse_manifest(
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ResourceFlavor",
            "metadata": {"name": "h100"},
            "spec": {"topologyName": "fabric"},
        },
        0,
    )
    assert isinstance(rf, ResourceFlavor)
    assert convert.flavor(rf).topology == "fabric"


def workload_doc(count: int, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {
            "queueName": "q",
            "podSets": [{"count": count, "requests": {GPU: 8}, "topologyRequest": request}],
        },
    }


def test_a_workload_pod_set_asks_for_a_rack_and_slices() -> None:
    wl = parse_manifest(
        workload_doc(8, {"required": BLOCK, "sliceRequiredTopology": RACK, "sliceSize": 4}), 0
    )
    assert isinstance(wl, WorkloadModel)
    (ps,) = convert.pod_sets(wl)
    assert ps.topology == PodSetTopology("Required", BLOCK, 4, RACK)


@pytest.mark.parametrize(
    ("request_", "rule"),
    [
        ({"required": RACK, "preferred": RACK}, "at most one of required, preferred"),
        ({"required": RACK, "sliceSize": 2}, "sliceSize and sliceRequiredTopology go together"),
        ({"sliceRequiredTopology": RACK, "sliceSize": 3}, "sliceSize must divide count"),
    ],
)
def test_a_topology_request_that_makes_no_sense_is_refused(
    request_: dict[str, Any], rule: str
) -> None:
    with pytest.raises(ManifestError, match="Workload ns/w") as error:
        parse_manifest(workload_doc(8, request_), 0)
    assert rule in str(error.value)


def job(annotations: dict[str, str], parallelism: int = 8) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ns", "labels": {"muster.dev/queue-name": "q"}},
        "spec": {
            "parallelism": parallelism,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {GPU: "8"}}}]},
            },
        },
    }


def test_a_jobs_pod_template_annotations_become_its_topology_request() -> None:
    model = convert.job_to_workload_model(
        job(
            {
                REQUIRED_TOPOLOGY_ANNOTATION: RACK,
                SLICE_TOPOLOGY_ANNOTATION: HOSTNAME_LABEL,
                SLICE_SIZE_ANNOTATION: "2",
            }
        ),
        {},
    )
    (ps,) = convert.pod_sets(model)
    assert ps.topology == PodSetTopology("Required", RACK, 2, HOSTNAME_LABEL)


def test_a_slice_size_that_does_not_divide_the_jobs_pods_names_the_annotation() -> None:
    with pytest.raises(ManifestError) as error:
        convert.job_to_workload_model(
            job({SLICE_TOPOLOGY_ANNOTATION: RACK, SLICE_SIZE_ANNOTATION: "3"}), {}
        )
    assert error.value.problems == [
        (
            f"spec.template.metadata.annotations[{SLICE_SIZE_ANNOTATION}]",
            "3 does not divide the Job's 8 pods",
        )
    ]


@pytest.mark.parametrize(
    ("mode", "level", "slice_level", "rule"),
    [
        (
            "Required",
            "example.com/zone",
            None,
            "example.com/zone is not a level of Topology fabric",
        ),
        ("Required", RACK, BLOCK, "slice level example.com/block is wider than the level"),
        ("Preferred", RACK, "example.com/zone", "slice level example.com/zone is not a level"),
    ],
)
def test_a_request_the_topology_cannot_honour_says_which_rule(
    mode: str, level: str, slice_level: str | None, rule: str
) -> None:
    found = domain_request("fabric", LEVELS, mode, level, 2 if slice_level else None, slice_level)
    assert isinstance(found, str)
    assert rule in found


# -- placement ----------------------------------------------------------------------------


def test_a_required_gang_lands_in_the_fullest_rack_that_fits() -> None:
    nodes = fabric()
    # b0-r0 has 1 node free, b1-r2 has 2, every other rack 4.
    pods = busy(nodes, {"b0-r0-n0": 8, "b0-r0-n1": 8, "b0-r0-n2": 8, "b1-r2-n0": 8, "b1-r2-n1": 8})
    view = NodeView(nodes, pods)
    placed = place_gang(view, gang(2, ask()))
    assert isinstance(placed, Placement)
    assert racks_of(placed) == {"b1-r2": 2}
    placed = place_gang(view, gang(3, ask()))
    assert isinstance(placed, Placement)
    # Four racks hold 4: the one in the fuller block (b0, with b0-r0 nearly full) goes first.
    assert racks_of(placed) == {"b0-r1": 3}


def test_a_gang_exactly_the_size_of_a_rack_takes_a_whole_rack() -> None:
    view = NodeView(fabric())
    placed = place_gang(view, gang(4, ask()))
    assert isinstance(placed, Placement)
    assert racks_of(placed) == {"b0-r0": 4}


def test_without_a_rack_that_fits_the_reason_names_the_roomiest_racks() -> None:
    nodes = fabric(blocks=1, racks=3)
    pods = busy(nodes, {"b0-r0-n0": 8, "b0-r1-n0": 8, "b0-r1-n1": 8, "b0-r2-n3": 4})
    placed = place_gang(NodeView(nodes, pods), gang(4, ask()))
    assert isinstance(placed, Unplaceable)
    assert not placed.never
    assert placed.reason == (
        "no rack of Topology fabric can hold gang of 4 pods x 8 nvidia.com/gpu: the roomiest "
        "of its 3 racks have room for 3 (b0-r0), 3 (b0-r2), 2 (b0-r1)"
    )


def test_a_gang_larger_than_any_rack_never_fits_and_says_so() -> None:
    placed = place_gang(NodeView(fabric()), gang(5, ask()))
    assert isinstance(placed, Unplaceable)
    assert placed.never
    assert "no rack of Topology fabric can ever hold gang of 5 pods" in placed.reason
    assert "the largest holds 4 even when empty" in placed.reason


def test_a_preferred_gang_stays_in_one_rack_when_one_fits() -> None:
    placed = place_gang(NodeView(fabric()), gang(4, ask("Preferred")))
    assert isinstance(placed, Placement)
    assert len(racks_of(placed)) == 1


def test_a_preferred_gang_climbs_to_a_block_only_when_no_rack_fits() -> None:
    placed = place_gang(NodeView(fabric()), gang(6, ask("Preferred")))
    assert isinstance(placed, Placement)
    racks = racks_of(placed)
    assert sorted(racks.values()) == [2, 4]  # as few racks as possible
    assert len({r.split("-")[0] for r in racks}) == 1  # in one block


def test_a_preferred_gang_too_big_for_a_block_spreads_over_the_topology() -> None:
    placed = place_gang(NodeView(fabric()), gang(14, ask("Preferred")))
    assert isinstance(placed, Placement)
    assert sorted(racks_of(placed).values()) == [2, 4, 4, 4]


def test_slices_each_stay_inside_one_rack() -> None:
    nodes = fabric(blocks=1, racks=3)
    # Racks with 3, 3 and 4 free nodes: slices of 2 fit 1, 1 and 2 times.
    view = NodeView(nodes, busy(nodes, {"b0-r0-n0": 8, "b0-r1-n0": 8}))
    placed = place_gang(view, gang(8, ask("Required", BLOCK, 2, RACK)))
    assert isinstance(placed, Placement)
    order = [node.rsplit("-", 1)[0] for node in placed.pod_nodes("main")]
    assert all(order[i] == order[i + 1] for i in range(0, 8, 2))
    # 10 nodes are free, but only one rack has room for a whole slice of 4.
    refused = place_gang(view, gang(8, ask("Required", BLOCK, 4, RACK)))
    assert isinstance(refused, Unplaceable)
    assert "in slices of 4 per rack" in refused.reason


def test_a_gang_required_on_one_node_uses_a_single_node() -> None:
    view = NodeView(fabric(gpus=8))
    placed = place_gang(view, gang(4, ask("Required", HOSTNAME_LABEL), gpus=2))
    assert isinstance(placed, Placement)
    assert len(placed.nodes["main"]) == 1


def test_one_node_racks_are_domains_too() -> None:
    nodes = fabric(blocks=1, racks=20, nodes=1)  # more rack values than the view groups by
    view = NodeView(nodes, busy(nodes, {"b0-r0-n0": 4}))
    placed = place_gang(view, gang(2, ask(), gpus=2))
    assert isinstance(placed, Placement)
    assert racks_of(placed) == {"b0-r0": 2}  # the fullest one-node rack


def test_nodes_without_the_topologys_labels_are_not_used() -> None:
    nodes = [Node("loose", {GPU: 8, "pods": 110}, {"pool": "h100"})]
    placed = place_gang(NodeView(nodes), gang(1, ask()))
    assert isinstance(placed, Unplaceable)
    assert placed.never
    assert "no matching node carries the labels of Topology fabric" in placed.reason
    assert "(1 lack them)" in placed.reason


def test_zero_pods_and_pods_asking_for_nothing_place_trivially() -> None:
    view = NodeView(fabric())
    empty = place_gang(view, gang(0, ask()))
    assert isinstance(empty, Placement) and empty.total == 0
    nothing = place_gang(view, GangRequest((PodSetRequest("main", 3, PodShape({}), None, ask()),)))
    assert isinstance(nothing, Placement)
    assert len(racks_of(nothing)) == 1


def test_partial_placement_takes_the_most_one_rack_holds_down_to_the_minimum() -> None:
    placed = place_gang(NodeView(fabric()), gang(6, ask(), floor=3))
    assert isinstance(placed, Placement)
    assert racks_of(placed) == {"b0-r0": 4}


# -- in the admission cycle ---------------------------------------------------------------


def topo_cycle(
    topology: PodSetTopology | None,
    flavor_topology: str | None = "fabric",
    topologies: dict[str, tuple[str, ...]] | None = None,
    count: int = 4,
    with_nodes: bool = True,
) -> tuple[Any, ...]:
    nodes = tuple(fabric())
    flavor = Flavor("h100", {"pool": "h100"}, topology=flavor_topology)
    w = Workload("ns/train", "a", 0, 0.0, (PodSet("main", count, {GPU: 8}, topology=topology),))
    result = admission_cycle(
        Snapshot(
            now=1_000.0,
            queues=queues_of(queue("a", quota=1_000)),
            flavors={"h100": flavor},
            capacity={("h100", GPU): 8 * len(nodes)},
            pending=(w,),
            nodes=nodes if with_nodes else None,
            topologies=topologies,
        )
    )
    return result.admit, result.pending


def test_the_admission_cycle_plans_a_required_gang_inside_one_rack() -> None:
    admit, _ = topo_cycle(PodSetTopology("Required", RACK), topologies={"fabric": LEVELS})
    ((assignment,),) = [a.assignments for a in admit]
    assert len({node.rsplit("-", 1)[0] for node, _ in assignment.nodes}) == 1


def test_a_flavor_naming_a_missing_topology_makes_its_workloads_wait() -> None:
    admit, pending = topo_cycle(None, topologies={})
    assert not admit
    assert pending[0].reason.endswith("flavor h100 names Topology fabric, which does not exist")


def test_where_topology_is_not_placed_by_a_flavor_naming_one_waits_and_says_so() -> None:
    admit, pending = topo_cycle(PodSetTopology("Required", RACK), topologies=None)
    assert not admit
    assert "this admission does not read Topologies" in pending[0].reason


def test_a_request_on_a_flavor_without_topology_waits_naming_the_field() -> None:
    admit, pending = topo_cycle(
        PodSetTopology("Required", RACK), flavor_topology=None, topologies={}
    )
    assert not admit
    assert "names none (spec.topologyName)" in pending[0].reason


def test_a_level_the_flavors_topology_lacks_waits_naming_the_rule() -> None:
    admit, pending = topo_cycle(
        PodSetTopology("Required", "example.com/zone"), topologies={"fabric": LEVELS}
    )
    assert not admit
    assert "example.com/zone is not a level of Topology fabric" in pending[0].reason


def test_without_a_request_a_flavor_with_a_topology_places_as_before() -> None:
    admit, _ = topo_cycle(None, topologies={"fabric": LEVELS}, count=6)
    assert admit


def test_placement_spells_the_hostname_label_as_the_api_does() -> None:
    from quota.placement import nodes

    assert nodes.HOSTNAME_LABEL == HOSTNAME_LABEL


def test_quota_alone_still_keeps_workloads_off_a_flavor_naming_a_missing_topology() -> None:
    admit, pending = topo_cycle(None, topologies={}, with_nodes=False)
    assert not admit
    assert pending[0].reason == "flavor h100 names Topology fabric, which does not exist"
    admit, _ = topo_cycle(
        PodSetTopology("Required", RACK), topologies={"fabric": LEVELS}, with_nodes=False
    )
    assert admit  # without nodes, quota decides: nothing to place by


def test_an_elastic_job_asks_for_topology_on_every_slice() -> None:
    elastic = job({REQUIRED_TOPOLOGY_ANNOTATION: RACK})
    elastic["metadata"]["annotations"] = {"muster.dev/elastic-job": "true"}
    model = convert.job_to_workload_model(elastic, {})
    request = model.spec.pod_sets[0].topology_request
    assert request is not None and request.required == RACK


# -- the simulator ------------------------------------------------------------------------


def test_a_node_pool_splits_into_domains_and_the_report_shows_the_largest_free_rack() -> None:
    from quota.simulation.report import placement_stats
    from quota.simulation.scenario import parse_scenario
    from quota.simulation.simulator import simulate

    docs: list[dict[str, Any]] = [
        topology_doc(BLOCK, RACK, HOSTNAME_LABEL),
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ResourceFlavor",
            "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"pool": "h"}, "topologyName": "fabric"},
        },
        {
            "apiVersion": "simulate.muster.dev/v1alpha1",
            "kind": "NodePool",
            "metadata": {"name": "h"},
            "spec": {
                "count": 4,
                "labels": {"pool": "h"},
                "allocatable": {GPU: 8},
                "levels": [{"label": BLOCK, "domains": 1}, {"label": RACK, "domains": 2}],
            },
        },
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ClusterQueue",
            "metadata": {"name": "cq"},
            "spec": {"flavors": [{"name": "h100", "quota": {GPU: 32}}]},
        },
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "LocalQueue",
            "metadata": {"name": "q", "namespace": "ns"},
            "spec": {"clusterQueue": "cq"},
        },
        {
            "apiVersion": "simulate.muster.dev/v1alpha1",
            "kind": "WorkloadGenerator",
            "metadata": {"name": "g"},
            "spec": {
                "targets": ["ns/q"],
                "classes": [
                    {
                        "name": "one",
                        "count": 1,
                        "interval": "0s",
                        "runtime": "10m",
                        "pods": 1,
                        "requests": {GPU: 8},
                        "topologyRequest": {"required": RACK},
                    }
                ],
            },
        },
    ]
    scenario = parse_scenario(docs)
    assert scenario.nodes is not None
    assert [n.labels[RACK] for n in scenario.nodes] == ["h-block0-rack0"] * 2 + [
        "h-block0-rack1"
    ] * 2
    stats = placement_stats(simulate(scenario, record=False))
    assert stats is not None
    block, rack = stats.levels
    assert (block.level, block.domains, block.largest) == (BLOCK, 1, 32)
    assert (rack.level, rack.domains, rack.largest) == (RACK, 2, 16)
    assert rack.min_largest_free == 16  # one node of one rack in use: the other rack stays whole
    assert block.min_largest_free == 24


def _scale_up(*, bound_in: str, other: dict[str, int], grow_to: int) -> tuple[Any, list[Node]]:
    """A running slice of 2 whole-node pods bound in rack `bound_in`, other owners' pods on
    the nodes of `other`, and a slice growing it to `grow_to` pods, all requiring a rack."""
    nodes = fabric(blocks=1, racks=2, nodes=4)
    need = PodSetTopology("Required", RACK)
    running = Workload(
        "ns/job-s1",
        "a",
        0,
        0.0,
        (PodSet("main", 2, {GPU: 8}, topology=need),),
        admission=(Assignment("main", 2, {GPU: "h100"}),),
        admitted_at=0.0,
    )
    grown = Workload(
        "ns/job-s2",
        "a",
        0,
        1.0,
        (PodSet("main", grow_to, {GPU: 8}, topology=need),),
        replaces="ns/job-s1",
    )
    pods = busy(nodes, other) + [
        BoundPod(f"ns/s1-{i}", f"{bound_in}-n{i}", {GPU: 8}, workload="ns/job-s1") for i in range(2)
    ]
    result = admission_cycle(
        Snapshot(
            now=10.0,
            queues=queues_of(queue("a", quota=1_000)),
            flavors={"h100": Flavor("h100", {"pool": "h100"}, topology="fabric")},
            capacity={("h100", GPU): 1_000},
            nodes=tuple(nodes),
            pods=tuple(pods),
            admitted=(running,),
            pending=(grown,),
            topologies={"fabric": LEVELS},
        )
    )
    return result, nodes


def test_a_scale_up_slice_of_a_required_gang_lands_in_its_running_rack() -> None:
    # Rack b0-r1 is the fuller one (room for one more pod: bin-packing would pick it), but
    # the Job runs in b0-r0.
    busy_r1 = {f"b0-r1-n{i}": 8 for i in range(3)}
    result, _ = _scale_up(bound_in="b0-r0", other=busy_r1, grow_to=3)
    [admitted] = result.admit
    nodes = {node for a in admitted.assignments for node, _ in a.nodes}
    assert nodes and all(n.startswith("b0-r0-") for n in nodes), nodes


def test_a_scale_up_slice_waits_when_its_running_rack_is_full_rather_than_split() -> None:
    # b0-r0 holds the two running pods and two other pods: the extra two have no room
    # there, though rack b0-r1 is empty.
    result, _ = _scale_up(bound_in="b0-r0", other={"b0-r0-n2": 8, "b0-r0-n3": 8}, grow_to=4)
    assert not result.admit
    assert "rack" in result.pending[0].reason


def test_a_partial_gang_is_never_placeable_only_when_no_rack_could_hold_its_minimum() -> None:
    nodes = fabric(blocks=1, racks=2)
    full = busy(nodes, {n.name: 8 for n in nodes if not n.name.endswith("-n0")})
    waiting = place_gang(NodeView(nodes, full), gang(6, ask(), floor=3))
    assert isinstance(waiting, Unplaceable) and not waiting.never  # 4 fit a rack emptied
    never = place_gang(NodeView(nodes), gang(6, ask(), floor=5))
    assert isinstance(never, Unplaceable) and never.never


def test_the_domain_of_running_pods_is_named_by_its_whole_path() -> None:
    # Rack labels repeat across blocks (each block has an "r0"): the rack where pods run is
    # b1's r0, never b0's as well.
    nodes = [
        Node(f"{b}-n{i}", {GPU: 8, "pods": 110}, {BLOCK: b, RACK: "r0", "pool": "h100"})
        for b in ("b0", "b1")
        for i in range(2)
    ]
    view = NodeView(nodes)
    assert domain_of(view, ["b1-n0", "b1-n1"], ask()) == {BLOCK: "b1", RACK: "r0"}
    assert domain_of(view, ["b1-n0"], ask(level=HOSTNAME_LABEL)) == {BLOCK: "b1", RACK: "r0"}
    assert domain_of(view, ["gone"], ask()) == {}
    assert domain_of(view, ["b0-n0"], ask("Unconstrained", None)) == {}
