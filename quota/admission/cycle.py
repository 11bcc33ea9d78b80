"""One admission cycle: which pending workloads to admit, whom to evict, and why.

The cycle keeps two ledgers. `held` is what nodes actually hold: admitted workloads,
including those already told to leave, plus this cycle's admissions. `planned` is the state
once every eviction in flight has completed: victims and drained workloads released,
preemptors that wait for them charged. A workload is admitted only when it fits both, so it
neither overcommits nodes nor takes room promised to a preemptor; preemption plans against
`planned`, so no quota is promised twice and no victim is chosen twice.

Queues are visited lowest usage/fair-share ratio first, subtrees compared before the queues
in them (quota/ordering.py); a queue keeps admitting while it stays the most deserving, so
one cycle admits as many workloads per queue as fit. Queues are visited twice: first for
what keeps them within fair share, then for what borrows beyond it (see `run`).

When the snapshot has nodes, quota is the policy and placement the physics: a workload whose
flavors fit is admitted only if the placement core finds nodes for all its pods (at least
minCount of them), counting every bound pod, Muster's or not, the room planned for admitted
workloads not yet bound, and this cycle's own admissions. The plan goes out with the
admission (`Assignment.nodes`) for the scheduler loop to bind. A workload no node could ever
host waits with that reason and never holds up its queue, even a StrictFIFO one.

A shape that failed in a queue is not tried again in the same cycle: usage in `held` only
grows during a cycle. A preemption elsewhere can give a little room back in `planned`, but a
failed shape is still not retried until the next cycle: being conservative for one cycle is
cheaper than re-running victim searches after every preemption.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import NamedTuple

from quota.fairness.fairshare import Counted, FairShare, fair_share, root_amount
from quota.fairness.ordering import (
    QueueKey,
    QueueOrder,
    dominant_ratio,
    queue_order,
    workload_order,
)
from quota.model.decisions import Admit, CycleResult, Pending, Preempt, Victim
from quota.model.flavorassign import (
    Fit,
    FitFailure,
    Planner,
    PodSetPlan,
    SliceBase,
    assign_flavors,
    assign_flavors_pair,
    slice_base,
)
from quota.model.ledger import Ledger
from quota.model.nodes import BoundPod, PodShape
from quota.model.resources import FlavorResource, flavor_resource, format_amount
from quota.model.snapshot import (
    Assignment,
    Flavor,
    Hold,
    PodSet,
    QueueSpec,
    Snapshot,
    Workload,
    admission_blocker,
    draining,
    pod_set_usage,
    queue_tree,
    superseded_slices,
)
from quota.placement.gang import GangRequest, Placement, PodSetRequest, Unplaceable, place_gang
from quota.placement.nodes import NodeView
from quota.placement.reservations import held_by, held_pods, planned_pods
from quota.preemption.consolidation import consolidate, move_reason
from quota.preemption.nodes import (
    NodePlan,
    node_candidates,
    node_victim_reason,
    preempt_on_nodes,
    protected_words,
)
from quota.preemption.reclaim import ReclaimIndex, plan_reclaim
from quota.preemption.victims import (
    Candidate,
    VictimKey,
    in_victim_order,
    pair_holders,
    preemption_reason,
    select_victims,
    started_at,
    victim_order,
    within_queue_candidates,
    within_queue_holders,
)

Vector = dict[FlavorResource, int]
_NO_SHARE: Mapping[FlavorResource, int] = {}


def admission_cycle(snapshot: Snapshot, fair: FairShare | None = None) -> CycleResult:
    """Decide, for every pending workload of `snapshot`, admit or keep pending (and evict whom).

    `fair` may be passed when the caller already computed it for the same snapshot.
    """
    return _Cycle(snapshot, fair if fair is not None else fair_share(snapshot)).run()


@dataclass(frozen=True, slots=True)
class _NodeOutcome:
    """A preemptor's room found on nodes: the plan, and the hold to keep it."""

    plan: NodePlan
    hold: Hold | None  # None: no pods to place


@dataclass(slots=True)
class _Request:
    """A pending workload prepared for fitting in its queue."""

    workload: Workload
    plans: tuple[PodSetPlan, ...]
    counts: tuple[int, ...]  # pods to charge per pod set (the extra pods for a scale-up)
    base: SliceBase | None  # what the slice it replaces already runs
    running: Workload | None  # that slice
    flexible: bool  # some pod set may start with fewer pods (minCount below count)
    # Its key in the cycle's memo of failures (see `_memo_key`), worked out once: a request
    # set aside in the first pass is asked again in the second.
    memo_key: tuple[object, ...] | None


class _GroupOptions(NamedTuple):
    """One resource group of one pod set of a request: per flavor it may take, the (key,
    need) pairs of the whole group there. (A named tuple: one is made per group of every
    victim search.)"""

    counted: bool  # the pod set has pods to charge (a scale-up may add none)
    flavors: list[list[tuple[FlavorResource, int]]]


