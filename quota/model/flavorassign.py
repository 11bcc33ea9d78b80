"""Choosing a flavor per resource for each pod set of a workload.

Resources that appear together in one of a queue's flavors form a resource group (cpu and
memory of "default", say, or cpu, memory and GPUs of "h100"); every requested resource of a
group comes from the same flavor, because the pods land on nodes of one kind. Flavors are
tried in the queue's preference order, a flavor whose node labels contradict the pod set's
node selector, or whose taints the pods do not tolerate, is skipped, and a whole pod set
always takes one flavor per resource.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple, Protocol

from quota.model.ledger import Ledger
from quota.model.nodes import Taint, Toleration
from quota.model.resources import FlavorResource, flavor_resource
from quota.model.snapshot import Flavor, PodSet, QueueSpec, Workload


def flavor_conflict(flavor: Flavor, pod_set: PodSet) -> str | None:
    """Why `flavor` cannot host `pod_set`, or None when it can.

    Only selector keys that the flavor labels count: a flavor says nothing about the others.
    The flavor's own tolerations count as the pods' because they are added to admitted pods.
    """
    for key, wanted in sorted(pod_set.node_selector.items()):
        have = flavor.node_labels.get(key)
        if have is not None and have != wanted:
            return (
                f"flavor {flavor.name} skipped: node selector {key}={wanted} of pod set "
                f"{pod_set.name} conflicts with flavor label {key}={have}"
            )
    tolerations = pod_set.tolerations + flavor.tolerations
    for taint in flavor.taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return (
                f"flavor {flavor.name} skipped: taint {taint} is not tolerated by pod set "
                f"{pod_set.name}"
            )
    return None


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """The flavors a group of requested resources may come from, in preference order."""

    resources: tuple[str, ...]
    flavors: tuple[str, ...]
    # Per flavor in `flavors`: the flavor and the ((flavor, resource), amount per pod) pair
    # of each resource, in `resources` order; made once per plan rather than once per
    # flavor tried (a cycle tries tens of thousands).
    options: tuple[tuple[str, tuple[tuple[FlavorResource, int], ...]], ...]


@dataclass(frozen=True, slots=True)
class PodSetPlan:
    """Everything flavor assignment needs about one pod set in one queue, computed once."""

    pod_set: PodSet  # shape only: its count is not used, callers pass counts
    groups: tuple[GroupPlan, ...]
    # Why the pod set cannot be admitted in this queue at all (no flavor covers a resource,
    # or every flavor is ruled out); None when some flavor may host every group.
    impossible: str | None
    skipped: tuple[str, ...]  # flavor conflicts, for reasons shown to users

    def pinned(self, flavors: Mapping[str, str] | None) -> PodSetPlan:
        """This plan with every group that `flavors` (resource -> flavor) names held to that
        one flavor: a scale-up slice stays on the flavors its running slice holds. Pinned
        once per request, so flavor assignment and the checks before a victim search only
        ever walk `options`."""
        if not flavors:
            return self
        per_pod = self.pod_set.per_pod
        groups: list[GroupPlan] = []
        for group in self.groups:
            f = flavors.get(group.resources[0])
            if f is None:
                groups.append(group)
            else:
                pairs = tuple((flavor_resource(f, r), per_pod[r]) for r in group.resources)
                groups.append(GroupPlan(group.resources, (f,), ((f, pairs),)))
        return replace(self, groups=tuple(groups))


def _resource_groups(flavor_resources: Sequence[tuple[str, tuple[str, ...]]]) -> dict[str, int]:
    """Map each resource to the id of its group (union of resources sharing a flavor), given
    each flavor of a queue with the resources it has quota for."""
    parent: dict[str, str] = {}

    def find(r: str) -> str:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for _, names in flavor_resources:
        for r in names:
            parent.setdefault(r, r)
        for r in names[1:]:
            a, b = find(names[0]), find(r)
            if a != b:
                parent[max(a, b)] = min(a, b)
    roots = sorted({find(r) for r in parent})
    ids = {root: i for i, root in enumerate(roots)}
    return {r: ids[find(r)] for r in parent}


# What planning reads of a queue and the flavors it names: per flavor in preference order,
# its name, the resources the queue has quota for there, and the flavor's labels, taints
# and tolerations (None for a flavor the snapshot does not describe). Hashable, so plans can
# be shared by every queue with the same flavors and by every cycle.
FlavorSignature = tuple[
    tuple[
        str,
        tuple[str, ...],
        tuple[tuple[tuple[str, str], ...], tuple[Taint, ...], tuple[Toleration, ...]] | None,
    ],
    ...,
]


def flavor_signature(spec: QueueSpec, flavors: Mapping[str, Flavor]) -> FlavorSignature:
    """What flavor planning depends on in a queue: equal signatures plan alike."""
    out = []
    for fq in spec.flavors:
        flavor = flavors.get(fq.flavor)
        described = (
            None
            if flavor is None
            else (tuple(sorted(flavor.node_labels.items())), flavor.taints, flavor.tolerations)
        )
        out.append((fq.flavor, tuple(sorted(fq.quota)), described))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Shape:
    """A plan without the queue: what every queue with one flavor signature shares."""

    groups: tuple[GroupPlan, ...]
    skipped: tuple[str, ...]
    uncovered: tuple[str, ...]  # requested resources no flavor of the queue has quota for
    unhostable: tuple[str, ...]  # a group every flavor of which is ruled out
    why: str  # why they are ruled out


@lru_cache(maxsize=4096)
def _plan_shape(flavor_sig: FlavorSignature, pod_sig: PodSetSignature) -> _Shape:
    """Plan a pod set shape against a queue's flavors, both given by signature.

    Pure and cached: the simulator and the controller plan the same few shapes in the same
    queues every cycle, and this used to be a quarter of a simulation's time. The cache is
    bounded; a miss only costs the planning itself.
    """
    name, per_pod, selector, tolerations = pod_sig
    pod_set = PodSet(name, 1, dict(per_pod), node_selector=dict(selector), tolerations=tolerations)
    requested = sorted(r for r, amount in per_pod if amount > 0)
    group_of = _resource_groups([(f, resources) for f, resources, _ in flavor_sig])
    uncovered = tuple(r for r in requested if r not in group_of)
    if uncovered:
        return _Shape((), (), uncovered, (), "")
    by_group: dict[int, list[str]] = {}
    for r in requested:
        by_group.setdefault(group_of[r], []).append(r)
    skipped: list[str] = []
    conflicts: dict[str, str | None] = {}
    groups: list[GroupPlan] = []
    for _, resources in sorted(by_group.items()):
        candidates: list[str] = []
        for flavor_name, covered, described in flavor_sig:
            if not all(r in covered for r in resources):
                continue
            if flavor_name not in conflicts:
                if described is None:
                    flavor = Flavor(flavor_name)
                else:
                    labels, taints, flavor_tolerations = described
                    flavor = Flavor(flavor_name, dict(labels), taints, flavor_tolerations)
                conflicts[flavor_name] = flavor_conflict(flavor, pod_set)
                if conflicts[flavor_name] is not None:
                    skipped.append(str(conflicts[flavor_name]))
            if conflicts[flavor_name] is None:
                candidates.append(flavor_name)
        if not candidates:
            why = "; ".join(skipped) if skipped else "no flavor covers them together"
            return _Shape((), tuple(skipped), (), tuple(resources), why)
        amounts = dict(per_pod)
        options = tuple(
            (f, tuple((flavor_resource(f, r), amounts[r]) for r in resources)) for f in candidates
        )
        groups.append(GroupPlan(tuple(resources), tuple(candidates), options))
    return _Shape(tuple(groups), tuple(skipped), (), (), "")


def plan_pod_set(
    spec: QueueSpec,
    flavors: Mapping[str, Flavor],
    pod_set: PodSet,
    signatures: tuple[FlavorSignature, PodSetSignature] | None = None,
) -> PodSetPlan:
    """Work out which flavors may serve each requested resource group of `pod_set`.

    `signatures`, when the caller already has them: the queue's `flavor_signature` and the
    pod set's `pod_set_signature` (a cycle plans thousands of pod sets in a few queues)."""
    if signatures is None:
        signatures = (flavor_signature(spec, flavors), pod_set_signature(pod_set))
    shape = _plan_shape(*signatures)
    if shape.uncovered:
        return PodSetPlan(
            pod_set,
            (),
            f"queue {spec.name} has no quota for {', '.join(shape.uncovered)} in any flavor",
            (),
        )
    if shape.unhostable:
        return PodSetPlan(
            pod_set,
            (),
            f"no flavor of queue {spec.name} can host {', '.join(shape.unhostable)} for pod set "
            f"{pod_set.name}: {shape.why}",
            shape.skipped,
        )
    return PodSetPlan(pod_set, shape.groups, None, shape.skipped)


