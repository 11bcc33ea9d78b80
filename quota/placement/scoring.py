"""The built-in scores, which choose among the nodes that fit: BinPack and Spread.

Both judge a node on the pod's scarcest resource: of the resources the pod requests, the
one with the least free room across the nodes it may use, relative to what one pod asks
(GPUs, on a GPU cluster). `BinPack` (kube-scheduler's MostAllocated) takes the node with the
least of it free that still fits, so that whole nodes stay free for the big pods that need
them; `Spread` (LeastAllocated) takes the node with the most free, so that pods land apart.
Ties go by the free amounts of the other resources in the view's tie order
(`nodes.tie_order`), then by node name (in reverse for Spread, which walks the same indexes
from the other end), so that equal inputs always place the same way. Each is a
`framework.Score`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sortedcontainers import SortedList

from quota.placement.nodes import Demand, NodeKey, tie_order


def scarcity_order(demand: Demand, total_free: Callable[[str], int]) -> tuple[str, ...]:
    """The requested resources, scarcest first: least total free per pod's request.

    Ties go by the tie order, so that GPUs are named before cpu when both run out.
    """
    # total / request compared exactly: scaled by the product of all requests, each ratio
    # is a whole number.
    scale = 1
    for _, v in demand:
        scale *= v
    ranks = {r: i for i, r in enumerate(tie_order(r for r, _ in demand))}
    return tuple(
        r for _, _, r in sorted((total_free(r) * (scale // v), ranks[r], r) for r, v in demand)
    )


def lowest_key(need: int) -> NodeKey:
    """A key below every node key with `need` free: the bound of "nodes with room"."""
    return (need, (), "")


class BinPack:
    """The fullest node that still fits first: as many pods on it as fit."""

    name = "BinPack"
    lookahead = 1

    def walk(self, index: SortedList[NodeKey], need: int) -> Iterator[NodeKey]:
        return index.irange(minimum=lowest_key(need))

    def better(self, a: NodeKey, b: NodeKey) -> bool:
        return a < b

    def batch(self, fits: int, best: int, runner_up: int, need: int) -> int:
        return fits  # never asked: with a lookahead of 1 the best node takes all that fit


class Spread:
    """The emptiest node first, until it is no emptier than the runner-up."""

    name = "Spread"
    lookahead = 2

    def walk(self, index: SortedList[NodeKey], need: int) -> Iterator[NodeKey]:
        return index.irange(minimum=lowest_key(need), reverse=True)

    def better(self, a: NodeKey, b: NodeKey) -> bool:
        return a > b

    def batch(self, fits: int, best: int, runner_up: int, need: int) -> int:
        """Placing one pod at a time would choose the same node until its free amount falls
        below the runner-up's; this is that count (at least 1), so a wide gang costs one
        step per node, not per pod."""
        return min(fits, max(1, -(-(best - runner_up) // need)))


BIN_PACK = BinPack()
SPREAD = Spread()
