"""The gang-placement core: which nodes a group of pods goes to, all of them or none.

Pure like the rest of `quota/`: the shell parses Nodes and Pods with `convert`, builds a
`NodeView`, and calls `place_gang`; the admission cycle, the scheduler loop and the
simulator all decide placement through these same functions.

Modules: `nodes.py` (the view of free room and its indexes), `framework.py` (the extension
points: Filter, Score, Profile), `filters.py` and `scoring.py` (the built-in filters and
scores), `profiles.py` (the profile each placementStrategy runs), `candidates.py` (a
profile's filters run once per node class and shape), `gang.py` (all-or-nothing placement
of a group), `topology.py` (domains of a flavor's Topology: which one a gang goes to),
`reservations.py` (room planned or held for pods not bound yet).
"""

from quota.model.nodes import BoundPod, Node, PodShape, Requirement, SelectorTerm
from quota.placement.framework import Filter, Profile, Refusals, Score
from quota.placement.gang import GangRequest, Placement, PodSetRequest, Unplaceable, place_gang
from quota.placement.nodes import NodeView
from quota.placement.profiles import PROFILES, STRATEGIES, Strategy

__all__ = [
    "PROFILES",
    "STRATEGIES",
    "BoundPod",
    "Filter",
    "GangRequest",
    "Node",
    "NodeView",
    "Placement",
    "PodSetRequest",
    "PodShape",
    "Profile",
    "Refusals",
    "Requirement",
    "Score",
    "SelectorTerm",
    "Strategy",
    "Unplaceable",
    "place_gang",
]
