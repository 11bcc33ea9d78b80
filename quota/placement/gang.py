"""Gang placement: every pod of a group gets a node at once, or none of them does.

`place_gang` is the one function the admission cycle, the scheduler loop and the simulator
call. It reads a `NodeView` and returns plain data: a `Placement` (pod set -> nodes and pod
counts) or an `Unplaceable` with a reason a person can act on. It leaves the view as it
found it; the caller takes the room with `view.assume(placement)` once it decides to.

It runs a profile (`framework.py`, `profiles.py`): each pod set's nodes are the ones that
pass the profile's filters (`candidates.py`), and the profile's score says which of those
that still have room goes first (`_place` walks it; room is checked here, node by node).

Identical pods of a pod set are placed in batches: the chosen node takes as many of them
as fit (the least over resources of free // request), so a node that takes four pods is
chosen once, not four times. Pod sets go in a fixed order, the largest per-pod request of
the gang's scarcest resource first, because the big pods are the ones that run out of
nodes. With minimum counts every pod set first gets its minimum, then as many more as fit.

A pod set with a topology request (`PodSetRequest.domain`) is placed whole in its turn:
`topology.choose` picks its domain and how its pods spread over the domains inside it, and
each portion is placed like any pod set on the nodes of its domain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice

from sortedcontainers import SortedList

from quota.model.nodes import PodShape
from quota.model.resources import format_amount
from quota.placement.candidates import Candidates, Share, candidates
from quota.placement.filters import fits_one
from quota.placement.framework import Profile, Score
from quota.placement.nodes import (
    PODS,
    Demand,
    NodeKey,
    NodeState,
    NodeView,
    demand_of,
    fit_count,
)
from quota.placement.profiles import PROFILES, STRATEGIES, Strategy
from quota.placement.scoring import lowest_key, scarcity_order
from quota.placement.topology import DomainRequest, Refused, choose

# Free amounts listed in a reason before it says "...": enough to see fragmentation.
_LISTED = 8


@dataclass(frozen=True, slots=True)
class PodSetRequest:
    """`count` identical pods; at least `min_count` of them when that is set."""

    name: str
    count: int
    shape: PodShape
    min_count: int | None = None
    # Keep the pods (or each slice of them) inside one domain of a topology (topology.py).
    domain: DomainRequest | None = None
    # Why the pod set can never be placed as asked here (e.g. its flavor names a Topology
    # that does not exist): the gang is refused with this, whatever the nodes.
    refused: str | None = None


@dataclass(frozen=True, slots=True)
class GangRequest:
    """Pod sets placed together or not at all; `min_count` as a PodGroup's minCount.

    Without any minimum every pod must be placed. A pod set's `min_count` is its own floor;
    the gang's `min_count` is a floor on the total, and pod sets without a floor of their
    own then count only towards it.
    """

    pod_sets: tuple[PodSetRequest, ...]
    min_count: int | None = None

    @property
    def count(self) -> int:
        """Pods in the whole gang."""
        return sum(ps.count for ps in self.pod_sets)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where each pod set's pods go: pod set -> ((node, pods on it), ...)."""

    nodes: Mapping[str, tuple[tuple[str, int], ...]]
    total: int
    requests: Mapping[str, Mapping[str, int]]  # per-pod requests of each pod set

    def count(self, pod_set: str) -> int:
        """Pods of `pod_set` placed (less than asked under partial placement)."""
        return sum(n for _, n in self.nodes.get(pod_set, ()))

    def pod_nodes(self, pod_set: str) -> tuple[str, ...]:
        """One node name per placed pod of `pod_set`, in placement order: what to bind."""
        return tuple(node for node, n in self.nodes.get(pod_set, ()) for _ in range(n))

    def usage(self) -> dict[str, dict[str, int]]:
        """What the placement takes from each node, pod slots included."""
        out: dict[str, dict[str, int]] = {}
        for pod_set, pairs in self.nodes.items():
            demand = demand_of(self.requests[pod_set])
            for node, n in pairs:
                room = out.setdefault(node, {})
                for r, v in demand:
                    room[r] = room.get(r, 0) + v * n
        return out


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """No placement now, and why.

    `never` is set when no node of the view could host it even with every bound pod gone:
    preemption cannot help, only new or changed nodes can, so a queue should not wait on it.
    """

    reason: str
    never: bool = False
    pod_set: str | None = None  # the pod set that did not fit, when one is to blame


