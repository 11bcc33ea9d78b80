"""Nodes, the pods bound to them, and the view of free room that placement reads and updates.

A `NodeView` is built once per admission cycle (or scheduler pass) from every node and every
bound, unfinished pod, Muster's or not. It is the one mutable thing in the placement core:
`assume` takes room for a placement, `forget` gives it back, `remove_pod` / `add_pod` play
preemption what-ifs. Placement cost must not grow with nodes x pods, so the view keeps
indexes: nodes that every filter treats alike share a `NodeClass` (filters run once per
class, `candidates.py`), and within a class each resource has a sorted index of nodes by
free amount, so "the fullest node that still fits" is a bisect and an update is O(log n)
per touched node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from sortedcontainers import SortedList

from quota.model.nodes import BoundPod, Node

PODS = "pods"
# The node label naming each node: `quota.api.names.HOSTNAME_LABEL`, spelled again here (a
# test holds them equal) because importing the API would load every pydantic model into the
# placement core, tripling what importing it costs.
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


class PlacedPods(Protocol):
    """What assume and forget need of a placement (`gang.Placement` is one)."""

    @property
    def nodes(self) -> Mapping[str, tuple[tuple[str, int], ...]]:
        """Pod set -> ((node, pods on it), ...)."""

    @property
    def requests(self) -> Mapping[str, Mapping[str, int]]:
        """Pod set -> what each of its pods requests."""


def demand_of(requests: Mapping[str, int]) -> Demand:
    """One pod's demand: its positive requests plus one pod slot (a "pods" request is ignored)."""
    items = sorted((r, v) for r, v in requests.items() if v > 0 and r != PODS)
    items.append((PODS, 1))
    return tuple(items)


