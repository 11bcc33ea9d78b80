"""A work queue of object keys with de-duplication and per-key exponential backoff.

It follows client-go's contract, because reconcilers are written against it: a key is in
the queue at most once; a key being processed is never handed to a second worker, and if it
is added meanwhile it is queued again when the first worker calls `done`; failures back off
per key (doubling up to a cap) until `forget` resets the key.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """De-duplicating, rate-limited queue of keys shared by a pool of worker threads."""

    def __init__(
        self,
        name: str,
        *,
        base_delay: float = 0.05,
        max_delay: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        # Delayed adds: a heap of (ready_at, seq, key) with lazy deletion; `_waiting` holds
        # the earliest ready time per key so a later add_after never postpones an earlier one.
        self._heap: list[tuple[float, int, K]] = []
        self._waiting: dict[K, float] = {}
        self._seq = itertools.count()
        self._shutdown = False

    # ------------------------------------------------------------------ adding
    def add(self, key: K) -> None:
        """Queue a key now (no-op if it is already queued)."""
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return
        self._queue.append(key)
        self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        """Queue a key once `delay` seconds have passed (earliest request wins)."""
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown:
                return
            ready = self._clock() + delay
            current = self._waiting.get(key)
            if current is not None and current <= ready:
                return
            self._waiting[key] = ready
            heapq.heappush(self._heap, (ready, next(self._seq), key))
            self._cond.notify()

    def add_rate_limited(self, key: K) -> float:
        """Queue a key after its backoff (base * 2^failures, capped); returns the delay."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = float(min(self._max_delay, self._base_delay * (2**failures)))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset a key's backoff after it was processed successfully."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """How many times in a row the key has been requeued with backoff."""
        with self._cond:
            return self._failures.get(key, 0)

    # ---------------------------------------------------------------- consuming
    def get(self, timeout: float | None = None) -> K | None:
        """Next key to process, or None on shutdown or timeout. Call `done(key)` after."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                self._promote_ready_locked()
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                if self._shutdown:
                    return None
                wait = None if deadline is None else deadline - self._clock()
                if wait is not None and wait <= 0:
                    return None
                if self._heap:
                    until_ready = max(0.0, self._heap[0][0] - self._clock())
                    wait = until_ready if wait is None else min(wait, until_ready)
                self._cond.wait(wait)

    def _promote_ready_locked(self) -> None:
        now = self._clock()
        while self._heap and self._heap[0][0] <= now:
            ready, _, key = heapq.heappop(self._heap)
            if self._waiting.get(key) != ready:
                continue  # superseded by an earlier request for the same key
            del self._waiting[key]
            self._add_locked(key)

    def done(self, key: K) -> None:
        """Mark a key processed; if it was added while processing, it is queued again."""
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        """Stop handing out keys; workers blocked in `get` return None."""
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def is_shutdown(self) -> bool:
        with self._cond:
            return self._shutdown
