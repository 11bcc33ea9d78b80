"""Rules about the queue tree that a CRD schema cannot express, because they span objects:
a parent that does not exist, a cycle of parents, a flavor that does not exist, a LocalQueue
pointing at a queue that is not a leaf.

The verdict is one Active state per queue. An inactive queue admits nothing new; the engine
honours that, and nothing already admitted is dropped because of it. Inactivity flows down
the tree: quota reaches a queue only through its ancestors, so a queue under an inactive
ancestor is inactive too, with a message naming the ancestor to fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quota.api.clusterqueue import ClusterQueue
from quota.api.conditions import ClusterQueueConditions as Reason
from quota.api.localqueue import LocalQueue
from quota.api.resourceflavor import ResourceFlavor

__all__ = ["QueueState", "QueueTree", "check_queue_tree"]


@dataclass(frozen=True)
class QueueState:
    """Whether a queue admits workloads, and why (the Active condition's status, reason and
    message)."""

    active: bool
    reason: str
    message: str

    @property
    def status(self) -> str:
        """ "True" or "False", as the Active condition writes it."""
        return "True" if self.active else "False"


@dataclass(frozen=True)
class QueueTree:
    """The checked tree: a state per ClusterQueue and per LocalQueue ((namespace, name)),
    and each queue's children in name order."""

    cluster_queues: Mapping[str, QueueState]
    local_queues: Mapping[tuple[str, str], QueueState]
    children: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def is_leaf(self, name: str) -> bool:
        """A queue no other queue names as its parent: the only kind that holds workloads."""
        return name in self.cluster_queues and not self.children.get(name)

    def inactive(self) -> frozenset[str]:
        """Names of the ClusterQueues that must not admit anything new."""
        return frozenset(n for n, s in self.cluster_queues.items() if not s.active)


def _cycles(parents: Mapping[str, str | None]) -> dict[str, list[str]]:
    """Every queue on a cycle of parents, mapped to the cycle (starting at that queue)."""
    on_cycle: dict[str, list[str]] = {}
    done: set[str] = set()
    for start in sorted(parents):
        path: list[str] = []
        seen: dict[str, int] = {}
        node: str | None = start
        while node is not None and node in parents and node not in done and node not in seen:
            seen[node] = len(path)
            path.append(node)
            node = parents[node]
        if node is not None and node in seen:
            cycle = path[seen[node] :]
            for i, member in enumerate(cycle):
                on_cycle[member] = cycle[i:] + cycle[:i]
        done.update(path)
    return on_cycle


def _own_problem(
    queue: ClusterQueue, parents: Mapping[str, str | None], flavors: frozenset[str]
) -> QueueState | None:
    parent = queue.spec.parent
    if parent is not None and parent not in parents:
        return QueueState(
            False,
            Reason.PARENT_NOT_FOUND,
            f"spec.parent names ClusterQueue {parent!r}, which does not exist; create it or "
            "fix spec.parent",
        )
    missing = [f.name for f in queue.spec.flavors if f.name not in flavors]
    if missing:
        names = ", ".join(repr(m) for m in missing)
        return QueueState(
            False,
            Reason.FLAVOR_NOT_FOUND,
            f"spec.flavors names ResourceFlavor {names}, which does not exist; create it or "
            "remove it from spec.flavors",
        )
    if queue.spec.stop_policy != "None":
        verb = "admits nothing new"
        if queue.spec.stop_policy == "HoldAndDrain":
            verb += " and evicts what is admitted"
        return QueueState(
            False, Reason.STOPPED, f"spec.stopPolicy is {queue.spec.stop_policy}: the queue {verb}"
        )
    return None