def fit_count(free: Mapping[str, int], demand: Demand) -> int:
    """How many pods of `demand` fit in `free`: the least over resources of free // request."""
    return max(0, min([free.get(r, 0) // v for r, v in demand]))


def tie_order(resources: Iterable[str]) -> tuple[str, ...]:
    """The fixed order in which free amounts break ties: devices, cpu, memory, others, pods.

    Devices come first because they are what a bin-packer must not fragment; pod slots
    last because a node's pod count says least about how full it is.
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
    """Nodes that every filter treats alike: same labels (per-node ones aside), taints, flags.

    A filter's answer for one of them stands for all (`candidates.py`).
    """

    __slots__ = (
        "allocatables",
        "fits",
        "indexes",
        "ready",
        "states",
        "total",
        "unschedulable",
        "version",
    )

    def __init__(self, unschedulable: bool, ready: bool) -> None:
        self.unschedulable = unschedulable
        self.ready = ready
        self.states: list[NodeState] = []
        self.total: dict[str, int] = {}  # free room of the whole class, per resource
        # Bumped by every take on one of its nodes: what `fit_total` caches stays true while
        # the version it was worked out at is current.
        self.version = 0
        self.fits: dict[Demand, tuple[int, int]] = {}  # demand -> (version, pods that fit)
        # Distinct allocatable vectors and how many nodes have each: "could it ever fit"
        # questions are answered per node type, not per node.
        self.allocatables: Counter[frozenset[tuple[str, int]]] = Counter()
        # Built on first use: a class only pays for the resources pods ask it about.
        self.indexes: dict[str, SortedList[NodeKey]] = {}

    def fit_total(self, demand: Demand) -> int:
        """How many pods of `demand` the class's nodes take between them now.

        Topology placement asks it of every class of a flavor for each gang; between two
        gangs only the classes a placement touched have changed, so it is cached."""
        cached = self.fits.get(demand)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        count = sum(fit_count(state.free, demand) for state in self.states)
        self.fits[demand] = (self.version, count)
        return count

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
        # A placement found but not yet assumed still holds its room (see `hold`).
        self._held: tuple[PlacedPods, list[tuple[NodeState, Demand, int]]] | None = None
        free: dict[str, dict[str, int]] = {}
        for node in node_list:
            if node.name in free:
                raise ValueError(f"node {node.name} appears twice")
            room = dict(node.allocatable)
            room.setdefault(PODS, 0)
            free[node.name] = room
        for pod in pods:
            self._bind(pod, free)
        self.order = tie_order(set().union(*free.values()))
        per_node = frozenset(per_node_labels) | _unique_label_keys(node_list)
        self.per_node_labels = per_node
        self.classes: list[NodeClass] = []
        by_key: dict[object, NodeClass] = {}
        order = self.order
        for node in node_list:
            labels = node.labels
            if not per_node.isdisjoint(labels):
                labels = {k: v for k, v in labels.items() if k not in per_node}
            class_key = (
                frozenset(labels.items()),
                frozenset(node.taints),
                node.unschedulable,
                node.ready,
            )
            group = by_key.get(class_key)
            if group is None:
                group = NodeClass(node.unschedulable, node.ready)
                by_key[class_key] = group
                self.classes.append(group)
            room = free[node.name]
            state = NodeState(node, room, group)
            state.tie = tuple([room.get(r, 0) for r in order])
            group.states.append(state)
            group.allocatables[frozenset(node.allocatable.items())] += 1
            total = group.total
            for r, v in room.items():
                total[r] = total.get(r, 0) + v
            self.states[node.name] = state
        # Filter results per pod shape (`filters.candidates`); nodes never change within a
        # view, so they stay true.
        self.shape_cache: dict[object, object] = {}

    def _bind(self, pod: BoundPod, free: Mapping[str, dict[str, int]]) -> None:
        key = pod.key
        if key in self.pods:
            raise ValueError(f"pod {key} appears twice")
        room = free.get(pod.node)
        if room is None:
            self.orphans.append(pod)
            return
        for r, v in pod.requests.items():
            if v > 0 and r != PODS:
                room[r] = room.get(r, 0) - v
        room[PODS] -= 1
        self.pods[key] = pod
        on = self._on_node.get(pod.node)
        if on is None:
            self._on_node[pod.node] = {key}
        else:
            on.add(key)

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
        self.settle()
        return dict(self.states[name].free)

    def free_by_node(self) -> dict[str, dict[str, int]]:
        """A copy of the room left on every node."""
        self.settle()
        return {name: dict(state.free) for name, state in self.states.items()}

    def pods_on(self, name: str) -> tuple[BoundPod, ...]:
        """The pods bound to node `name`, by key."""
        if name not in self.states:
            raise KeyError(name)
        return tuple(self.pods[key] for key in sorted(self._on_node.get(name, ())))

    # -- changing -----------------------------------------------------------------------

    def take(self, state: NodeState, demand: Demand, times: int) -> None:
        """Take `times` x `demand` from a node (negative gives back), keeping indexes exact.

        The primitive under assume/forget and the placement scratch; callers use those.
        """
        group = state.group
        group.version += 1
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

    def hold(self, placement: PlacedPods, log: list[tuple[NodeState, Demand, int]]) -> None:
        """Leave a just-found placement's takes in place until the next call on the view.

        Placing then assuming is the common path; keeping the takes saves undoing them and
        taking them again. `assume(placement)` keeps them; anything else first undoes them
        (`settle`), so to every caller the view looks as if placing never touched it.
        """
        self.settle()
        self._held = (placement, log)

    def settle(self) -> None:
        """Undo the takes of a held placement that was not assumed."""
        held = self._held
        if held is not None:
            self._held = None
            for state, demand, times in reversed(held[1]):
                self.take(state, demand, -times)

    def assume(self, placement: PlacedPods) -> None:
        """Take the room `placement` needs, as if its pods were bound."""
        if self._held is not None and self._held[0] is placement:
            self._held = None
            return
        self._apply(placement, 1)

    def forget(self, placement: PlacedPods) -> None:
        """Give back the room of a placement assumed earlier (and only such a one)."""
        self._apply(placement, -1)

    def _apply(self, placement: PlacedPods, sign: int) -> None:
        self.settle()
        # Checked before anything is taken, so that a bad placement changes nothing.
        for pod_set, pairs in placement.nodes.items():
            for name, _ in pairs:
                if name not in self.states:
                    raise ValueError(f"placement of pod set {pod_set} names unknown node {name}")
        for pod_set, pairs in placement.nodes.items():
            demand = demand_of(placement.requests[pod_set])
            for name, count in pairs:
                self.take(self.states[name], demand, sign * count)

    def remove_pod(self, key: str) -> BoundPod:
        """Unbind pod `key` (a preemption what-if) and return it; KeyError when unknown."""
        self.settle()
        pod = self.pods.pop(key)
        self._on_node[pod.node].discard(key)
        self.take(self.states[pod.node], demand_of(pod.requests), -1)
        return pod

    def add_pod(self, pod: BoundPod) -> None:
        """Bind `pod` in the view (undoing `remove_pod`, or a pod the loop just bound)."""
        self.settle()
        if pod.key in self.pods:
            raise ValueError(f"pod {pod.key} is already bound to {self.pods[pod.key].node}")
        state = self.states.get(pod.node)
        if state is None:
            raise ValueError(f"pod {pod.key} names unknown node {pod.node}")
        self.pods[pod.key] = pod
        self._on_node.setdefault(pod.node, set()).add(pod.key)
        self.take(state, demand_of(pod.requests), 1)


def _unique_label_keys(nodes: list[Node]) -> frozenset[str]:
    """Label keys whose every value names one node, past a few: per-node by nature."""
    values: dict[str, set[str]] = {}
    carriers: Counter[str] = Counter()
    for node in nodes:
        carriers.update(node.labels.keys())
        for k, v in node.labels.items():
            seen = values.get(k)
            if seen is None:
                values[k] = {v}
            else:
                seen.add(v)
    return frozenset(
        k
        for k, seen in values.items()
        if len(seen) > _UNIQUE_LABEL_VALUES and len(seen) == carriers[k]
    )