class _Cycle:
    def __init__(self, snapshot: Snapshot, fair: FairShare) -> None:
        self.snapshot = snapshot
        self.fair = fair
        self.queues = snapshot.queues
        self.tree = queue_tree(snapshot.queues)
        self.quotas = {name: spec.quotas for name, spec in self.queues.items()}
        limits = {name: spec.limits for name, spec in self.queues.items()}
        amount = dict(fair.amount) if fair.amount else root_amount(snapshot, self.tree)
        self.held = Ledger(self.tree.paths, limits, amount)
        self.admit: list[Admit] = []
        self.preempt: list[Preempt] = []
        self.pending: list[Pending] = []
        self.drain: list[Victim] = []
        # Admitted workloads that hold quota (an old slice whose successor is admitted does
        # not), per queue, each with its usage (never changed).
        gone = superseded_slices(snapshot.admitted)
        holding: Mapping[str, Sequence[Counted]]
        if fair.snapshot is snapshot:
            # Fair share counted these very workloads (the same ones: not superseded, in a
            # known queue) and rolled their usage up the tree: taken as they are.
            holding = fair.queue_workloads
            self.held.load(fair.usage, self.tree.roots)
        else:
            holding, per_leaf = self._count_admitted(gone, fair)
            # Summed per leaf first: one charge per leaf instead of one per workload up the
            # tree.
            for queue in sorted(per_leaf):
                self.held.charge(queue, per_leaf[queue])
        self.holding = holding
        self.holders: dict[str, Counted] | None = None  # by key, see _running
        self.planned = self.held.copy()
        # Workloads already leaving, or chosen as victims this cycle: never chosen again.
        self.taken: set[str] = set()
        # Per queue, its admitted workloads that may still be chosen as victims.
        self.admitted_by_queue: Mapping[str, Sequence[Counted]] = holding
        # Per queue, the draining queue on its path.
        drains = {name: draining(self.queues, self.tree, name) for name in holding}
        evicting = (
            fair.evicting
            if fair.snapshot is snapshot
            else {w.queue for counted in holding.values() for w, _ in counted if w.evicting}
        )
        if evicting or any(d is not None for d in drains.values()):
            # Some are leaving already: walked in the snapshot's order (that of the drain
            # decisions). Most cycles have none, and keep the lists as fair share made them.
            by_queue: dict[str, list[Counted]] = {}
            for w, usage in self._running().values():
                drained_by = drains[w.queue]
                if w.evicting or drained_by is not None:
                    self.taken.add(w.key)
                    self.planned.charge(w.queue, usage, -1)
                    if drained_by is not None and not w.evicting:
                        self.drain.append(
                            Victim(
                                w.key,
                                w.queue,
                                "Preempted",
                                f"queue {drained_by} is draining (stopPolicy HoldAndDrain); "
                                "set stopPolicy to None to keep workloads running",
                            )
                        )
                else:
                    by_queue.setdefault(w.queue, []).append((w, usage))
            self.admitted_by_queue = by_queue
        self.diverged = bool(self.taken)
        # Placement: free room on every node, less bound pods and planned, unbound room.
        self.nodes: NodeView | None = None
        if snapshot.nodes is not None:
            kept = [w for w in snapshot.admitted if w.key not in gone]
            pods = list(snapshot.pods) + planned_pods(kept, snapshot.pods)
            # Room held for preemptors whose victims are leaving: taken for everyone else,
            # whichever queue comes first, until the preemptor's own turn (`_release_hold`).
            holders = [*snapshot.pending, *(w for w in snapshot.admitted if w.hold is not None)]
            pods += held_pods(holders, snapshot.now, snapshot.hold_timeout_s)
            self.nodes = NodeView(snapshot.nodes, pods)
        # Pod keys in the view per workload (bound and planned), for preemption on nodes.
        self.pods_of: dict[str, list[str]] = {}
        if self.nodes is not None:
            for pod in self.nodes.pods.values():
                if pod.workload is not None:
                    self.pods_of.setdefault(pod.workload, []).append(pod.key)
        self.replaced: set[str] = set()  # slices taken over by this cycle's scale-ups
        # Placeholder pods of holds released at their preemptor's turn (see _keep_hold).
        self.released: dict[str, list[BoundPod]] = {}
        self.all_victims: list[Candidate] | None = None
        self.node_victims: list[Candidate] | None = None
        self.young_victims: list[Candidate] | None = None
        # Fair share planned the pending pod sets of this snapshot already.
        planner = fair.planner if fair.snapshot is snapshot else None
        self.planner = planner if planner is not None else Planner(snapshot.flavors)
        self.memo: dict[tuple[object, ...], str] = {}
        self.never: set[tuple[object, ...]] = set()  # memo keys no node could ever host
        self.homeless: dict[str, str] = {}  # flavor -> why no node carries it ("" if one does)
        self.set_aside: dict[str, _Request] = {}  # by workload key, for the second pass
        self.room: dict[FlavorResource, int] = {}  # see _could_stay_within_share
        self.reclaim_index: ReclaimIndex | None = None
        self.victim_lists: dict[str, list[Candidate]] = {}
        self.victim_keys: dict[str, list[VictimKey]] = {}
        # Per queue and (flavor, resource): its admitted workloads holding that pair, in
        # victim order, with their priorities (see _within_queue).
        self.pair_holders: dict[tuple[str, FlavorResource], tuple[list[Candidate], list[int]]] = {}
        self.order_inputs: dict[str, tuple[Vector, Mapping[FlavorResource, int], int]] = {}
        self.order = QueueOrder(self.tree, self._order)

    def _count_admitted(
        self, gone: frozenset[str], fair: FairShare
    ) -> tuple[dict[str, list[Counted]], dict[str, Vector]]:
        """The admitted workloads that hold quota with their usage, per queue, and their usage
        summed per queue (for a fair share computed from another snapshot)."""
        # Fair share may have worked a workload's usage out, if computed with that workload.
        known = {id(w): usage for counted in fair.queue_workloads.values() for w, usage in counted}
        holding: dict[str, list[Counted]] = {}
        per_leaf: dict[str, Vector] = {}
        for w in self.snapshot.admitted:
            if w.key in gone or w.queue not in self.tree.paths:
                continue
            usage = known.get(id(w))
            if usage is None:
                usage = pod_set_usage(w)
            holding.setdefault(w.queue, []).append((w, usage))
            total = per_leaf.get(w.queue)
            if total is None:
                per_leaf[w.queue] = dict(usage)
            else:
                for key, held in usage.items():
                    total[key] = total.get(key, 0) + held
        return holding, per_leaf

    def _running(self) -> dict[str, Counted]:
        """The admitted workloads that hold quota by key, in the snapshot's order, with their
        usage: made on first use (a scale-up slice, a drain), most cycles need none."""
        if self.holders is None:
            usage_of = {id(w): usage for counted in self.holding.values() for w, usage in counted}
            self.holders = {}
            for w in self.snapshot.admitted:
                usage = usage_of.get(id(w))
                if usage is not None:
                    self.holders[w.key] = (w, usage)
        return self.holders

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> CycleResult:
        by_queue: dict[str, list[Workload]] = {}
        for w in self.snapshot.pending:
            by_queue.setdefault(w.queue, []).append(w)
        open_queues: dict[str, list[Workload]] = {}
        for name in sorted(by_queue):
            items = by_queue[name]
            items.sort(key=workload_order)
            blocker = admission_blocker(self.queues, self.tree, name)
            if blocker is not None:
                self.pending.extend(Pending(w.key, name, blocker) for w in items)
                continue
            open_queues[name] = items
        # Two passes, as KAI-Scheduler allocates deserved quota before over-quota: first each
        # queue admits while it stays (with its ancestors) within fair share, then, from what
        # is left, the rest. Otherwise a queue could borrow room that another queue below
        # its share was about to use (room a reclaim had just freed, say), and lose it to
        # that queue's reclaim in the next cycle: churn.
        beyond: dict[str, list[Workload]] = {}
        self._pass(open_queues, beyond)
        self._pass(beyond, None)
        # The queue order and the reclaim index hold bound methods of this cycle: dropped
        # so that the cycle and all it made (fair share's per-workload usage, ledgers,
        # victim lists: ~80,000 objects in the bench's contended cycle) are freed by
        # reference counting as it returns, not left as cyclic garbage for the collector,
        # whose next pass then walked them all (~30 ms there, usually as the caller turns
        # the collector back on after the cycle).
        del self.order
        self.reclaim_index = None
        return CycleResult(
            admit=tuple(self.admit),
            preempt=tuple(self.preempt),
            pending=tuple(self.pending),
            drain=tuple(self.drain),
        )

    def _pass(
        self, by_queue: Mapping[str, list[Workload]], beyond: dict[str, list[Workload]] | None
    ) -> None:
        """Visit the queues in order and decide for their workloads.

        With `beyond`, a workload that would take its queue beyond fair share is set aside
        there, in order, with whatever `_held_back` keeps behind it.
        """
        order = self.order = QueueOrder(self.tree, self._order)
        order.push_all(name for name in by_queue if by_queue[name])
        cursor = dict.fromkeys(by_queue, 0)
        while (picked := order.pop()) is not None:
            name = picked
            items = by_queue[name]
            spec = self.queues[name]
            index = cursor[name]
            moved = False
            # Usage stays as it is until this turn ends with an admission or a wait.
            self.room = {}
            while index < len(items):
                w = items[index]
                index += 1
                if beyond is not None and name in beyond:
                    deferred = beyond[name]
                    if self._held_back(spec, w, deferred[0]):
                        deferred.extend(items[index - 1 :])
                        index = len(items)
                        break
                outcome = self._consider(spec, w, within_share=beyond is not None)
                if outcome == "beyond":
                    assert beyond is not None
                    beyond.setdefault(name, []).append(w)
                    continue
                if outcome == "admitted":
                    moved = True
                    break
                if outcome == "never":
                    continue  # no node could ever host it: it must not hold up the queue
                if spec.queueing_strategy == "StrictFIFO" or outcome == "waiting":
                    if spec.queueing_strategy == "StrictFIFO":
                        why = f"waiting behind {w.key}, the head of StrictFIFO queue {name}" + (
                            " (it is waiting for preempted workloads)" if outcome else ""
                        )
                        self.pending.extend(Pending(x.key, name, why) for x in items[index:])
                        index = len(items)
                    moved = True
                    break
            cursor[name] = index
            if moved and index < len(items):
                order.push(name)
            elif moved:
                order.refresh(name)  # its ancestors stay in line with their new usage

    @staticmethod
    def _held_back(spec: QueueSpec, w: Workload, first: Workload) -> bool:
        """Whether `w` must wait for the borrowing pass because `first`, ahead of it in its
        queue, was set aside for it.

        BestEffortFIFO lets a workload pass one that cannot be admitted yet, and one set
        aside is in that position, so `w` may go unless `first` could preempt it within the
        queue: it would only be evicted for `first` a cycle later. StrictFIFO holds all.
        """
        if spec.queueing_strategy == "StrictFIFO":
            return True
        if spec.within_queue == "LowerPriority":
            return w.priority < first.priority
        if spec.within_queue == "LowerOrNewerEqualPriority":
            return w.priority <= first.priority  # those behind it arrived later
        return False

    def _order(self, name: str) -> QueueKey:
        found = self.order_inputs.get(name)
        if found is None:
            # What a queue's key reads, looked up once: keys are worked out ~10,000 times.
            found = self.order_inputs[name] = (
                self.planned.used[name],
                self.fair.shares.get(name, _NO_SHARE),
                self.queues[name].priority,
            )
        used, share, priority = found
        return queue_order(dominant_ratio(used, share), priority, name)

    # -- one workload -----------------------------------------------------------------------

    def _consider(self, spec: QueueSpec, w: Workload, within_share: bool = False) -> str:
        """Decide for `w`; return "admitted", "waiting" (preempting or reserved) or "".

        With `within_share`, return "beyond" without deciding when `w` would take its queue
        or an ancestor beyond fair share (whether it would fit or not).
        """
        if w.hold is not None:
            self._release_hold(w)
        request = self.set_aside.pop(w.key, None) or self._request(spec, w)
        if isinstance(request, str):
            self.pending.append(Pending(w.key, spec.name, request))
            return ""
        memo_key = request.memo_key
        if memo_key is not None and memo_key in self.memo:
            self.pending.append(Pending(w.key, spec.name, self.memo[memo_key]))
            return "never" if memo_key in self.never else ""
        if within_share and not self._could_stay_within_share(spec.name, request):
            return self._set_aside(request)  # decided in the second pass, fitting or not
        sticky = request.base.flavors if request.base is not None else None
        ledgers = (self.held, self.planned) if self.diverged else (self.held,)
        reserved: Fit | FitFailure | None = None  # what the planned ledger alone gives
        if self.diverged:
            result, reserved = self._assign_both(spec.name, request, sticky)
        else:
            result = assign_flavors(spec.name, request.plans, request.counts, ledgers, sticky)
        if isinstance(result, Fit):
            if within_share and self._beyond_share(spec.name, result):
                return self._set_aside(request)
            return self._place_and_admit(spec, request, request.counts, result, memo_key)
        failure = result
        if reserved is not None:
            if isinstance(reserved, Fit) and self.nodes is not None:
                # The quota exists once evictions in flight complete; so must room on nodes,
                # in what the leaving free or (lower priorities allowing) by evicting more.
                outcome = self._preempt_on_nodes(spec, request, request.counts, reserved, None)
                if isinstance(outcome, Unplaceable):
                    self.pending.append(Pending(w.key, spec.name, outcome.reason))
                    return ""
                self._wait_on_nodes(spec, request, reserved, outcome)
                return "waiting"
            if isinstance(reserved, Fit):
                # The room exists once evictions in flight complete: hold it for this workload.
                self.planned.charge(spec.name, reserved.usage)
                self.pending.append(
                    Pending(
                        w.key,
                        spec.name,
                        "waiting for preempted workloads to release quota; its room is reserved",
                    )
                )
                return "waiting"
        smallest = request.counts
        if request.base is None and request.flexible:
            partial = self._partial(spec, request, ledgers)
            if partial is not None:
                counts, fit = partial
                if within_share and self._beyond_share(spec.name, fit):
                    return self._set_aside(request)
                return self._place_and_admit(spec, request, counts, fit, memo_key)
            smallest = tuple(
                ps.min_count if ps.min_count is not None else ps.count for ps in w.pod_sets
            )
        preempted = self._preempt(spec, request, smallest)
        if preempted is True:
            return "waiting"
        reason = self._failure_reason(spec, w, failure, smallest != request.counts)
        if isinstance(preempted, Unplaceable):
            reason += "; " + preempted.reason
        if memo_key is not None:
            self.memo[memo_key] = reason
        self.pending.append(Pending(w.key, spec.name, reason))
        return ""

    def _assign_both(
        self,
        queue: str,
        request: _Request,
        sticky: Sequence[Mapping[str, str] | None] | None,
    ) -> tuple[Fit | FitFailure, Fit | FitFailure | None]:
        """Flavors for `request` in the held and planned ledgers together and, when that
        fails, in the planned one alone (the room once evictions in flight complete)."""
        return assign_flavors_pair(
            queue, request.plans, request.counts, self.held, self.planned, sticky
        )

    def _request(self, spec: QueueSpec, w: Workload) -> _Request | str:
        base: SliceBase | None = None
        running: Workload | None = None
        if w.replaces is not None:
            found = self._running().get(w.replaces)
            running = found[0] if found is not None else None
            if running is not None:
                if w.replaces in self.taken:
                    return (
                        f"the slice {w.replaces} it replaces is being evicted; it will be "
                        "considered again once that slice is gone"
                    )
                base = slice_base(w, running)
        plans: list[PodSetPlan] = []
        flexible = False
        for ps in w.pod_sets:
            plan = self.planner.plan(spec, ps)
            if plan.impossible is not None:
                return plan.impossible
            plans.append(plan)
            if ps.min_count is not None and ps.min_count < ps.count:
                flexible = True
        if base is None:
            counts = tuple([ps.count for ps in w.pod_sets])
        else:
            counts = tuple(max(0, ps.count - base.counts[i]) for i, ps in enumerate(w.pod_sets))
        memo_key = self._memo_key(spec, w) if base is None else None
        return _Request(w, tuple(plans), counts, base, running, flexible, memo_key)

    def _set_aside(self, request: _Request) -> str:
        """Keep `request` for the second pass; a slice's depends on what is being evicted by
        then, so it is worked out again."""
        if request.base is None:
            self.set_aside[request.workload.key] = request
        self._keep_hold(request.workload.key)
        return "beyond"

    def _could_stay_within_share(self, queue: str, request: _Request) -> bool:
        """Whether some flavor per resource group keeps `queue` and its ancestors within fair
        share (pod sets judged one by one: a necessary condition, cheaper than assigning
        flavors). Every workload is asked this in the first pass: the room left under the
        shares is worked out once per key while the queue's turn lasts (`self.room`)."""
        room = self.room
        levels: list[tuple[Mapping[FlavorResource, int], Mapping[FlavorResource, int]]] = []
        for i, plan in enumerate(request.plans):
            count = request.counts[i]
            if not count:
                continue
            pinned = request.base.flavors[i] if request.base is not None else None
            for group in plan.groups:
                choices = (
                    group.options if pinned is None else group.choices(pinned, plan.pod_set.per_pod)
                )
                for _, pairs in choices:
                    for key, amount in pairs:
                        left = room.get(key)
                        if left is None:
                            if not levels:
                                shares = self.fair.shares
                                levels = [
                                    (self.planned.used[n], shares.get(n, _NO_SHARE))
                                    for n in self.tree.paths[queue]
                                ]
                            left = None
                            for used, share in levels:
                                under = share.get(key, 0) - used.get(key, 0)
                                if left is None or under < left:
                                    left = under
                            assert left is not None  # a path is never empty
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
        usage = fit.usage
        shares = self.fair.shares
        for name in self.tree.paths[queue]:
            used = self.planned.used[name]
            share = shares.get(name, {})
            for key, amount in usage.items():
                if amount > 0 and used.get(key, 0) + amount > share.get(key, 0):
                    return True
        return False

    def _memo_key(self, spec: QueueSpec, w: Workload) -> tuple[object, ...]:
        """Identical shapes fail identically; priority and arrival matter only to preemption.
        (Not for a scale-up slice: what it needs depends on the slice it replaces.)"""
        shape: list[object] = [spec.name]
        for ps in w.pod_sets:
            # The planner's shape number: equal numbers, equal signatures.
            shape.append((self.planner.shape(ps), ps.count, ps.min_count))
        if spec.within_queue != "Never" or spec.reclaim != "Never":
            shape.append(w.priority)
            if spec.within_queue == "LowerOrNewerEqualPriority":
                shape.append(w.arrival)
        return tuple(shape)

    def _partial(
        self, spec: QueueSpec, request: _Request, ledgers: Sequence[Ledger]
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

    # -- placement ---------------------------------------------------------------------------

    def _place_and_admit(
        self,
        spec: QueueSpec,
        request: _Request,
        counts: tuple[int, ...],
        fit: Fit,
        memo_key: tuple[object, ...] | None,
    ) -> str:
        """Admit `request` with `fit` if its pods can be placed; else keep it pending.

        When the nodes of the flavors quota chose cannot take the pods, the next flavors in
        the queue's order are tried (a pinned slice stays on its own)."""
        if self.nodes is None:
            self._admit(spec, request, counts, fit, None)
            return "admitted"
        placed = first = self._place(spec, request, counts, fit)
        first_fit = fit
        if isinstance(first, Unplaceable) and request.base is None:
            excluded = frozenset[str]()
            ledgers = (self.held, self.planned) if self.diverged else (self.held,)
            while isinstance(placed, Unplaceable):
                tried = {f for flavors in fit.flavors for f in flavors.values()}
                if tried <= excluded:
                    break
                excluded |= tried
                other = assign_flavors(
                    spec.name, request.plans, counts, ledgers, None, excluded, explain=False
                )
                if not isinstance(other, Fit):
                    break
                fit = other
                placed = self._place(spec, request, counts, fit)
            if isinstance(placed, Unplaceable):
                placed = Unplaceable(first.reason, first.never and placed.never, first.pod_set)
        if isinstance(placed, Unplaceable) and isinstance(first, Unplaceable) and not first.never:
            # Quota chose these flavors: make room on their nodes, if lower priorities allow.
            still = self._preempt_on_nodes(spec, request, counts, first_fit, first)
            if isinstance(still, _NodeOutcome):
                self._wait_on_nodes(spec, request, first_fit, still)
                return "waiting"
            if self._consolidate(spec, request, counts, first_fit):
                return "waiting"
            placed = still
        if isinstance(placed, Unplaceable):
            w = request.workload
            if memo_key is not None:
                self.memo[memo_key] = placed.reason
                if placed.never:
                    self.never.add(memo_key)
            self.pending.append(Pending(w.key, spec.name, placed.reason))
            return "never" if placed.never else ""
        got = tuple(placed.count(ps.name) for ps in request.workload.pod_sets)
        if got != counts:
            # Partial placement (minCount): charge quota for the pods that were placed.
            ledgers = (self.held, self.planned) if self.diverged else (self.held,)
            refit = assign_flavors(spec.name, request.plans, got, ledgers, None, explain=False)
            if not isinstance(refit, Fit):  # fewer pods than already fitted: cannot happen
                raise AssertionError(f"{request.workload.key}: {got} pods stopped fitting")
            counts, fit = got, refit
        self.nodes.assume(placed)
        self._admit(spec, request, counts, fit, placed)
        return "admitted"

    def _place(
        self, spec: QueueSpec, request: _Request, counts: Sequence[int], fit: Fit
    ) -> Placement | Unplaceable:
        """Where the pods to admit go, on nodes of the flavors `fit` chose, or why nowhere.

        A pod's shape is its pod set's, with the node labels of its flavors added to the
        node selector and their tolerations to its own, as the Job integration writes them
        into the pod template on admission."""
        assert self.nodes is not None
        gang, where = self._gang(request, counts, fit)
        if gang is None:
            return Placement({}, 0, {})
        placed = place_gang(self.nodes, gang, spec.placement)
        if isinstance(placed, Unplaceable):
            return Unplaceable(
                f"quota is available but the pods cannot be placed{where}: {placed.reason}",
                placed.never,
                placed.pod_set,
            )
        return placed

    def _gang(
        self, request: _Request, counts: Sequence[int], fit: Fit
    ) -> tuple[GangRequest | None, str]:
        """The gang to place for `request` on the flavors `fit` chose (None: no pods), and
        " on flavor h100" for reasons."""
        return self._gang_of(request.workload, counts, fit.flavors, request.base is None)

    def _gang_of(
        self,
        w: Workload,
        counts: Sequence[int],
        chosen: Sequence[Mapping[str, str]],
        partial: bool,
    ) -> tuple[GangRequest | None, str]:
        """The gang of `w`'s pod sets with `counts` pods on the flavors `chosen` per pod set
        (partial: its minCounts apply)."""
        flavors = self.snapshot.flavors
        sets: list[PodSetRequest] = []
        names: set[str] = set()
        for i, ps in enumerate(w.pod_sets):
            if not counts[i]:
                continue
            selector = dict(ps.node_selector)
            tolerations = list(ps.tolerations)
            for name in sorted(set(chosen[i].values())):
                names.add(name)
                flavor = flavors.get(name)
                if flavor is not None:
                    selector.update(flavor.node_labels)
                    tolerations.extend(flavor.tolerations)
            shape = PodShape(dict(ps.per_pod), selector, ps.affinity, tuple(tolerations))
            low = ps.min_count if partial and ps.min_count is not None else None
            sets.append(
                PodSetRequest(ps.name, counts[i], shape, min(low, counts[i]) if low else None)
            )
        where = f" on flavor {', '.join(sorted(names))}" if names else ""
        return (GangRequest(tuple(sets)) if sets else None), where

    def _admit(
        self,
        spec: QueueSpec,
        request: _Request,
        counts: Sequence[int],
        fit: Fit,
        placed: Placement | None,
    ) -> None:
        w = request.workload
        assignments: list[Assignment] = []
        total: Vector = {}
        for i, ps in enumerate(w.pod_sets):
            # A slice is admitted at its full new size; only the difference is charged.
            full = ps.count if request.base is not None else counts[i]
            flavors = fit.flavors[i]
            assignments.append(
                Assignment(ps.name, full, dict(flavors), self._planned_nodes(request, ps, placed))
            )
            for resource, amount in ps.per_pod.items():
                flavor = flavors.get(resource)
                if flavor is not None and amount:
                    key = flavor_resource(flavor, resource)
                    total[key] = total.get(key, 0) + amount * full
        charge = total
        if request.running is not None:
            charge = dict(total)
            for key, amount in self._running()[request.running.key][1].items():
                charge[key] = charge.get(key, 0) - amount
            # The old slice is now part of this one: it must not be picked as a victim.
            self.taken.add(request.running.key)
            self.replaced.add(request.running.key)
        self.held.charge(spec.name, charge)
        self.planned.charge(spec.name, charge)
        borrowed = self._borrowing(spec.name, total)
        reason = self._admit_reason(spec, request, counts, total, borrowed)
        if placed is not None and placed.total:
            reason += "; " + _placement_words(placed)
        self.admit.append(Admit(w.key, spec.name, tuple(assignments), borrowed is not None, reason))

    @staticmethod
    def _planned_nodes(
        request: _Request, ps: PodSet, placed: Placement | None
    ) -> tuple[tuple[str, int], ...]:
        """The plan of one pod set: for a scale-up slice, the nodes the slice it replaces
        runs on plus those of its extra pods."""
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

    def _borrowing(self, queue: str, usage: Mapping[FlavorResource, int]) -> str | None:
        """Describe the first queue on the path now above its quota, if any."""
        keys = sorted(usage)
        for name in self.tree.paths[queue]:
            used = self.held.used[name]
            quota = self.quotas[name]
            for key in keys:
                if used.get(key, 0) > quota.get(key, 0):
                    flavor, resource = key
                    return (
                        f"borrows idle capacity beyond the quota of queue {name} for {resource} "
                        f"in flavor {flavor} ({format_amount(resource, used.get(key, 0))} in use, "
                        f"quota {format_amount(resource, quota.get(key, 0))})"
                    )
        return None

    def _admit_reason(
        self,
        spec: QueueSpec,
        request: _Request,
        counts: Sequence[int],
        usage: Mapping[FlavorResource, int],
        borrowed: str | None,
    ) -> str:
        w = request.workload
        flavors = sorted({flavor for flavor, _ in usage})
        where = f" on flavor {', '.join(flavors)}" if flavors else ""
        parts = [f"admitted to queue {spec.name}{where}"]
        if request.running is not None:
            grown = sum(counts)
            parts[0] = (
                f"scale-up slice replacing {request.running.key} admitted to queue {spec.name}: "
                f"{grown} more pods charged on the flavors it already runs on"
                if grown
                else f"scale-down slice replacing {request.running.key}: quota freed at once"
            )
        else:
            for i, ps in enumerate(w.pod_sets):
                if counts[i] < ps.count:
                    parts.append(
                        f"partial admission: pod set {ps.name} gets {counts[i]} of {ps.count} "
                        f"pods (minCount {ps.min_count})"
                    )
        if borrowed is not None:
            parts.append(borrowed)
        return "; ".join(parts)

    # -- preemption and reclaim -------------------------------------------------------------

    def _options(
        self, queue: str, request: _Request, counts: Sequence[int]
    ) -> tuple[list[_GroupOptions], dict[FlavorResource, int], set[FlavorResource]]:
        """What every check before a victim search reads, laid out once per search instead of
        once per check and level, in one walk:

        - per pod set and resource group, the flavors it may take, each as the (key, need)
          pairs of the whole group there;
        - the headroom in the planned ledger of every pair they name (for `_covering` too:
          the ledger does not change in between);
        - the pairs the request is short of there, on any flavor it could take. Only these
          are worth freeing, so victims must hold some of them and their queues' floors are
          judged on them alone: a queue's in-quota cpu must not shield the GPUs it borrows.
          Each pair's need sums every pod set that could land there, so a pair two pod sets
          would share is not missed.
        """
        headroom = self.planned.headroom
        out: list[_GroupOptions] = []
        room: dict[FlavorResource, int] = {}
        need: dict[FlavorResource, int] = {}
        for i, plan in enumerate(request.plans):
            pinned = request.base.flavors[i] if request.base is not None else None
            count = counts[i]
            for group in plan.groups:
                flavors: list[list[tuple[FlavorResource, int]]] = []
                choices = (
                    group.options if pinned is None else group.choices(pinned, plan.pod_set.per_pod)
                )
                for _, pairs in choices:
                    needs: list[tuple[FlavorResource, int]] = []
                    for key, amount in pairs:
                        needed = amount * count
                        needs.append((key, needed))
                        if key not in room:
                            room[key] = headroom(queue, key)
                        if count > 0:
                            need[key] = need.get(key, 0) + needed
                    flavors.append(needs)
                out.append(_GroupOptions(count > 0, flavors))
        return out, room, {key for key, amount in need.items() if amount > room[key]}

    def _preempt(
        self, spec: QueueSpec, request: _Request, counts: tuple[int, ...]
    ) -> bool | Unplaceable:
        """Try within-queue preemption, then reclaim; on success record the decision.

        An Unplaceable says the quota could be freed but the pods still not be placed, so
        nothing was decided."""
        if spec.within_queue == "Never" and spec.reclaim == "Never":
            return False
        w = request.workload
        sticky = request.base.flavors if request.base is not None else None
        options, room, contended = self._options(spec.name, request, counts)
        if not contended:
            return False  # nothing is short in the planned ledger: evicting cannot help
        # Valid for the whole call: each search below leaves the ledger as it found it or
        # succeeds and ends the call.
        covered = self._covering(options, room)

        def try_fit() -> Fit | None:
            fit = assign_flavors(
                spec.name, request.plans, counts, (self.planned,), sticky, explain=False
            )
            return fit if isinstance(fit, Fit) else None

        victims: list[Victim] = []
        chosen: list[Candidate] | None = None
        if spec.within_queue != "Never":
            candidates = self._within_queue(spec, w, contended)
            if candidates:

                def fits(_: Sequence[Candidate]) -> bool:
                    return try_fit() is not None

                # It was just seen not to fit the planned ledger at these counts, unless
                # they are the smallest of a partial admission tried against both ledgers.
                short = counts is request.counts or not self.diverged
                chosen = select_victims(candidates, self.planned, fits, enough=covered, short=short)
                if chosen is not None:
                    victims = [
                        Victim(
                            c.workload.key,
                            c.queue,
                            "Preempted",
                            preemption_reason(w, c.workload, c.queue),
                        )
                        for c in chosen
                    ]
        if chosen is None and spec.reclaim != "Never":
            plan = plan_reclaim(
                w,
                spec,
                self.queues,
                self.tree,
                self._reclaim_index(),
                self.taken,
                contended,
                self.planned,
                self.snapshot.now,
                try_fit,
                partial(self._could_stay_under, options),
                covered,
            )
            if plan is not None:
                chosen = list(plan.victims)
                victims = [
                    Victim(c.workload.key, c.queue, "Reclaimed", plan.reasons[c.workload.key])
                    for c in chosen
                ]
        if chosen is None:
            return self._protected_words(spec, w, contended)
        fit = try_fit()
        assert fit is not None, "victim search ended in a state where the preemptor fits"
        if self.nodes is not None:
            # One decision with placement: the quota victims count as gone; if the gang still
            # cannot be placed, lower priorities in its way go too, or no one goes at all.
            outcome = self._preempt_on_nodes(spec, request, counts, fit, None, chosen)
            if isinstance(outcome, Unplaceable):
                for c in chosen:
                    self.planned.charge(c.queue, c.usage)
                names = ", ".join(c.workload.key for c in chosen)
                return Unplaceable(
                    f"evicting {names} would free the quota, but no one is evicted: "
                    + outcome.reason,
                    False,
                    outcome.pod_set,
                )
            kept = self._reprieve_for_quota(chosen, outcome, fit, try_fit)
            if len(kept) < len(chosen) and outcome.hold is not None:
                spared = {c.workload.key for c in chosen} - {c.workload.key for c in kept}
                victims = [v for v in victims if v.workload not in spared]
                outcome = _NodeOutcome(
                    outcome.plan,
                    replace(
                        outcome.hold,
                        victims=tuple(v for v in outcome.hold.victims if v not in spared),
                    ),
                )
            self.taken.update(c.workload.key for c in kept)
            for queue in sorted({c.queue for c in kept}):
                self.order.refresh(queue)
            self._wait_on_nodes(spec, request, fit, outcome, victims)
            return True
        self.planned.charge(spec.name, fit.usage)
        self.taken.update(c.workload.key for c in chosen)
        # Victims' subtrees are less saturated once they leave; the preemptor's own path is
        # re-keyed when its turn ends (`_pass`), right after this.
        mine = self.tree.paths[spec.name]
        for queue in sorted({c.queue for c in chosen}):
            self.order.refresh(queue, mine)
        self.diverged = True
        self.preempt.append(Preempt(w.key, tuple(victims)))
        n = len(victims)
        self.pending.append(
            Pending(
                w.key,
                spec.name,
                f"waiting for {n} preempted workload{'s' if n != 1 else ''} to release quota: "
                + ", ".join(v.workload for v in victims),
            )
        )
        return True

    def _preempt_on_nodes(
        self,
        spec: QueueSpec,
        request: _Request,
        counts: Sequence[int],
        fit: Fit,
        why: Unplaceable | None,
        quota_victims: Sequence[Candidate] = (),
    ) -> _NodeOutcome | Unplaceable:
        """Make room on nodes for a workload that fits quota (quota/preemption/nodes.py).

        `quota_victims` were just chosen to free quota for it (not yet taken): they count as
        leaving, and are never chosen twice. Returns the placement held for it with the
        workloads to evict for nodes (none when leaving ones suffice), or why it still
        cannot be placed (the view and ledgers then as they were). `why` is the failure of a
        placement already tried as things are, None when none was.
        """
        view = self.nodes
        gang, where = self._gang(request, counts, fit)
        assert view is not None
        if gang is None:  # no pods to place: nothing to make room for
            return _NodeOutcome(NodePlan(Placement({}, 0, {}), (), {}), None)
        w = request.workload
        excluded = self.taken | {c.workload.key for c in quota_victims}
        if request.running is not None:
            excluded.add(request.running.key)
        found = node_candidates(
            w, spec, self.queues, self._node_victims(), excluded, self.snapshot.now
        )
        stuck = self._stuck_victims(w)
        leaving = [
            k
            for k in sorted(self.taken | {c.workload.key for c in quota_victims})
            if k in self.pods_of and k not in self.replaced and k not in stuck
        ]
        if why is not None and not found.allowed and not found.protected and not leaving:
            return why
        plan = preempt_on_nodes(
            view,
            found.allowed,
            self.pods_of,
            leaving,
            partial(place_gang, view, gang, spec.placement),
        )
        if isinstance(plan, Unplaceable):
            reason = (
                why.reason
                if why is not None
                else f"quota is available but the pods cannot be placed{where}: {plan.reason}"
            )
            if found.allowed:
                reason = (
                    f"quota is available but the pods cannot be placed{where} even if every "
                    "lower-priority workload on its flavor's nodes that its queue may preempt "
                    f"were evicted: {plan.reason}"
                )
            if found.protected:
                reason += "; " + protected_words(found.protected, self.snapshot.now)
            return Unplaceable(self._lapse_words(w, stuck) + reason, False, plan.pod_set)
        return _NodeOutcome(plan, self._hold_for(request, fit, plan, quota_victims))

    def _reprieve_for_quota(
        self,
        chosen: Sequence[Candidate],
        outcome: _NodeOutcome,
        fit: Fit,
        try_fit: Callable[[], Fit | None],
    ) -> list[Candidate]:
        """The quota victims still needed once the victims chosen for nodes are counted:
        those free quota too, so a quota victim that is not in the gang's way on nodes is
        spared, most important first, whenever the quota still fits without it (on the
        flavors the gang was placed on). Returns them in victim order; the planned ledger
        ends with the spared ones charged back."""
        planned = self.planned
        node_victims = outcome.plan.victims
        if not node_victims:
            return list(chosen)
        for c in node_victims:
            planned.charge(c.queue, c.usage, -1)
        used = {node for pairs in outcome.plan.placement.nodes.values() for node, _ in pairs}
        view = self.nodes
        assert view is not None
        kept: list[Candidate] = []
        for c in reversed(chosen):
            keys = self.pods_of.get(c.workload.key, ())
            if any(key not in view.pods or view.pods[key].node in used for key in keys):
                kept.append(c)  # its pods are in the gang's way (removed from the view)
                continue
            planned.charge(c.queue, c.usage)
            again = try_fit()
            if again is None or again.flavors != fit.flavors:
                planned.charge(c.queue, c.usage, -1)
                kept.append(c)
        for c in node_victims:
            planned.charge(c.queue, c.usage)
        kept.reverse()
        return kept

    def _hold_for(
        self, request: _Request, fit: Fit, plan: NodePlan, quota_victims: Sequence[Candidate]
    ) -> Hold:
        """The room to hold for the preemptor: where `plan` placed it. A hold that has not
        lapsed keeps its start while no one new is evicted for it, so a plan that keeps
        breaking cannot hold room for ever."""
        w = request.workload
        assignments = _assignments(w, plan.placement, fit.flavors)
        new = {c.workload.key for c in (*quota_victims, *plan.victims)}
        old = self.snapshot.active_hold(w)
        victims = set(new)
        if old is not None:
            victims.update(v for v in old.victims if v in self.taken)
        since = old.since if old is not None and not new else self.snapshot.now
        return Hold(assignments, since, tuple(sorted(victims)))

    def _release_hold(self, w: Workload) -> None:
        """The preemptor's own turn: the room held for it is its own to place into again."""
        if w.hold is None or self.nodes is None:
            return
        keys = self.pods_of.pop(held_by(w.key), ())
        self.released[w.key] = [self.nodes.remove_pod(k) for k in keys if k in self.nodes.pods]

    def _keep_hold(self, key: str) -> None:
        """A preemptor set aside for the second pass keeps its room held until then."""
        pods = self.released.pop(key, None)
        if not pods or self.nodes is None:
            return
        for pod in pods:
            self.nodes.add_pod(pod)
        self.pods_of[held_by(key)] = [pod.key for pod in pods]

    def _stuck_victims(self, w: Workload) -> frozenset[str]:
        """Victims of `w`'s lapsed hold that still have pods on nodes: they would not go in
        time, so a new plan must not count on their room."""
        if w.hold is None or self.snapshot.active_hold(w) is not None:
            return frozenset()
        return frozenset(v for v in w.hold.victims if v in self.pods_of)

    def _lapse_words(self, w: Workload, stuck: frozenset[str]) -> str:
        """ "the room held since 14:05:00 UTC lapsed after 300s (ns/a did not leave); " """
        hold = w.hold
        if hold is None or self.snapshot.active_hold(w) is not None:
            return ""
        when = datetime.fromtimestamp(hold.since, UTC).strftime("%H:%M:%S UTC")
        late = f" ({', '.join(sorted(stuck))} did not leave)" if stuck else ""
        return (
            f"the room held since {when} lapsed after {self.snapshot.hold_timeout_s:.0f}s{late}; "
        )

    def _wait_on_nodes(
        self,
        spec: QueueSpec,
        request: _Request,
        fit: Fit,
        outcome: _NodeOutcome,
        quota_victims: Sequence[Victim] = (),
    ) -> None:
        """Record a preemptor that waits with its room held: quota in `planned`, room in the
        view, victims for nodes (after those chosen for quota) evicted."""
        w = request.workload
        plan = outcome.plan
        self.planned.charge(spec.name, fit.usage)  # its quota is held with its room
        self.diverged = True
        for c in plan.victims:
            self.planned.charge(c.queue, c.usage, -1)
        self.taken.update(c.workload.key for c in plan.victims)
        for queue in sorted({c.queue for c in plan.victims}):
            self.order.refresh(queue)
        victims = (
            *quota_victims,
            *(
                Victim(
                    c.workload.key,
                    c.queue,
                    "Preempted" if c.queue == spec.name else "Reclaimed",
                    node_victim_reason(w, c, plan.freed[c.workload.key], spec.name),
                )
                for c in plan.victims
            ),
        )
        lapsed = self._lapse_words(w, self._stuck_victims(w))
        if victims:
            self.preempt.append(Preempt(w.key, victims))
            n = len(victims)
            freed = sorted({node for nodes in plan.freed.values() for node in nodes})
            what = (
                " and ".join(
                    part
                    for part in (
                        "release quota" if quota_victims else "",
                        f"leave nodes {', '.join(freed)}" if freed else "",
                    )
                    if part
                )
                or "leave"
            )
            reason = (
                f"waiting for {n} preempted workload{'s' if n != 1 else ''} to {what}: "
                f"{', '.join(v.workload for v in victims)}; its room is held: "
                + _placement_words(plan.placement)
            )
        else:
            reason = (
                "waiting for preempted workloads to leave nodes; its room is held: "
                + _placement_words(plan.placement)
            )
        self.pending.append(Pending(w.key, spec.name, lapsed + reason, outcome.hold))

    def _protected_words(
        self, spec: QueueSpec, w: Workload, contended: set[FlavorResource]
    ) -> Unplaceable | bool:
        """When no victims could be found, whether some were spared only by their
        minRuntime: the words say until when (False when none were)."""
        young = self._young_victims()
        if not young:
            return False
        found = node_candidates(w, spec, self.queues, young, self.taken, self.snapshot.now)
        protected = [p for p in found.protected if contended & set(p.candidate.usage)]
        if not protected:
            return False
        return Unplaceable(protected_words(protected, self.snapshot.now), False, None)

    def _consolidate(
        self, spec: QueueSpec, request: _Request, counts: Sequence[int], fit: Fit
    ) -> bool:
        """Move workloads of queues that allow it so that the gang fits (see
        quota/preemption/consolidation.py); True when it now waits for them to move."""
        view = self.nodes
        gang, _ = self._gang(request, counts, fit)
        if view is None or gang is None:
            return False
        w = request.workload
        movable = self._movable(w, request)
        if not movable:
            return False
        stuck = self._stuck_victims(w)
        leaving = [
            k
            for k in sorted(self.taken)
            if k in self.pods_of and k not in self.replaced and k not in stuck
        ]
        plan = consolidate(
            view,
            movable,
            self.pods_of,
            leaving,
            partial(place_gang, view, gang, spec.placement),
            self._place_moved,
        )
        if plan is None:
            return False
        now = self.snapshot.now
        moved = [m.candidate.workload.key for m in plan.moves]
        # The moved keep their quota (they are admitted again at once, where room is held
        # for them); they are never chosen again in this cycle.
        self.taken.update(moved)
        self.planned.charge(spec.name, fit.usage)
        self.diverged = True
        victims = tuple(
            Victim(
                m.candidate.workload.key,
                m.candidate.queue,
                "Moved",
                move_reason(w.key, w.priority, m.leaves),
                Hold(_assignments(m.candidate.workload, m.placement), now),
            )
            for m in plan.moves
        )
        if victims:
            self.preempt.append(Preempt(w.key, victims))
        freed = sorted({node for m in plan.moves for node in m.leaves})
        n = len(victims)
        hold = Hold(_assignments(w, plan.placement, fit.flavors), now, tuple(sorted(moved)))
        reason = (
            f"waiting for {n} workload{'s' if n != 1 else ''} to move off nodes "
            f"{', '.join(freed)} (free room was scattered): {', '.join(moved)}; its room is "
            "held: " + _placement_words(plan.placement)
            if victims
            else "waiting for preempted workloads to leave nodes; its room is held: "
            + _placement_words(plan.placement)
        )
        self.pending.append(Pending(w.key, spec.name, self._lapse_words(w, stuck) + reason, hold))
        return True

    def _movable(self, w: Workload, request: _Request) -> list[Candidate]:
        """Running workloads `w` may move (victim order): their queue opts in, their priority
        is not above `w`'s (and under the queue's bound), and minRuntime no longer protects
        them."""
        out: list[Candidate] = []
        now = self.snapshot.now
        own = request.running.key if request.running is not None else None
        for c in self._node_victims():
            v = c.workload
            if v.priority > w.priority:
                break  # victim order is by priority
            queue = self.queues.get(c.queue)
            if queue is None or not queue.movable or v.key in self.taken or v.key == own:
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
        assert self.nodes is not None
        w = c.workload
        by_name = {a.pod_set: a for a in w.admission or ()}
        counts = [by_name[ps.name].count if ps.name in by_name else 0 for ps in w.pod_sets]
        chosen = [dict(by_name[ps.name].flavors) if ps.name in by_name else {} for ps in w.pod_sets]
        gang, _ = self._gang_of(w, counts, chosen, False)
        if gang is None:
            return Placement({}, 0, {})
        queue = self.queues.get(c.queue)
        return place_gang(self.nodes, gang, queue.placement if queue else "BinPack")

    def _within_queue(
        self, spec: QueueSpec, w: Workload, contended: set[FlavorResource]
    ) -> list[Candidate]:
        """The workloads of `w`'s own queue it may preempt, in victim order."""
        if len(contended) == 1 and spec.within_queue != "Never":
            # Short of one pair: only the queue's workloads holding it can help. They are
            # listed once per queue and pair, in victim order, for every search to bisect.
            pair = next(iter(contended))
            found = self.pair_holders.get((spec.name, pair))
            if found is None:
                found = self.pair_holders[spec.name, pair] = pair_holders(
                    self.admitted_by_queue.get(spec.name, ()), pair, spec.name
                )
            return within_queue_holders(
                w,
                spec.within_queue,
                found[0],
                found[1],
                self.taken,
                self.snapshot.now,
                spec.min_runtime_preempt_s,
            )
        return within_queue_candidates(
            w,
            spec.within_queue,
            spec.name,
            self.admitted_by_queue.get(spec.name, ()),
            self.taken,
            contended,
            self.snapshot.now,
            spec.min_runtime_preempt_s,
        )

    def _all_victims(self) -> list[Candidate]:
        """Every admitted workload as a candidate, in victim order, sorted once per cycle
        (taken ones are filtered when used)."""
        if self.all_victims is None:
            self.all_victims = sorted(
                (c for name in self.admitted_by_queue for c in self._victim_list(name)),
                key=victim_order,
            )
        return self.all_victims

    def _young_victims(self) -> list[Candidate]:
        """Admitted workloads some minRuntime still protects (in their own queue or from
        reclaim), in victim order: the only ones a failed search may have spared for it.

        A failed search asks after them; walking every admitted workload instead made each
        failure cost as much as the cluster is large."""
        if self.young_victims is None:
            now = self.snapshot.now
            young: list[Candidate] = []
            for name in self.admitted_by_queue:
                queue = self.queues[name]
                preempt, reclaim = queue.min_runtime_preempt_s, queue.min_runtime_reclaim_s
                if not preempt and not reclaim:
                    continue
                for c in self._victim_list(name):
                    start = started_at(c.workload)
                    if (preempt and now < start + preempt) or (reclaim and now < start + reclaim):
                        young.append(c)
            young.sort(key=victim_order)
            self.young_victims = young
        return self.young_victims

    def _node_victims(self) -> list[Candidate]:
        """Admitted workloads with pods on nodes, in victim order."""
        if self.node_victims is None:
            pods_of = self.pods_of
            self.node_victims = [c for c in self._all_victims() if c.workload.key in pods_of]
        return self.node_victims

    def _victim_list(self, queue: str) -> list[Candidate]:
        """The admitted workloads of a leaf as candidates in victim order, sorted once per
        cycle and shared by preemption and reclaim (taken ones are filtered when used)."""
        found = self.victim_lists.get(queue)
        if found is None:
            found, keys = in_victim_order(self.admitted_by_queue.get(queue, ()), queue)
            self.victim_lists[queue] = found
            self.victim_keys[queue] = keys
        return found

    def _victim_keys(self, queue: str) -> list[VictimKey]:
        """`victim_order` of each of `_victim_list(queue)`, for the reclaim search's merge."""
        keys = self.victim_keys.get(queue)
        if keys is None:
            self._victim_list(queue)
            keys = self.victim_keys[queue]
        return keys

    def _reclaim_index(self) -> ReclaimIndex:
        """Every admitted workload as a reclaim candidate, per leaf in victim order."""
        if self.reclaim_index is None:
            self.reclaim_index = ReclaimIndex(
                self.admitted_by_queue,
                self._victim_list,
                self._victim_keys,
                self.planned,
                self.tree,
                self.fair.shares,
                self.quotas,
            )
        return self.reclaim_index

    def _covering(
        self, options: Sequence[_GroupOptions], room: Mapping[FlavorResource, int]
    ) -> Callable[[Mapping[FlavorResource, int]], bool]:
        """`covered(freed)`: whether room free now (`room`, from `_options`) plus `freed` could
        hold the request on some flavor choice (each pod set judged alone: a necessary
        condition).

        Victim searches ask this after every candidate they count, while the planned ledger
        stays as it is (or is restored), so the room free now is looked up once, on the first
        question: most searches end before asking any (in the bench's contended cycle, 1,074
        of 2,929).
        """
        # Per pod set and resource group, per flavor option: (key, need, room free now).
        options_per_group: list[list[list[tuple[FlavorResource, int, int]]]] = []

        def covered(freed: Mapping[FlavorResource, int]) -> bool:
            if not options_per_group:
                options_per_group.extend(
                    [[(key, need, room[key]) for key, need in needs] for needs in g.flavors]
                    for g in options
                )
            get = freed.get
            for flavors in options_per_group:
                for needs in flavors:
                    for key, need, free in needs:
                        if need > free + get(key, 0):
                            break
                    else:
                        break  # this flavor could hold it
                else:
                    return False
            return True

        return covered

    def _could_stay_under(
        self,
        options: Sequence[_GroupOptions],
        queue: str,
        ceiling: Mapping[FlavorResource, int],
        limits: Mapping[FlavorResource, int] | None,
    ) -> bool:
        """Whether some flavor per group keeps `queue`'s planned usage plus the request within
        `ceiling` (a missing key: 0) and `limits` (a missing key: no limit); `queue` is the
        request's leaf or an ancestor, pod sets are judged one by one.

        A necessary condition for reclaim, checked before looking at any victim.
        """
        get = self.planned.used[queue].get
        for group in options:
            for needs in group.flavors:
                for key, need in needs:
                    bound = ceiling.get(key, 0)
                    if limits:
                        cap = limits.get(key)
                        if cap is not None and cap < bound:
                            bound = cap
                    if get(key, 0) + need > bound:
                        break
                else:
                    break  # this flavor stays within bounds
            else:
                return False
        return True

    # -- reasons ----------------------------------------------------------------------------

    def _no_node_carries(self, flavor: str) -> str | None:
        """ "no Ready node carries flavor h100's labels (...)" when the cluster has nodes but
        none of that flavor: its capacity is zero for a reason more quota cannot fix."""
        nodes = self.snapshot.nodes
        if not nodes:
            return None
        known = self.homeless.get(flavor)
        if known is None:
            spec = self.snapshot.flavors.get(flavor)
            labels = spec.node_labels if spec is not None else {}
            carried = any(
                n.ready
                and not n.unschedulable
                and all(n.labels.get(k) == v for k, v in labels.items())
                for n in nodes
            )
            known = (
                ""
                if carried
                else (f"no Ready node carries flavor {flavor}'s labels{_flavor_labels(spec)}")
            )
            self.homeless[flavor] = known
        return known or None

    def _failure_reason(
        self, spec: QueueSpec, w: Workload, failure: FitFailure, partial: bool
    ) -> str:
        shares = self.fair.shares.get(spec.name, {})
        parts: list[str] = []
        for short in failure.shortfalls:
            key = (short.flavor, short.resource)
            # The tighter of the two ledgers (the held one when they are equal).
            held = self.held.binding(spec.name, key)
            planned = self.planned.binding(spec.name, key)
            available, binder, bound = planned if planned[0] < held[0] else held
            r = short.resource
            requested = format_amount(r, short.requested)
            if binder is not None:
                parts.append(
                    f"exceeds limit of queue {binder} for {r} in flavor {short.flavor}: "
                    f"requested {requested}, limit {format_amount(r, bound)}, "
                    f"in use {format_amount(r, bound - available)}"
                )
            else:
                parts.append(
                    f"insufficient quota for {r} in flavor {short.flavor}: requested "
                    f"{requested}, available {format_amount(r, max(0, available))}, "
                    f"fair share {format_amount(r, shares.get(key, 0))}"
                )
            homeless = self._no_node_carries(short.flavor)
            if homeless is not None:
                parts[-1] = f"{homeless}; {parts[-1]}"
        text = "; ".join(parts)
        if len(w.pod_sets) > 1:
            text = f"pod set {failure.pod_set}: {text}"
        if failure.skipped:
            text += "; " + "; ".join(failure.skipped)
        if partial:
            text += "; not even minCount pods fit"
        if spec.within_queue != "Never" or spec.reclaim != "Never":
            text += "; no preemption or reclaim allowed by the queue's policies would make room"
        return text


def _flavor_labels(flavor: Flavor | None) -> str:
    if flavor is None or not flavor.node_labels:
        return ""
    return " (" + ", ".join(f"{k}={v}" for k, v in sorted(flavor.node_labels.items())) + ")"


def _assignments(
    w: Workload, placed: Placement, flavors: Sequence[Mapping[str, str]] | None = None
) -> tuple[Assignment, ...]:
    """`placed` as plans per pod set (for a hold), with the flavors chosen per pod set
    (the admitted ones when `flavors` is None)."""
    admitted = {a.pod_set: a.flavors for a in w.admission or ()}
    return tuple(
        Assignment(
            ps.name,
            placed.count(ps.name),
            flavors[i] if flavors is not None else admitted.get(ps.name, {}),
            placed.nodes[ps.name],
        )
        for i, ps in enumerate(w.pod_sets)
        if placed.nodes.get(ps.name)
    )


def _placement_words(placed: Placement) -> str:
    """ "pods planned on h100-1 (x4), h100-2 (x4)", shortened past a few nodes."""
    per_node: dict[str, int] = {}
    for pairs in placed.nodes.values():
        for node, n in pairs:
            per_node[node] = per_node.get(node, 0) + n
    shown = [f"{node} (x{n})" if n > 1 else node for node, n in list(per_node.items())[:4]]
    more = len(per_node) - len(shown)
    tail = f" and {more} more node{'s' if more > 1 else ''}" if more > 0 else ""
    return (
        f"{placed.total} pod{'s' if placed.total != 1 else ''} planned on {', '.join(shown)}{tail}"
    )
