"""Consolidation in the cycle: move running workloads so that a gang fits the nodes.

When a gang fits quota but its flavor's free room is scattered over nodes, workloads of
queues that allow it (`movable`) and of no higher priority are moved elsewhere
(quota/preemption/consolidation.py chooses whom and where). This is tried before anyone is
evicted for nodes (decide.py): a move keeps the workload running, an eviction requeues it.
The moved keep their quota and are admitted again at once into room held for them; the
gang waits with its room held, as a preemptor does (node_room.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from quota.admission.candidates import VictimLists
from quota.admission.node_room import NodeRoom, held_assignments, held_words
from quota.admission.requests import Request, gang_of, request_gang
from quota.admission.state import CycleState
from quota.model.decisions import Pending, Preempt, Victim
from quota.model.flavorassign import Fit
from quota.model.snapshot import Hold, QueueSpec, Workload
from quota.placement.gang import Placement, Unplaceable, place_gang
from quota.preemption.consolidation import consolidate, move_reason
from quota.preemption.domains import domain_scope
from quota.preemption.victims import Candidate, started_at


class Moves:
    """Consolidation for the pending workloads of one cycle."""

    __slots__ = ("any_movable", "lists", "room", "state")

    def __init__(self, state: CycleState, lists: VictimLists, room: NodeRoom) -> None:
        self.state = state
        self.lists = lists
        self.room = room
        # Tried for every pending workload that fits quota but not nodes, before node
        # preemption: when no queue opts in, that must cost nothing.
        self.any_movable = any(q.movable for q in state.queues.values())

    def consolidate(
        self, spec: QueueSpec, request: Request, counts: Sequence[int], fit: Fit
    ) -> bool:
        """Move workloads of queues that allow it so that the gang fits; True when it now
        waits for them to move."""
        state = self.state
        view = state.nodes
        if view is None or not self.any_movable:
            return False
        w = request.workload
        movable = self._movable(w, request)
        if not movable:
            return False
        gang, _ = request_gang(state, request, counts, fit.flavors)
        if gang is None:
            return False
        stuck = self.room.stuck(w)
        plan = consolidate(
            view,
            movable,
            state.pods_of,
            self.room.leaving(set(), stuck),
            self.room.placer(w, gang, spec.placement),
            self._place_moved,
            [ps.shape.requests for ps in gang.pod_sets],
        )
        if plan is None:
            return False
        scope = domain_scope(gang)
        domain = scope.words(view, plan.placement) if scope is not None else ""
        now = state.snapshot.now
        moved = [m.candidate.workload.key for m in plan.moves]
        # The moved keep their quota (they are admitted again at once, where room is held
        # for them); they are never chosen again in this cycle.
        state.taken.update(moved)
        state.planned.charge(spec.name, fit.usage)
        state.diverged = True
        victims = tuple(
            Victim(
                m.candidate.workload.key,
                m.candidate.queue,
                "Moved",
                move_reason(w.key, w.priority, m.leaves, domain),
                Hold(held_assignments(m.candidate.workload, m.placement), now),
            )
            for m in plan.moves
        )
        if victims:
            state.preempt.append(Preempt(w.key, victims))
        freed = sorted({node for m in plan.moves for node in m.leaves})
        n = len(victims)
        hold = Hold(held_assignments(w, plan.placement, fit.flavors), now, tuple(sorted(moved)))
        reason = (
            f"waiting for {n} workload{'s' if n != 1 else ''} to move off nodes "
            f"{', '.join(freed)} (free room was scattered): {', '.join(moved)}; "
            if victims
            else "waiting for preempted workloads to leave nodes; "
        ) + held_words(plan.placement, domain)
        lapsed = self.room.lapse_words(w, stuck)
        state.pending.append(Pending(w.key, spec.name, lapsed + reason, hold))
        return True

    def _movable(self, w: Workload, request: Request) -> list[Candidate]:
        """Running workloads `w` may move (victim order): their queue opts in, their priority
        is not above `w`'s (and under the queue's bound), and minRuntime no longer protects
        them."""
        state = self.state
        out: list[Candidate] = []
        now = state.snapshot.now
        own = request.running.key if request.running is not None else None
        for c in self.lists.on_nodes():
            v = c.workload
            if v.priority > w.priority:
                break  # victim order is by priority
            queue = state.queues.get(c.queue)
            if queue is None or not queue.movable or v.key in state.taken or v.key == own:
                continue
            if queue.movable_below is not None and v.priority >= queue.movable_below:
                continue
            min_runtime = (
                queue.min_runtime_preempt_s if c.queue == w.queue else queue.min_runtime_reclaim_s
            )
            if min_runtime and now < started_at(v) + min_runtime:
                continue
            out.append(c)
        return out

    def _place_moved(self, c: Candidate) -> Placement | Unplaceable:
        """New room for a moved workload: its admitted pods, on the flavors it holds."""
        state = self.state
        assert state.nodes is not None
        w = c.workload
        by_name = {a.pod_set: a for a in w.admission or ()}
        counts = [by_name[ps.name].count if ps.name in by_name else 0 for ps in w.pod_sets]
        chosen = [dict(by_name[ps.name].flavors) if ps.name in by_name else {} for ps in w.pod_sets]
        gang, _ = gang_of(state.snapshot, w, counts, chosen, False)
        if gang is None:
            return Placement({}, 0, {})
        queue = state.queues.get(c.queue)
        return place_gang(state.nodes, gang, queue.placement if queue else "BinPack")
