"""Requeue backoff: how long an evicted workload waits before it competes for quota again.

The wait doubles with every requeue, from a base up to a cap, so a workload that keeps being
preempted does not thrash the cluster, yet one evicted once is back almost at once.
"""

from __future__ import annotations

from dataclasses import dataclass

# The controller's defaults; a simulation's settings may choose their own.
REQUEUE_BASE_S = 1.0
REQUEUE_MAX_S = 600.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """base_s x 2^(requeues - 1), at most max_s."""

    base_s: float = REQUEUE_BASE_S
    max_s: float = REQUEUE_MAX_S

    def delay(self, requeues: int) -> float:
        """Seconds before a workload requeued `requeues` times (this one included) competes
        again; 0 for one never requeued."""
        if requeues < 0:
            raise ValueError(f"a requeue count cannot be negative, got {requeues}")
        if requeues == 0:
            return 0.0
        # Doubling step by step and stopping at the cap gives exactly base * 2^(n-1), without
        # the overflow that raising 2 to a count in the thousands would hit.
        delay = self.base_s
        for _ in range(requeues - 1):
            if delay >= self.max_s:
                break
            delay *= 2
        return min(self.max_s, delay)


DEFAULT_BACKOFF = Backoff()
