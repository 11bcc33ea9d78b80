"""Preemption for quota: within the preemptor's queue first, then reclaim across queues.

The searches themselves are quota/preemption/victims.py and reclaim.py. This part lays out
what they check once per search (the flavors the request may take, the headroom, the pairs
it is short of), runs them against the planned ledger under one `Transaction`, and, when the
snapshot has nodes, makes the decision whole with room on nodes (node_room.py): if the gang
still cannot be placed, the transaction is rolled back and no one is evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal, NamedTuple

from quota.admission.candidates import VictimLists, shielded_words
from quota.admission.node_room import HeldRoom, NodeRoom
from quota.admission.outcome import NoEviction
from quota.admission.reasons import no_victim_set, waits_before_evicting
from quota.admission.requests import Request
from quota.admission.state import CycleState
from quota.model.decisions import Pending, Preempt, Victim
from quota.model.flavorassign import Fit, assign_flavors
from quota.model.resources import FlavorResource
from quota.model.snapshot import QueueSpec, Workload
from quota.model.transaction import Transaction
from quota.placement.gang import Unplaceable
from quota.placement.reservations import pod_keys
from quota.preemption.nodes import node_candidates, protected_words, reclaimable
from quota.preemption.reclaim import Vector, plan_reclaim
from quota.preemption.victims import Candidate, preemption_reason, select_victims


class GroupOptions(NamedTuple):
    """One resource group of one pod set of a request: per flavor it may take, the (key,
    need) pairs of the whole group there. (A named tuple: one is made per group of every
    victim search.)"""

    counted: bool  # the pod set has pods to charge (a scale-up may add none)
    flavors: list[list[tuple[FlavorResource, int]]]


@dataclass(frozen=True, slots=True)
class QuotaPreemption:
    """Within-queue preemption and reclaim for the pending workloads of one cycle."""

    state: CycleState
    lists: VictimLists
    room: NodeRoom

    def preempt(
        self, spec: QueueSpec, request: Request, counts: tuple[int, ...]
    ) -> Literal["waiting"] | NoEviction:
        """Try within-queue preemption, then reclaim; on success record the decision (the
        preemptor then waits). NoEviction's words say why no one could be evicted, when
        there is more to say than the failure to fit: minRuntime protects some, or the
        quota could be freed but the pods still not be placed."""
        state = self.state
        if spec.within_queue == "Never" and spec.reclaim == "Never":
            return NoEviction()
        w = request.workload
        failed = no_victim_set(spec)
        options, room, contended = self._options(spec.name, request, counts)
        if not contended:
            # Nothing is short in the planned ledger: evicting cannot help.
            return NoEviction(failed)
        waits = waits_before_evicting(spec, w, state.snapshot.now)
        if waits:
            # Room may still free by completions: evicting now could throw work away for
            # nothing.
            return NoEviction(waits, waiting=True)
        # Valid for the whole call: each search below leaves the ledger as it found it or
        # succeeds and ends the call.
        covered = _covering(options, room)
        planned = state.planned
        rooms = (request.room(planned),)  # a non-preemptible one stays within quota

        def try_fit() -> Fit | None:
            fit = assign_flavors(spec.name, request.plans, counts, rooms, explain=False)
            return fit if isinstance(fit, Fit) else None

        tx = Transaction()
        # A Single victim loses single pods: how many is decided here, which ones (with
        # nodes) once the gang is placed (`_with_nodes`).
        single = True
        victims: list[Victim] = []
        chosen: list[Candidate] | None = None
        if spec.within_queue != "Never":
            candidates = self.lists.within_queue(spec, w, contended)
            if candidates:

                def fits(_: Sequence[Candidate]) -> bool:
                    return try_fit() is not None

                # It was just seen not to fit the planned ledger at these counts, unless
                # they are the smallest of a partial admission tried against both ledgers.
                short = counts is request.counts or not state.diverged
                chosen = select_victims(
                    candidates, planned, fits, enough=covered, short=short, tx=tx, single=single
                )
                if chosen is not None:
                    victims = [
                        Victim(
                            c.workload.key,
                            c.queue,
                            "Preempted",
                            preemption_reason(w, c.workload, c.queue),
                            pods=c.pods,
                        )
                        for c in chosen
                    ]
        reclaim = partial(
            self._reclaim, w, spec, contended, try_fit, partial(self._could_stay_under, options)
        )
        reclaimed = False
        if chosen is None and spec.reclaim != "Never":
            found = reclaim(covered, tx, single, state.taken)
            if found is not None:
                chosen, victims = found
                reclaimed = True
        if chosen is None:
            protected = self._protected(spec, w, contended)
            return NoEviction(f"{failed}; {protected}" if protected else failed)
        fit = try_fit()
        assert fit is not None, "victim search ended in a state where the preemptor fits"
        if state.nodes is not None and not spec.remote:
            outcome = self._with_nodes(spec, request, counts, fit, try_fit, tx, chosen, victims)
            if outcome == "waiting" or not reclaimed:
                return outcome
            # The quota search chose without looking at nodes: its victims may free enough
            # quota and yet no node the gang could use. Ask the nodes which reclaimable
            # workloads stand in the gang's way, and search again among those alone: the
            # reclaim rules (floors, ceilings, order) still decide whom of them.
            pool = reclaimable(
                w, spec, state.queues, self.lists.on_nodes(), state.taken, state.snapshot.now
            )
            in_the_way = self.room.in_the_way(spec, request, counts, fit.flavors, pool)
            if not in_the_way:
                return outcome
            tx = Transaction()
            others = {c.workload.key for c in pool} - in_the_way
            found = reclaim(covered, tx, single, state.taken | others)
            if found is None:
                tx.rollback()
                return outcome
            chosen, victims = found
            fit = try_fit()
            assert fit is not None, "victim search ended in a state where the preemptor fits"
            again = self._with_nodes(spec, request, counts, fit, try_fit, tx, chosen, victims)
            return again if again == "waiting" else outcome
        tx.commit()
        planned.charge(spec.name, fit.usage)
        state.taken.update(c.workload.key for c in chosen)
        # Victims' subtrees are less saturated once they leave; the preemptor's own path is
        # re-keyed when its turn ends (the driver's pass), right after this.
        mine = state.tree.paths[spec.name]
        for queue in sorted({c.queue for c in chosen}):
            state.order.refresh(queue, mine)
        state.diverged = True
        state.preempt.append(Preempt(w.key, tuple(victims)))
        n = len(victims)
        state.pending.append(
            Pending(
                w.key,
                spec.name,
                f"waiting for {n} preempted workload{'s' if n != 1 else ''} to release quota: "
                + ", ".join(v.workload for v in victims),
            )
        )
        return "waiting"

    def _reclaim(
        self,
        w: Workload,
        spec: QueueSpec,
        contended: set[FlavorResource],
        try_fit: Callable[[], Fit | None],
        could_stay_under: Callable[[str, Vector, Vector | None], bool],
        covered: Callable[[Mapping[FlavorResource, int]], bool],
        tx: Transaction,
        single: bool,
        excluded: set[str],
    ) -> tuple[list[Candidate], list[Victim]] | None:
        """Reclaim across queues (reclaim.py) among the workloads not `excluded`: the
        victims, and what each is told; None when no set of them lets `w` fit."""
        state = self.state
        plan = plan_reclaim(
            w,
            spec,
            state.queues,
            state.tree,
            self.lists.reclaim_index(),
            excluded,
            contended,
            state.planned,
            state.snapshot.now,
            try_fit,
            could_stay_under,
            covered,
            tx,
            single,
        )
        if plan is None:
            return None
        chosen = list(plan.victims)
        victims = [
            Victim(c.workload.key, c.queue, "Reclaimed", plan.reasons[c.workload.key], pods=c.pods)
            for c in chosen
        ]
        return chosen, victims

    def _with_nodes(
        self,
        spec: QueueSpec,
        request: Request,
        counts: tuple[int, ...],
        fit: Fit,
        try_fit: Callable[[], Fit | None],
        tx: Transaction,
        chosen: list[Candidate],
        victims: list[Victim],
    ) -> Literal["waiting"] | NoEviction:
        """One decision with placement: the quota victims count as gone; if the gang still
        cannot be placed, lower priorities in its way go too, or no one goes at all."""
        state = self.state
        outcome = self.room.make_room(spec, request, counts, fit, None, chosen)
        if isinstance(outcome, Unplaceable):
            tx.rollback()
            names = ", ".join(c.workload.key for c in chosen)
            return NoEviction(
                f"{no_victim_set(spec)}; evicting {names} would free the quota, but no one is "
                "evicted: " + outcome.reason
            )
        tx.commit()
        kept = self._reprieve_for_quota(chosen, outcome, fit, try_fit)
        if len(kept) < len(chosen) and outcome.hold is not None:
            spared = {c.workload.key for c in chosen} - {c.workload.key for c in kept}
            victims = [v for v in victims if v.workload not in spared]
            outcome = outcome.sparing(spared)
        settled: dict[str, tuple[Candidate, tuple[str, ...]]] = {
            c.workload.key: self.room.settle_single(c, outcome.plan)
            for c in kept
            if c.pods is not None
        }
        victims = [_settled(v, settled.get(v.workload)) for v in victims]
        for c in kept:
            if c.workload.key in settled:
                state.shed_pods(c.workload.key, settled[c.workload.key][1])
        state.taken.update(c.workload.key for c in kept)
        for queue in sorted({c.queue for c in kept}):
            state.order.refresh(queue)
        self.room.wait(spec, request, fit, outcome, victims)
        return "waiting"

    def _reprieve_for_quota(
        self,
        chosen: Sequence[Candidate],
        outcome: HeldRoom,
        fit: Fit,
        try_fit: Callable[[], Fit | None],
    ) -> list[Candidate]:
        """The quota victims still needed once the victims chosen for nodes are counted:
        those free quota too, so a quota victim that is not in the gang's way on nodes is
        spared, most important first, whenever the quota still fits without it (on the
        flavors the gang was placed on). Returns them in victim order; the planned ledger
        ends with the spared ones charged back."""
        planned = self.state.planned
        node_victims = outcome.plan.victims
        if not node_victims:
            return list(chosen)
        tx = Transaction()
        for c in node_victims:  # gone for this question only: node_room.wait releases them
            tx.release(planned, c.queue, c.usage)
        used = {node for pairs in outcome.plan.placement.nodes.values() for node, _ in pairs}
        view = self.state.nodes
        assert view is not None
        kept: list[Candidate] = []
        spared: list[Candidate] = []
        for c in reversed(chosen):
            keys = self.state.pods_of.get(c.workload.key, ())
            if any(key not in view.pods or view.pods[key].node in used for key in keys):
                kept.append(c)  # its pods are in the gang's way (removed from the view)
                continue
            mark = tx.checkpoint()
            tx.charge(planned, c.queue, c.usage)
            again = try_fit()
            if again is None or again.flavors != fit.flavors:
                tx.rollback(mark)
                kept.append(c)
            else:
                spared.append(c)
        tx.rollback()
        for c in spared:  # no longer a victim: its quota is its own again
            planned.charge(c.queue, c.usage)
        kept.reverse()
        return kept

    def _protected(self, spec: QueueSpec, w: Workload, contended: set[FlavorResource]) -> str:
        """When no victims could be found, whether some were spared only by their
        minRuntime (the words say until when) or because they are non-preemptible ("" when
        neither)."""
        words = [shielded_words(self.lists.shielded(spec, w, contended))]
        young = self.lists.young()
        if young:
            state = self.state
            now = state.snapshot.now
            found = node_candidates(w, spec, state.queues, young, state.taken, now)
            protected = [p for p in found.protected if contended & set(p.candidate.usage)]
            if protected:
                words.append(protected_words(protected, now))
        return "; ".join(part for part in words if part)

    def _options(
        self, queue: str, request: Request, counts: Sequence[int]
    ) -> tuple[list[GroupOptions], dict[FlavorResource, int], set[FlavorResource]]:
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
        # A non-preemptible request's headroom is its quota's too: victims in its own queue
        # can give it back what its quota holds, so that counts as short.
        headroom = request.room(self.state.planned).headroom
        out: list[GroupOptions] = []
        room: dict[FlavorResource, int] = {}
        need: dict[FlavorResource, int] = {}
        for i, plan in enumerate(request.plans):
            count = counts[i]
            for group in plan.groups:
                flavors: list[list[tuple[FlavorResource, int]]] = []
                for _, pairs in group.options:
                    needs: list[tuple[FlavorResource, int]] = []
                    for key, amount in pairs:
                        needed = amount * count
                        needs.append((key, needed))
                        if key not in room:
                            room[key] = headroom(queue, key)
                        if count > 0:
                            need[key] = need.get(key, 0) + needed
                    flavors.append(needs)
                out.append(GroupOptions(count > 0, flavors))
        return out, room, {key for key, amount in need.items() if amount > room[key]}

    def _could_stay_under(
        self,
        options: Sequence[GroupOptions],
        queue: str,
        ceiling: Mapping[FlavorResource, int],
        limits: Mapping[FlavorResource, int] | None,
    ) -> bool:
        """Whether some flavor per group keeps `queue`'s planned usage plus the request within
        `ceiling` (a missing key: 0) and `limits` (a missing key: no limit); `queue` is the
        request's leaf or an ancestor, pod sets are judged one by one.

        A necessary condition for reclaim, checked before looking at any victim.
        """
        get = self.state.planned.used[queue].get
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


def _covering(
    options: Sequence[GroupOptions], room: Mapping[FlavorResource, int]
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


def _settled(victim: Victim, settled: tuple[Candidate, tuple[str, ...]] | None) -> Victim:
    """A quota victim as `NodeRoom.settle_single` left it: the pods it loses, and which."""
    if settled is None:
        return victim
    c, keys = settled
    if c.pods is None:
        return replace(victim, pods=None, pod_names=())
    lost = ", ".join(f"{n} {pod_set} pod{'s' if n != 1 else ''}" for pod_set, n in c.pods)
    return replace(
        victim,
        pods=c.pods,
        pod_names=pod_keys(keys),
        reason=f"{victim.reason} (disruptionMode Single: it loses {lost} and keeps the rest)",
    )
