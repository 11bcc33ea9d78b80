"""How placement chooses among the nodes that fit: BinPack (the default) or Spread.

Both judge a node on the pod's scarcest resource: of the resources the pod requests, the
one with the least free room across the nodes it may use, relative to what one pod asks
(GPUs, on a GPU cluster). BinPack takes the node with the least of it free that still fits,
so that whole nodes stay free for the big pods that need them; Spread takes the node with
the most free, so that pods land apart. Ties go by the free amounts of the other resources
in the view's tie order (`nodes.tie_order`), then by node name (in reverse for Spread, which
walks the same indexes from the other end), so that equal inputs always place the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

from sortedcontainers import SortedList

from quota.placement.nodes import Demand, NodeKey, tie_order

Strategy = Literal["BinPack", "Spread"]
STRATEGIES: tuple[Strategy, ...] = ("BinPack", "Spread")


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


def preferred(index: SortedList[NodeKey], strategy: Strategy, need: int) -> Iterator[NodeKey]:
    """Keys of the nodes with at least `need` free of the index's resource, best first."""
    return index.irange(minimum=lowest_key(need), reverse=strategy == "Spread")


def better(strategy: Strategy, a: NodeKey, b: NodeKey) -> bool:
    """True when a node keyed `a` is preferred to one keyed `b`."""
    return a > b if strategy == "Spread" else a < b


def spread_batch(best: int, runner_up: int, need: int) -> int:
    """How many pods Spread puts on its chosen node before another has more free (at least 1).

    Placing one pod at a time would choose the same node until its free amount falls below
    the runner-up's; this is that count, so a wide gang costs one step per node, not per pod.
    """
    return max(1, -(-(best - runner_up) // need))
