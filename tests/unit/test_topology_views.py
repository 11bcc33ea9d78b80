"""What the views of topology read from the placement core: the room a domain has for a pod
shape (as `choose` counts it), the level a placed gang landed at, and the level a waiting
gang's reason names (metrics count by both); and the simulator's report of where each
queue's gangs landed."""

from __future__ import annotations

import pytest
import yaml

from quota.model.nodes import Node
from quota.model.snapshot import PodSetTopology
from quota.placement import NodeView, Placement, PodShape, Unplaceable, place_gang
from quota.placement.candidates import candidates
from quota.placement.nodes import demand_of
from quota.placement.profiles import PROFILES
from quota.placement.topology import (
    ANYWHERE,
    SPREAD,
    domain_room,
    landed_depth,
    landed_level,
    tree,
    waiting_level,
)
from quota.simulation.report import landed_by_queue, placement_json
from quota.simulation.scenario import parse_scenario
from quota.simulation.simulator import simulate
from tests.conftest import REPO
from tests.unit.strategies import GPU
from tests.unit.test_topology import BLOCK, LEVELS, RACK, ask, busy, fabric, gang, topo_cycle


def room_by_domain(view: NodeView, gpus: int) -> dict[str, int]:
    shape = PodShape({GPU: gpus}, {"pool": "h100"})
    found = tree(view, candidates(view, shape, PROFILES["BinPack"].filters), LEVELS)
    room = domain_room(found, demand_of(shape.requests))
    out = {}
    for depth in range(len(LEVELS)):
        for domain in found.level(depth):
            out[domain.name] = room(domain)
    out[""] = room(found.root)
    return out


def test_a_domains_room_is_the_pods_of_the_shape_its_nodes_take_now() -> None:
    nodes = fabric(blocks=1, racks=2, nodes=2)
    view = NodeView(nodes, busy(nodes, {"b0-r0-n0": 3, "b0-r1-n0": 8}))
    # 4-GPU pods: 5 GPUs free on n0 take one, never the 1.25 a sum of GPUs would say.
    room = room_by_domain(view, 4)
    assert room["b0-r0-n0"] == 1 and room["b0-r0-n1"] == 2 and room["b0-r1-n0"] == 0
    assert room["b0-r0"] == 3 and room["b0-r1"] == 2 and room["b0"] == 5 and room[""] == 5


def test_the_room_shown_is_the_room_placement_goes_by() -> None:
    nodes = fabric(blocks=1, racks=3)
    view = NodeView(nodes, busy(nodes, {"b0-r0-n0": 8, "b0-r1-n0": 8, "b0-r1-n1": 8}))
    room = room_by_domain(view, 8)
    assert [room[r] for r in ("b0-r0", "b0-r1", "b0-r2")] == [3, 2, 4]
    # A gang of exactly the room of the fullest rack that holds it goes there...
    placed = place_gang(view, gang(3, ask()))
    assert isinstance(placed, Placement)
    assert {node.rsplit("-", 1)[0] for node, _ in placed.nodes["main"]} == {"b0-r0"}
    # ...and one more pod than any rack's room is refused.
    assert isinstance(place_gang(view, gang(5, ask())), Unplaceable)


def placed_on(count: int, mode: str, level: str, nodes: list[Node]) -> str | None:
    placed = place_gang(NodeView(nodes), gang(count, ask(mode, level)))
    assert isinstance(placed, Placement)
    by_name = {n.name: n for n in nodes}
    return landed_level((by_name[name] for name, _ in placed.nodes["main"]), LEVELS)


def test_a_placement_counts_at_the_narrowest_level_holding_all_its_pods() -> None:
    nodes = fabric()
    assert placed_on(1, "Required", RACK, nodes) == "node"
    assert placed_on(4, "Required", RACK, nodes) == "rack"
    # A preferred gang that had to climb counts where it landed.
    assert placed_on(6, "Preferred", RACK, nodes) == "block"
    assert placed_on(14, "Preferred", RACK, nodes) == SPREAD


@pytest.mark.parametrize(
    ("names", "depth"),
    [
        (["b0-r0-n0"], 2),
        (["b0-r0-n0", "b0-r0-n3"], 1),
        (["b0-r0-n0", "b0-r2-n0"], 0),
        (["b0-r0-n0", "b1-r0-n0"], -1),
    ],
)
def test_landed_depth_is_the_index_of_the_shared_level(names: list[str], depth: int) -> None:
    by_name = {n.name: n for n in fabric()}
    assert landed_depth([by_name[n] for n in names], LEVELS) == depth


def test_a_node_outside_the_topology_or_no_node_lands_nowhere() -> None:
    outside = Node("loose", {GPU: 8}, {BLOCK: "b0"})
    assert landed_depth([fabric()[0], outside], LEVELS) is None
    assert landed_depth([], LEVELS) is None
    # Without the hostname level one node is as narrow as its lowest labelled domain.
    assert landed_depth(fabric()[:1], (BLOCK, RACK)) == 1


def test_the_level_a_gang_waits_at_is_read_from_the_cycles_own_reason() -> None:
    topologies = {"fabric": LEVELS}
    _, (waiting,) = topo_cycle(PodSetTopology("Required", RACK), topologies=topologies, count=5)
    assert waiting_level(waiting.reason) == "rack"  # "can ever hold": never fits, still a wait
    _, (waiting,) = topo_cycle(PodSetTopology("Required", BLOCK), topologies=topologies, count=13)
    assert waiting_level(waiting.reason) == "block"
    # Preferred, with too little room even in the whole topology: it waits for any room.
    nodes = fabric()
    view = NodeView(nodes, busy(nodes, {"b0-r0-n0": 8}))
    refused = place_gang(view, gang(24, ask("Preferred")))
    assert isinstance(refused, Unplaceable)
    assert waiting_level(f"quota is available but ...: {refused.reason}") == ANYWHERE


def test_waits_of_other_kinds_are_not_topology_waits() -> None:
    _, (waiting,) = topo_cycle(PodSetTopology("Required", RACK), topologies={})
    assert waiting_level(waiting.reason) is None
    _, (waiting,) = topo_cycle(None, topologies={"fabric": LEVELS}, count=49)
    assert waiting_level(waiting.reason) is None
    assert waiting_level("insufficient quota for nvidia.com/gpu in flavor h100") is None


def test_the_example_shows_where_each_teams_gangs_landed_next_to_their_waits() -> None:
    docs = list(yaml.safe_load_all((REPO / "examples" / "topology.yaml").read_text()))
    result = simulate(parse_scenario(docs), record=False)
    levels, landed = landed_by_queue(result)
    assert levels == ("node", "rack", "block", SPREAD)
    by_queue = {q.queue: q for q in landed}
    # Single-pod serving replicas are no gangs.
    assert set(by_queue) == {"anywhere", "preferred", "required"}
    assert by_queue["required"].by_level == {"rack": 6}
    # Without a request, gangs spread: what a team gives up for starting sooner.
    assert by_queue["anywhere"].by_level.get("rack", 0) < by_queue["preferred"].by_level["rack"]
    assert by_queue["anywhere"].by_level.get(SPREAD, 0) > 0
    waits = {q: sorted(j.waited for j in result.jobs if j.cluster_queue == q) for q in by_queue}
    assert sum(waits["required"]) > sum(waits["anywhere"])
    section = placement_json(result)["topologyLanded"]
    assert {"queue": "required", "gangs": 6, "levels": {"rack": 6}} in section
