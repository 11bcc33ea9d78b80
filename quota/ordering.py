"""The order in which a cycle visits queues and workloads.

Queues furthest below their fair share go first: a queue's saturation is its dominant
usage/fair-share ratio over the flavor-resources it uses, so a team that has little of
everything is served before one that is short of one thing only. Equal ratios (typically
zero, when queues start empty) fall back to queue priority, then name. Inside a queue,
higher workload priority first, then earlier arrival, then key, so decisions never depend
on the order the shell listed workloads in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from quota.resources import FlavorResource
from quota.snapshot import Workload


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


def queue_order(ratio: float, priority: int, name: str) -> tuple[float, int, str]:
    """Sort key across leaf queues: lowest saturation, then higher queue priority, then name."""
    return (ratio, -priority, name)
