"""`kubectl muster topology` on a built cluster: the tree of a flavor's domains with their
free room, the pods bound there, the room for a pod shape, where a gang would go, and what
it says when something cannot be shown."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner
from rich.console import Console

from controllers.plugin import topology as topo
from controllers.plugin.main import main
from quota.api.names import HOSTNAME_LABEL
from quota.model.nodes import BoundPod, Node
from quota.model.snapshot import Flavor
from tests.unit.strategies import GPU
from tests.unit.test_topology import BLOCK, LEVELS, RACK, busy, fabric


def hosts(nodes: list[Node]) -> list[Node]:
    """As the kubelet labels them: the hostname label on every node."""
    return [Node(n.name, n.allocatable, {**n.labels, HOSTNAME_LABEL: n.name}) for n in nodes]


def cluster(
    nodes: list[Node], pods: list[BoundPod] | None, muster: frozenset[str] = frozenset()
) -> topo.LiveCluster:
    flavor = Flavor("h100", {"pool": "h100"}, topology="fabric")
    return topo.LiveCluster({"fabric": LEVELS}, [flavor], nodes, pods, muster)


def shown(
    live: topo.LiveCluster,
    shape: topo.Shape | None = None,
    depth: int | None = None,
    limit: int | None = None,
) -> str:
    views, notes = topo.views(live, shape)
    console = Console(width=250, no_color=True, force_terminal=False)
    with console.capture() as out:
        for view in views:
            console.print(topo.render(view, shape, depth, limit))
        for note in notes:
            console.print(note)
    return out.get()


def line_of(text: str, what: str) -> str:
    return next(line for line in text.splitlines() if what in line)


def test_the_tree_shows_free_gpus_and_pods_per_block_rack_and_node() -> None:
    nodes = hosts(fabric(blocks=2, racks=2, nodes=2))
    mine = BoundPod("ns/train-0", "b0-r0-n1", {GPU: 2})
    pods = [*busy(nodes, {"b0-r0-n0": 8, "b0-r1-n1": 3}), mine]
    out = shown(cluster(nodes, pods, frozenset({"ns/train-0"})))
    assert "Topology fabric (example.com/block > example.com/rack > kubernetes.io/hostname)" in out
    assert "flavor h100 (pool=h100)" in out
    assert "8 nodes in all  nvidia.com/gpu 51/64 free  pods 3 (1 Muster's)" in out
    assert "block b0  4 nodes  nvidia.com/gpu 19/32 free  pods 3 (1 Muster's)" in out
    assert "rack b0-r0  2 nodes  nvidia.com/gpu 6/16 free  pods 2 (1 Muster's)" in out
    assert "node b0-r0-n0  nvidia.com/gpu 0/8 free  pods 1" in line_of(out, "b0-r0-n0")
    assert "block b1  4 nodes  nvidia.com/gpu 32/32 free  pods 0" in out
    # Drawn as a tree: each rack under its block, each node under its rack.
    assert out.index("block b0") < out.index("rack b0-r0") < out.index("node b0-r0-n0")
    assert out.index("node b0-r1-n1") < out.index("block b1")


def test_room_for_a_shape_counts_whole_pods_and_marks_where_a_gang_would_go() -> None:
    nodes = hosts(fabric(blocks=1, racks=3))
    pods = busy(nodes, {"b0-r0-n0": 8, "b0-r1-n0": 8, "b0-r1-n1": 8, "b0-r2-n3": 5})
    out = shown(cluster(nodes, pods), topo.Shape(GPU, 8, 3))
    assert "room for 3 x 8 nvidia.com/gpu" in line_of(out, "rack b0-r0")
    assert "room for 2 x 8 nvidia.com/gpu" in line_of(out, "rack b0-r1")
    # 3 GPUs free on b0-r2-n3 hold no 8-GPU pod: room is whole pods, not a sum of GPUs.
    assert "nvidia.com/gpu 27/32 free" in line_of(out, "rack b0-r2")
    assert "room for 3 x 8 nvidia.com/gpu" in line_of(out, "rack b0-r2")
    # The placement core's choice: the fullest rack that holds the gang; tied, by name.
    assert "a gang of 3 x 8 nvidia.com/gpu required in one rack: rack b0-r0" in out
    assert "required in one block: block b0" in out
    assert (
        "required in one node: no node of Topology fabric can ever hold gang of 3 pods x 8 "
        "nvidia.com/gpu" in out
    )


def test_a_gang_no_rack_holds_gets_the_reason_the_cycle_would_give() -> None:
    nodes = hosts(fabric(blocks=1, racks=2))
    pods = busy(nodes, {"b0-r0-n0": 8, "b0-r1-n0": 8})
    out = " ".join(shown(cluster(nodes, pods), topo.Shape(GPU, 8, 4)).split())
    assert (
        "required in one rack: no rack of Topology fabric can hold gang of 4 pods x 8 "
        "nvidia.com/gpu: the roomiest of its 2 racks have room for 3 (b0-r0), 3 (b0-r1)"
    ) in out


def test_a_large_tree_shows_the_roomiest_domains_and_sums_up_the_rest() -> None:
    nodes = hosts(fabric(blocks=1, racks=5))
    pods = busy(nodes, {f"b0-r{r}-n{n}": 8 for r in range(3) for n in range(r + 2)})
    out = shown(cluster(nodes, pods), depth=2, limit=2)
    assert "rack b0-r3" in out and "rack b0-r4" in out
    assert "rack b0-r0" not in out
    assert "... 3 more racks  12 nodes  nvidia.com/gpu 24/96 free" in out
    # Depth 2 stops at racks: no node rows.
    assert "node b0-" not in out


def test_without_the_right_to_list_pods_allocatable_is_shown_and_nothing_else() -> None:
    out = shown(cluster(hosts(fabric(blocks=1, racks=1)), None))
    assert "rack b0-r0  4 nodes  nvidia.com/gpu 32" in out
    assert "free" not in out and "pods" not in out
    said = topo.pods_hidden('pods is forbidden: User "alice" cannot list resource "pods"')
    assert (
        "free room, bound pods and where a gang would go are not shown" in said and "alice" in said
    )
    said = topo.reservations_hidden('workloads.muster.dev is forbidden: User "alice"')
    assert "planned for admitted gangs not bound yet" in said and "counted as free" in said


def test_nodes_the_flavor_cannot_use_or_outside_the_topology_are_said() -> None:
    nodes = hosts(fabric(blocks=1, racks=1))
    cordoned = Node(
        "cordoned", {GPU: 8}, {"pool": "h100", BLOCK: "b0", RACK: "b0-r0"}, unschedulable=True
    )
    loose = Node("loose", {GPU: 8}, {"pool": "h100"})
    out = shown(cluster([*nodes, cordoned, loose], []))
    assert "1 more node carries flavor h100's labels and is not counted" in out
    assert "1 more node lacks a level's label of Topology fabric" in out
    assert "4 nodes in all" in out


def test_what_cannot_be_shown_is_said() -> None:
    live = cluster(hosts(fabric(blocks=1, racks=1)), [])
    live.flavors.append(Flavor("a100", {"pool": "a100"}, topology="missing"))
    live.topologies["spare"] = (RACK,)
    out = shown(live)
    assert "flavor a100 names Topology missing, which does not exist" in out
    assert "Topology spare: no ResourceFlavor names it" in out
    assert topo.nothing_to_show(live, None, "nope") == "no ResourceFlavor named nope"
    live.flavors.append(Flavor("cpu"))
    assert "names no Topology" in topo.nothing_to_show(live, None, "cpu")
    assert topo.nothing_to_show(live, "nope", None) == "no Topology named nope"


def test_fits_without_a_shape_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["topology", "--fits", "4"])
    assert result.exit_code == 2
    assert "--fits needs --gpus" in result.output


def test_asking_where_a_gang_would_go_changes_no_figure_of_the_tree() -> None:
    # One level, the hostname, on cpu nodes: the gang fits a node, and the tree still shows
    # that node's room as it is.
    nodes = [Node(f"n{i}", {"cpu": 8000, "pods": 110}, {"pool": "c"}) for i in range(3)]
    live = topo.LiveCluster(
        {"hosts": (HOSTNAME_LABEL,)},
        [Flavor("c", {"pool": "c"}, topology="hosts")],
        nodes,
        [BoundPod("ns/p", "n0", {"cpu": 3000})],
    )
    plain = shown(live, topo.Shape("cpu", 2000))
    asked = shown(live, topo.Shape("cpu", 2000, 2))
    assert "node n0  cpu 5/8 free  pods 1 (0 Muster's)  room for 2 x 2 cpu" in plain
    assert asked.startswith(plain.rstrip("\n"))
    assert "a gang of 2 x 2 cpu required in one node: node n0 (the fullest that holds it)" in asked


def test_a_flavor_whose_labels_no_node_carries_says_so() -> None:
    live = cluster(hosts(fabric(blocks=1, racks=1)), [])
    live.flavors[0] = Flavor("h100", {"pool": "elsewhere"}, topology="fabric")
    assert "no node carries flavor h100's labels" in shown(live)


def admitted_workload(name: str, count: int, plan: dict[str, int], gpus: int = 8) -> Any:
    """An admitted Workload of Job `name` (uid uid-<name>) planned on the nodes of `plan`."""
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {
            "name": f"job-{name}",
            "namespace": "ns",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": f"uid-{name}"}
            ],
        },
        "spec": {
            "queueName": "team",
            "podSets": [{"name": "main", "count": count, "requests": {GPU: str(gpus)}}],
        },
        "status": {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": count,
                        "flavors": {GPU: "h100"},
                        "nodes": [{"name": n, "count": c} for n, c in plan.items()],
                    }
                ],
            },
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "reason": "QuotaReserved",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    }


def test_room_planned_for_a_gang_not_bound_yet_is_not_shown_free() -> None:
    nodes = hosts(fabric(blocks=1, racks=2, nodes=2))
    # A 3-pod gang planned on rack b0-r1 and b0-r0-n0; one of its pods is bound already.
    plan = {"b0-r1-n0": 1, "b0-r1-n1": 1, "b0-r0-n0": 1}
    bound = [BoundPod("ns/gang-0", "b0-r1-n0", {GPU: 8})]
    left_out: list[str] = []
    held = topo.reserved_pods(
        [admitted_workload("gang", 3, plan)], bound, {"ns/gang-0": ["uid-gang"]}, left_out
    )
    assert not left_out
    # Its bound pod fills its plan on b0-r1-n0: only the two others are held.
    assert sorted(p.node for p in held) == ["b0-r0-n0", "b0-r1-n1"]
    live = cluster(nodes, [*bound, *held], frozenset({"ns/gang-0"}))
    live.reserved = frozenset(p.key for p in held)
    out = shown(live, topo.Shape(GPU, 8))
    assert (
        "rack b0-r1  2 nodes  nvidia.com/gpu 0/16 free  pods 1 (1 Muster's)  + room of 1 "
        "planned or held  room for 0 x 8 nvidia.com/gpu"
    ) in out
    assert "rack b0-r0  2 nodes  nvidia.com/gpu 8/16 free  pods 0  + room of 1 planned" in out
