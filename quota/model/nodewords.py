"""Which nodes, in words shown to people: the one way reasons, Events and reports list them.

A list is cut after a few nodes ("and 3 more"): a reason names where a gang went or which
nodes a victim must leave, and a 64-node gang must not make it a page long.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SHOWN = 4  # nodes named before "and N more"


def node_list(nodes: Sequence[str], most: int = SHOWN) -> str:
    """ "h100-1, h100-2, h100-3, h100-4 and 2 more": the first `most` names, and the count of
    the rest."""
    more = len(nodes) - most
    return ", ".join(nodes[:most]) + (f" and {more} more" if more > 0 else "")


def named_nodes(nodes: Sequence[str], most: int = SHOWN) -> str:
    """ "node h100-1", or "nodes h100-1, h100-2, h100-3, h100-4 and 2 more"."""
    return f"{'node' if len(nodes) == 1 else 'nodes'} {node_list(nodes, most)}"


def pods_on_nodes(placed: Iterable[tuple[str, int]], most: int = SHOWN) -> str:
    """ "h100-1 (x4), h100-2 (x4), h100-3 and 2 more nodes": (node, pods) pairs, summed per
    node in the order first seen, a count shown where a node has more than one pod."""
    per_node: dict[str, int] = {}
    for node, n in placed:
        per_node[node] = per_node.get(node, 0) + n
    labels = [f"{node} (x{n})" if n > 1 else node for node, n in per_node.items()]
    more = len(labels) - most
    return node_list(labels, most) + ((" nodes" if more > 1 else " node") if more > 0 else "")
