"""Driving a leader-only loop that runs one pass whenever something it decides from changed.

`poke()` marks the loop dirty; a pass starts shortly after (a burst of events lands first, so
one pass covers them all) and at least every `resync` seconds. After a long pass the loop
waits as long again, so it never takes more than half of the process (webhooks, reconcilers
and the other loop share it). A failed pass is logged and tried again a second later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class Pacer:
    """Runs `run_once` while leading, paced as described above."""

    def __init__(
        self,
        name: str,
        run_once: Callable[[], object],
        *,
        min_interval: float = 0.05,
        resync: float = 2.0,
        log: logging.Logger,
    ) -> None:
        self.name = name
        self.run_once = run_once
        self.min_interval = min_interval
        self.resync = resync
        self.log = log
        self._dirty = threading.Event()
        self._last_seconds = 0.0

    def poke(self) -> None:
        """Something a decision depends on changed: run a pass soon."""
        self._dirty.set()

    def run(self, stop: threading.Event, is_leader: Callable[[], bool]) -> None:
        """Run passes while `is_leader()`, until `stop` is set."""
        while not stop.is_set():
            self._dirty.wait(self.resync)
            if stop.is_set():
                break
            if not is_leader():
                self._dirty.clear()
                stop.wait(0.2)
                continue
            stop.wait(max(self.min_interval, self._last_seconds))
            self._dirty.clear()
            started = time.monotonic()
            try:
                self.run_once()
            except Exception:
                self.log.exception(f"{self.name} failed")
                stop.wait(1.0)
                self._dirty.set()
            self._last_seconds = min(2.0, time.monotonic() - started)