class _Plan:
    """One pod set, with what placing it needs computed once."""

    __slots__ = ("cands", "count", "demand", "domain", "floor", "name", "need")

    def __init__(self, request: PodSetRequest, cands: Candidates, floor: int) -> None:
        self.name = request.name
        self.count = request.count
        self.demand = demand_of(request.shape.requests)
        self.need = dict(self.demand)
        self.cands = cands
        self.floor = floor
        self.domain = request.domain


class _Scratch:
    """Tentative takes on the view, undone in reverse so that a gang leaves no trace."""

    __slots__ = ("log", "view")

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self.log: list[tuple[NodeState, Demand, int]] = []

    def take(self, state: NodeState, demand: Demand, times: int) -> None:
        self.view.take(state, demand, times)
        self.log.append((state, demand, times))

    def undo(self, keep: int = 0) -> None:
        """Undo every take but the first `keep`."""
        take = self.view.take
        while len(self.log) > keep:
            state, demand, times = self.log.pop()
            take(state, demand, -times)


def place_gang(
    view: NodeView, request: GangRequest, strategy: Strategy | Profile = "BinPack"
) -> Placement | Unplaceable:
    """Place the whole gang (or at least its minimums) on the view's nodes, or say why not.

    `strategy` is a queue's `placementStrategy` (its profile in `profiles.py`) or a profile.
    The view is left as it was; call `view.assume(placement)` to take the room.
    """
    if isinstance(strategy, str):
        if strategy not in PROFILES:
            known = ", ".join(STRATEGIES)
            raise ValueError(f"unknown placement strategy {strategy!r} (one of {known})")
        profile = PROFILES[strategy]
    else:
        profile = strategy
    floors, gang_floor = _floors(request)
    several = len(request.pod_sets) > 1
    for ps in request.pod_sets:
        if ps.refused is not None:
            return Unplaceable(
                f"pod set {ps.name}: {ps.refused}" if several else ps.refused, True, ps.name
            )
    view.settle()
    plans = _ordered(
        view,
        [
            _Plan(ps, candidates(view, ps.shape, profile.filters), floors[ps.name])
            for ps in request.pod_sets
        ],
    )
    placed: dict[str, dict[str, int]] = {plan.name: {} for plan in plans}
    scratch = _Scratch(view)
    try:
        result = _place_all(view, request, plans, placed, gang_floor, profile.score, scratch)
    except BaseException:
        scratch.undo()
        raise
    if isinstance(result, Placement) and scratch.log:
        view.hold(result, scratch.log)
    else:
        scratch.undo()
    return result


def _place_all(
    view: NodeView,
    request: GangRequest,
    plans: list[_Plan],
    placed: dict[str, dict[str, int]],
    gang_floor: int,
    score: Score,
    scratch: _Scratch,
) -> Placement | Unplaceable:
    """Every pod set's floor first, then as many more pods as fit.

    A reason describes the nodes as they were before the pods it speaks of were tried, so
    the takes of those pods are undone before it is written.
    """
    several = len(plans) > 1
    for plan in plans:
        before = len(scratch.log)
        if plan.domain is not None:
            refused = _place_in_domains(
                view, plan, plan.domain, score, scratch, placed[plan.name], several
            )
            if refused is not None:
                scratch.undo(keep=before)
                return refused
            continue
        if not plan.floor:
            continue
        got = _place(view, plan, plan.floor, score, scratch, placed[plan.name])
        if got < plan.floor:
            scratch.undo(keep=before)
            return _pod_set_short(view, plan, plan.floor, got, several, before > 0)
    for plan in plans:
        if plan.domain is None:
            _place(view, plan, plan.count - plan.floor, score, scratch, placed[plan.name])
    total = sum(sum(p.values()) for p in placed.values())
    if total < gang_floor:
        scratch.undo()
        return _gang_short(view, request, plans, placed, gang_floor, total)
    return Placement(
        nodes={ps.name: tuple(placed[ps.name].items()) for ps in request.pod_sets},
        total=total,
        requests={ps.name: dict(ps.shape.requests) for ps in request.pod_sets},
    )


