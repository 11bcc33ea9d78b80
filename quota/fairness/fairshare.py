"""Hierarchical fair share per flavor and resource (see docs/fairness.md).

At the root the amount to share is the capacity of Ready nodes of each flavor, or, with no
nodes known, the sum of the root queues' quotas. Among siblings, each queue first gets
min(quota, demand capped by limit); what is left goes to priority buckets, highest first, and
inside a bucket is water-filled in proportion to over-quota weight, never above a queue's
limit or demand. Each parent's share is then split among its children the same way.
Everything is an exact integer; how indivisible units are handed out is documented in
docs/fairness.md and implemented by `_largest_remainder`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from quota.fairness.usage import adjust_weights
from quota.model.flavorassign import Planner, slice_base
from quota.model.resources import FlavorResource, add_into, flavor_resource, interned
from quota.model.snapshot import (
    PodSet,
    QueueSpec,
    QueueTree,
    Snapshot,
    Workload,
    admission_blocker,
    is_preemptible,
    pod_set_usage,
    queue_tree,
    superseded_slices,
)

# Over-quota weights are floats in the API; they are turned into integers at this scale so
# the water-filling below is exact. Two weights closer than one millionth count as equal.
WEIGHT_SCALE = 1_000_000

Vector = dict[FlavorResource, int]
# An admitted workload that holds quota, with the usage it holds.
Counted = tuple[Workload, Mapping[FlavorResource, int]]


@dataclass(frozen=True, slots=True)
class FairShare(Mapping[str, Mapping[FlavorResource, int]]):
    """Fair share of every queue (leaves and parents) per (flavor, resource).

    Reads like a mapping of queue name to shares; `usage` and `demand` have the same shape
    (subtree totals for parents), and `amount` is what was distributed at the root. A key
    missing from an inner mapping means zero.
    """

    shares: Mapping[str, Mapping[FlavorResource, int]]
    usage: Mapping[str, Mapping[FlavorResource, int]] = field(default_factory=dict)
    demand: Mapping[str, Mapping[FlavorResource, int]] = field(default_factory=dict)
    amount: Mapping[FlavorResource, int] = field(default_factory=dict)
    # Per queue, its admitted workloads that were counted (in the snapshot's order) with the
    # usage each was counted with, so that an admission cycle need not work it out again (a
    # large share of a big cycle's fixed cost). Not part of the result proper: ignored by
    # comparisons.
    queue_workloads: Mapping[str, Sequence[Counted]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # The snapshot they were counted from: a cycle on that very snapshot starts its ledger
    # from `usage` instead of summing every workload again. Ignored by comparisons too.
    snapshot: Snapshot | None = field(default=None, compare=False, repr=False)
    # The planner that planned the pending pod sets, and the queues with an admitted
    # workload already being evicted: what a cycle on the same snapshot would work out
    # again. Ignored by comparisons too.
    planner: Planner | None = field(default=None, compare=False, repr=False)
    evicting: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __getitem__(self, queue: str) -> Mapping[FlavorResource, int]:
        return self.shares[queue]

    def __iter__(self) -> Iterator[str]:
        return iter(self.shares)

    def __len__(self) -> int:
        return len(self.shares)


def root_amount(snapshot: Snapshot, tree: QueueTree) -> Vector:
    """What is shared at the root: Ready capacity, or the sum of the root queues' quotas."""
    if snapshot.capacity is not None:
        return interned(snapshot.capacity)
    amount: Vector = {}
    for name in tree.roots:
        for fq in snapshot.queues[name].flavors:
            for resource, quota in fq.quota.items():
                key = flavor_resource(fq.flavor, resource)
                amount[key] = amount.get(key, 0) + quota
    return amount


