"""A pending workload prepared for fitting in its queue, and the gang its pods make.

A request is worked out once per cycle: its pod sets planned against the queue's flavors,
what a scale-up slice adds to the slice it replaces, and its key in the cycle's memo of
failures (identical shapes fail identically).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

from quota.admission.state import CycleState
from quota.model.flavorassign import (
    FitFailure,
    Planner,
    PodSetPlan,
    Room,
    SliceBase,
    WithinQuota,
    slice_base,
)
from quota.model.ledger import Ledger
from quota.model.nodes import PodShape
from quota.model.resources import flavor_resource, format_amount
from quota.model.snapshot import (
    Flavor,
    PodSet,
    PodSetTopology,
    QueueSpec,
    Snapshot,
    Workload,
    is_preemptible,
    non_preemptible_words,
)
from quota.placement.gang import GangRequest, PodSetRequest
from quota.placement.topology import DomainRequest, domain_of, domain_request


@dataclass(slots=True)
class Request:
    """A pending workload prepared for fitting in its queue."""

    workload: Workload
    plans: tuple[PodSetPlan, ...]
    counts: tuple[int, ...]  # pods to charge per pod set (the extra pods for a scale-up)
    base: SliceBase | None  # what the slice it replaces already runs
    running: Workload | None  # that slice
    flexible: bool  # some pod set may start with fewer pods (minCount below count)
    # Its key in the cycle's memo of failures (see `Requests.memo_key`), worked out once: a
    # request set aside in the first pass is asked again in the second.
    memo_key: tuple[object, ...] | None
    # A non-preemptible workload never borrows: a ledger bounded by the quota of every queue
    # on its path (None: it may borrow, and fits the ledgers alone), made once per ledger.
    bound: Callable[[Ledger], WithinQuota] | None = None
    bounded: dict[int, WithinQuota] | None = None  # made on first use: most requests borrow
    may_borrow: bool = True  # `bound` is None: it may take its queue path beyond quota

    def room(self, ledger: Ledger) -> Room:
        """What it may take of `ledger`: all its room, or, for a non-preemptible workload,
        no more than keeps its queue path within quota."""
        if self.bound is None:
            return ledger
        if self.bounded is None:
            self.bounded = {}
        found = self.bounded.get(id(ledger))
        if found is None:
            found = self.bounded[id(ledger)] = self.bound(ledger)
        return found

    def rooms(self, ledgers: Sequence[Ledger]) -> tuple[Room, ...]:
        """`room` of each of `ledgers`."""
        return tuple([self.room(ledger) for ledger in ledgers])


class Requests:
    """Makes the requests of one cycle, planning pod sets with one shared planner."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        fair = state.fair
        # Fair share planned the pending pod sets of this snapshot already.
        planner = fair.planner if fair.snapshot is state.snapshot else None
        self.planner = planner if planner is not None else Planner(state.snapshot.flavors)
        # Whether some queue's workloads may be moved (consolidation), for whom depends on
        # the priority of the workload they would be moved for.
        self.movable = state.nodes is not None and any(q.movable for q in state.queues.values())

    def make(self, spec: QueueSpec, w: Workload) -> Request | str:
        """`w` as a request in `spec`, or why it cannot be admitted in this cycle."""
        state = self.state
        base: SliceBase | None = None
        running: Workload | None = None
        if w.replaces is not None:
            found = state.running().get(w.replaces)
            running = found[0] if found is not None else None
            if running is not None:
                if w.replaces in state.taken:
                    return (
                        f"the slice {w.replaces} it replaces is being evicted; it will be "
                        "considered again once that slice is gone"
                    )
                base = slice_base(w, running)
        plans: list[PodSetPlan] = []
        flexible = False
        for i, ps in enumerate(w.pod_sets):
            plan = self.planner.plan(spec, ps)
            if plan.impossible is not None:
                return plan.impossible
            # A scale-up slice stays on the flavors its running slice holds.
            plans.append(plan if base is None else plan.pinned(base.flavors[i]))
            if ps.min_count is not None and ps.min_count < ps.count:
                flexible = True
        if base is None:
            counts = tuple([ps.count for ps in w.pod_sets])
        else:
            counts = tuple(max(0, ps.count - base.counts[i]) for i, ps in enumerate(w.pod_sets))
        # A holder's room and quota are its own: its failure says nothing of another's.
        memo_key = self.memo_key(spec, w) if base is None and w.hold is None else None
        bound = None
        if not is_preemptible(w, spec):
            bound = partial(WithinQuota, path=state.tree.paths[spec.name], quotas=state.quotas)
            if memo_key is not None:
                # It fails where a preemptible workload of its shape may still fit.
                memo_key = (*memo_key, "within quota")
        return Request(
            w,
            tuple(plans),
            counts,
            base,
            running,
            flexible,
            memo_key,
            bound=bound,
            may_borrow=bound is None,
        )

    def memo_key(self, spec: QueueSpec, w: Workload) -> tuple[object, ...]:
        """Identical shapes fail identically; priority and arrival matter only to preemption,
        and priority to consolidation too (who may be moved for it). (Not for a scale-up
        slice: what it needs depends on the slice it replaces; nor for a holder.)"""
        shape: list[object] = [spec.name]
        for ps in w.pod_sets:
            # The planner's shape number: equal numbers, equal signatures.
            shape.append((self.planner.shape(ps), ps.count, ps.min_count, ps.topology))
        if spec.within_queue != "Never" or spec.reclaim != "Never" or self.movable:
            shape.append(w.priority)
            if spec.within_queue == "LowerOrNewerEqualPriority":
                shape.append(w.arrival)
        return tuple(shape)


