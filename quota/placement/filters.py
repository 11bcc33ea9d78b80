"""What a pod needs from a node, and which nodes pass: selector, affinity, taints, room.

A node passes when it is Ready, not cordoned, carries the pod's node selector labels,
matches one of its required node affinity terms, has every NoSchedule and NoExecute taint
tolerated, and has room for the pod's requests and a pod slot.
Everything but room never changes within a view, so `candidates` runs those filters once
per node class and pod shape and remembers the answer; room is checked per node by the
placement loop. Every failing filter has a short reason a person can act on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from quota.model.nodes import Node, PodShape, Taint, Toleration
from quota.model.resources import format_amount
from quota.placement.nodes import PODS, Demand, NodeClass, NodeState, NodeView

# -- static filters: the same answer for a node all through a view ------------------------


def labels_match(shape: PodShape, labels: Mapping[str, str], name: str) -> bool:
    """Node selector and required node affinity both hold for these labels and node name."""
    for key, wanted in shape.node_selector.items():
        if labels.get(key) != wanted:
            return False
    return not shape.affinity or any(t.matches(labels, name) for t in shape.affinity)


def label_reason(shape: PodShape, labels: Mapping[str, str], name: str) -> str | None:
    """Why the node's labels rule it out, or None when they do not."""
    for key, wanted in sorted(shape.node_selector.items()):
        have = labels.get(key)
        if have != wanted:
            has = f"has {key}={have}" if have is not None else f"has no {key} label"
            return f"node selector {key}={wanted} not matched (node {has})"
    if not shape.affinity or any(t.matches(labels, name) for t in shape.affinity):
        return None
    if len(shape.affinity) == 1:
        failing = next(
            (r for r in shape.affinity[0].requirements if not r.matches(labels, name)), None
        )
        return f"node affinity {failing or shape.affinity[0]} not matched"
    return f"none of the {len(shape.affinity)} node affinity terms matched"


def untolerated(tolerations: tuple[Toleration, ...], taints: tuple[Taint, ...]) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration matches, or None."""
    for taint in taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


def static_reason(node: Node, shape: PodShape) -> str | None:
    """Why `node` can never take this pod in the current view (room aside), or None."""
    if not node.ready:
        return "not Ready"
    if node.unschedulable:
        return "cordoned (spec.unschedulable)"
    reason = label_reason(shape, node.labels, node.name)
    if reason is not None:
        return reason
    taint = untolerated(shape.tolerations, node.taints)
    return None if taint is None else f"taint {taint} not tolerated"


# -- room ---------------------------------------------------------------------------------


def fit_count(free: Mapping[str, int], demand: Demand) -> int:
    """How many pods of `demand` fit in `free`: the least over resources of free // request."""
    return max(0, min([free.get(r, 0) // v for r, v in demand]))


def fits_one(free: Mapping[str, int], demand: Demand) -> bool:
    """True when one pod of `demand` fits in `free`."""
    # A plain loop: this runs for every node a placement looks at, and all() over a
    # generator costs about twice as much.
    for r, v in demand:  # noqa: SIM110
        if free.get(r, 0) < v:
            return False
    return True


def shortfall(node: Node, free: Mapping[str, int], demand: Demand) -> str | None:
    """The first resource a node lacks for one pod, as "4 of 8 nvidia.com/gpu free", or None."""
    for r, v in demand:
        have = free.get(r, 0)
        if have >= v:
            continue
        allocatable = node.allocatable.get(r, 0)
        if r == PODS:
            return f"{have} of {allocatable} pod slots free"
        return (
            f"{format_amount(r, have)} of {format_amount(r, allocatable)} {r} free, "
            f"pod needs {format_amount(r, v)}"
        )
    return None


def node_reason(view: NodeView, name: str, shape: PodShape, demand: Demand) -> str | None:
    """Why node `name` cannot take one pod of this shape right now, or None when it can."""
    view.settle()
    state = view.states[name]
    reason = static_reason(state.node, shape) or shortfall(state.node, state.free, demand)
    return None if reason is None else f"node {name}: {reason}"


# -- candidates: static filters once per class and shape ----------------------------------


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


def candidates(view: NodeView, shape: PodShape) -> Candidates:
    """The nodes that pass the static filters for `shape`, computed once per view and shape."""
    key = (tuple(sorted(shape.node_selector.items())), shape.affinity, shape.tolerations)
    found = view.shape_cache.get(key)
    if not isinstance(found, Candidates):
        found = _filter(view, shape)
        view.shape_cache[key] = found
    return found


def _names_single_nodes(shape: PodShape, per_node: frozenset[str]) -> bool:
    if any(k in per_node for k in shape.node_selector):
        return True
    return any(r.field or r.key in per_node for term in shape.affinity for r in term.requirements)


def _filter(view: NodeView, shape: PodShape) -> Candidates:
    per_node = _names_single_nodes(shape, view.per_node_labels)
    shares: list[Share] = []
    nodes: list[NodeState] = []
    matched = not_ready = cordoned = 0
    taints: Counter[Taint] = Counter()
    for group in view.classes:
        if per_node:
            members = [s for s in group.states if labels_match(shape, s.node.labels, s.name)]
        elif labels_match(shape, group.labels, ""):
            members = group.states
        else:
            members = []
        if not members:
            continue
        matched += len(members)
        if not group.ready:
            not_ready += len(members)
            continue
        if group.unschedulable:
            cordoned += len(members)
            continue
        taint = untolerated(shape.tolerations, group.taints)
        if taint is not None:
            taints[taint] += len(members)
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
    return Candidates((), (), _failure(view, shape, matched, not_ready, cordoned, taints))


def _selection(shape: PodShape) -> str:
    parts = []
    if shape.node_selector:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(shape.node_selector.items()))
        parts.append(f"carries labels {labels}")
    if shape.affinity:
        parts.append(f"matches node affinity {' or '.join(f'({t})' for t in shape.affinity)}")
    return " and ".join(parts)


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _failure(
    view: NodeView,
    shape: PodShape,
    matched: int,
    not_ready: int,
    cordoned: int,
    taints: Counter[Taint],
) -> str:
    if not len(view):
        return "there are no nodes"
    selection = _selection(shape)
    head = f"no Ready node {selection}" if selection else "no Ready, schedulable node"
    if not matched:
        return head
    unusable = []
    if not_ready:
        unusable.append(f"{_nodes(not_ready)} not Ready")
    if cordoned:
        unusable.append(f"{_nodes(cordoned)} cordoned")
    if not taints:
        return f"{head} ({', '.join(unusable)})"
    # Most common first: the taint that rules out most nodes is the one to tolerate.
    parts = [
        f"taint {t} not tolerated ({_nodes(n)})"
        for t, n in sorted(taints.items(), key=lambda item: (-item[1], str(item[0])))
    ]
    return "; ".join(parts + unusable)