def usage_and_demand(
    snapshot: Snapshot,
    tree: QueueTree,
    per_queue: dict[str, list[Counted]] | None = None,
    planner: Planner | None = None,
    evicting: set[str] | None = None,
) -> tuple[dict[str, Vector], dict[str, Vector]]:
    """Usage of admitted workloads and demand (usage + pending requests), per queue subtree.

    A pending pod set counts toward every flavor that could host it, since the queue could
    take its request from any of them: demand is an upper bound per flavor. Pending
    workloads of queues that cannot admit (inactive, held, unknown) add no demand. A
    scale-up slice adds only its extra pods, on the flavors of the slice it replaces.
    `per_queue`, when given, receives per queue each counted admitted workload and its usage
    (queues in the order their first workload comes in the snapshot); `planner` plans the
    pending pod sets (and keeps the plans); `evicting` receives the queues with a counted
    workload already being evicted.
    """
    usage: dict[str, Vector] = {name: {} for name in snapshot.queues}
    demand: dict[str, Vector] = {name: {} for name in snapshot.queues}
    gone = superseded_slices(snapshot.admitted)
    # Only a pending scale-up slice looks up the slice it replaces: most cycles have none.
    by_key = (
        {w.key: w for w in snapshot.admitted if w.key not in gone}
        if any(w.replaces is not None for w in snapshot.pending)
        else {}
    )
    # Per queue met so far: its usage and its counted workloads (one lookup per workload).
    slots: dict[str, tuple[Vector, list[Counted]]] = {}
    for w in snapshot.admitted:
        if gone and w.key in gone:
            continue
        slot = slots.get(w.queue)
        if slot is None:
            target = usage.get(w.queue)
            if target is None:
                continue  # not a known queue
            slot = slots[w.queue] = (target, [])
        held = pod_set_usage(w, slot[0])
        if per_queue is not None:
            slot[1].append((w, held))
        if w.evicting and evicting is not None:
            evicting.add(w.queue)
    if per_queue is not None:
        per_queue.update((name, counted) for name, (_, counted) in slots.items())
    for name, vector in usage.items():
        add_into(demand[name], vector)
    # Pending pod sets of one shape in one queue share one plan: sum their pod counts first,
    # then spread the total over the flavors that could host them.
    pods: dict[tuple[str, int, bool], int] = {}
    shapes: dict[int, PodSet] = {}
    blocked: dict[str, bool] = {}
    # The queues with a preemptibility threshold: in the others only an annotated workload
    # can be non-preemptible (asked per pending workload, so the usual case costs no call).
    thresholds = {n for n, s in snapshot.queues.items() if s.preemptible_below is not None}
    for w in snapshot.pending:
        queue = w.queue
        if queue not in blocked:
            blocked[queue] = admission_blocker(snapshot.queues, tree, queue) is not None
        if blocked[queue]:
            continue
        within = (w.preemptible is not None or queue in thresholds) and not is_preemptible(
            w, snapshot.queues[queue]
        )
        running = by_key.get(w.replaces) if w.replaces is not None else None
        base = slice_base(w, running) if running is not None else None
        for index, ps in enumerate(w.pod_sets):
            count = ps.count
            if base is not None:
                count -= base.counts[index]
                pinned = base.flavors[index]
                if pinned is not None:
                    target = demand[queue]
                    if count > 0:
                        for resource, amount in ps.per_pod.items():
                            flavor = pinned.get(resource)
                            if flavor is not None and amount:
                                key = flavor_resource(flavor, resource)
                                target[key] = target.get(key, 0) + amount * count
                    continue
            if count <= 0:
                continue
            shape = (queue, id(ps), within)
            pods[shape] = pods.get(shape, 0) + count
            shapes[id(ps)] = ps
    if planner is None:
        planner = Planner(snapshot.flavors)
    # Non-preemptible workloads never borrow: what they ask beyond their queue's quota left
    # is no demand for surplus (it would give a queue a share it cannot use).
    within_quota: dict[str, Vector] = {}
    for (queue, shape_id, within), count in pods.items():
        ps = shapes[shape_id]
        spec = snapshot.queues[queue]
        plan = planner.plan(spec, ps)
        target = within_quota.setdefault(queue, {}) if within else demand[queue]
        for group in plan.groups:
            for _, pairs in group.options:
                for key, amount in pairs:
                    target[key] = target.get(key, 0) + amount * count
    for queue, asked in within_quota.items():
        quotas, used, target = snapshot.queues[queue].quotas, usage[queue], demand[queue]
        for key, amount in asked.items():
            left = max(0, quotas.get(key, 0) - used.get(key, 0))
            target[key] = target.get(key, 0) + min(amount, left)
    _roll_up(tree, usage)
    _roll_up(tree, demand)
    return usage, demand


def _roll_up(tree: QueueTree, vectors: dict[str, Vector]) -> None:
    """Add every queue's own amounts into all its ancestors."""
    # Copied first: an inner queue may have amounts of its own, and only those go up.
    own = {name: dict(v) for name, v in vectors.items() if v}
    for name, vector in own.items():
        for ancestor in tree.paths[name][1:]:
            add_into(vectors[ancestor], vector)


