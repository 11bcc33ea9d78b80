"""The profile each `placementStrategy` runs: which filters, in which order, and which score.

This is where a new filter or score is put to use: add it to the tuple of both profiles
(a filter) or make a profile of it (a score), and the admission cycle, the scheduler loop
and the simulator all place with it, since they all call `gang.place_gang`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from quota.placement.filters import NODE_AFFINITY, NODE_READY, NODE_UNSCHEDULABLE, TAINT_TOLERATION
from quota.placement.framework import Filter, Profile
from quota.placement.scoring import BIN_PACK, SPREAD

Strategy = Literal["BinPack", "Spread"]

# One tuple for both, so that their filter results are shared in a view's cache.
FILTERS: tuple[Filter, ...] = (NODE_AFFINITY, NODE_READY, NODE_UNSCHEDULABLE, TAINT_TOLERATION)

# A ClusterQueue's `spec.placementStrategy` -> the profile its workloads are placed with.
PROFILES: Mapping[Strategy, Profile] = {
    "BinPack": Profile("BinPack", FILTERS, BIN_PACK),
    "Spread": Profile("Spread", FILTERS, SPREAD),
}
STRATEGIES: tuple[Strategy, ...] = tuple(PROFILES)
