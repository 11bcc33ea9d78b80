"""Fair share as computed for speed equals the plain algorithm, exactly, on random trees.

The reference below is the split as docs/fairness.md states it, written for reading, not
speed (and as `distribute` was before it was made faster): per (flavor, resource), each
sibling gets min(quota, demand capped by limit), scaled down by largest remainders when the
guarantees exceed what there is; otherwise the rest is water-filled by weight, bucket by
priority, highest first. Drawn: zero weights, zero quotas, limits below quota, zero and
overcommitted amounts, empty trees, equal and unequal claims.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.fairness.fairshare import distribute, weight_units
from quota.model.resources import FlavorResource
from quota.model.snapshot import QueueSpec, QueueTree, queue_tree
from tests.unit.strategies import CPU, GPU, queue_trees

Vector = dict[FlavorResource, int]


def _largest_remainder(total: int, claims: list[int], names: list[str]) -> list[int]:
    whole = sum(claims)
    out = [total * claim // whole for claim in claims]
    order = sorted(range(len(claims)), key=lambda i: (-(total * claims[i] % whole), names[i]))
    for i in [i for i in order if total * claims[i] % whole][: total - sum(out)]:
        out[i] += 1
    return out


def _water_fill(left: int, wanting: list[int], caps: list[int], grants: list[int], w: list[int],
                names: list[str]) -> int:  # fmt: skip
    want = {i: caps[i] - grants[i] for i in wanting}
    if sum(want.values()) <= left:
        for i, amount in want.items():
            grants[i] += amount
        return sum(want.values())
    given = 0
    active = list(wanting)
    while True:
        weight = sum(w[i] for i in active)
        full = [i for i in active if want[i] * weight <= left * w[i]]
        if not full:
            break
        for i in full:
            grants[i] += want[i]
            given += want[i]
            left -= want[i]
        active = [i for i in active if i not in full]
    if active and left > 0:
        weight = sum(w[i] for i in active)
        shares = _largest_remainder(left, [w[i] for i in active], [names[i] for i in active])
        for i, share in zip(active, shares, strict=True):
            grants[i] += share
        given += left
    return given


def reference(
    queues: Mapping[str, QueueSpec],
    tree: QueueTree,
    demand: Mapping[str, Vector],
    amount: Vector,
) -> dict[str, Vector]:
    shares: dict[str, Vector] = {name: {} for name in queues}
    todo: list[tuple[tuple[str, ...], Mapping[FlavorResource, int]]] = [(tree.roots, amount)]
    while todo:
        group, available = todo.pop()
        names = list(group)
        specs = [queues[n] for n in names]
        w = [weight_units(s.over_quota_weight) for s in specs]
        keys = sorted({k for n in names for k in demand.get(n, {})})
        for key in keys:
            total = available.get(key, 0)
            if total <= 0:
                continue
            caps, grants = [], []
            for n, s in zip(names, specs, strict=True):
                want = demand.get(n, {}).get(key, 0)
                limit = s.limits.get(key)
                cap = 0 if want <= 0 else want if limit is None else min(want, limit)
                caps.append(cap)
                grants.append(0 if want <= 0 else min(s.quotas.get(key, 0), cap))
            if sum(grants) > total:
                grants = _largest_remainder(total, grants, names)
            elif sum(grants) < total:
                wants = [c if w[i] > 0 else grants[i] for i, c in enumerate(caps)]
                if sum(wants) <= total:
                    grants = wants
                else:
                    left = total - sum(grants)
                    for p in sorted({s.priority for s in specs}, reverse=True):
                        bucket = [i for i, s in enumerate(specs) if s.priority == p]
                        wanting = [i for i in bucket if caps[i] > grants[i] and w[i] > 0]
                        if wanting:
                            left -= _water_fill(left, wanting, caps, grants, w, names)
                            if left <= 0:
                                break
            for n, grant in zip(names, grants, strict=True):
                if grant:
                    shares[n][key] = grant
        for n in names:
            if tree.children.get(n):
                todo.append((tree.children[n], shares[n]))
    return shares


KEYS = [("h100", GPU), ("h100", CPU), ("a100", GPU), ("a100", CPU)]


@st.composite
def inputs(draw: st.DrawFn) -> tuple[dict[str, QueueSpec], dict[str, Vector], Vector]:
    queues = draw(
        queue_trees(flavors=("h100", "a100"), resources=(GPU, CPU), max_queues=12, min_queues=0)
    )
    tree = queue_tree(queues)
    # Demand as usage_and_demand leaves it: every subtree's total, here drawn per leaf and
    # rolled up (equal claims are likely: quotas are drawn from a few small values).
    demand: dict[str, Vector] = {name: {} for name in queues}
    for name in queues:
        if tree.is_leaf(name):
            for key in KEYS:
                amount = draw(st.sampled_from((0, 0, 1, 3, 6, 40, 10**15)))
                for up in tree.paths[name]:
                    demand[up][key] = demand[up].get(key, 0) + amount
    amount = {key: draw(st.sampled_from((0, 1, 5, 17, 60, 10**16))) for key in KEYS}
    return queues, demand, amount


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs())
def test_distribute_equals_the_plain_split(
    drawn: tuple[dict[str, QueueSpec], dict[str, Vector], Vector],
) -> None:
    queues, demand, amount = drawn
    tree = queue_tree(queues)
    assert distribute(queues, tree, demand, amount) == reference(queues, tree, demand, amount)
