"""Coalesced writes: keep only the latest desired state per object and write it at most
once per interval, and only when it differs from what the object already says.

Status that is recomputed every cycle (queue usage, why a workload waits) would otherwise
cost one write per object per cycle; with this, a thousand admissions in a second cost one
status write per queue per interval.

With `max_interval` above `interval` (the controller's `--status-max-interval`; off by
default), while an object stays busy (each write follows the one before within twice its
gap) the gap doubles up to `max_interval`: a queue admitting through a long burst is written
at 0, 1, 3, 7, 15, 23 ... s instead of every second, and its last state at most
`max_interval` after the burst. After a quiet spell of more than twice the gap a change goes
out at once again; but a change that follows a busy stretch waits for the gap, so a person
who reads a queue's usage right after admitting may see the figure before it (why it is not
the default).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class CoalescingWriter(Generic[K]):
    """Background writer of the latest submitted state per key.

    `write(key, desired)` performs the write (and is expected to skip it when the object
    already holds `desired`); it is called from the writer thread, at most once per
    `interval` seconds per key, or per longer gap (up to `max_interval`) while the key stays
    busy. A failed write is retried when the key is next due."""

    def __init__(
        self,
        name: str,
        write: Callable[[K, Any], None],
        *,
        interval: float = 1.0,
        max_interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._write = write
        self._interval = interval
        self._max_interval = max(interval, max_interval if max_interval is not None else interval)
        self._clock = clock
        self._cond = threading.Condition()
        self._desired: dict[K, Any] = {}
        self._last_write: dict[K, float] = {}
        self._gap: dict[K, float] = {}  # keys written at a gap above `interval`
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._enabled: Callable[[], bool] = lambda: True

    def submit(self, key: K, desired: Any) -> None:
        """Ask for `key` to hold `desired` (replacing any earlier request not yet written)."""
        with self._cond:
            self._desired[key] = desired
            self._cond.notify()

    def discard(self, key: K) -> None:
        """Forget a pending request (the object is gone or the request is moot)."""
        with self._cond:
            self._desired.pop(key, None)

    def pending(self) -> int:
        with self._cond:
            return len(self._desired)

    def start(self, enabled: Callable[[], bool] = lambda: True) -> None:
        """Run the writer thread; nothing is written while `enabled()` is False."""
        self._enabled = enabled
        self._thread = threading.Thread(target=self._run, name=f"coalesce-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def flush_due(self) -> int:
        """Write every request whose key is due now; returns how many were attempted.

        Keys are taken one at a time, so a request discarded (or replaced) while earlier
        ones are being written is never written stale."""
        attempted = 0
        while True:
            now = self._clock()
            with self._cond:
                key = next((k for k in self._desired if self._due(k) <= now), None)
                if key is None:
                    return attempted
                desired = self._desired.pop(key)
                self._wrote(key, now)
            attempted += 1
            try:
                self._write(key, desired)
            except Exception as error:
                log.warning(
                    "coalesced write failed; will retry",
                    extra={"writer": self.name, "key": str(key), "error": str(error)[:300]},
                )
                with self._cond:
                    self._desired.setdefault(key, desired)

    def _due(self, key: K) -> float:
        """When `key` may be written next (caller holds the lock)."""
        return self._last_write.get(key, float("-inf")) + self._gap.get(key, self._interval)

    def _wrote(self, key: K, now: float) -> None:
        """Note a write of `key` at `now` and set the gap before its next (caller holds the
        lock): doubled while writes come back to back, the base interval after a quiet spell."""
        last = self._last_write.get(key)
        gap = self._gap.get(key, self._interval)
        busy = last is not None and now - last <= 2 * gap
        gap = min(2 * gap, self._max_interval) if busy else self._interval
        self._last_write[key] = now
        if gap > self._interval:
            self._gap[key] = gap
        else:
            self._gap.pop(key, None)

    def _next_due_in(self) -> float | None:
        if not self._desired:
            return None
        return max(0.0, min(self._due(k) for k in self._desired) - self._clock())

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                wait = self._next_due_in()
                if wait is None or wait > 0:
                    self._cond.wait(wait if wait is not None else 1.0)
                    continue
            if self._enabled():
                self.flush_due()
            else:
                time.sleep(0.2)
            # Forget old timestamps so the map does not grow with every object ever seen.
            # A key last written over twice the longest gap ago counts as quiet either way.
            with self._cond:
                if len(self._last_write) > 10_000:
                    cutoff = self._clock() - 2 * self._max_interval
                    self._last_write = {k: t for k, t in self._last_write.items() if t > cutoff}
                    self._gap = {k: g for k, g in self._gap.items() if k in self._last_write}
