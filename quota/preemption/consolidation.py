"""Consolidation (KAI-Scheduler's action): move running workloads to other nodes so that a
gang blocked only by fragmentation fits.

A workload may be moved when its queue opts in (`spec.consolidation.movable`), its priority is
not above the gang's (and below the queue's `belowPriority`, when set), and its queue's
minRuntime no longer protects it. A move restarts the workload's pods elsewhere: the shell
evicts it with room held on its new nodes and admits it there again at once.

The search looks for the plan with the fewest moves. Sets of movable workloads are tried by
size (one, then two, ... up to `MAX_MOVES`), and within a size least disruption first (lower
priority, then fewer pods: victim order). A set is tried only if taking it off frees room
for one more of the gang's pods on some node it leaves; trying it takes its pods off, places
the gang, lets every one of the set whose pods fit back where they run stay, and places each
one left anew on what remains. The first set whose movers all find room is the plan. The
work is bounded (`MAX_TRIES` placements, `MAX_SETS` sets looked at), and when the bounded
search finds nothing, every movable workload is taken off at once as a last try (plans of
more moves than the search reaches). A plan is all or nothing, found on one view under one
transaction: only if every mover finds new room is anything moved, otherwise the view is
left exactly as it was. So a move never strands a workload, no room is promised twice (the
gang and each mover are assumed in turn on the same view), and nothing moves unless the
gang then fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import combinations, islice

from quota.model.nodes import BoundPod
from quota.model.nodewords import named_nodes
from quota.placement.gang import Placement, Unplaceable
from quota.placement.nodes import Demand, NodeView, demand_of, fit_count
from quota.preemption.nodes import Place, WhatIf, placement_nodes
from quota.preemption.victims import Candidate

# The most workloads moved as one set by the search: every move restarts a running
# workload, so a plan of more moves is rarely worth it (KAI caps its consolidation
# preemptees likewise); plans of more moves come only from the last, take-all-off try.
MAX_MOVES = 3
# Sets tried (a gang placement and the movers' each) before the search gives up: on a big
# cluster a gang blocked by fragmentation may have hundreds of movable neighbours, and a
# placement is the expensive step. 16 failed tries cost less than the last, take-all-off
# try on 200 busy nodes; on a small cluster they cover every single move.
MAX_TRIES = 16
# Sets looked at (a few dict sums each, no placement) before the search gives up.
MAX_SETS = 2048


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
    requests: Sequence[Mapping[str, int]],
) -> ConsolidationPlan | None:
    """The fewest moves of `movable` (victim order: least important first) that let
    `place()` succeed; `requests` are the gang's per-pod requests, one per pod set.
    None too when the workloads already `leaving` make room alone (no move is needed).

    On success the gang's placement and the moved workloads' new placements are assumed in
    the view (their old pods stay until they are evicted, so the room they leave is taken
    too); on failure the view is as it was and None says no legal plan was found.
    """
    if not movable:
        return None
    what_if = WhatIf(view)
    what_if.remove(key for w in leaving for key in pods_of.get(w, ()))
    gone = list(what_if.removed)
    if gone and isinstance(place(), Placement):
        # Workloads already leaving make room without a move: node preemption holds it.
        what_if.undo()
        return None
    attempt = partial(_attempt, what_if, pods_of, gone, place, place_moved)
    demands = [demand_of(r) for r in requests]
    sets = _useful_sets(view, movable, pods_of, demands)
    for chosen in islice(sets, MAX_TRIES):
        if (plan := attempt(chosen)) is not None:
            return plan
    if (plan := attempt(movable, orders=(False,))) is not None:
        return plan
    what_if.undo()
    return None


def _useful_sets(
    view: NodeView,
    movable: Sequence[Candidate],
    pods_of: Mapping[str, Sequence[str]],
    demands: Sequence[Demand],
) -> Iterator[tuple[Candidate, ...]]:
    """Sets of `movable` by size, least disruption first, whose removal frees room for one
    more pod of the gang on some node (a set that frees none cannot be what the gang lacks).

    Each size is ordered as `movable` is after a stable sort by (priority, pods): lower
    priorities, then smaller workloads, then the victim order."""
    pods: dict[str, list[BoundPod]] = {}
    for c in movable:
        key = c.workload.key
        pods[key] = [view.pods[k] for k in pods_of.get(key, ()) if k in view.pods]
    ranked = sorted(movable, key=lambda c: (c.workload.priority, len(pods[c.workload.key])))
    looked = 0
    for size in range(1, min(MAX_MOVES, len(ranked)) + 1):
        for chosen in combinations(ranked, size):
            looked += 1
            if looked > MAX_SETS:
                return
            if _frees_room(view, [p for c in chosen for p in pods[c.workload.key]], demands):
                yield chosen


def _frees_room(view: NodeView, pods: Sequence[BoundPod], demands: Sequence[Demand]) -> bool:
    """Whether unbinding `pods` lets some node take one more pod of some `demands`."""
    freed: dict[str, dict[str, int]] = {}
    for pod in pods:
        room = freed.setdefault(pod.node, {})
        for r, v in demand_of(pod.requests):
            room[r] = room.get(r, 0) + v
    for node, room in freed.items():
        free = view.free(node)
        after = {r: free.get(r, 0) + room.get(r, 0) for r in free.keys() | room.keys()}
        if any(fit_count(after, d) > fit_count(free, d) for d in demands):
            return True
    return False


def _attempt(
    what_if: WhatIf,
    pods_of: Mapping[str, Sequence[str]],
    gone: Sequence[str],
    place: Place,
    place_moved: Callable[[Candidate], Placement | Unplaceable],
    chosen: Sequence[Candidate],
    orders: tuple[bool, ...] = (False, True),
) -> ConsolidationPlan | None:
    """Take `chosen` off and find room for the gang and for each of them that must move.
    A plan (committed) when all find room; else the view as before.

    The gang goes first (where the profile puts it), then the movers; when they find no
    room, the other way round: the profile may put part of a gang just where a mover had
    to go while other room would have held it. `orders` says which to try (movers first:
    True); the take-all-off try has too many movers to place them all before the gang."""
    tx = what_if.tx
    mark = tx.checkpoint()
    for movers_first in orders:
        what_if.remove(key for c in chosen for key in pods_of.get(c.workload.key, ()))
        found = _arrange(what_if, pods_of, place, place_moved, chosen, movers_first)
        if found is None:
            tx.rollback(mark)
            continue
        placed, moved = found
        moves = [_move(what_if, pods_of, c, again) for c, again in moved]
        # The moved workloads' pods run until evicted: their room is taken meanwhile, and so
        # is that of workloads already leaving that the gang does not need.
        for key in [*gone, *(k for c, _ in moved for k in pods_of.get(c.workload.key, ()))]:
            back = tx.checkpoint()
            if not what_if.add_back((key,)):
                tx.rollback(back)
        tx.commit()
        return ConsolidationPlan(placed, tuple(moves))
    return None


def _arrange(
    what_if: WhatIf,
    pods_of: Mapping[str, Sequence[str]],
    place: Place,
    place_moved: Callable[[Candidate], Placement | Unplaceable],
    chosen: Sequence[Candidate],
    movers_first: bool,
) -> tuple[Placement, list[tuple[Candidate, Placement]]] | None:
    """The gang's placement and the new room of those of `chosen` (taken off) that must
    move, all assumed in the view; None (the view to roll back) when one finds no room."""
    view, tx = what_if.view, what_if.tx

    def assume(placed: Placement) -> None:
        view.assume(placed)
        tx.record(partial(view.forget, placed))

    moved: dict[str, tuple[Candidate, Placement]] = {}
    if movers_first:
        for c in reversed(chosen):
            again = place_moved(c)
            if isinstance(again, Unplaceable):
                return None
            assume(again)
            moved[c.workload.key] = (c, again)
    placed = place()
    if isinstance(placed, Unplaceable):
        return None
    assume(placed)
    what_if.used = placement_nodes(placed)
    moving: list[Candidate] = []
    for c in reversed(chosen):  # the most important stays where it is whenever it can
        back = tx.checkpoint()
        key = c.workload.key
        if key in moved:  # placed anew already: its new room is given up to try the old
            view.forget(moved[key][1])
            tx.record(partial(view.assume, moved[key][1]))
        if what_if.add_back(pods_of.get(key, ())):
            moved.pop(key, None)
        else:
            tx.rollback(back)
            if key not in moved:
                moving.append(c)
    for c in moving:
        again = place_moved(c)
        if isinstance(again, Unplaceable):
            return None
        assume(again)
        moved[c.workload.key] = (c, again)
    return placed, list(moved.values())


def _move(
    what_if: WhatIf, pods_of: Mapping[str, Sequence[str]], c: Candidate, again: Placement
) -> Move:
    """`c` moved to `again`, leaving the nodes of the gang's placement it ran on."""
    keys = pods_of.get(c.workload.key, ())
    old = {what_if.removed[k].node for k in keys if k in what_if.removed}
    return Move(c, again, tuple(sorted(old & what_if.used)))


def move_reason(preemptor: str, priority: int, nodes: Sequence[str], domain: str = "") -> str:
    """Why a workload is moved (its pods restart on other nodes, room held for them), out of
    `domain` ("rack b0-r1 of Topology fabric") when the gang keeps to one."""
    where = named_nodes(nodes) + (f" in {domain}" if domain else "")
    return (
        f"moved to other nodes to free {where} for {preemptor} "
        f"(priority {priority}), whose pods fit nowhere else only because free room is "
        "scattered; its pods restart on room held for them, and it keeps its place in line"
    )