def fair_share(snapshot: Snapshot) -> FairShare:
    """Compute every queue's fair share, usage and demand for one snapshot."""
    tree = queue_tree(snapshot.queues)
    per_queue: dict[str, list[Counted]] = {}
    planner = Planner(snapshot.flavors)
    evicting: set[str] = set()
    usage, demand = usage_and_demand(snapshot, tree, per_queue, planner, evicting)
    amount = root_amount(snapshot, tree)
    weights = _weights(snapshot, tree)
    shares = distribute(snapshot.queues, tree, demand, amount, weights)
    return FairShare(
        shares,
        usage,
        demand,
        amount,
        queue_workloads=per_queue,
        snapshot=snapshot,
        planner=planner,
        evicting=frozenset(evicting),
    )


def _weights(snapshot: Snapshot, tree: QueueTree) -> dict[str, int]:
    """Integer over-quota weights, shifted by recent usage when time-based fairness is on."""
    raw = {name: spec.over_quota_weight for name, spec in snapshot.queues.items()}
    if snapshot.historical_usage and snapshot.usage_fairness_k:
        for group in (tree.roots, *tree.children.values()):
            if not group:
                continue
            siblings = {name: raw[name] for name in group}
            used = {name: snapshot.historical_usage.get(name, 0.0) for name in group}
            raw.update(adjust_weights(siblings, used, snapshot.usage_fairness_k))
    return {name: weight_units(w) for name, w in raw.items()}


def weight_units(weight: float) -> int:
    """An over-quota weight as the integer the water-filling works with."""
    return max(0, round(weight * WEIGHT_SCALE))


def distribute(
    queues: Mapping[str, QueueSpec],
    tree: QueueTree,
    demand: Mapping[str, Mapping[FlavorResource, int]],
    amount: Mapping[FlavorResource, int],
    weights: Mapping[str, int] | None = None,
) -> dict[str, Vector]:
    """Split `amount` down the tree given each queue's subtree `demand` (the pure algorithm).

    `weights` are integer over-quota weights (default: each queue's weight x WEIGHT_SCALE).
    """
    shares: dict[str, Vector] = {name: {} for name in queues}
    # Groups of siblings, each with the amount it splits: the root group first, then every
    # parent's children once the parent's own share is known (parents before children).
    pending: list[tuple[tuple[str, ...], Mapping[FlavorResource, int]]] = [(tree.roots, amount)]
    while pending:
        group, available = pending.pop()
        if not group:
            continue
        _split_group(queues, group, demand, available, weights, shares)
        for name in group:
            kids = tree.children.get(name)
            if kids:
                pending.append((kids, shares[name]))
    return shares


def _split_group(
    queues: Mapping[str, QueueSpec],
    group: tuple[str, ...],
    demand: Mapping[str, Mapping[FlavorResource, int]],
    available: Mapping[FlavorResource, int],
    weights: Mapping[str, int] | None,
    shares: dict[str, Vector],
) -> None:
    # Every sibling, per key: the hot loop of fair share, some 4,400 (sibling, key) steps
    # for a tree of 1,110 queues, each two dictionary reads and a min. What only the
    # over-quota phase needs (wants capped by limits, weights, priority buckets) is worked
    # out on first use: in many groups the guarantees alone take all there is.
    empty: Mapping[FlavorResource, int] = {}
    demands = [demand.get(name, empty) for name in group]
    keys = sorted(k for k in set().union(*demands) if available.get(k, 0) > 0)
    if not keys:
        return
    specs = [queues[name] for name in group]
    pairs = [(d, s.quotas) for d, s in zip(demands, specs, strict=True)]
    # Few queues have limits: their grants are corrected after the plain min(quota, demand)
    # rather than a limit being looked for on every sibling's step.
    limited = [(i, s.limits) for i, s in enumerate(specs) if s.limits]
    names = list(group)
    w: list[int] = []
    buckets: list[list[int]] = []
    outs = [shares[name] for name in group]
    for key in keys:
        total = available[key]
        # min(quota, demand) per sibling, as one comprehension (a loop of appends, with a
        # limit looked for on every step, took about half as long again). Amounts are never
        # negative (quantities are refused negative), so no demand means a grant of
        # min(quota, 0) = 0 without a case of its own.
        grants = [
            q if q < want else want
            for d, quotas in pairs
            for want in (d.get(key, 0),)
            for q in (quotas.get(key, 0),)
        ]
        for i, limits in limited:
            limit = limits.get(key)
            if limit is not None and limit < grants[i]:
                # The grant was min(quota, demand): capping demand at the limit caps it too.
                grants[i] = limit
        claimed = sum(grants)
        if claimed > total:
            # Guarantees add up to more than there is (overcommitted quota, or nodes
            # missing): the in-quota claims are scaled down in proportion.
            grants = _largest_remainder(total, grants, names)
        elif claimed < total:
            if not w:
                w = (
                    [weight_units(s.over_quota_weight) for s in specs]
                    if weights is None
                    else [weights.get(name, 0) for name in group]
                )
                priorities = sorted({s.priority for s in specs}, reverse=True)
                buckets = (
                    [[i for i, s in enumerate(specs) if s.priority == p] for p in priorities]
                    if len(priorities) > 1
                    else [list(range(len(specs)))]
                )
            # What each sibling could take at most: its demand, capped by its limit.
            caps = [d.get(key, 0) for d in demands]
            for i, limits in limited:
                limit = limits.get(key)
                if limit is not None and limit < caps[i]:
                    caps[i] = limit
            # Weight 0 means never more than quota, even when everything would fit.
            wants = [c if w[i] > 0 else grants[i] for i, c in enumerate(caps)]
            if sum(wants) <= total:
                grants = wants
            else:
                left = total - claimed
                for bucket in buckets:
                    wanting = [i for i in bucket if caps[i] > grants[i] and w[i] > 0]
                    if not wanting:
                        continue
                    left -= _water_fill(left, wanting, caps, grants, w, names)
                    if left <= 0:
                        break
        for out, grant in zip(outs, grants, strict=True):
            if grant:
                out[key] = grant


