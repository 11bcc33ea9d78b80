"""Nodes, the pods bound to them, and the view of free room that placement reads and updates.

A `NodeView` is built once per admission cycle (or scheduler pass) from every node and every
bound, unfinished pod, Muster's or not. It is the one mutable thing in the placement core:
`assume` takes room for a placement, `forget` gives it back, `remove_pod` / `add_pod` play
preemption what-ifs. Placement cost must not grow with nodes x pods, so the view keeps
indexes: nodes that every filter treats alike share a `NodeClass` (filters run once per
class), and within a class each resource has a sorted index of nodes by free amount, so
"the fullest node that still fits" is a bisect and an update is O(log n) per touched node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from quota.model.snapshot import Taint

if TYPE_CHECKING:
    from quota.placement.filters import Candidates
    from quota.placement.gang import Placement

PODS = "pods"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# A label whose every value names exactly one node (an instance id, say) would give each
# node a class of its own; past this many distinct values such a key is treated like the
# hostname label and matched node by node. Only speed depends on it, never a decision.
_UNIQUE_LABEL_VALUES = 16

# Per-pod amounts as (resource, amount) pairs, the pod slot included: the shape the hot
# loops iterate over.
Demand = tuple[tuple[str, int], ...]

# A node's place in one resource's index: the free amount of that resource, then the free
# amounts of every resource in the view's tie order, then the name (unique, so keys are).
NodeKey = tuple[int, tuple[int, ...], str]


@dataclass(frozen=True, slots=True)
class Node:
    """A node as placement sees it; `allocatable` includes "pods" (missing means none)."""

    name: str
    allocatable: Mapping[str, int]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod bound to a node and not finished, whoever owns it; it holds one pod slot too."""

    key: str  # "namespace/name"
    node: str
    requests: Mapping[str, int]


def demand_of(requests: Mapping[str, int]) -> Demand:
    """One pod's demand: its positive requests plus one pod slot (a "pods" request is ignored)."""
    items = sorted((r, v) for r, v in requests.items() if v > 0 and r != PODS)
    items.append((PODS, 1))
    return tuple(items)


def tie_order(resources: Iterable[str]) -> tuple[str, ...]:
    """The fixed order in which free amounts break ties: devices, cpu, memory, others, pods.

    Devices come first because they are what a bin-packer must not fragment; pod slots
    last because they are rarely what runs out.
    """

    def rank(resource: str) -> tuple[int, str]:
        if resource == PODS:
            return (4, resource)
        if resource == "cpu":
            return (1, resource)
        if resource == "memory":
            return (2, resource)
        if "/" in resource:
            return (0, resource)
        return (3, resource)

    return tuple(sorted(set(resources), key=rank))


class NodeState:
    """One node's free room as the indexes see it."""

    __slots__ = ("free", "group", "name", "node", "tie")

    def __init__(self, node: Node, free: dict[str, int], group: NodeClass) -> None:
        self.node = node
        self.name = node.name
        self.free = free
        self.group = group
        self.tie: tuple[int, ...] = ()

    def key(self, resource: str) -> NodeKey:
        """This node's key in `resource`'s index."""
        return (self.free.get(resource, 0), self.tie, self.name)


class NodeClass:
    """Nodes that every filter treats alike: same labels (per-node ones aside), taints, flags."""

    __slots__ = (
        "allocatables",
        "indexes",
        "labels",
        "ready",
        "states",
        "taints",
        "total",
        "unschedulable",
    )

    def __init__(
        self, labels: Mapping[str, str], taints: tuple[Taint, ...], unschedulable: bool, ready: bool
    ) -> None:
        self.labels = labels
        self.taints = taints
        self.unschedulable = unschedulable
        self.ready = ready
        self.states: list[NodeState] = []
        self.total: dict[str, int] = {}  # free room of the whole class, per resource
        # Distinct allocatable vectors and how many nodes have each: "could it ever fit"
        # questions are answered per node type, not per node.
        self.allocatables: Counter[tuple[tuple[str, int], ...]] = Counter()
        # Built on first use: a class only pays for the resources pods ask it about.
        self.indexes: dict[str, SortedList[NodeKey]] = {}

    def index(self, resource: str) -> SortedList[NodeKey]:
        """The class's nodes ordered by free `resource` (then the tie order, then name)."""
        found = self.indexes.get(resource)
        if found is None:
            found = SortedList(s.key(resource) for s in self.states)
            self.indexes[resource] = found
        return found


