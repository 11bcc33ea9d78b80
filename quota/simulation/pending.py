"""The simulator's pending workloads, grouped per queue by shape, oldest first.

Kept apart from the loop because it is where a simulation of thousands of pending
workloads stays fast without changing what is decided (see `Pending`).
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from quota.model.flavorassign import pod_set_signature
from quota.model.snapshot import PodSet, Workload

# Workloads of one shape and queue a cycle is shown at first (see Pending).
INITIAL_WINDOW = 2


ShapeKey = tuple[int, tuple[object, ...]]  # (priority, pod sets' signatures and counts)


class _Line:
    """Pending workloads of one shape in one queue, oldest first.

    Admission takes workloads from the front, so removal there just moves `head`; a
    workload leaving from elsewhere is marked gone and skipped. Either way no removal
    shifts the list, which matters when a queue holds tens of thousands.
    """

    __slots__ = ("gone", "head", "items", "live")

    def __init__(self) -> None:
        self.items: list[Workload] = []
        self.head = 0
        self.gone: set[int] = set()  # ids of removed workloads still in `items`
        self.live = 0

    def add(self, w: Workload) -> None:
        items = self.items
        if len(items) == self.head or _age(items[-1]) <= _age(w):
            items.append(w)  # the usual case: arrivals come in time order
        else:
            bisect.insort(items, w, lo=self.head, key=_age)
        self.live += 1

    def remove(self, w: Workload) -> None:
        self.live -= 1
        if self.items[self.head] is w:
            self.head += 1
            self._skip()
        else:
            self.gone.add(id(w))
        if self.head > 1024 and self.head * 2 > len(self.items):
            self.items = [x for x in self.items[self.head :] if id(x) not in self.gone]
            self.gone.clear()
            self.head = 0

    def _skip(self) -> None:
        items, gone = self.items, self.gone
        while self.head < len(items) and id(items[self.head]) in gone:
            gone.discard(id(items[self.head]))
            self.head += 1

    def first(self, n: int) -> list[Workload]:
        """The `n` oldest workloads."""
        if not self.gone:
            return self.items[self.head : self.head + n]
        out: list[Workload] = []
        for w in self.items[self.head :]:
            if id(w) not in self.gone:
                out.append(w)
                if len(out) == n:
                    break
        return out


class Pending:
    """Pending workloads, grouped per queue by shape (priority, pod sets), oldest first.

    Two things make a simulation of thousands of pending workloads fast without changing
    what is decided:

    - Fair share depends on pending workloads only through their summed requests per queue
      and shape, so the fair-share snapshot carries one aggregate per shape instead of
      every workload (exactly the same demand, hence the same shares).
    - Workloads of one shape in one queue differ only in age, and the engine rejects a shape
      that failed once for every younger copy in the same cycle. So a cycle is shown, per
      queue and shape, only the oldest `window` of them (INITIAL_WINDOW at first). When a
      cycle admits (or starts preemption for) every workload of a window that hid others,
      its decisions are thrown away and the cycle is run again on the same state with that
      window doubled, so what is carried out is what a cycle over every pending workload
      would decide. A window shrinks back to what its shape used plus one. Scale-up slices
      are always shown.
    """

    def __init__(self) -> None:
        self.by_key: dict[str, Workload] = {}
        self.shapes: dict[str, dict[ShapeKey, _Line]] = {}
        self.slices: dict[str, Workload] = {}
        self.window: dict[tuple[str, ShapeKey], int] = {}
        # id(pod sets) -> (pod sets, key); holding the tuple keeps its id from being reused.
        self._shape_of: dict[int, tuple[tuple[PodSet, ...], tuple[object, ...]]] = {}
        self._shown: list[tuple[tuple[str, ShapeKey], list[Workload]]] = []
        # (queue, shape) -> how many workloads the aggregate last built for it stands for,
        # and that aggregate; rebuilt only when the count changes.
        self._aggregates: dict[tuple[str, ShapeKey], tuple[int, Workload]] = {}

    def _shape(self, w: Workload) -> ShapeKey:
        cached = self._shape_of.get(id(w.pod_sets))
        if cached is None:
            signature = tuple((pod_set_signature(ps), ps.count, ps.min_count) for ps in w.pod_sets)
            cached = (w.pod_sets, signature)
            self._shape_of[id(w.pod_sets)] = cached
        return w.priority, cached[1]

    def add(self, w: Workload) -> None:
        self.by_key[w.key] = w
        if w.replaces is not None:
            self.slices[w.key] = w
            return
        by_shape = self.shapes.setdefault(w.queue, {})
        shape = self._shape(w)
        line = by_shape.get(shape)
        if line is None:
            line = by_shape[shape] = _Line()
        line.add(w)

    def remove(self, key: str) -> Workload | None:
        w = self.by_key.pop(key, None)
        if w is None:
            return None
        if w.replaces is not None:
            del self.slices[key]
            return w
        by_shape = self.shapes[w.queue]
        shape = self._shape(w)
        line = by_shape[shape]
        line.remove(w)
        if not line.live:
            del by_shape[shape]
        return w

    def shown(self) -> list[Workload]:
        """The workloads one cycle decides about (see the class docstring)."""
        out: list[Workload] = []
        self._shown = []
        for queue, by_shape in self.shapes.items():
            for shape, line in by_shape.items():
                size = self.window.get((queue, shape), INITIAL_WINDOW)
                head = line.first(size)
                out.extend(head)
                if line.live > size:
                    self._shown.append(((queue, shape), head))
        out.extend(self.slices.values())
        return out

    def aggregated(self) -> list[Workload]:
        """One workload per queue and shape carrying their summed pods (for fair share)."""
        out: list[Workload] = []
        for queue, by_shape in self.shapes.items():
            for shape, line in by_shape.items():
                n = line.live
                cached = self._aggregates.get((queue, shape))
                if cached is None or cached[0] != n:
                    first = line.first(1)[0]
                    pod_sets = tuple(replace(ps, count=ps.count * n) for ps in first.pod_sets)
                    # The first workload's key keeps aggregates of one snapshot distinct.
                    cached = (n, replace(first, key=f"{first.key}~{n}", pod_sets=pod_sets))
                    self._aggregates[(queue, shape)] = cached
                out.append(cached[1])
        out.extend(self.slices.values())
        return out

    def feedback(self, progressed: set[str]) -> bool:
        """Resize the windows after a cycle; True when a saturated window calls for another."""
        again = False
        for (queue, shape), head in self._shown:
            used = sum(1 for w in head if w.key in progressed)
            if used == len(head):
                self.window[(queue, shape)] = 2 * len(head)
                again = True
            elif used + 1 < len(head):
                self.window[(queue, shape)] = max(INITIAL_WINDOW, used + 1)
        return again


def _age(w: Workload) -> tuple[float, str]:
    return w.arrival, w.key