class Planner:
    """The plans of one snapshot's pod sets, per queue: worked out once and shared by fair
    share and the admission cycle on that snapshot, which plan the same pending pod sets.

    Pod sets are known by id (the snapshot keeps them alive while its planner is used) and
    by the number of their `pod_set_signature` (equal signatures, equal numbers), so that
    a lookup hashes small numbers rather than nested signatures. A plan that can be admitted
    depends on the queue only through its flavor signature, so queues with equal ones share
    it; one that cannot is made per queue (its reason names the queue).
    """

    __slots__ = (
        "_by_number",
        "_flavor_numbers",
        "_flavors",
        "_plans",
        "_queues",
        "_shapes",
        "_shared",
        "_sigs",
    )

    def __init__(self, flavors: Mapping[str, Flavor]) -> None:
        self._flavors = flavors
        self._shapes: dict[int, int] = {}  # id(pod set) -> its signature's number
        self._sigs: dict[PodSetSignature, int] = {}
        self._by_number: list[PodSetSignature] = []
        self._queues: dict[str, tuple[int, FlavorSignature]] = {}  # number and signature
        self._flavor_numbers: dict[FlavorSignature, int] = {}
        self._plans: dict[tuple[str, int], PodSetPlan] = {}  # by queue and shape number
        self._shared: dict[tuple[int, int], PodSetPlan] = {}  # by flavor and shape numbers

    def shape(self, pod_set: PodSet) -> int:
        """The number of `pod_set`'s signature: equal numbers, equal signatures."""
        found = self._shapes.get(id(pod_set))
        if found is None:
            signature = pod_set_signature(pod_set)
            found = self._sigs.get(signature)
            if found is None:
                found = self._sigs[signature] = len(self._by_number)
                self._by_number.append(signature)
            self._shapes[id(pod_set)] = found
        return found

    def plan(self, spec: QueueSpec, pod_set: PodSet) -> PodSetPlan:
        """`plan_pod_set(spec, flavors, pod_set)`, worked out once per queue and shape."""
        shape = self.shape(pod_set)
        key = (spec.name, shape)
        plan = self._plans.get(key)
        if plan is None:
            queue = self._queues.get(spec.name)
            if queue is None:
                signature = flavor_signature(spec, self._flavors)
                number = self._flavor_numbers.setdefault(signature, len(self._flavor_numbers))
                queue = self._queues[spec.name] = (number, signature)
            shared = (queue[0], shape)
            plan = self._shared.get(shared)
            if plan is None:
                plan = plan_pod_set(
                    spec, self._flavors, pod_set, (queue[1], self._by_number[shape])
                )
                if plan.impossible is None:
                    self._shared[shared] = plan
            self._plans[key] = plan
        return plan