def _largest_remainder(total: int, claims: list[int], names: list[str]) -> list[int]:
    """Split `total` < sum(claims) in proportion to claims, in whole units.

    Each gets the floor of its exact share; the units left over go one each to the largest
    fractional remainders, ties to the alphabetically first name.
    """
    count = len(claims)
    if claims.count(claims[0]) == count:
        # Siblings often claim the same (teams with equal quotas, all asking for more):
        # each exact share is total / count, and every remainder is the same, so the units
        # left over go to the alphabetically first names.
        share, leftover = divmod(total, count)
        out = [share] * count
        if leftover:
            for i in sorted(range(count), key=names.__getitem__)[:leftover]:
                out[i] += 1
        return out
    whole = sum(claims)
    # Equal claims among unequal ones are still divided once, the big-integer products
    # being the costly part.
    divided: dict[int, tuple[int, int]] = {}
    split = []
    for claim in claims:
        parts = divided.get(claim)
        if parts is None:
            parts = divided[claim] = divmod(total * claim, whole)
        split.append(parts)
    out = [share for share, _ in split]
    leftover = total - sum(out)
    if leftover:
        remainders = sorted((-rem, names[i], i) for i, (_, rem) in enumerate(split) if rem)
        for _, _, i in remainders[:leftover]:
            out[i] += 1
    return out


def _water_fill(
    left: int,
    wanting: list[int],
    caps: list[int],
    grants: list[int],
    weights: list[int],
    names: list[str],
) -> int:
    """Raise `grants` of `wanting` toward `caps` in proportion to weight; return units given.

    Exact: a queue is filled to its cap when its remaining want per unit of weight is at most
    the current water level (left / total weight); the level only rises as such queues drop
    out. The rest share what is left in proportion to weight, floored, and the leftover
    units go to the largest remainders (ties by name).
    """
    want = {i: caps[i] - grants[i] for i in wanting}
    total_want = sum(want.values())
    if total_want <= left:
        for i, amount in want.items():
            grants[i] += amount
        return total_want
    given = 0
    active = list(wanting)
    weight = sum(weights[i] for i in active)
    while active:
        full = [i for i in active if want[i] * weight <= left * weights[i]]
        if not full:
            break
        for i in full:
            grants[i] += want[i]
            given += want[i]
            left -= want[i]
            weight -= weights[i]
        done = set(full)
        active = [i for i in active if i not in done]
    if active and left > 0:
        remainders: list[tuple[int, str, int]] = []
        handed = 0
        for i in active:
            share, rem = divmod(left * weights[i], weight)
            grants[i] += share
            handed += share
            if rem:
                remainders.append((-rem, names[i], i))
        remainders.sort()
        extra = left - handed
        for _, _, i in remainders[:extra]:
            grants[i] += 1
        given += left
    return given
