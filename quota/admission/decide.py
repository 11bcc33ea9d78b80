"""Deciding for one pending workload at its queue's turn: fit quota, place, admit or wait.

Flavors are assigned against the held ledger (and the planned one once they may differ,
see state.py). A workload that fits is placed on nodes when the snapshot has them
(quota is the policy, placement the physics): its pods must all find room (at least minCount
of them), counting every bound pod, the room planned for admitted workloads not yet bound,
and this cycle's own admissions; if the nodes of the flavors quota chose cannot take them,
the next flavors in the queue's order are tried. A workload that does not fit may preempt
for quota (quota_preemption.py) or for nodes (node_room.py), or have others moved for it
(moves.py); else it waits with the reason.

A shape that failed in a queue is not tried again in the same cycle: usage in `held` only
grows during a cycle. A preemption elsewhere can give a little room back in `planned`, but a
failed shape is still not retried until the next cycle: being conservative for one cycle is
cheaper than re-running victim searches after every preemption.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from quota.admission.moves import Moves
from quota.admission.node_room import HeldRoom, NodeRoom, placement_words
from quota.admission.outcome import NoEviction, Outcome
from quota.admission.quota_preemption import QuotaPreemption
from quota.admission.reasons import Reasons, held_back_words
from quota.admission.requests import (
    Request,
    Requests,
    request_gang,
    topology_refusal,
    within_quota_words,
)
from quota.admission.state import NO_SHARE, CycleState, Vector
from quota.model.decisions import Admit, Pending
from quota.model.flavorassign import Fit, FitFailure, Room, assign_flavors, assign_flavors_pair
from quota.model.resources import FlavorResource, add_into, on_flavors, subtracted
from quota.model.snapshot import Assignment, PodSet, QueueSpec, Workload
from quota.placement.gang import Placement, Unplaceable


class Decide:
    """Decides for the pending workloads of one cycle, one at a time."""

    def __init__(
        self,
        state: CycleState,
        requests: Requests,
        room: NodeRoom,
        preemption: QuotaPreemption,
        moves: Moves,
    ) -> None:
        self.state = state
        self.requests = requests
        self.room = room
        self.preemption = preemption
        self.moves = moves
        self.reasons = Reasons(state)
        # Memo of failures by request shape (see Requests.memo_key): the reason, and which
        # no node could ever host.
        self._memo: dict[tuple[object, ...], str] = {}
        self._never: set[tuple[object, ...]] = set()
        self._set_aside: dict[str, Request] = {}  # by workload key, for the second pass
        # Room left under the fair shares per key, while one queue's turn lasts.
        self._share_room: dict[FlavorResource, int] = {}
        # By queue: the first workload of this cycle that waits (waitBeforeEvicting) before
        # it may preempt lower priorities of its queue. Those are not started meanwhile:
        # the quota they would take is what it waits for, and it would evict them later.
        self._waiting_to_evict: dict[str, Workload] = {}

    def new_turn(self) -> None:
        """A queue's turn starts: usage stays as it is until it ends with an admission or a
        wait."""
        self._share_room = {}

    def consider(self, spec: QueueSpec, w: Workload, within_share: bool = False) -> Outcome:
        """Decide for `w` and record the decision.

        With `within_share`, return BEYOND without deciding when `w` would take its queue
        or an ancestor beyond fair share (whether it would fit or not).

        A holder (a preemptor, a moved workload) takes back the room and quota held for it
        for its turn, and every ending of the turn that neither admits it nor holds new
        room for it gives them back: no later workload of the cycle is admitted on them.
        When its hold has lapsed instead, its wait says so.
        """
        if w.hold is None:
            return self._turn(spec, w, within_share)
        released = self.room.release_hold(w)
        outcome = self._turn(spec, w, within_share)
        if outcome == "admitted" or outcome == "waiting":
            return outcome
        if released is not None:
            self.room.restore_hold(released)
        elif outcome != "beyond":
            lapsed = self.room.lapse_words(w, self.room.stuck(w))
            last = self.state.pending[-1]
            if lapsed and last.workload == w.key:
                self.state.pending[-1] = replace(last, reason=lapsed + last.reason)
        return outcome

    def _turn(self, spec: QueueSpec, w: Workload, within_share: bool) -> Outcome:
        """`consider` without the holder's room and quota."""
        state = self.state
        request = self._set_aside.pop(w.key, None) or self.requests.make(spec, w)
        if isinstance(request, str):
            state.pending.append(Pending(w.key, spec.name, request))
            return "pending"
        first = self._waiting_to_evict.get(spec.name)
        # A holder's room and quota are its own already: holding it back would only delay it.
        if (
            first is not None
            and w.priority < first.priority
            and request.base is None
            and w.hold is None
        ):
            state.pending.append(Pending(w.key, spec.name, held_back_words(first)))
            return "pending"
        memo_key = request.memo_key
        if memo_key is not None and memo_key in self._memo:
            state.pending.append(Pending(w.key, spec.name, self._memo[memo_key]))
            return "never" if memo_key in self._never else "pending"
        # A non-preemptible workload never borrows: it is decided here, within quota, or
        # waits; never in the borrowing pass.
        within_share = within_share and request.may_borrow
        if within_share and not self._could_stay_within_share(spec.name, request):
            return self._put_aside(request)  # decided in the second pass, fitting or not
        reserved: Fit | FitFailure | None = None  # what the planned ledger alone gives
        if state.diverged:
            result, reserved = assign_flavors_pair(
                spec.name,
                request.plans,
                request.counts,
                request.room(state.held),
                request.room(state.planned),
            )
        else:
            result = assign_flavors(
                spec.name, request.plans, request.counts, (request.room(state.held),)
            )
        if isinstance(result, Fit):
            if within_share and self._beyond_share(spec.name, result):
                return self._put_aside(request)
            return self._place_and_admit(spec, request, request.counts, result, memo_key)
        failure = result
        if isinstance(reserved, Fit):
            return self._reserve(spec, request, reserved)
        smallest = request.counts
        if request.base is None and request.flexible:
            partial = self._partial(spec, request, request.rooms(state.ledgers()))
            if partial is not None:
                counts, fit = partial
                if within_share and self._beyond_share(spec.name, fit):
                    return self._put_aside(request)
                return self._place_and_admit(spec, request, counts, fit, memo_key)
            smallest = tuple(
                ps.min_count if ps.min_count is not None else ps.count for ps in w.pod_sets
            )
        preempted = self.preemption.preempt(spec, request, smallest)
        if not isinstance(preempted, NoEviction):
            return preempted
        if preempted.waiting and spec.within_queue != "Never" and w.hold is None:
            self._waiting_to_evict.setdefault(spec.name, w)
        reason = self.reasons.not_fitting(spec, w, failure, smallest != request.counts)
        if not request.may_borrow:
            reason = within_quota_words(spec, request, failure, state.ledgers()) or reason
        if preempted.words:
            reason += "; " + preempted.words
        if memo_key is not None:
            self._memo[memo_key] = reason
        state.pending.append(Pending(w.key, spec.name, reason))
        return "pending"

    def _reserve(self, spec: QueueSpec, request: Request, reserved: Fit) -> Outcome:
        """`request` fits once evictions in flight complete (`reserved`, in the planned
        ledger alone): it waits for them with that room reserved."""
        state = self.state
        w = request.workload
        if state.nodes is not None and not spec.remote:
            # The quota exists once evictions in flight complete; so must room on nodes,
            # in what the leaving free or (lower priorities allowing) by evicting more.
            outcome = self.room.make_room(spec, request, request.counts, reserved, None)
            if isinstance(outcome, Unplaceable):
                state.pending.append(Pending(w.key, spec.name, outcome.reason))
                return "pending"
            self.room.wait(spec, request, reserved, outcome)
            return "waiting"
        state.planned.charge(spec.name, reserved.usage)
        state.pending.append(
            Pending(
                w.key,
                spec.name,
                "waiting for preempted workloads to release quota; its room is reserved",
            )
        )
        return "waiting"

    # -- the fair-share pass ----------------------------------------------------------------

    def _put_aside(self, request: Request) -> Outcome:
        """Keep `request` for the second pass; a slice's depends on what is being evicted by
        then, so it is worked out again."""
        if request.base is None:
            self._set_aside[request.workload.key] = request
        return "beyond"

    def _could_stay_within_share(self, queue: str, request: Request) -> bool:
        """Whether some flavor per resource group keeps `queue` and its ancestors within fair
        share (pod sets judged one by one: a necessary condition, cheaper than assigning
        flavors). Every workload is asked this in the first pass: the room left under the
        shares is worked out once per key while the queue's turn lasts."""
        state = self.state
        room = self._share_room
        levels: list[tuple[Mapping[FlavorResource, int], Mapping[FlavorResource, int]]] = []
        for i, plan in enumerate(request.plans):
            count = request.counts[i]
            if not count:
                continue
            for group in plan.groups:
                for _, pairs in group.options:
                    for key, amount in pairs:
                        left = room.get(key)
                        if left is None:
                            if not levels:
                                shares = state.fair.shares
                                levels = [
                                    (state.planned.used[n], shares.get(n, NO_SHARE))
                                    for n in state.tree.paths[queue]
                                ]
                            # The least room under any level's share.
                            used, share = levels[0]
                            left = share.get(key, 0) - used.get(key, 0)
                            for used, share in levels[1:]:
                                under = share.get(key, 0) - used.get(key, 0)
                                if under < left:
                                    left = under
                            room[key] = left
                        if amount * count > left:
                            break
                    else:
                        break  # this flavor keeps every level within its share
                else:
                    return False
        return True

    def _beyond_share(self, queue: str, fit: Fit) -> bool:
        """Whether admitting `fit` would take `queue` or an ancestor beyond its fair share on
        some flavor/resource it adds to (for a scale-up slice `fit` holds the extra pods)."""
        state = self.state
        usage = fit.usage
        shares = state.fair.shares
        for name in state.tree.paths[queue]:
            used = state.planned.used[name]
            share = shares.get(name, {})
            for key, amount in usage.items():
                if amount > 0 and used.get(key, 0) + amount > share.get(key, 0):
                    return True
        return False

    # -- fitting and placing ----------------------------------------------------------------

    def _partial(
        self, spec: QueueSpec, request: Request, ledgers: Sequence[Room]
    ) -> tuple[tuple[int, ...], Fit] | None:
        """The largest counts between minCount and count that fit (binary search)."""
        pod_sets = request.workload.pod_sets
        lows = [ps.min_count if ps.min_count is not None else ps.count for ps in pod_sets]
        spans = [ps.count - low for ps, low in zip(pod_sets, lows, strict=True)]
        steps = max(spans)

        def counts_at(step: int) -> tuple[int, ...]:
            return tuple(low + span * step // steps for low, span in zip(lows, spans, strict=True))

        best: tuple[tuple[int, ...], Fit] | None = None
        lo, hi = 0, steps - 1  # `steps` itself (the full count) already failed
        while lo <= hi:
            mid = (lo + hi) // 2
            counts = counts_at(mid)
            fit = assign_flavors(spec.name, request.plans, counts, ledgers, explain=False)
            if isinstance(fit, Fit):
                best = (counts, fit)
                lo = mid + 1
            else:
                if mid == 0:
                    return None
                hi = mid - 1
        return best

    def _place_and_admit(
        self,
        spec: QueueSpec,
        request: Request,
        counts: tuple[int, ...],
        fit: Fit,
        memo_key: tuple[object, ...] | None,
    ) -> Outcome:
        """Admit `request` with `fit` if its pods can be placed; else keep it pending.

        When the nodes of the flavors quota chose cannot take the pods, the next flavors in
        the queue's order are tried (a pinned slice stays on its own)."""
        state = self.state
        if state.nodes is None or spec.remote:
            # Quota alone decides, but a Topology its flavors cannot have is not ignored.
            refused = topology_refusal(state.snapshot, request.workload, fit.flavors)
            if refused is not None:
                state.pending.append(Pending(request.workload.key, spec.name, refused))
                return "never"
            self._admit(spec, request, counts, fit, None)
            return "admitted"
        placed = first = self._place(spec, request, counts, fit)
        first_fit = fit
        if isinstance(first, Unplaceable) and request.base is None:
            excluded = frozenset[str]()
            ledgers = request.rooms(state.ledgers())
            while isinstance(placed, Unplaceable):
                tried = {f for flavors in fit.flavors for f in flavors.values()}
                if tried <= excluded:
                    break
                excluded |= tried
                other = assign_flavors(
                    spec.name, request.plans, counts, ledgers, excluded, explain=False
                )
                if not isinstance(other, Fit):
                    break
                fit = other
                placed = self._place(spec, request, counts, fit)
            if isinstance(placed, Unplaceable):
                placed = Unplaceable(first.reason, first.never and placed.never, first.pod_set)
        if isinstance(placed, Unplaceable) and isinstance(first, Unplaceable) and not first.never:
            # Quota chose these flavors: make room on their nodes by moving workloads that
            # may move (they keep running), else by evicting lower priorities if allowed.
            if self.moves.consolidate(spec, request, counts, first_fit):
                return "waiting"
            still = self.room.make_room(spec, request, counts, first_fit, first)
            if isinstance(still, HeldRoom):
                self.room.wait(spec, request, first_fit, still)
                return "waiting"
            placed = still
        if isinstance(placed, Unplaceable):
            w = request.workload
            if memo_key is not None:
                self._memo[memo_key] = placed.reason
                if placed.never:
                    self._never.add(memo_key)
            state.pending.append(Pending(w.key, spec.name, placed.reason))
            return "never" if placed.never else "pending"
        got = tuple(placed.count(ps.name) for ps in request.workload.pod_sets)
        if got != counts:
            # Partial placement (minCount): charge quota for the pods that were placed.
            refit = assign_flavors(
                spec.name, request.plans, got, request.rooms(state.ledgers()), explain=False
            )
            if not isinstance(refit, Fit):  # fewer pods than already fitted: cannot happen
                raise AssertionError(f"{request.workload.key}: {got} pods stopped fitting")
            counts, fit = got, refit
        state.nodes.assume(placed)
        self._admit(spec, request, counts, fit, placed)
        return "admitted"

    def _place(
        self, spec: QueueSpec, request: Request, counts: Sequence[int], fit: Fit
    ) -> Placement | Unplaceable:
        """Where the pods to admit go, on nodes of the flavors `fit` chose, or why nowhere."""
        state = self.state
        assert state.nodes is not None
        gang, where = request_gang(state, request, counts, fit.flavors)
        if gang is None:
            return Placement({}, 0, {})
        placed = self.room.placer(request.workload, gang, spec.placement)()
        if isinstance(placed, Unplaceable):
            return Unplaceable(
                f"quota is available but the pods cannot be placed{where}: {placed.reason}",
                placed.never,
                placed.pod_set,
            )
        return placed

    def _admit(
        self,
        spec: QueueSpec,
        request: Request,
        counts: Sequence[int],
        fit: Fit,
        placed: Placement | None,
    ) -> None:
        state = self.state
        w = request.workload
        assignments: list[Assignment] = []
        total: Vector = {}
        for i, ps in enumerate(w.pod_sets):
            # A slice is admitted at its full new size; only the difference is charged.
            full = ps.count if request.base is not None else counts[i]
            flavors = fit.flavors[i]
            assignments.append(
                Assignment(ps.name, full, dict(flavors), _planned_nodes(request, ps, placed))
            )
            add_into(total, on_flavors(ps.per_pod, flavors), full)
        charge = total
        if request.running is not None:
            charge = subtracted(total, state.running()[request.running.key][1])
            # The old slice is now part of this one: it must not be picked as a victim.
            state.taken.add(request.running.key)
            state.replaced.add(request.running.key)
        state.held.charge(spec.name, charge)
        state.planned.charge(spec.name, charge)
        borrowed = self.reasons.borrowing(spec.name, total)
        reason = self.reasons.admitted(spec, request, counts, total, borrowed)
        if placed is not None and placed.total:
            reason += "; " + placement_words(placed)
        state.admit.append(
            Admit(w.key, spec.name, tuple(assignments), borrowed is not None, reason)
        )


def _planned_nodes(
    request: Request, ps: PodSet, placed: Placement | None
) -> tuple[tuple[str, int], ...]:
    """The plan of one pod set: for a scale-up slice, the nodes the slice it replaces runs on
    plus those of its extra pods."""
    nodes: dict[str, int] = {}
    if request.running is not None and request.running.admission is not None:
        for a in request.running.admission:
            if a.pod_set == ps.name:
                for node, n in a.nodes:
                    nodes[node] = nodes.get(node, 0) + n
    if placed is not None:
        for node, n in placed.nodes.get(ps.name, ()):
            nodes[node] = nodes.get(node, 0) + n
    return tuple(nodes.items())