# Shortfall, FitFailure and Fit are named tuples rather than frozen dataclasses: a cycle
# makes one or more for every flavor assignment it tries (tens of thousands), and a tuple
# is made several times faster.


class Shortfall(NamedTuple):
    """One flavor that could not take one resource: what was asked and what was left."""

    pod_set: str
    flavor: str
    resource: str
    requested: int


class FitFailure(NamedTuple):
    """The pod set that did not fit, and per flavor tried the first resource short."""

    pod_set: str
    shortfalls: tuple[Shortfall, ...]
    skipped: tuple[str, ...]


# What `assign_flavors` returns for a failure it was not asked to explain.
UNEXPLAINED = FitFailure("", (), ())


class Fit(NamedTuple):
    """A flavor per resource for every pod set, and the usage that admission charges."""

    flavors: tuple[dict[str, str], ...]  # per pod set, resource -> flavor
    usage: dict[FlavorResource, int]


class Room(Protocol):
    """What flavor assignment asks of a ledger: a `Ledger`, or one `WithinQuota` bounds."""

    def first_short(
        self,
        queue: str,
        pairs: Sequence[tuple[FlavorResource, int]],
        count: int,
        base: Mapping[FlavorResource, int],
    ) -> int: ...

    def headroom(self, queue: str, key: FlavorResource) -> int: ...