def _floors(request: GangRequest) -> tuple[dict[str, int], int]:
    """Each pod set's floor and the gang's, after checking the request makes sense."""
    floors: dict[str, int] = {}
    for ps in request.pod_sets:
        if ps.name in floors:
            raise ValueError(f"pod set {ps.name} appears twice in the gang")
        if ps.count < 0:
            raise ValueError(f"pod set {ps.name}: count {ps.count} is negative")
        if ps.min_count is not None and not 0 <= ps.min_count <= ps.count:
            raise ValueError(
                f"pod set {ps.name}: min_count {ps.min_count} is not between 0 and count {ps.count}"
            )
        for r, v in ps.shape.requests.items():
            if v < 0:
                raise ValueError(f"pod set {ps.name}: request {r}={v} is negative")
        if ps.min_count is not None:
            floors[ps.name] = ps.min_count
        else:
            floors[ps.name] = ps.count if request.min_count is None else 0
    gang_min = request.min_count
    if gang_min is not None and not 0 <= gang_min <= request.count:
        raise ValueError(f"gang min_count {gang_min} is not between 0 and its {request.count} pods")
    return floors, max(gang_min or 0, sum(floors.values()))


def _ordered(view: NodeView, plans: list[_Plan]) -> list[_Plan]:
    """Largest per-pod request of the gang's scarcest resource first, then the next, then name."""
    if len(plans) < 2:
        return plans
    wanted: dict[str, int] = {}
    for plan in plans:
        for r, v in plan.demand:
            wanted[r] = wanted.get(r, 0) + v * max(plan.count, 1)
    usable = [g for g in view.classes if g.ready and not g.unschedulable]
    order = scarcity_order(tuple(wanted.items()), lambda r: sum(g.total.get(r, 0) for g in usable))
    return sorted(plans, key=lambda p: (*(-p.need.get(r, 0) for r in order), p.name))


def _place_in_domains(
    view: NodeView,
    plan: _Plan,
    domain: DomainRequest,
    score: Score,
    scratch: _Scratch,
    placed: dict[str, int],
    several: bool,
) -> Unplaceable | None:
    """Place a pod set with a topology request: its domains chosen (`topology.choose`), then
    each portion on the nodes of its domain with the queue's score. None when placed."""
    if not plan.count:
        return None
    if plan.cands.failure is not None:
        return _pod_set_short(view, plan, plan.floor or plan.count, 0, several, False)
    want = plan.count
    subject = f"{_subject(plan, want, several)} x {_requests_text(plan)}"
    chosen = choose(view, plan.cands, plan.demand, domain, want, plan.floor, subject)
    if isinstance(chosen, Refused):
        return Unplaceable(chosen.reason, chosen.never, plan.name)
    portions, total = chosen
    got = sum(_place(view, plan, n, score, scratch, placed, cands) for cands, n in portions)
    if got != total:  # the domains were counted to hold them: placing cannot fall short
        raise AssertionError(f"pod set {plan.name}: {got} of {total} pods placed in its domains")
    return None


def _place(
    view: NodeView,
    plan: _Plan,
    want: int,
    score: Score,
    scratch: _Scratch,
    placed: dict[str, int],
    domain: Candidates | None = None,
) -> int:
    """Place up to `want` pods of `plan` in batches (on the nodes of `domain` when given, a
    part of the plan's); return how many were placed."""
    cands = plan.cands if domain is None else domain
    if want <= 0 or cands.failure is not None:
        return 0
    demand = plan.demand
    lead = scarcity_order(demand, cands.total_free)[0]
    need = plan.need[lead]
    better = score.better
    runner_up = score.lookahead > 1
    sources: list[Share | None] = [*cands.shares, *([None] if cands.nodes else [])]
    # Each source's best nodes, kept until a batch lands in that source.
    tops: list[list[tuple[NodeKey, NodeState]] | None] = [None] * len(sources)
    remaining = want
    while remaining:
        best_i = -1
        best_key: NodeKey | None = None
        for i, share in enumerate(sources):
            top = tops[i]
            if top is None:
                top = tops[i] = _top(view, share, cands, lead, need, demand, score)
            if top and (best_key is None or better(top[0][0], best_key)):
                best_i, best_key = i, top[0][0]
        if best_key is None:
            break
        best = tops[best_i]
        assert best is not None
        state = best[0][1]
        batch = min(remaining, fit_count(state.free, demand))
        if runner_up:
            second: NodeKey | None = None
            for j, top in enumerate(tops):
                if j != best_i and top and (second is None or better(top[0][0], second)):
                    second = top[0][0]
            if len(best) > 1 and (second is None or better(best[1][0], second)):
                second = best[1][0]
            if second is not None:
                batch = score.batch(batch, best_key[0], second[0], need)
        scratch.take(state, demand, batch)
        placed[state.name] = placed.get(state.name, 0) + batch
        tops[best_i] = None
        remaining -= batch
    return want - remaining


