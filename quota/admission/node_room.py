"""Room on nodes for a preemptor, from its first eviction to its admission or lapse.

A workload that fits quota but not nodes may evict lower-priority workloads in its way
(KEP-5710; the search itself is quota/preemption/nodes.py). It then waits with its room
held: its placement is written as a `Hold` (placeholder pods every other workload and the
scheduler loop count as taken) and its quota charged in the planned ledger. A workload moved
by consolidation (moves.py) holds its new room the same way. In each later cycle the hold's
quota is charged in the planned ledger from the start (state.py) and the holder goes first
in its queue (cycle.py); at its own turn the room and quota are released to it
(`release_hold`) and it is placed again, into its room or wherever there is room by then.
Every ending of the turn that neither admits it nor holds new room for it (set aside for
the borrowing pass, pending, refused) gives them back (`restore_hold`, called in one place:
decide.py's `consider`). A hold lapses after the snapshot's hold timeout if
its victims would not leave: a new plan then does not count on their room (`stuck`), and the
reason says so (`lapse_words`). A hold keeps its start while no one new is evicted for it,
so a plan that keeps breaking cannot hold room for ever.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial

from quota.admission.candidates import VictimLists, shielded_words
from quota.admission.reasons import waits_before_evicting
from quota.admission.requests import Request, request_gang
from quota.admission.state import CycleState
from quota.model.decisions import Pending, Preempt, Victim
from quota.model.flavorassign import Fit
from quota.model.nodes import BoundPod
from quota.model.nodewords import pods_on_nodes
from quota.model.resources import FlavorResource
from quota.model.snapshot import Assignment, Hold, QueueSpec, Workload
from quota.placement.gang import GangRequest, Placement, Unplaceable, place_gang
from quota.placement.profiles import Strategy
from quota.placement.reservations import held_by, leaving_of, pod_keys
from quota.placement.topology import freeable_words
from quota.preemption.domains import Scope, Search, domain_scope
from quota.preemption.nodes import (
    NodeCandidates,
    NodePlan,
    Place,
    forbidden_words,
    node_candidates,
    node_victim_reason,
    preempt_on_nodes,
    protected_words,
)
from quota.preemption.partial import is_whole, lost_pods, on_nodes, pod_set_of, pods_usage
from quota.preemption.victims import Candidate, victim_order


@dataclass(frozen=True, slots=True)
class HeldRoom:
    """A preemptor's room found on nodes: the plan, and the hold to keep it."""

    plan: NodePlan
    hold: Hold | None  # None: no pods to place
    domain: str = ""  # "rack b0-r1 of Topology fabric" when the gang keeps to one

    def sparing(self, spared: set[str]) -> HeldRoom:
        """The same room, no longer waiting for the `spared` workloads."""
        if self.hold is None:
            return self
        victims = tuple(v for v in self.hold.victims if v not in spared)
        return replace(self, hold=replace(self.hold, victims=victims))


@dataclass(frozen=True, slots=True)
class Released:
    """What a holder's turn took back from the view and the planned ledger: its
    placeholder pods and the quota of its hold."""

    workload: Workload
    pods: tuple[BoundPod, ...]
    usage: Mapping[FlavorResource, int]


