"""The topology side by side of bench/scheduler_bench.py: the fabric's labels, the stream of
gangs it sends, and how it counts where the gangs landed (the share it prints)."""

from __future__ import annotations

from collections import Counter

from bench.scheduler_bench import BLOCK_LABEL, NODE_GPUS, POD_GPUS, RACK_LABEL, Fabric, rack_spread


def test_fabric_labels_put_each_rack_whole_inside_one_block() -> None:
    fabric = Fabric(blocks=2, racks=3, nodes=4)
    labels = [fabric.labels(i) for i in range(fabric.count)]
    nodes_per_rack = Counter(x[RACK_LABEL] for x in labels)
    assert len(nodes_per_rack) == 6
    assert set(nodes_per_rack.values()) == {4}
    blocks_of_rack = {(x[RACK_LABEL], x[BLOCK_LABEL]) for x in labels}
    assert len(blocks_of_rack) == 6  # no rack straddles two blocks
    assert Counter(x[BLOCK_LABEL] for x in labels) == {"b0": 12, "b1": 12}


def test_gangs_fit_a_rack_each_and_ask_for_no_more_than_the_fill() -> None:
    fabric = Fabric(blocks=4, racks=8, nodes=16)
    sizes = fabric.gang_sizes(0.75)
    rack_pods = fabric.nodes * NODE_GPUS // POD_GPUS
    assert set(sizes) == {rack_pods // 8, rack_pods // 4, rack_pods // 2}
    cluster_pods = fabric.count * NODE_GPUS // POD_GPUS
    assert 0.7 * cluster_pods < sum(sizes) <= 0.75 * cluster_pods
    # One-node racks still get gangs of at least one pod.
    assert min(Fabric(1, 2, 1).gang_sizes(1.0)) >= 1


def test_a_gang_counts_inside_one_rack_only_when_whole_and_in_a_single_rack() -> None:
    rack_of = {"n0": "r0", "n1": "r0", "n2": "r1", "n3": "r2"}
    gangs = {"whole": 2, "split": 2, "partial": 3}
    gang_of = {"w0": "whole", "w1": "whole", "s0": "split", "s1": "split", "p0": "partial"}
    node_of = {"w0": "n0", "w1": "n1", "s0": "n1", "s1": "n2", "p0": "n1"}
    spread = rack_spread(gangs, gang_of, node_of, rack_of)
    assert spread["gangs_all_bound"] == 2  # "partial" has one of its three pods bound
    assert spread["gangs_in_one_rack"] == 1
    assert spread["share_in_one_rack"] == round(1 / 3, 3)
    assert spread["gangs_over_several_racks"] == 1
    assert spread["most_racks_of_one_gang"] == 2
    assert (spread["racks_used"], spread["racks_untouched"]) == (2, 1)