def _top(
    view: NodeView,
    share: Share | None,
    cands: Candidates,
    lead: str,
    need: int,
    demand: Demand,
    score: Score,
) -> list[tuple[NodeKey, NodeState]]:
    """The best `score.lookahead` nodes of one source that fit a pod, best first."""
    limit = score.lookahead
    out: list[tuple[NodeKey, NodeState]] = []
    if share is not None:
        states = view.states
        skip = share.skip
        for key in score.walk(share.group.index(lead), need):
            state = states[key[2]]
            if key[2] not in skip and fits_one(state.free, demand):
                out.append((key, state))
                if len(out) == limit:
                    break
        return out
    # Nodes that pass one by one (e.g. pinned by hostname) are few: ordered on the spot.
    fitting = {s.name: s for s in cands.nodes if fits_one(s.free, demand)}
    index = SortedList(s.key(lead) for s in fitting.values())
    return [(key, fitting[key[2]]) for key in islice(score.walk(index, need), limit)]


# -- reasons ------------------------------------------------------------------------------


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def _subject(plan: _Plan, want: int, several: bool) -> str:
    what = f"pod set {plan.name} of" if several else "gang of"
    floor = f" (at least {want})" if want < plan.count else ""
    return f"{what} {_pods(plan.count)}{floor}"


def _requests_text(plan: _Plan) -> str:
    parts = [f"{format_amount(r, v)} {r}" for r, v in plan.demand if r != PODS]
    return ", ".join(parts) or "no resources"


def _pod_set_short(
    view: NodeView, plan: _Plan, want: int, got: int, several: bool, after_others: bool
) -> Unplaceable:
    """Why `plan` got only `got` of the `want` pods it must have."""
    if plan.cands.failure is not None:
        reason = plan.cands.failure
        return Unplaceable(f"pod set {plan.name}: {reason}" if several else reason, True, plan.name)
    never = _never(view, plan, want, several)
    if never is not None:
        return Unplaceable(never, True, plan.name)
    reason = _shortage(plan, want, got, several)
    if after_others:
        reason += "; the gang's other pod sets were placed first"
    return Unplaceable(reason, False, plan.name)


def _never(view: NodeView, plan: _Plan, want: int, several: bool) -> str | None:
    """Why `want` pods could not be placed even on emptied nodes, or None when they could."""
    vectors = list(plan.cands.allocatables())
    where = "node" if plan.cands.count == len(view) else "matching node"
    pod_set = f"pod set {plan.name}: " if several else ""
    for r, v in plan.demand:
        largest = max((a.get(r, 0) for a, _ in vectors), default=0)
        if v <= largest:
            continue
        if r == PODS:
            return f"{pod_set}no {where} accepts pods (allocatable pods is 0)"
        return (
            f"{pod_set}pod needs {format_amount(r, v)} {r}; the largest {where} has "
            f"{format_amount(r, largest)} allocatable"
        )
    capacity = sum(fit_count(a, plan.demand) * n for a, n in vectors)
    if not capacity:
        return f"{pod_set}pod needs {_requests_text(plan)}; no {where} has all of it allocatable"
    if capacity < want:
        asks = f" x {_requests_text(plan)}" if len(plan.demand) > 1 else ""
        return (
            f"{_subject(plan, want, several)}{asks}: the {plan.cands.count:,} {where}s hold "
            f"{capacity:,} even when empty"
        )
    return None


def _room(cands: Candidates, resource: str, need: int) -> tuple[int, int]:
    """How many passing nodes have `need` of `resource` free, and the most any has."""
    bound = lowest_key(need)
    count, most = 0, 0
    for share in cands.shares:
        index = share.group.index(resource)
        count += len(index) - index.bisect_left(bound)
        count -= sum(1 for s in share.excluded if s.free.get(resource, 0) >= need)
        top = next((k for k in reversed(index) if k[2] not in share.skip), None)
        if top is not None:
            most = max(most, top[0])
    for state in cands.nodes:
        have = state.free.get(resource, 0)
        count += have >= need
        most = max(most, have)
    return count, most