class NodeRoom:
    """Node preemption, holds and lapses for the preemptors of one cycle."""

    def __init__(self, state: CycleState, lists: VictimLists) -> None:
        self.state = state
        self.lists = lists

    # -- a held room across cycles ----------------------------------------------------------

    def release_hold(self, w: Workload) -> Released | None:
        """The holder's own turn: the room and quota held for it are its own to take again
        (None: it holds nothing, or its hold lapsed)."""
        state = self.state
        usage = state.reserved.pop(w.key, None)
        if usage is None:
            return None
        state.planned.release(w.queue, usage)
        nodes = state.nodes
        assert nodes is not None  # a hold is room on nodes
        keys = state.pods_of.pop(held_by(w.key), ())
        return Released(w, tuple(nodes.remove_pod(k) for k in keys if k in nodes.pods), usage)

    def restore_hold(self, released: Released) -> None:
        """A turn that ended without admitting the holder or a new plan for it (set aside
        for the second pass, pending, refused): it keeps its room and quota held, so no
        later workload of the cycle is admitted on them."""
        state = self.state
        nodes = state.nodes
        assert nodes is not None
        w = released.workload
        for pod in released.pods:
            nodes.add_pod(pod)
        state.pods_of[held_by(w.key)] = [pod.key for pod in released.pods]
        state.planned.charge(w.queue, released.usage)
        state.reserved[w.key] = released.usage

    def stuck(self, w: Workload) -> frozenset[str]:
        """Victims of `w`'s lapsed hold that still have pods on nodes: they would not go in
        time, so a new plan must not count on their room."""
        state = self.state
        snapshot = state.snapshot
        if w.hold is None or snapshot.active_hold(w) is not None:
            return frozenset()
        return frozenset(
            v
            for v in w.hold.victims
            if leaving_of(v) in state.pods_of or (v in state.taken and v in state.pods_of)
        )

    def lapse_words(self, w: Workload, stuck: frozenset[str]) -> str:
        """ "the room held since 14:05:00 UTC lapsed after 300s (ns/a did not leave); " """
        snapshot = self.state.snapshot
        hold = w.hold
        if hold is None or snapshot.active_hold(w) is not None:
            return ""
        when = datetime.fromtimestamp(hold.since, UTC).strftime("%H:%M:%S UTC")
        late = f" ({', '.join(sorted(stuck))} did not leave)" if stuck else ""
        return f"the room held since {when} lapsed after {snapshot.hold_timeout_s:.0f}s{late}; "

    def leaving(self, extra: set[str], stuck: frozenset[str]) -> list[str]:
        """Workloads already leaving (taken, or `extra` about to be) whose pods still count
        as room for a preemptor: not a slice taken over by a scale-up, not stuck; and the
        pods single-pod preemption took (`leaving_of`), those of stuck victims aside."""
        state = self.state
        shed = state.shed - {leaving_of(k) for k in stuck}
        return [
            k
            for k in sorted((state.taken | extra) - state.shrunk)
            if k in state.pods_of and k not in state.replaced and k not in stuck
        ] + sorted(shed)

    def settle_single(self, c: Candidate, plan: NodePlan) -> tuple[Candidate, tuple[str, ...]]:
        """A Single quota victim once the gang is placed: it loses, per pod set, as many pods
        as the quota needs or as stand in the gang's way, whichever is more; the pods in the
        way first, then (the quota needing more) its other unprotected pods, last key first.
        Returns it (whole when that is every pod) with the keys of the pods it loses; the
        planned ledger gives back the quota of pods taken past the quota's count."""
        state = self.state
        view = state.nodes
        assert view is not None and c.pods is not None
        w = c.workload
        in_way = plan.lost.get(w.key, ())
        need = dict(c.pods)
        lost: list[BoundPod] = list(in_way)
        counts = dict(lost_pods(w, in_way))
        spare = [
            view.pods[k]
            for k in reversed(on_nodes(w, state.pods_of.get(w.key, ()), view.pods))
            if k in view.pods
        ]
        for pod in spare:
            pod_set = pod_set_of(w, pod) or ""
            if counts.get(pod_set, 0) < need.get(pod_set, 0):
                counts[pod_set] = counts.get(pod_set, 0) + 1
                lost.append(pod)
        taken = tuple((ps.name, counts[ps.name]) for ps in w.pod_sets if counts.get(ps.name))
        more = tuple((name, n - need.get(name, 0)) for name, n in taken if n > need.get(name, 0))
        if more:
            state.planned.release(c.queue, pods_usage(w, more))
        if is_whole(w, taken):
            return Candidate(w, c.queue, c.usage), ()
        return Candidate(w, c.queue, pods_usage(w, taken), taken), tuple(p.key for p in lost)

    # -- making room ------------------------------------------------------------------------

    def placer(self, w: Workload, gang: GangRequest, strategy: Strategy) -> Place:
        """How to place `w`'s gang: for a preemptor holding room in a domain, inside that
        domain first (its victims were evicted there), then wherever there is room."""
        view = self.state.nodes
        assert view is not None
        anywhere = partial(place_gang, view, gang, strategy)
        if w.hold is None:  # every workload but a waiting preemptor: kept cheap
            return anywhere
        scope = domain_scope(gang)
        if scope is None:
            return anywhere
        path = scope.domain_of(view, (node for a in w.hold.assignments for node, _ in a.nodes))
        if not path:
            return anywhere
        held = scope.pinned(path)

        def place() -> Placement | Unplaceable:
            placed = place_gang(view, held, strategy)
            return placed if isinstance(placed, Placement) else anywhere()

        return place

    def make_room(
        self,
        spec: QueueSpec,
        request: Request,
        counts: Sequence[int],
        fit: Fit,
        why: Unplaceable | None,
        quota_victims: Sequence[Candidate] = (),
    ) -> HeldRoom | Unplaceable:
        """Make room on nodes for a workload that fits quota (quota/preemption/nodes.py).

        `quota_victims` were just chosen to free quota for it (not yet taken): they count as
        leaving, and are never chosen twice. Returns the placement held for it with the
        workloads to evict for nodes (none when leaving ones suffice), or why it still
        cannot be placed (the view and ledgers then as they were). `why` is the failure of a
        placement already tried as things are, None when none was.
        """
        state = self.state
        view = state.nodes
        gang, where = request_gang(state, request, counts, fit.flavors)
        assert view is not None
        if gang is None:  # no pods to place: nothing to make room for
            return HeldRoom(NodePlan(Placement({}, 0, {}), (), {}), None)
        w = request.workload
        chosen = {c.workload.key for c in quota_victims}
        excluded = state.taken | chosen
        if request.running is not None:
            excluded.add(request.running.key)
        now = state.snapshot.now
        found = node_candidates(w, spec, state.queues, self.lists.on_nodes(), excluded, now)
        waits = waits_before_evicting(spec, w, now) if found.allowed else ""
        if waits:
            found = replace(found, allowed=())  # those already leaving may still do
            waits = "; " + waits
        stuck = self.stuck(w)
        leaving = self.leaving(chosen, stuck)
        scope = domain_scope(gang)
        if spec.within_queue == "Never" and spec.reclaim == "Never":
            # A queue that may evict no one is told one reason for a shape, whatever the
            # priority (decide.py's memo): not how many domains others' eviction would free.
            found = replace(found, forbidden=())
        spared = found.protected or (scope is not None and found.forbidden)
        if why is not None and not found.allowed and not spared and not leaving:
            shielded = self.lists.shielded_on_nodes(w, spec, excluded)
            if shielded:
                waits += "; " + shielded_words(shielded)
            return replace(why, reason=why.reason + waits) if waits else why
        place = self.placer(w, gang, spec.placement)
        found, pods_of = self._offered(found, [c for c in quota_victims if c.pods is not None])
        # The pods of Single quota victims, for what of them ends in the gang's way.
        offered = {
            c.workload.key: {
                k: view.pods[k] for k in pods_of.get(c.workload.key, ()) if k in view.pods
            }
            for c in quota_victims
            if c.pods is not None
        }
        freeable = ""
        if scope is None:
            plan = preempt_on_nodes(view, found.allowed, pods_of, leaving, place)
        else:
            plan, freeable = self._in_domains(scope, found, leaving, place, spec.placement, pods_of)
        if isinstance(plan, Unplaceable):
            reason = (
                why.reason
                if why is not None
                else f"quota is available but the pods cannot be placed{where}: {plan.reason}"
            )
            if found.allowed and not freeable:
                reason = (
                    f"quota is available but the pods cannot be placed{where} even if every "
                    "lower-priority workload on its flavor's nodes that its queue may preempt "
                    f"were evicted: {plan.reason}"
                )
            if freeable:
                reason += "; " + freeable
                if found.forbidden:
                    reason += "; " + forbidden_words(found.forbidden, spec)
            if found.protected:
                reason += "; " + protected_words(found.protected, now)
            shielded = self.lists.shielded_on_nodes(w, spec, excluded)
            if shielded:
                reason += "; " + shielded_words(shielded)
            reason += waits
            return Unplaceable(reason, False, plan.pod_set)
        domain = scope.words(view, plan.placement) if scope is not None else ""
        plan = _single_pods(plan)
        if offered:
            lost = {
                key: tuple(pod for k, pod in pods.items() if k not in view.pods)
                for key, pods in offered.items()
            }
            plan = replace(plan, lost={**plan.lost, **lost})
        return HeldRoom(plan, self._hold_for(request, fit, plan, quota_victims), domain)

    def in_the_way(
        self,
        spec: QueueSpec,
        request: Request,
        counts: Sequence[int],
        flavors: Sequence[Mapping[str, str]],
        pool: Sequence[Candidate],
    ) -> frozenset[str]:
        """The workloads of `pool` (victim order) whose eviction would let the gang be
        placed: the fewest and least important, by KEP-5710's search, as an estimate (the
        view is left as it was). Empty when even evicting all of them would not do, and for
        a gang bound to a topology domain (whose search is per domain)."""
        state = self.state
        view = state.nodes
        assert view is not None
        gang, _ = request_gang(state, request, counts, flavors)
        if gang is None or not pool or domain_scope(gang) is not None:
            return frozenset()
        w = request.workload
        found, pods_of = self._offered(NodeCandidates(tuple(pool), ()))
        leaving = self.leaving(set(), self.stuck(w))
        place = self.placer(w, gang, spec.placement)
        plan = preempt_on_nodes(view, found.allowed, pods_of, leaving, place, keep=False)
        if isinstance(plan, Unplaceable):
            return frozenset()
        return frozenset(c.workload.key for c in plan.victims)

    def _offered(
        self, found: NodeCandidates, partial: Sequence[Candidate] = ()
    ) -> tuple[NodeCandidates, Mapping[str, Sequence[str]]]:
        """The candidates, and the pods each offers the node search (and each of the
        `partial` quota victims, leaving with single pods): every pod of it, but only the
        unprotected ones of a disruptionMode Single workload (one with none is no
        candidate)."""
        state = self.state
        view = state.nodes
        assert view is not None
        offered = {
            c.workload.key: on_nodes(c.workload, state.pods_of.get(c.workload.key, ()), view.pods)
            for c in (*found.allowed, *partial)
            if c.workload.disruption_single
        }
        if not offered:
            return found, state.pods_of
        allowed = tuple(c for c in found.allowed if offered.get(c.workload.key, True))
        return replace(found, allowed=allowed), ChainMap(offered, state.pods_of)

    def _in_domains(
        self,
        scope: Scope,
        found: NodeCandidates,
        leaving: Sequence[str],
        place: Place,
        strategy: Strategy,
        pods_of: Mapping[str, Sequence[str]],
    ) -> tuple[NodePlan | Unplaceable, str]:
        """Room for a gang that keeps to domains (quota/preemption/domains.py): the
        leaving alone, then victims in the one domain that costs least, then (a preferred
        request past its widest level) anywhere. On failure, the failure as things are and,
        when lower-priority workloads that minRuntime or its queue's policies spare stand
        in the way, how many domains would hold the gang were they evicted ("" when none
        would or no one is spared)."""
        state = self.state
        view = state.nodes
        assert view is not None
        alone = preempt_on_nodes(view, (), pods_of, leaving, place)
        if isinstance(alone, NodePlan):
            return alone, ""
        search = Search(
            view,
            scope,
            pods_of,
            leaving,
            lambda path: partial(place_gang, view, scope.pinned(path), strategy),
            strategy,
        )
        if found.allowed:
            plan = search.run(found.allowed)
            if plan is not None:
                return plan, ""
        anywhere = preempt_on_nodes(
            view,
            found.allowed,
            pods_of,
            leaving,
            partial(place_gang, view, scope.gang, strategy),
        )
        if isinstance(anywhere, NodePlan) or not (found.protected or found.forbidden):
            return anywhere, ""
        spared = (*(p.candidate for p in found.protected), *found.forbidden)
        every = sorted((*found.allowed, *spared), key=victim_order)
        count, depth = search.freeable(every)
        return alone, freeable_words(scope.lead, depth, count) if count else ""

    def _hold_for(
        self, request: Request, fit: Fit, plan: NodePlan, quota_victims: Sequence[Candidate]
    ) -> Hold:
        """The room to hold for the preemptor: where `plan` placed it. A hold that has not
        lapsed keeps its start while no one new is evicted for it."""
        snapshot = self.state.snapshot
        w = request.workload
        assignments = held_assignments(w, plan.placement, fit.flavors)
        new = {c.workload.key for c in (*quota_victims, *plan.victims)}
        old = snapshot.active_hold(w)
        victims = set(new)
        if old is not None:
            victims.update(v for v in old.victims if v in self.state.taken)
        since = old.since if old is not None and not new else snapshot.now
        return Hold(assignments, since, tuple(sorted(victims)))

    def wait(
        self,
        spec: QueueSpec,
        request: Request,
        fit: Fit,
        room: HeldRoom,
        quota_victims: Sequence[Victim] = (),
    ) -> None:
        """Record a preemptor that waits with its room held: quota in `planned`, room in the
        view, victims for nodes (after those chosen for quota) evicted."""
        state = self.state
        w = request.workload
        plan = room.plan
        state.planned.charge(spec.name, fit.usage)  # its quota is held with its room
        state.diverged = True
        for c in plan.victims:
            state.planned.release(c.queue, c.usage)
            if c.pods is not None:
                state.shed_pods(c.workload.key, [p.key for p in plan.lost[c.workload.key]])
        state.taken.update(c.workload.key for c in plan.victims)
        for queue in sorted({c.queue for c in plan.victims}):
            state.order.refresh(queue)
        victims = (
            *quota_victims,
            *(
                Victim(
                    c.workload.key,
                    c.queue,
                    "Preempted" if c.queue == spec.name else "Reclaimed",
                    node_victim_reason(w, c, plan.freed[c.workload.key], spec.name, room.domain),
                    pods=c.pods,
                    pod_names=pod_keys(p.key for p in plan.lost[c.workload.key])
                    if c.pods is not None
                    else (),
                )
                for c in plan.victims
            ),
        )
        lapsed = self.lapse_words(w, self.stuck(w))
        if victims:
            state.preempt.append(Preempt(w.key, victims))
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
                f"{', '.join(v.workload for v in victims)}; "
                + held_words(plan.placement, room.domain)
            )
        else:
            reason = "waiting for preempted workloads to leave nodes; " + held_words(
                plan.placement, room.domain
            )
        state.pending.append(Pending(w.key, spec.name, lapsed + reason, room.hold))


