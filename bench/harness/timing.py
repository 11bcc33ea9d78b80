"""Timing a piece of work repeatedly, and the percentiles the benchmarks report."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def timed(fn: Callable[[], T], repeat: int) -> tuple[list[float], T]:
    """Seconds of each of `repeat` runs of `fn` (at least one), each started after a full
    garbage collection (no run pays for the garbage of the one before); and the last result."""
    times: list[float] = []
    while True:
        gc.collect()
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
        if len(times) >= repeat:
            return times, result


def percentile(ordered: Sequence[float], percent: int) -> float:
    """The value at rank `percent` % of an ordered, non-empty sequence (the 50th is its upper
    median; the 100th, its maximum)."""
    return ordered[min(len(ordered) - 1, len(ordered) * percent // 100)]
