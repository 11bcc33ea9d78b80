"""The nodes a pod shape may ever use in a view: a profile's filters, run once per node
class and shape.

Nothing a filter reads changes within a view, so `candidates` runs the filters once per
node class (a node standing for its class) and remembers the answer for the view; a
`per_node` filter (the pod's node selection) goes node by node when the shape names single
nodes (a hostname selector, a `metadata.name` field).
Room is left to the placement walk. When no node passes, the answer carries the reason:
what the pod asks for, then what each filter ruled out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from quota.model.nodes import Node, PodShape
from quota.placement.framework import Filter
from quota.placement.nodes import NodeClass, NodeState, NodeView

# A class may be used through its index while a pod shape rules out at most this share of
# its nodes by name (skipped while walking); past it, the passing nodes are scanned instead.
_MOSTLY = 8


@dataclass(frozen=True, slots=True)
class Share:
    """The nodes of one class that pass: all of them, or all but a few named ones."""

    group: NodeClass
    excluded: tuple[NodeState, ...] = ()
    skip: frozenset[str] = frozenset()  # the excluded nodes' names

    @property
    def count(self) -> int:
        """How many nodes of the class pass."""
        return len(self.group.states) - len(self.excluded)

    def total_free(self, resource: str) -> int:
        """Free `resource` on the passing nodes of the class."""
        free = self.group.total.get(resource, 0)
        for state in self.excluded:
            free -= state.free.get(resource, 0)
        return free


@dataclass(frozen=True, slots=True)
class Candidates:
    """The nodes of a view that a pod shape may ever use (every filter but room passed)."""

    shares: tuple[Share, ...]  # used through the class indexes
    nodes: tuple[NodeState, ...]  # scanned one by one (a shape that names a few nodes)
    failure: str | None  # why no node passes; None when some does

    @property
    def count(self) -> int:
        """How many nodes pass."""
        return sum(s.count for s in self.shares) + len(self.nodes)

    def allocatables(self) -> Iterator[tuple[Mapping[str, int], int]]:
        """Each distinct allocatable vector among the passing nodes, with how many have it."""
        for share in self.shares:
            counts = Counter(share.group.allocatables)
            counts.subtract(frozenset(s.node.allocatable.items()) for s in share.excluded)
            for vector, count in counts.items():
                if count > 0:
                    yield dict(vector), count
        for state in self.nodes:
            yield state.node.allocatable, 1

    def total_free(self, resource: str) -> int:
        """Free `resource` summed over the passing nodes."""
        return sum(s.total_free(resource) for s in self.shares) + sum(
            s.free.get(resource, 0) for s in self.nodes
        )


def candidates(view: NodeView, shape: PodShape, filters: tuple[Filter, ...]) -> Candidates:
    """The nodes that pass `filters` for `shape`, computed once per view, filters and shape."""
    key = (filters, tuple(sorted(shape.node_selector.items())), shape.affinity, shape.tolerations)
    found = view.shape_cache.get(key)
    if not isinstance(found, Candidates):
        found = _filter(view, shape, filters)
        view.shape_cache[key] = found
    return found


def _refusing(filters: tuple[Filter, ...], node: Node, shape: PodShape) -> int:
    """The index of the first filter `node` fails, or -1 when it passes them all."""
    for i, f in enumerate(filters):
        if not f.passes(node, shape):
            return i
    return -1


def _names_single_nodes(shape: PodShape, per_node: frozenset[str]) -> bool:
    if any(k in per_node for k in shape.node_selector):
        return True
    return any(r.field or r.key in per_node for term in shape.affinity for r in term.requirements)


def _filter(view: NodeView, shape: PodShape, filters: tuple[Filter, ...]) -> Candidates:
    per_node = _names_single_nodes(shape, view.per_node_labels)
    # With a shape that names single nodes, only the per-node filters go node by node.
    shared = tuple(f for f in filters if not f.per_node) if per_node else filters
    own = tuple(f for f in filters if f.per_node) if per_node else ()
    shares: list[Share] = []
    nodes: list[NodeState] = []
    for group in view.classes:
        if _refusing(shared, group.states[0].node, shape) >= 0:
            continue
        members = group.states
        for f in own:
            passes = f.passes
            members = [s for s in members if passes(s.node, shape)]
        if not members:
            continue
        missing = len(group.states) - len(members)
        if missing * _MOSTLY <= len(group.states):
            # Indexed, skipping the few excluded nodes: what keeps placing cheap.
            passing = {s.name for s in members}
            excluded = tuple(s for s in group.states if s.name not in passing)
            shares.append(Share(group, excluded, frozenset(s.name for s in excluded)))
        else:
            nodes.extend(members)
    if shares or nodes:
        return Candidates(tuple(shares), tuple(nodes), None)
    return Candidates((), (), _failure(view, shape, filters, per_node))


def _selection(shape: PodShape) -> str:
    parts = []
    if shape.node_selector:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(shape.node_selector.items()))
        parts.append(f"carries labels {labels}")
    if shape.affinity:
        parts.append(f"matches node affinity {' or '.join(f'({t})' for t in shape.affinity)}")
    return " and ".join(parts)


def _failure(view: NodeView, shape: PodShape, filters: tuple[Filter, ...], per_node: bool) -> str:
    """Why no node passes: the pod's selection, then what each filter ruled out, each node
    counted against the first filter it fails."""
    if not len(view):
        return "there are no nodes"
    refused: list[list[tuple[Node, int]]] = [[] for _ in filters]
    for group in view.classes:
        if per_node:
            for state in group.states:
                refused[_refusing(filters, state.node, shape)].append((state.node, 1))
        else:
            node = group.states[0].node
            refused[_refusing(filters, node, shape)].append((node, len(group.states)))
    pod: list[str] = []
    state_words: list[str] = []
    for f, nodes in zip(filters, refused, strict=True):
        if nodes:
            said = f.summary(nodes, shape)
            pod.extend(said.pod)
            state_words.extend(said.nodes)
    selection = _selection(shape)
    head = f"no Ready node {selection}" if selection else "no Ready, schedulable node"
    if not pod and not state_words:
        return head
    if not pod:
        return f"{head} ({', '.join(state_words)})"
    return "; ".join(pod + state_words)
