"""The extension points of placement: filters that say which nodes a pod may use, a score
that says which of them goes first, and the profile that puts them in order.

Shaped after kube-scheduler's scheduling framework (named Filter and Score plugins gathered
in a profile), kept plain: a filter or a score is any object with these methods, a profile
is a tuple of them, and `place_gang` runs the profile its queue's `placementStrategy` names
(`profiles.py`). Nothing is looked up by name; `name` is for people and error messages.

- A **Filter** rules nodes out for a pod shape. It reads only what every node of a
  `NodeClass` shares (labels but the per-node ones, taints, Ready, cordoned), unless it says
  `per_node` (the pod's own node selection, which may name a node): placement runs the
  filters once per class and pod shape (`candidates.py`), a `per_node` one node by node when
  the shape names single nodes, and caches the answer for the view. Room is not a filter: it changes
  with every pod placed, so the placement walk checks it per node (`filters.fits_one`).
  When no node passes, each filter says what it ruled out (`summary`): phrases about the
  pod's own asks come first, then the nodes' state.
- A **Score** orders the nodes that passed. Placement does not score every node: each node
  class keeps its nodes sorted by free room of one resource (`nodes.NodeKey`), and a score
  walks that index from its best end and compares the best nodes of different classes; so a
  score is an order over node keys, plus how many pods its best node takes before the
  runner-up would go first (every pod that fits, for a score that looks at one node).

Where the next ones go (a reader's map): a filter or score lives in a module of its own (the
built-ins are in `filters.py` and `scoring.py`), and is added to the profiles in
`profiles.py`. Topology is a gang-level step instead (`topology.py`, run by `gang.py`): the
nodes of one domain (classes, since nodes with different level labels are different
classes) stand in for the filter, and the choice among domains (the fullest that fits) for
KEP-5732's placement score.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from sortedcontainers import SortedList

from quota.model.nodes import Node, PodShape
from quota.placement.nodes import NodeKey


@dataclass(frozen=True, slots=True)
class Refusals:
    """What a filter ruled out, in words: about the pod's asks, and about the nodes' state."""

    pod: tuple[str, ...] = ()  # e.g. "taint gpu:NoSchedule not tolerated (4 nodes)"
    nodes: tuple[str, ...] = ()  # e.g. "2 nodes not Ready"


class Filter(Protocol):
    """A rule a node must pass to take a pod of a shape, the same all through one view."""

    @property
    def name(self) -> str:
        """What people call it (kube-scheduler's plugin names where one matches)."""

    @property
    def per_node(self) -> bool:
        """True when the answer may differ between nodes of one class: it reads the node's
        name or per-node labels (only the pod's own node selection does)."""

    def passes(self, node: Node, shape: PodShape) -> bool:
        """True when `node` may take a pod of `shape` (room aside).

        Unless `per_node`, read only what the node's class shares: the answer for one node
        stands for its class.
        """

    def summary(self, refused: Sequence[tuple[Node, int]], shape: PodShape) -> Refusals:
        """What this filter ruled out, given (a node, how many nodes like it) for each
        refusal, when no node passed every filter."""


class Score(Protocol):
    """An order of the nodes that can take a pod, best first."""

    @property
    def name(self) -> str:
        """What people call it (the `placementStrategy` value)."""

    @property
    def lookahead(self) -> int:
        """How many of a class's best nodes to look at: 1, or 2 when `batch` needs the
        runner-up."""

    def walk(self, index: SortedList[NodeKey], need: int) -> Iterator[NodeKey]:
        """Keys of the index's nodes with at least `need` free, best first."""

    def better(self, a: NodeKey, b: NodeKey) -> bool:
        """True when the node keyed `a` goes before the one keyed `b`."""

    def batch(self, fits: int, best: int, runner_up: int, need: int) -> int:
        """How many pods the best node takes before the runner-up goes first: at most
        `fits`, at least 1.

        `best` and `runner_up` are the free amounts of the walked resource on the two nodes.
        Only asked with `lookahead` above 1 and a runner-up; otherwise the best node takes
        every pod that fits.
        """


@dataclass(frozen=True, slots=True)
class Profile:
    """The filters, in order, and the score that one placement strategy runs.

    Filter order matters only for words: a node ruled out by several filters is counted
    against the first.
    """

    name: str
    filters: tuple[Filter, ...]
    score: Score
