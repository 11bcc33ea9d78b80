"""The profile each `placementStrategy` runs: which filters, in which order, and which score.

This is where a new filter or score is put to use: add it to the tuple of both profiles
(a filter) or make a profile of it (a score), and the admission cycle, the scheduler loop
and the simulator all place with it, since they all call `gang.place_gang`.
"""

from __future__ import annotations

from typing import Literal

from quota.placement.filters import NODE_AFFINITY, NODE_READY, NODE_UNSCHEDULABLE, TAINT_TOLERATION
from quota.placement.framework import Filter, Profile
from quota.placement.scoring import BIN_PACK, SPREAD

Strategy = Literal["BinPack", "Spread"]
STRATEGIES: tuple[Strategy, ...] = ("BinPack", "Spread")

# One tuple for both, so that their filter results are shared in a view's cache.
FILTERS: tuple[Filter, ...] = (NODE_AFFINITY, NODE_READY, NODE_UNSCHEDULABLE, TAINT_TOLERATION)

BIN_PACK_PROFILE = Profile("BinPack", FILTERS, BIN_PACK)
SPREAD_PROFILE = Profile("Spread", FILTERS, SPREAD)


def profile_for(strategy: Strategy) -> Profile:
    """The profile of a ClusterQueue's `spec.placementStrategy`."""
    if strategy == "BinPack":
        return BIN_PACK_PROFILE
    if strategy == "Spread":
        return SPREAD_PROFILE
    known = ", ".join(STRATEGIES)
    raise ValueError(f"unknown placement strategy {strategy!r} (one of {known})")
