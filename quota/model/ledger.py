"""Quota in use along the queue tree, and how much more a leaf may still take.

A ledger charges a workload's usage to its leaf queue and to every ancestor, so that a limit
anywhere on the path and the amount distributed at the root (capacity of Ready nodes, or the
sum of the root queues' quotas) are checked by walking at most the depth of the tree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quota.model.resources import FlavorResource

# (queue name, its limits, its usage) for one limited queue on a path.
_LimitedQueue = tuple[str, Mapping[FlavorResource, int], dict[FlavorResource, int]]


class Ledger:
    """Mutable usage per queue subtree and in total, for the duration of one cycle."""

    __slots__ = (
        "_free",
        "_limited",
        "_path_used",
        "amount",
        "limits",
        "paths",
        "touched",
        "used",
    )

    def __init__(
        self,
        paths: Mapping[str, tuple[str, ...]],
        limits: Mapping[str, Mapping[FlavorResource, int]],
        amount: Mapping[FlavorResource, int],
    ) -> None:
        self.paths = paths
        self.limits = limits
        self.amount = amount
        self.used: dict[str, dict[FlavorResource, int]] = {name: {} for name in paths}
        # The amount less what is charged, kept as charges come: what headroom starts from,
        # read tens of thousands of times a cycle for a few thousand charges.
        self._free: dict[FlavorResource, int] = dict(amount)
        # Per queue, the (name, limits, usage) of the queues on its path that have any limit;
        # most trees limit few queues, so the walk is usually empty. Laid out for every queue
        # up front (a few hundred tuples) rather than on first use: headroom is asked tens of
        # thousands of times a cycle. Valid as long as the usage dicts are the same objects.
        self._limited: dict[str, tuple[_LimitedQueue, ...]] = {
            queue: tuple((name, limits[name], self.used[name]) for name in path if limits.get(name))
            for queue, path in paths.items()
        }
        # Per queue, the usage dicts of its path (itself first): what every charge updates.
        self._path_used: dict[str, tuple[dict[FlavorResource, int], ...]] = {}
        # When set, every charged queue is appended here, so that figures derived from
        # usage (see quota/preemption/reclaim.py) can be refreshed for just those queues.
        self.touched: list[str] | None = None

    def load(self, used: Mapping[str, Mapping[FlavorResource, int]], roots: Sequence[str]) -> None:
        """Start a fresh ledger from `used`, every queue's subtree total (as fair share rolls
        usage up), the roots' being what is charged against the amount: the same figures as
        charging each leaf's own usage, without walking each path again."""
        for name, usage in self.used.items():
            total = used.get(name)
            if total:
                usage.update(total)
        free = self._free
        for root in roots:
            for key, amount in used.get(root, {}).items():
                free[key] = free.get(key, 0) - amount

    def copy(self) -> Ledger:
        """An independent ledger with the same usage."""
        twin = Ledger(self.paths, self.limits, self.amount)
        for name, usage in self.used.items():
            twin.used[name].update(usage)  # into its own dicts, which its paths hold
        twin._free = dict(self._free)
        return twin

    def charge(self, queue: str, usage: Mapping[FlavorResource, int], sign: int = 1) -> None:
        """Add (sign=1) or release (sign=-1) `usage` on `queue` and all its ancestors."""
        if self.touched is not None:
            self.touched.append(queue)
        path = self._path_used.get(queue)
        if path is None:
            path = self._path_used[queue] = tuple(self.used[name] for name in self.paths[queue])
        free = self._free
        release = sign < 0
        for key, amount in usage.items():
            # Negated rather than multiplied by the sign: memory amounts are big integers,
            # and multiplying them is a call into long arithmetic for every key charged.
            delta = -amount if release else amount
            free[key] = free.get(key, 0) - delta
            for used in path:
                used[key] = used.get(key, 0) + delta

    def release(self, queue: str, usage: Mapping[FlavorResource, int]) -> None:
        """Release `usage` from `queue` and all its ancestors (a workload that leaves)."""
        self.charge(queue, usage, -1)

    def headroom(self, queue: str, key: FlavorResource) -> int:
        """How much more of `key` a workload in `queue` may take right now."""
        room = self._free.get(key, 0)
        for _, limits, used in self._limited[queue]:
            cap = limits.get(key)
            if cap is not None:
                left = cap - used.get(key, 0)
                if left < room:
                    room = left
        return room

    def first_short(
        self,
        queue: str,
        pairs: Sequence[tuple[FlavorResource, int]],
        count: int,
        base: Mapping[FlavorResource, int],
    ) -> int:
        """The index of the first (key, amount per pod) pair of `pairs` for which `count` pods
        plus what `base` already takes of the key need more than `headroom` allows in
        `queue`, or -1 when all fit. Flavor assignment asks this for every flavor it tries:
        one call per group instead of one per resource."""
        free = self._free
        limited = self._limited[queue]
        for index, (key, amount) in enumerate(pairs):
            need = amount * count
            if base:
                need += base.get(key, 0)
            if need > free.get(key, 0):
                return index
            for _, limits, used in limited:
                cap = limits.get(key)
                if cap is not None and need > cap - used.get(key, 0):
                    return index
        return -1

    def binding(self, queue: str, key: FlavorResource) -> tuple[int, str | None, int]:
        """(available, queue whose limit binds or None for the root amount, that bound)."""
        room = self._free.get(key, 0)
        binder: str | None = None
        bound = self.amount.get(key, 0)
        for name, limits, used in self._limited[queue]:
            cap = limits.get(key)
            if cap is not None:
                left = cap - used.get(key, 0)
                if left < room or (left == room and binder is None):
                    room, binder, bound = left, name, cap
        return room, binder, bound
