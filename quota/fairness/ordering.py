"""The order in which a cycle visits queues and workloads.

Queues furthest below their fair share go first: a queue's saturation is its dominant
usage/fair-share ratio over the flavor-resources it uses, so a team that has little of
everything is served before one that is short of one thing only. Equal ratios (typically
zero, when queues start empty) fall back to queue priority, then name. Inside a queue,
higher workload priority first, then earlier arrival, then key, so decisions never depend
on the order the shell listed workloads in.

Across the tree, subtrees are compared before the queues in them, the way hierarchical fair
schedulers pick: among the roots the least saturated subtree goes first, inside it the least
saturated child, and so on down to a leaf. A team far below its own share still waits while
its department is more saturated than another department; otherwise an idle team could pull
into a well-served department the capacity that a less served department is owed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Mapping

from quota.model.resources import FlavorResource
from quota.model.snapshot import QueueTree, Workload

QueueKey = tuple[float, int, str]


def workload_order(workload: Workload) -> tuple[int, float, str]:
    """Sort key inside a leaf queue: priority (high first), arrival, key."""
    return (-workload.priority, workload.arrival, workload.key)


def dominant_ratio(
    usage: Mapping[FlavorResource, int], share: Mapping[FlavorResource, int]
) -> float:
    """Largest usage/fair-share ratio over the keys in use (inf when using beyond a zero share)."""
    ratio = 0.0
    for key, used in usage.items():
        if used <= 0:
            continue
        fair = share.get(key, 0)
        if fair <= 0:
            return math.inf
        r = used / fair
        if r > ratio:
            ratio = r
    return ratio


def queue_order(ratio: float, priority: int, name: str) -> QueueKey:
    """Sort key among sibling queues: lowest saturation, then higher queue priority, then name."""
    return (ratio, -priority, name)


class QueueOrder:
    """The leaf queues still to visit, picked subtree by subtree from the roots down.

    Every queue with a leaf to visit below it sits in its parent's heap (the roots in the
    top heap) under `key(queue)`. Picking descends from the top, taking the smallest key at
    each level. When usage changes, only the changed queue's path is re-keyed: a re-keyed or
    removed entry stays in its heap and is skipped when it surfaces (its version is stale),
    so each change costs the depth of the tree times a heap push.

    A key ends with its queue's name (`queue_order`): the heaps hold the keys themselves,
    not (key, name) pairs, so that each comparison in a heap compares one tuple, not two.
    """

    __slots__ = ("_active", "_current", "_heaps", "_key", "_kids", "_leaf", "_parent", "_paths")

    def __init__(self, tree: QueueTree, key: Callable[[str], QueueKey]) -> None:
        self._paths = tree.paths
        self._parent = {
            name: path[1] if len(path) > 1 else None for name, path in tree.paths.items()
        }
        self._leaf = {name: not tree.children.get(name) for name in tree.paths}
        self._key = key
        self._heaps: dict[str | None, list[QueueKey]] = {None: []}
        # The key of each queue's one live heap entry; an entry whose key differs is stale.
        self._current: dict[str, QueueKey] = {}
        self._active: set[str] = set()
        self._kids: dict[str, int] = {}  # active children per inner queue

    def _enter(self, name: str) -> None:
        key = self._key(name)
        if self._current.get(name) == key:
            return  # its live entry already says so
        self._current[name] = key
        heap = self._heaps.get(self._parent[name])
        if heap is None:
            heap = self._heaps[self._parent[name]] = []
        heapq.heappush(heap, key)

    def push(self, leaf: str) -> None:
        """Add `leaf` (again) with its current usage, and re-key its ancestors."""
        newly = leaf not in self._active
        for name in self._paths[leaf]:
            if newly:
                self._active.add(name)
                self._current.pop(name, None)  # entries left from an earlier stay are stale
                parent = self._parent[name]
                if parent is not None:
                    kids = self._kids.get(parent, 0)
                    self._kids[parent] = kids + 1
                    newly = kids == 0  # the parent joins only with its first active child
                else:
                    newly = False
            self._enter(name)

    def push_all(self, leaves: Iterable[str]) -> None:
        """`push` each of `leaves` in turn, usage staying as it is meanwhile: a queue already
        in line when another leaf below it comes keeps the key it was given (pushing would
        work it out again, the same, once per leaf: a thousand times for a root)."""
        for leaf in leaves:
            if leaf in self._active:
                continue  # its path is in line with its current key
            for name in self._paths[leaf]:
                if name in self._active:
                    break  # and so are its ancestors
                self._active.add(name)
                self._current.pop(name, None)
                parent = self._parent[name]
                if parent is not None:
                    self._kids[parent] = self._kids.get(parent, 0) + 1
                self._enter(name)

    def refresh(self, queue: str, later: Collection[str] = ()) -> None:
        """Re-key the queues on `queue`'s path that are still to visit (usage changed), but
        those in `later`, which the caller re-keys itself before the next `pop`."""
        for name in self._paths[queue]:
            if name in self._active and name not in later:
                self._enter(name)

    def pop(self) -> str | None:
        """Remove and return the next leaf to visit, or None when none is left."""
        heaps, current, active = self._heaps, self._current, self._active
        parent: str | None = None
        while True:
            heap = heaps.get(parent)
            # An entry is live when its key is the very key object its queue holds now
            # (queues not in line hold none); an equal key of an earlier stay is stale, and
            # skipping it changes nothing: the live entry says the same.
            while heap and heap[0] is not current.get(heap[0][2]):
                heapq.heappop(heap)
            if not heap:
                return None  # only possible at the top: inner queues stay while a leaf does
            name = heap[0][2]
            if self._leaf[name]:
                break
            parent = name
        # Leave: the leaf, and every ancestor whose last active child it was.
        for node in self._paths[name]:
            active.discard(node)
            current.pop(node, None)
            up = self._parent[node]
            if up is None:
                break
            self._kids[up] -= 1
            if self._kids[up]:
                break
        return name