class WithinQuota:
    """A ledger's room, and no more than keeps every queue on a path within its quota: what
    a non-preemptible workload may take (it never borrows). Reads the ledger's usage as it
    is when asked, so one is made per request and ledger and used for the whole cycle."""

    __slots__ = ("ledger", "levels")

    def __init__(
        self,
        ledger: Ledger,
        path: Sequence[str],
        quotas: Mapping[str, Mapping[FlavorResource, int]],
    ) -> None:
        self.ledger = ledger
        # Per queue on the path: its quota and its usage in the ledger (the same dict the
        # ledger charges, so it is always current).
        self.levels = tuple((name, quotas[name], ledger.used[name]) for name in path)

    def first_short(
        self,
        queue: str,
        pairs: Sequence[tuple[FlavorResource, int]],
        count: int,
        base: Mapping[FlavorResource, int],
    ) -> int:
        """`Ledger.first_short`, with each queue's quota on the path as a limit too."""
        at = self.ledger.first_short(queue, pairs, count, base)
        for index in range(len(pairs) if at < 0 else at):
            key, amount = pairs[index]
            need = amount * count + base.get(key, 0)
            for _, quota, used in self.levels:
                if need > quota.get(key, 0) - used.get(key, 0):
                    return index
        return at

    def headroom(self, queue: str, key: FlavorResource) -> int:
        """`Ledger.headroom`, no more than the quota left on the path."""
        return min(self.ledger.headroom(queue, key), self.quota_left(key)[0])

    def quota_left(self, key: FlavorResource) -> tuple[int, str]:
        """What the tightest queue on the path has left of its quota of `key`, and its name
        (the nearest of equals)."""
        left, _, name = min(
            (quota.get(key, 0) - used.get(key, 0), i, name)
            for i, (name, quota, used) in enumerate(self.levels)
        )
        return left, name


def assign_flavors(
    queue: str,
    plans: Sequence[PodSetPlan],
    counts: Sequence[int],
    ledgers: Sequence[Room],
    excluded: frozenset[str] = frozenset(),
    explain: bool = True,
) -> Fit | FitFailure:
    """Pick flavors for the pod sets at `counts` pods so the whole workload fits every ledger.

    A scale-up slice's plans are pinned to the flavors it runs on (`PodSetPlan.pinned`).
    Flavors in `excluded` are not considered (their nodes
    could not take the pods). Pod sets are charged one after another, so two pod sets
    asking for the same flavor see each other's requests. With `explain` False a failure
    is `UNEXPLAINED`, for callers that only ask whether the workload fits (victim searches
    ask thousands of times a cycle).
    """
    usage: dict[FlavorResource, int] = {}
    chosen: list[dict[str, str]] = []
    for index, plan in enumerate(plans):
        count = counts[index]
        picked: dict[str, str] = {}
        for group in plan.groups:
            resources = group.resources
            options = group.options
            if excluded:
                options = tuple(o for o in options if o[0] not in excluded)
            shortfalls: list[Shortfall] = []
            for flavor, pairs in options:
                if count:
                    # The first resource short in any ledger, as asking each resource of
                    # every ledger in turn would find it.
                    short = -1
                    for ledger in ledgers:
                        at = ledger.first_short(queue, pairs, count, usage)
                        if at >= 0 and (short < 0 or at < short):
                            short = at
                    if short >= 0:
                        if explain:
                            key, amount = pairs[short]
                            need = amount * count + usage.get(key, 0)
                            shortfalls.append(
                                Shortfall(plan.pod_set.name, flavor, resources[short], need)
                            )
                        continue
                    for key, amount in pairs:
                        usage[key] = usage.get(key, 0) + amount * count
                for r in resources:
                    picked[r] = flavor
                break
            else:
                if not explain:
                    return UNEXPLAINED
                return FitFailure(plan.pod_set.name, tuple(shortfalls), plan.skipped)
        chosen.append(picked)
    return Fit(tuple(chosen), usage)