def held_assignments(
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


def held_words(placed: Placement, domain: str) -> str:
    """ "its room is held in rack b0-r1 of Topology fabric: 8 pods planned on ..." """
    where = f" in {domain}" if domain else ""
    return f"its room is held{where}: " + placement_words(placed)


def placement_words(placed: Placement) -> str:
    """ "8 pods planned on h100-1 (x4), h100-2 (x4)", shortened past a few nodes."""
    pods = f"{placed.total} pod{'s' if placed.total != 1 else ''}"
    return f"{pods} planned on " + pods_on_nodes(
        pair for pairs in placed.nodes.values() for pair in pairs
    )


def _single_pods(plan: NodePlan) -> NodePlan:
    """`plan` with each disruptionMode Single victim losing only its pods in the gang's
    way (`plan.lost`): a victim of ((pod set, pods), ...), quota and all (partial.py)."""
    if not any(c.workload.disruption_single for c in plan.victims):
        return plan
    victims = []
    for c in plan.victims:
        w = c.workload
        taken = lost_pods(w, plan.lost.get(w.key, ())) if w.disruption_single else ()
        if not taken or is_whole(w, taken):
            victims.append(c)
        else:
            victims.append(Candidate(w, c.queue, pods_usage(w, taken), taken))
    return replace(plan, victims=tuple(victims))
