"""Decisions assumed before they are written: the admission cycle never waits on the
apiserver (Kueue's assume-then-patch, in Muster's terms).

When a cycle decides to admit, evict or hold room for a Workload, the writer computes the
Workload as the write will make it and assumes it here, then sends the write in the
background. Until the write's outcome is known, every later cycle sees the assumed object in
place of the cached one, so the quota it takes (or the eviction under way) counts at once and
nothing is decided twice on the strength of the old object.

An assumption ends:
- once its write has ended, when the cache holds a newer version than the one it was
  computed from (the write's own result, fed back, or anyone else's change: the cache is the
  truth again). While the write is under way, someone else's change does not end it: the
  write retries on that newer version and lands all the same, so the quota it takes must
  keep counting until then (else a later cycle admits into that room, and the queue ends
  over its limit once the write lands: seen in the chaos run when a pending-status write
  moved a Workload on between the cycle that admitted it and the next);
- when the write failed for certain (a conflict, a refusal, not sent because the lead ran
  out): the writer rolls it back and the next cycle decides again from the cache;
- after `max_age_s`, if neither happened: a write whose outcome was lost (a timeout) and
  that changed nothing the watch has shown in that time did not happen.

A write whose outcome is unknown keeps its assumption until one of those: rolling it back at
once could let another workload take room this one may in fact hold.

An assumed Workload is read as a cached one is (by later cycles, and by the writing and
history threads through the view) and, like it, is frozen: no one changes it in place
(controllers/runtime/frozen.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controllers.runtime.frozen import freeze
from controllers.runtime.informer import resource_version
from controllers.runtime.resources import Obj
from controllers.state.changes import decision_inputs


@dataclass(frozen=True)
class Assumed:
    obj: Obj  # the Workload as the write makes it (its resourceVersion is the base's)
    base: str  # the resourceVersion it was computed from
    since: float
    serial: int  # tells apart assumptions made on the same base (for parse caches)


class Assumptions:
    """Workloads as pending writes will make them, by key; safe from any thread."""

    def __init__(self, *, max_age_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, Assumed] = {}
        self._writing: set[str] = set()  # keys whose write has not ended yet
        self._serial = 0

    def assume(self, key: str, obj: Obj) -> None:
        """`obj` (a changed copy of the cached Workload) stands for it until the write ends;
        it is kept frozen, and the caller's copy is its own."""
        frozen = freeze(obj)
        with self._lock:
            self._serial += 1
            self._entries[key] = Assumed(frozen, resource_version(obj), self._clock(), self._serial)
            self._writing.add(key)

    def written(self, key: str) -> None:
        """The write behind `key`'s assumption ended (whatever its outcome): from now on the
        cache's next version ends the assumption."""
        with self._lock:
            self._writing.discard(key)

    def forget(self, key: str) -> None:
        """Roll back: the write failed for certain (or was never sent)."""
        with self._lock:
            self._entries.pop(key, None)
            self._writing.discard(key)

    def effective(self, key: str, cached: Obj) -> tuple[Obj, str]:
        """The Workload a cycle should see, and its version: the resourceVersion, with a
        suffix naming the assumption when it is one."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (
                (key not in self._writing and resource_version(cached) != entry.base)
                or self._clock() - entry.since > self.max_age_s
            ):
                del self._entries[key]
                self._writing.discard(key)
                entry = None
        if entry is None:
            return cached, resource_version(cached)
        return entry.obj, f"{entry.base}+assumed{entry.serial}"

    def landed(self, key: str, cached: Obj) -> bool:
        """Whether `cached` (the Workload as the watch now shows it) reads, for every
        decision, as `key`'s assumption does: the write landing as assumed. The cycles since
        the assumption already decided from it, so its arrival needs no cycle of its own (in
        a burst of 1,000 admissions, it was a cycle per write). The assumption itself ends at
        the next cycle, as ever."""
        with self._lock:
            entry = self._entries.get(key)
        return entry is not None and decision_inputs(entry.obj) == decision_inputs(cached)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Drop assumptions about Workloads no longer cached (deleted)."""
        live = set(keys)
        with self._lock:
            for key in [k for k in self._entries if k not in live]:
                del self._entries[key]
                self._writing.discard(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