def assign_flavors_pair(
    queue: str,
    plans: Sequence[PodSetPlan],
    counts: Sequence[int],
    first: Room,
    second: Room,
) -> tuple[Fit | FitFailure, Fit | FitFailure | None]:
    """`assign_flavors` against both ledgers and, when that fails, against `second` alone
    (unexplained; None when both fit).

    A cycle asks both for every workload that does not fit once evictions are under way
    (the room may be promised to no one else yet: reserve it). For one pod set of one
    resource group, the usual shape, both come from one walk over the flavors, which
    checks each flavor against both ledgers anyway; otherwise from two calls.
    """
    if len(plans) != 1 or len(plans[0].groups) != 1 or not counts[0]:
        both = assign_flavors(queue, plans, counts, (first, second))
        if isinstance(both, Fit):
            return both, None
        return both, assign_flavors(queue, plans, counts, (second,), explain=False)
    plan, count = plans[0], counts[0]
    group = plan.groups[0]
    resources = group.resources
    shortfalls: list[Shortfall] = []
    alone: Fit | FitFailure = UNEXPLAINED
    for flavor, pairs in group.options:
        at = first.first_short(queue, pairs, count, _NO_USAGE)
        alone_at = second.first_short(queue, pairs, count, _NO_USAGE)
        fit = None
        if alone_at < 0 and alone is UNEXPLAINED:
            fit = alone = _fit_on(flavor, resources, pairs, count)
        short = alone_at if at < 0 or (0 <= alone_at < at) else at
        if short < 0:
            return fit or _fit_on(flavor, resources, pairs, count), None
        shortfalls.append(
            Shortfall(plan.pod_set.name, flavor, resources[short], pairs[short][1] * count)
        )
    return FitFailure(plan.pod_set.name, tuple(shortfalls), plan.skipped), alone


_NO_USAGE: Mapping[FlavorResource, int] = {}


def _fit_on(
    flavor: str,
    resources: Sequence[str],
    pairs: Sequence[tuple[FlavorResource, int]],
    count: int,
) -> Fit:
    """One pod set of one group on `flavor`, as `assign_flavors` makes it."""
    return Fit(({r: flavor for r in resources},), {key: amount * count for key, amount in pairs})


PodSetSignature = tuple[
    str, tuple[tuple[str, int], ...], tuple[tuple[str, str], ...], tuple[Toleration, ...]
]


def pod_set_signature(pod_set: PodSet) -> PodSetSignature:
    """What flavor planning depends on: equal signatures share one PodSetPlan."""
    return (
        pod_set.name,
        tuple(sorted(pod_set.per_pod.items())),
        tuple(sorted(pod_set.node_selector.items())),
        pod_set.tolerations,
    )


@dataclass(frozen=True, slots=True)
class SliceBase:
    """For a scale-up slice, per pod set: pods already running and their (sticky) flavors."""

    counts: tuple[int, ...]
    flavors: tuple[Mapping[str, str] | None, ...]


def slice_base(workload: Workload, running: Workload) -> SliceBase:
    """What `running` (the admitted slice that `workload` replaces) already holds per pod set.

    Pod sets the running slice lacks start from zero and choose flavors freely.
    """
    admitted = {a.pod_set: a for a in running.admission or ()}
    counts: list[int] = []
    pinned: list[Mapping[str, str] | None] = []
    for ps in workload.pod_sets:
        a = admitted.get(ps.name)
        counts.append(a.count if a is not None else 0)
        pinned.append(a.flavors if a is not None else None)
    return SliceBase(tuple(counts), tuple(pinned))
