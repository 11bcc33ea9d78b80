"""Which nodes, in the words people read in reasons, Events and reports."""

from __future__ import annotations

from quota.model.nodewords import named_nodes, node_list, pods_on_nodes


def test_a_long_list_names_four_nodes_and_counts_the_rest() -> None:
    nodes = [f"gpu-{i}" for i in range(7)]
    assert node_list(nodes) == "gpu-0, gpu-1, gpu-2, gpu-3 and 3 more"
    assert node_list(nodes[:4]) == "gpu-0, gpu-1, gpu-2, gpu-3"


def test_one_node_is_a_node_and_several_are_nodes() -> None:
    assert named_nodes(["gpu-0"]) == "node gpu-0"
    assert named_nodes(["gpu-0", "gpu-1"]) == "nodes gpu-0, gpu-1"


def test_pods_are_summed_per_node_in_the_order_first_seen() -> None:
    # Two pod sets on the same node count as one node with all their pods.
    placed = [("h100-2", 4), ("h100-1", 2), ("h100-2", 4), ("a100-1", 1)]
    assert pods_on_nodes(placed) == "h100-2 (x8), h100-1 (x2), a100-1"


def test_past_four_nodes_the_rest_are_counted_as_nodes() -> None:
    placed = [(f"n{i}", 2) for i in range(6)]
    assert pods_on_nodes(placed) == "n0 (x2), n1 (x2), n2 (x2), n3 (x2) and 2 more nodes"
    assert pods_on_nodes(placed[:5]).endswith(" and 1 more node")