def check_queue_tree(
    cluster_queues: Iterable[ClusterQueue],
    flavors: Iterable[str | ResourceFlavor],
    local_queues: Iterable[LocalQueue] = (),
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> QueueTree:
    """Check the tree of ClusterQueues, their flavors and the LocalQueues pointing into it.

    ``namespace_labels`` (namespace -> labels), when given, also checks each LocalQueue's
    namespace against its ClusterQueue's namespaceSelector; namespaces missing from it are
    not checked.
    """
    queues = {q.name: q for q in cluster_queues}
    flavor_names = frozenset(f if isinstance(f, str) else f.name for f in flavors)
    parents = {name: q.spec.parent for name, q in queues.items()}
    children: dict[str, list[str]] = {name: [] for name in queues}
    for name, parent in sorted(parents.items()):
        if parent in children:
            children[parent].append(name)

    own: dict[str, QueueState] = {}
    for member, cycle in _cycles(parents).items():
        loop = " -> ".join([*cycle, cycle[0]])
        own[member] = QueueState(
            False,
            Reason.CYCLE,
            f"spec.parent forms a cycle ({loop}); point one of these queues at a queue "
            "outside the cycle or remove its parent",
        )
    for name, queue in queues.items():
        if name not in own and (problem := _own_problem(queue, parents, flavor_names)):
            own[name] = problem

    states: dict[str, QueueState] = {}
    for name in queues:
        states[name] = own.get(name) or _inherited(name, parents, own) or _ready(name, children)

    lq_states: dict[tuple[str, str], QueueState] = {}
    for lq in local_queues:
        key = (lq.metadata.namespace or "", lq.name)
        lq_states[key] = _local_queue_state(lq, queues, children, states, namespace_labels)

    return QueueTree(
        cluster_queues=states,
        local_queues=lq_states,
        children={name: tuple(kids) for name, kids in children.items()},
    )


def _inherited(
    name: str, parents: Mapping[str, str | None], own: Mapping[str, QueueState]
) -> QueueState | None:
    ancestor = parents.get(name)
    visited = {name}
    while ancestor is not None and ancestor in parents and ancestor not in visited:
        if ancestor in own:
            problem = own[ancestor]
            return QueueState(
                False,
                Reason.ANCESTOR_INACTIVE,
                f"ancestor ClusterQueue {ancestor!r} is inactive ({problem.reason}: "
                f"{problem.message})",
            )
        visited.add(ancestor)
        ancestor = parents[ancestor]
    return None


def _ready(name: str, children: Mapping[str, list[str]]) -> QueueState:
    kids = children.get(name, [])
    if kids:
        return QueueState(
            True,
            Reason.READY,
            f"distributes its quota among {len(kids)} child queue(s): {', '.join(kids)}",
        )
    return QueueState(True, Reason.READY, "can admit workloads")


def _local_queue_state(
    lq: LocalQueue,
    queues: Mapping[str, ClusterQueue],
    children: Mapping[str, list[str]],
    states: Mapping[str, QueueState],
    namespace_labels: Mapping[str, Mapping[str, str]] | None,
) -> QueueState:
    target = lq.spec.cluster_queue
    if target not in queues:
        return QueueState(
            False,
            Reason.CLUSTER_QUEUE_NOT_FOUND,
            f"spec.clusterQueue names ClusterQueue {target!r}, which does not exist",
        )
    if children.get(target):
        kids = ", ".join(children[target])
        return QueueState(
            False,
            Reason.CLUSTER_QUEUE_NOT_LEAF,
            f"ClusterQueue {target!r} is a parent queue (children: {kids}); only leaf queues "
            "hold workloads, so point spec.clusterQueue at one of its children",
        )
    namespace = lq.metadata.namespace or ""
    selector = queues[target].spec.namespace_selector
    if (
        selector is not None
        and namespace_labels is not None
        and namespace in namespace_labels
        and not selector.matches(dict(namespace_labels[namespace]))
    ):
        return QueueState(
            False,
            Reason.NAMESPACE_NOT_SELECTED,
            f"namespace {namespace!r} does not match the namespaceSelector of ClusterQueue "
            f"{target!r}",
        )
    target_state = states[target]
    if not target_state.active:
        return QueueState(
            False,
            Reason.CLUSTER_QUEUE_INACTIVE,
            f"ClusterQueue {target!r} is inactive ({target_state.reason}: {target_state.message})",
        )
    return QueueState(True, Reason.READY, f"workloads are queued in ClusterQueue {target!r}")