def _below(cands: Candidates, resource: str, need: int) -> list[tuple[int, int]]:
    """Free amounts of `resource` under `need` on passing nodes, largest first, with how many
    nodes have each; at most one more distinct amount than is listed (to know to say "...")."""
    out: list[tuple[int, int]] = []
    upper = need
    while len(out) <= _LISTED:
        # The largest amount under `upper`, then how many nodes have exactly it: bisects,
        # so a reason costs the same on 5,000 nodes as on 5.
        below = lowest_key(upper)
        amounts = []
        for share in cands.shares:
            run = share.group.index(resource).irange(None, below, (True, False), reverse=True)
            key = next((k for k in run if k[2] not in share.skip), None)
            if key is not None:
                amounts.append(key[0])
        amounts += [f for s in cands.nodes if (f := s.free.get(resource, 0)) < upper]
        if not amounts:
            break
        amount = max(amounts)
        low, high = lowest_key(amount), lowest_key(amount + 1)
        nodes = 0
        for share in cands.shares:
            index = share.group.index(resource)
            nodes += index.bisect_left(high) - index.bisect_left(low)
            nodes -= sum(1 for s in share.excluded if s.free.get(resource, 0) == amount)
        nodes += sum(1 for s in cands.nodes if s.free.get(resource, 0) == amount)
        out.append((amount, nodes))
        upper = amount
    return out


def _amounts(resource: str, below: list[tuple[int, int]], others: bool) -> str:
    """ "the others have 4, 4, 2" for a few nodes; "4,990 others have 4, 10 have 2" for many."""
    shown = below[:_LISTED]
    more = ", ..." if len(below) > _LISTED else ""
    count = sum(n for _, n in shown)
    if count <= _LISTED:
        values = ", ".join(format_amount(resource, v) for v, n in shown for _ in range(n))
        if count == 1:
            return f"{'the other' if others else 'the node'} has {values}"
        return f"{'the others' if others else 'the nodes'} have {values}{more}"
    groups = []
    for i, (v, n) in enumerate(shown):
        who = (f"{n:,} other" if others else f"{n:,} node") if i == 0 else f"{n:,}"
        if n != 1 and i == 0:
            who += "s"
        groups.append(f"{who} {'has' if n == 1 else 'have'} {format_amount(resource, v)}")
    return ", ".join(groups) + more


def _shortage(plan: _Plan, want: int, got: int, several: bool) -> str:
    """The free amounts behind a shortage, on the resource fewest nodes have room for."""
    cands = plan.cands
    order = scarcity_order(plan.demand, cands.total_free)
    rooms = {r: _room(cands, r, plan.need[r]) for r in order}
    resource = min(order, key=lambda r: (rooms[r][0], order.index(r)))
    need = plan.need[resource]
    with_room, most = rooms[resource]
    unit = "pod slot" if resource == PODS else resource
    head = f"{_subject(plan, want, several)} x {format_amount(resource, need)} {unit}"
    amount = format_amount(resource, need)
    parts = []
    if got != with_room:
        parts.append(f"room for {got}")
    if with_room:
        have = "node has" if with_room == 1 else "nodes have"
        more = " or more" if most > need else ""
        parts.append(f"{with_room} {have} {amount}{more} free")
    else:
        parts.append(f"no node has {amount} free")
    below = _below(cands, resource, need)
    if below:
        parts.append(_amounts(resource, below, others=with_room > 0))
    total = format_amount(resource, cands.total_free(resource))
    return f"{head}: {'; '.join(parts)} ({total} free in total)"


def _gang_short(
    view: NodeView,
    request: GangRequest,
    plans: list[_Plan],
    placed: dict[str, dict[str, int]],
    gang_floor: int,
    total: int,
) -> Unplaceable:
    """Why the gang as a whole stays under its minimum even though each pod set met its own."""
    head = f"gang needs at least {gang_floor} of its {request.count} pods; room for {total}"
    capacity = 0
    for plan in plans:
        if plan.cands.failure is None:
            vectors = plan.cands.allocatables()
            capacity += min(plan.count, sum(fit_count(a, plan.demand) * n for a, n in vectors))
    if capacity < gang_floor:
        return Unplaceable(f"{head}; the matching nodes hold {capacity} even when empty", True)
    short = [p for p in plans if sum(placed[p.name].values()) < p.count]
    plan = short[0]
    got = sum(placed[plan.name].values())
    if plan.cands.failure is not None:
        detail = f"pod set {plan.name}: {plan.cands.failure}"
    else:
        detail = _shortage(plan, plan.count, got, len(plans) > 1)
    return Unplaceable(f"{head}: {detail}", False, plan.name)
