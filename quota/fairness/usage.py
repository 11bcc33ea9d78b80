"""Time-based fair share: recent usage shifts over-quota weight between siblings.

A team that used more than its share of the surplus recently yields some of its weight to
siblings that used less. Only the surplus split (over-quota weight) changes; guaranteed quota
and queue priority never do. The shell computes the decayed usage figures from history and
hands them to the core inside the snapshot; nothing here reads the history itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def adjust_weights(
    weights: Mapping[str, float], usage: Mapping[str, float], k: float
) -> dict[str, float]:
    """Return w' = max(0, w + k (w - u)) per sibling, with w and u normalised over the siblings.

    Queues missing from `usage` count as having used nothing. With no usage at all, or k = 0,
    the weights come back unchanged so that turning the feature on for a new cluster is a no-op.
    """
    total_w = sum(weights.values())
    total_u = sum(max(0.0, usage.get(name, 0.0)) for name in weights)
    if k == 0 or total_u <= 0 or total_w <= 0:
        return dict(weights)
    adjusted: dict[str, float] = {}
    for name, w in weights.items():
        share_w = w / total_w
        share_u = max(0.0, usage.get(name, 0.0)) / total_u
        # Scale back to the siblings' own weight units so a later proportional split reads
        # the same as with unadjusted weights.
        adjusted[name] = max(0.0, share_w + k * (share_w - share_u)) * total_w
    return adjusted


def decayed_usage(samples: Iterable[tuple[float, float]], now: float, half_life_s: float) -> float:
    """Sum `amount * seconds` samples, each weighted by 0.5 ** (age / half_life).

    `samples` are (timestamp, usage integrated over the sample interval) pairs; samples from
    the future (clock skew between replicas) count as current.
    """
    if half_life_s <= 0:
        raise ValueError("half_life_s must be positive")
    decay = math.log(2) / half_life_s
    return sum(amount * math.exp(-decay * max(0.0, now - ts)) for ts, amount in samples)
