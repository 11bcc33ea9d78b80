"""Timing a piece of work repeatedly, and the percentiles the benchmarks report."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def timed(fn: Callable[[], T], repeat: int, *, collect_each: bool = True) -> tuple[list[float], T]:
    """Seconds of each of `repeat` runs of `fn` (at least one), and the last result.

    Each run starts after a full garbage collection (no run pays for the garbage of the one
    before), or, with `collect_each` False, only the first: short runs in a loop then show
    the steady state with warm allocator arenas, as the controller's own loops run (fair
    share measures ~1 ms more when every run follows a full collection).
    """
    times: list[float] = []
    gc.collect()
    while True:
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
        if len(times) >= repeat:
            return times, result
        if collect_each:
            gc.collect()


def percentile(ordered: Sequence[float], percent: int) -> float:
    """The value at rank `percent` % of an ordered, non-empty sequence (the 50th is its upper
    median; the 100th, its maximum)."""
    return ordered[min(len(ordered) - 1, len(ordered) * percent // 100)]