def within_quota_words(
    spec: QueueSpec, request: Request, failure: FitFailure, ledgers: Sequence[Ledger]
) -> str | None:
    """Why a non-preemptible `request` does not fit, when its quota is why: "non-preemptible
    (priority 150 >= 100 in queue serve): admitted only within the queue's guaranteed quota
    of nvidia.com/gpu in flavor h100: requested 8, quota left 4"; None when some flavor
    would not fit even if it could borrow (the usual words say why)."""
    parts: list[str] = []
    for short in failure.shortfalls:
        key = flavor_resource(short.flavor, short.resource)
        if any(short.requested > ledger.headroom(spec.name, key) for ledger in ledgers):
            return None
        bounds = [request.room(ledger) for ledger in ledgers]
        left, binder = min(b.quota_left(key) for b in bounds if isinstance(b, WithinQuota))
        r = short.resource
        whose = "the queue's" if binder == spec.name else f"queue {binder}'s"
        parts.append(
            f"{whose} guaranteed quota of {r} in flavor {short.flavor}: requested "
            f"{format_amount(r, short.requested)}, quota left {format_amount(r, max(0, left))}"
        )
    if not parts:
        return None
    words = f"{non_preemptible_words(request.workload, spec)}: admitted only within "
    text = words + "; ".join(parts)
    if len(request.workload.pod_sets) > 1:
        text = f"pod set {failure.pod_set}: {text}"
    return text


def gang_of(
    snapshot: Snapshot,
    w: Workload,
    counts: Sequence[int],
    chosen: Sequence[Mapping[str, str]],
    partial: bool,
) -> tuple[GangRequest | None, str]:
    """The gang of `w`'s pod sets with `counts` pods on the flavors `chosen` per pod set
    (None: no pods; partial: its minCounts apply), and " on flavor h100" for reasons.

    A pod's shape is its pod set's, with the node labels of its flavors added to the node
    selector and their tolerations to its own, as the Job integration writes them into the
    pod template on admission. A pod set on a flavor with a Topology is kept in its domains
    as it asks (`topology_of`)."""
    flavors = snapshot.flavors
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
        floor = min(low, counts[i]) if low else None
        domain, refused = topology_of(snapshot, ps, chosen[i].values())
        sets.append(PodSetRequest(ps.name, counts[i], shape, floor, domain, refused))
    where = f" on flavor {', '.join(sorted(names))}" if names else ""
    return (GangRequest(tuple(sets)) if sets else None), where


