"""Consolidation (KAI-Scheduler's action): move running workloads to other nodes so that a
gang blocked only by fragmentation fits.

A workload may be moved when its queue opts in (`spec.consolidation.movable`), its priority is
not above the gang's (and below the queue's `belowPriority`, when set), and its queue's
minRuntime no longer protects it. A move restarts the workload's pods elsewhere: the shell
evicts it with room held on its new nodes and admits it there again at once.

The plan is all or nothing, found on one view under one transaction: every movable pod is
taken off, the gang placed and assumed, then every movable workload whose pods all fit back
where they run stays (most important first), and each one left is placed anew on what
remains. Only if every one of them finds new room is anything moved; otherwise the view is
left exactly as it was. So a move never strands a workload, and nothing moves unless the
gang then fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from quota.model.nodewords import named_nodes
from quota.placement.gang import Placement, Unplaceable
from quota.placement.nodes import NodeView
from quota.preemption.nodes import Place, WhatIf, placement_nodes
from quota.preemption.victims import Candidate


@dataclass(frozen=True, slots=True)
class Move:
    """A running workload to restart on other nodes, and where its pods go."""

    candidate: Candidate
    placement: Placement
    # The nodes of the gang's placement it leaves.
    leaves: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ConsolidationPlan:
    """Where the gang goes once `moves` are done."""

    placement: Placement
    moves: tuple[Move, ...]


def consolidate(
    view: NodeView,
    movable: Sequence[Candidate],
    pods_of: Mapping[str, Sequence[str]],
    leaving: Iterable[str],
    place: Place,
    place_moved: Callable[[Candidate], Placement | Unplaceable],
) -> ConsolidationPlan | None:
    """Moves of `movable` (victim order: least important first) that let `place()` succeed.

    On success the gang's placement and the moved workloads' new placements are assumed in
    the view (their old pods stay until they are evicted, so the room they leave is taken
    too); on failure the view is as it was and None says no legal plan exists.
    """
    if not movable:
        return None
    what_if = WhatIf(view)
    what_if.remove(key for w in leaving for key in pods_of.get(w, ()))
    gone = list(what_if.removed)
    what_if.remove(key for c in movable for key in pods_of.get(c.workload.key, ()))
    placed = place()
    if isinstance(placed, Unplaceable):
        what_if.undo()
        return None
    tx = what_if.tx
    view.assume(placed)
    tx.record(partial(view.forget, placed))
    what_if.used = used = placement_nodes(placed)
    moving: list[Candidate] = []
    for c in reversed(movable):  # the most important stays where it is whenever it can
        mark = tx.checkpoint()
        if not what_if.add_back(pods_of.get(c.workload.key, ())):
            tx.rollback(mark)
            moving.append(c)
    moves: list[Move] = []
    for c in moving:
        again = place_moved(c)
        if isinstance(again, Unplaceable):
            what_if.undo()
            return None
        view.assume(again)
        tx.record(partial(view.forget, again))
        keys = pods_of.get(c.workload.key, ())
        old = {what_if.removed[k].node for k in keys if k in what_if.removed}
        moves.append(Move(c, again, tuple(sorted(old & used))))
    # The moved workloads' pods run until evicted: their room is taken meanwhile, and so is
    # that of workloads already leaving that the gang does not need.
    for key in [*gone, *(k for m in moves for k in pods_of.get(m.candidate.workload.key, ()))]:
        mark = tx.checkpoint()
        if not what_if.add_back((key,)):
            tx.rollback(mark)
    tx.commit()
    return ConsolidationPlan(placed, tuple(moves))


def move_reason(preemptor: str, priority: int, nodes: Sequence[str], domain: str = "") -> str:
    """Why a workload is moved (its pods restart on other nodes, room held for them), out of
    `domain` ("rack b0-r1 of Topology fabric") when the gang keeps to one."""
    where = named_nodes(nodes) + (f" in {domain}" if domain else "")
    return (
        f"moved to other nodes to free {where} for {preemptor} "
        f"(priority {priority}), whose pods fit nowhere else only because free room is "
        "scattered; its pods restart on room held for them, and it keeps its place in line"
    )
