"""The gang-placement core: which nodes a group of pods goes to, all of them or none.

Pure like the rest of `quota/`: the shell parses Nodes and Pods with `convert`, builds a
`NodeView`, and calls `place_gang`; the admission cycle, the scheduler loop and the
simulator all decide placement through these same functions.
"""

from quota.model.nodes import BoundPod, Node, PodShape, Requirement, SelectorTerm
from quota.placement.gang import GangRequest, Placement, PodSetRequest, Unplaceable, place_gang
from quota.placement.nodes import NodeView
from quota.placement.scoring import STRATEGIES, Strategy

__all__ = [
    "STRATEGIES",
    "BoundPod",
    "GangRequest",
    "Node",
    "NodeView",
    "Placement",
    "PodSetRequest",
    "PodShape",
    "Requirement",
    "SelectorTerm",
    "Strategy",
    "Unplaceable",
    "place_gang",
]