class NodeView:
    """Free room on every node, indexed for placement; owned by one cycle or loop at a time."""

    def __init__(
        self,
        nodes: Iterable[Node],
        pods: Iterable[BoundPod] = (),
        *,
        per_node_labels: Iterable[str] = (HOSTNAME_LABEL,),
    ) -> None:
        node_list = list(nodes)
        self.states: dict[str, NodeState] = {}
        self.pods: dict[str, BoundPod] = {}
        self._on_node: dict[str, set[str]] = {}
        # Pods naming a node the view does not have (the caches lag each other): counted
        # nowhere, since that node cannot be chosen either.
        self.orphans: list[BoundPod] = []
        free: dict[str, dict[str, int]] = {}
        for node in node_list:
            if node.name in free:
                raise ValueError(f"node {node.name} appears twice")
            room = {r: v for r, v in node.allocatable.items()}
            room.setdefault(PODS, 0)
            free[node.name] = room
            self._on_node[node.name] = set()
        for pod in pods:
            if pod.key in self.pods:
                raise ValueError(f"pod {pod.key} appears twice")
            room = free.get(pod.node)
            if room is None:
                self.orphans.append(pod)
                continue
            for r, v in demand_of(pod.requests):
                room[r] = room.get(r, 0) - v
            self.pods[pod.key] = pod
            self._on_node[pod.node].add(pod.key)
        self.order = tie_order(r for room in free.values() for r in room)
        self.per_node_labels = frozenset(per_node_labels) | _unique_label_keys(node_list)
        self.classes: list[NodeClass] = []
        by_key: dict[object, NodeClass] = {}
        for node in node_list:
            labels = {k: v for k, v in node.labels.items() if k not in self.per_node_labels}
            class_key = (
                frozenset(labels.items()),
                frozenset(node.taints),
                node.unschedulable,
                node.ready,
            )
            group = by_key.get(class_key)
            if group is None:
                group = NodeClass(labels, node.taints, node.unschedulable, node.ready)
                by_key[class_key] = group
                self.classes.append(group)
            state = NodeState(node, free[node.name], group)
            state.tie = tuple(state.free.get(r, 0) for r in self.order)
            group.states.append(state)
            group.allocatables[tuple(sorted(node.allocatable.items()))] += 1
            for r, v in state.free.items():
                group.total[r] = group.total.get(r, 0) + v
            self.states[node.name] = state
        # Filter results per pod shape; nodes never change within a view, so they stay true.
        self.shape_cache: dict[object, Candidates] = {}

    # -- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.states)

    def __contains__(self, name: object) -> bool:
        return name in self.states

    def __iter__(self) -> Iterator[str]:
        return iter(self.states)

    def node(self, name: str) -> Node:
        """The node called `name` (KeyError when the view has none)."""
        return self.states[name].node

    def free(self, name: str) -> dict[str, int]:
        """A copy of the room left on node `name`, per resource, pod slots included."""
        return dict(self.states[name].free)

    def free_by_node(self) -> dict[str, dict[str, int]]:
        """A copy of the room left on every node."""
        return {name: dict(state.free) for name, state in self.states.items()}

    def pods_on(self, name: str) -> tuple[BoundPod, ...]:
        """The pods bound to node `name`, by key."""
        return tuple(self.pods[key] for key in sorted(self._on_node[name]))

    # -- changing -----------------------------------------------------------------------

    def take(self, state: NodeState, demand: Demand, times: int) -> None:
        """Take `times` x `demand` from a node (negative gives back), keeping indexes exact.

        The primitive under assume/forget and the placement scratch; callers use those.
        """
        group = state.group
        indexes = group.indexes
        free = state.free
        name = state.name
        tie = state.tie
        for r, index in indexes.items():
            index.remove((free.get(r, 0), tie, name))
        total = group.total
        for r, v in demand:
            amount = v * times
            free[r] = free.get(r, 0) - amount
            total[r] = total.get(r, 0) - amount
        state.tie = tie = tuple([free.get(r, 0) for r in self.order])
        for r, index in indexes.items():
            index.add((free.get(r, 0), tie, name))

    def assume(self, placement: Placement) -> None:
        """Take the room `placement` needs, as if its pods were bound."""
        self._apply(placement, 1)

    def forget(self, placement: Placement) -> None:
        """Give back the room of a placement assumed earlier (and only such a one)."""
        self._apply(placement, -1)

    def _apply(self, placement: Placement, sign: int) -> None:
        for pod_set, pairs in placement.nodes.items():
            demand = demand_of(placement.requests[pod_set])
            for name, count in pairs:
                state = self.states.get(name)
                if state is None:
                    raise ValueError(f"placement of pod set {pod_set} names unknown node {name}")
                self.take(state, demand, sign * count)

    def remove_pod(self, key: str) -> BoundPod:
        """Unbind pod `key` (a preemption what-if) and return it; KeyError when unknown."""
        pod = self.pods.pop(key)
        self._on_node[pod.node].discard(key)
        self.take(self.states[pod.node], demand_of(pod.requests), -1)
        return pod

    def add_pod(self, pod: BoundPod) -> None:
        """Bind `pod` in the view (undoing `remove_pod`, or a pod the loop just bound)."""
        if pod.key in self.pods:
            raise ValueError(f"pod {pod.key} is already bound to {self.pods[pod.key].node}")
        state = self.states.get(pod.node)
        if state is None:
            raise ValueError(f"pod {pod.key} names unknown node {pod.node}")
        self.pods[pod.key] = pod
        self._on_node[pod.node].add(pod.key)
        self.take(state, demand_of(pod.requests), 1)


def _unique_label_keys(nodes: list[Node]) -> frozenset[str]:
    values: dict[str, Counter[str]] = {}
    for node in nodes:
        for k, v in node.labels.items():
            values.setdefault(k, Counter())[v] += 1
    return frozenset(
        k
        for k, seen in values.items()
        if len(seen) > _UNIQUE_LABEL_VALUES and max(seen.values()) == 1
    )