def topology_of(
    snapshot: Snapshot, ps: PodSet, chosen: Iterable[str]
) -> tuple[DomainRequest | None, str | None]:
    """The domains `ps` must or should keep to on the flavors `chosen`, or why it cannot be
    placed there at all: (None, None) places it as if the nodes were flat."""
    if ps.topology is None and snapshot.topology_flavors.isdisjoint(chosen):
        return None, None
    return topology_for(snapshot.flavors, snapshot.topologies, ps.topology, chosen)


def topology_for(
    flavors: Mapping[str, Flavor],
    topologies: Mapping[str, tuple[str, ...]] | None,
    ask: PodSetTopology | None,
    chosen: Iterable[str],
) -> tuple[DomainRequest | None, str | None]:
    """`topology_of` for any caller that knows the flavors and Topologies (the scheduler
    loop reads them from its caches): `topologies` None when the caller cannot place by
    topology at all."""
    named: dict[str, str] = {}
    for name in sorted(set(chosen)):
        flavor = flavors.get(name)
        if flavor is not None and flavor.topology is not None:
            named[name] = flavor.topology
    if not named:
        if ask is None:
            return None, None
        listed = ", ".join(sorted(set(chosen)))
        return None, (
            f"its topologyRequest needs a flavor with a Topology, and flavor {listed} names "
            "none (spec.topologyName)"
        )
    if len(set(named.values())) > 1:
        listed = ", ".join(f"{f} names {t}" for f, t in named.items())
        return None, f"its flavors name different Topologies ({listed}); a pod set keeps to one"
    first, topology = next(iter(named.items()))
    if topologies is None:
        return None, (
            f"flavor {first} names Topology {topology}, and this admission does not read "
            "Topologies (it admits by quota alone), so it cannot keep pods in a domain; "
            "workloads that need the flavor wait"
        )
    levels = topologies.get(topology)
    if levels is None:
        return None, f"flavor {first} names Topology {topology}, which does not exist"
    if ask is None:
        return None, None
    found = domain_request(
        topology, levels, ask.mode, ask.level, ask.slice_size, ask.slice_level, tier=ask.tier
    )
    if isinstance(found, str):
        return None, f"its topologyRequest cannot be honoured on flavor {first}: {found}"
    return found, None


def topology_refusal(
    snapshot: Snapshot, w: Workload, chosen: Sequence[Mapping[str, str]]
) -> str | None:
    """Why `w` cannot have the Topology its pod sets need on the flavors `chosen`, or None:
    what quota-only admission (no nodes) still checks (see `topology_of`)."""
    several = len(w.pod_sets) > 1
    for i, ps in enumerate(w.pod_sets):
        _, refused = topology_of(snapshot, ps, chosen[i].values())
        if refused is not None:
            return f"pod set {ps.name}: {refused}" if several else refused
    return None


def request_gang(
    state: CycleState, request: Request, counts: Sequence[int], chosen: Sequence[Mapping[str, str]]
) -> tuple[GangRequest | None, str]:
    """The gang to place for `request` on the flavors `chosen` (see `gang_of`).

    A scale-up slice asks only for its extra pods; a pod set of it that requires one domain
    places them in the domain where the slice it replaces runs, which is where the whole
    Job must be."""
    gang, where = gang_of(state.snapshot, request.workload, counts, chosen, request.base is None)
    if gang is None or request.running is None or state.nodes is None:
        return gang, where
    view = state.nodes
    running = [view.pods[k].node for k in state.pods_of.get(request.running.key, ())]
    sets = []
    for ps in gang.pod_sets:
        if ps.domain is not None and ps.domain.required:
            there = domain_of(view, running, ps.domain)
            shape = replace(ps.shape, node_selector={**ps.shape.node_selector, **there})
            ps = replace(ps, shape=shape)
        sets.append(ps)
    return replace(gang, pod_sets=tuple(sets)), where
