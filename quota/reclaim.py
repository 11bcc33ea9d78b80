"""Reclaim: a queue below its fair share takes capacity back from queues above theirs.

Two rules are tried in turn, both judged at the level where the two queues meet (every queue
on each side's path below their lowest common ancestor):

1. fair share: after the transfer the reclaimer's queues stay at or below their fair share
   and the victim's queues stay at or above theirs (and never below their quota);
2. quota: while the reclaimer's queues stay within their quota, the victim's queues may be
   taken down to their quota, even if that leaves them below their fair share.

Either way in-quota usage of a queue at or below its quota is never reclaimed, and because
the reclaimer ends no higher than the level the victim keeps, the victim can never
reclaim the same capacity straight back (no ping-pong). Minimum runtimes protect young
workloads, and policy LowerPriority only reclaims workloads of lower priority.

The search is bounded by what could possibly be given back: each leaf offers only its least
important workloads that fit in what it holds above its floor, the offers are taken in
victim order while every queue on the victim's side stays above its floor, and the walk
stops as soon as the freed room could be enough. The usual greedy-then-reprieve search
(quota/preemption.py) then picks the final victims among those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from quota.flavorassign import Fit
from quota.ledger import Ledger
from quota.preemption import Candidate, select_victims, started_at, victim_order
from quota.resources import FlavorResource, format_amount
from quota.snapshot import QueueSpec, QueueTree, Workload

Rule = Literal["fair share", "quota"]
_RULES: tuple[Rule, ...] = ("fair share", "quota")

Vector = Mapping[FlavorResource, int]
_NOTHING: Vector = {}


@dataclass(frozen=True, slots=True)
class ReclaimPlan:
    """Victims that make room, and the rule that allowed taking them."""

    victims: tuple[Candidate, ...]
    rule: Rule
    reasons: Mapping[str, str]  # victim key -> reason


def lowest_common_ancestor(tree: QueueTree, a: str, b: str) -> str | None:
    """The deepest queue on both paths, or None when they sit under different roots."""
    other = set(tree.paths[b])
    for name in tree.paths[a]:
        if name in other:
            return name
    return None


def below(tree: QueueTree, queue: str, ancestor: str | None) -> tuple[str, ...]:
    """`queue` and its ancestors strictly below `ancestor` (the whole path for None)."""
    path = tree.paths[queue]
    if ancestor is None:
        return path
    return path[: path.index(ancestor)]


class _Levels:
    """Floors (what a victim's queue keeps) and ceilings (what the reclaimer may reach)."""

    def __init__(
        self, rule: Rule, shares: Mapping[str, Vector], quotas: Mapping[str, Vector]
    ) -> None:
        self.rule = rule
        self.shares = shares
        self.quotas = quotas

    def floor(self, queue: str, key: FlavorResource) -> int:
        quota = self.quotas.get(queue, {}).get(key, 0)
        if self.rule == "quota":
            return quota
        share = self.shares.get(queue, {}).get(key, 0)
        return share if share > quota else quota

    def ceiling(self, queue: str, key: FlavorResource) -> int:
        source = self.shares if self.rule == "fair share" else self.quotas
        return source.get(queue, {}).get(key, 0)


def plan_reclaim(
    preemptor: Workload,
    queue: QueueSpec,
    queues: Mapping[str, QueueSpec],
    tree: QueueTree,
    index: ReclaimIndex,
    excluded: set[str],
    relevant: set[FlavorResource],
    shares: Mapping[str, Vector],
    quotas: Mapping[str, Vector],
    ledger: Ledger,
    now: float,
    try_fit: Callable[[], Fit | None],
    could_stay_under: Callable[[Callable[[FlavorResource], int]], bool],
    covered: Callable[[Mapping[FlavorResource, int]], bool],
) -> ReclaimPlan | None:
    """Find workloads of other queues whose eviction lets `preemptor` fit, or None.

    `ledger` is the cycle's planned usage; on success the victims stay released in it.
    `try_fit` assigns flavors to the preemptor against that ledger; `could_stay_under(bound)`
    tells whether some flavor choice keeps the preemptor's queue within `bound` per key;
    `covered(freed)` whether freeing `freed` could be enough room for some flavor choice.
    """
    if queue.reclaim == "Never":
        return None
    own_path = tree.paths[queue.name]
    meet: dict[str, str | None] = {}

    def meeting(victim_queue: str) -> str | None:
        if victim_queue not in meet:
            meet[victim_queue] = lowest_common_ancestor(tree, queue.name, victim_queue)
        return meet[victim_queue]

    for rule in _RULES:
        levels = _Levels(rule, shares, quotas)
        # The reclaimer must have room under its ceiling somewhere it could use.
        if not could_stay_under(partial(levels.ceiling, queue.name)):
            continue
        if not covered(index.freeable(rule, queue.name, relevant)):
            continue  # even all that other subtrees hold above their floors would not do
        candidates = _walk(
            preemptor,
            queue,
            queues,
            tree,
            index,
            excluded,
            relevant,
            levels,
            ledger,
            now,
            meeting,
            covered,
        )
        if not candidates:
            continue

        def allowed(candidate: Candidate, levels: _Levels = levels) -> bool:
            for name in below(tree, candidate.queue, meeting(candidate.queue)):
                used = ledger.used[name]
                for key, amount in candidate.usage.items():
                    if key in relevant and used.get(key, 0) - amount < levels.floor(name, key):
                        return False
            return True

        def fits(chosen: Sequence[Candidate], levels: _Levels = levels) -> bool:
            fit = try_fit()
            if fit is None:
                return False
            depth = 0
            for candidate in chosen:
                top = meeting(candidate.queue)
                depth = len(own_path) if top is None else max(depth, own_path.index(top))
            for name in own_path[:depth]:
                used = ledger.used[name]
                for key, amount in fit.usage.items():
                    if used.get(key, 0) + amount > levels.ceiling(name, key):
                        return False
            return True

        victims = select_victims(candidates, ledger, fits, allowed)
        if victims is not None:
            reasons = {
                v.workload.key: _reason(preemptor, queue.name, v, victims, levels, ledger, relevant)
                for v in victims
            }
            return ReclaimPlan(tuple(victims), rule, reasons)
    return None


class ReclaimIndex:
    """The admitted workloads of a cycle as reclaim candidates, per leaf in victim order, and
    what each subtree could give back under each rule.

    Built once per cycle. A search first asks whether everything the other subtrees could
    give without dropping below their floors would be enough (a few lookups per key), and
    then only looks at leaves that have something to give, and in each only at the least
    important workloads that fit in what it can give. The figures follow the ledger: it
    records which queues it charged, and only their paths are refreshed.
    """

    __slots__ = (
        "_avail",
        "_kids",
        "_ledger",
        "_levels",
        "_seen",
        "_top",
        "_tree",
        "by_leaf",
        "giving",
    )

    def __init__(
        self,
        candidates: Sequence[Candidate],
        ledger: Ledger,
        tree: QueueTree,
        shares: Mapping[str, Vector],
        quotas: Mapping[str, Vector],
    ) -> None:
        by_leaf: dict[str, list[Candidate]] = {}
        for c in candidates:
            by_leaf.setdefault(c.queue, []).append(c)
        for found in by_leaf.values():
            found.sort(key=victim_order)
        self.by_leaf = by_leaf
        self._ledger = ledger
        self._tree = tree
        self._levels = {rule: _Levels(rule, shares, quotas) for rule in _RULES}
        # Per rule and queue: what the subtree can give (min of its own spare above its floor
        # and what its children can give), and the sum of that over its children; _top sums
        # the roots. `giving` holds the leaves with anything to give.
        self._avail: dict[Rule, dict[str, dict[FlavorResource, int]]] = {r: {} for r in _RULES}
        self._kids: dict[Rule, dict[str, dict[FlavorResource, int]]] = {r: {} for r in _RULES}
        self._top: dict[Rule, dict[FlavorResource, int]] = {r: {} for r in _RULES}
        self.giving: dict[Rule, set[str]] = {r: set() for r in _RULES}
        if ledger.touched is None:
            ledger.touched = []
        self._seen = len(ledger.touched)
        for leaf in sorted(by_leaf):
            self._refresh(leaf)

    def _refresh(self, leaf: str) -> None:
        tree = self._tree
        for rule, levels in self._levels.items():
            avail, kids = self._avail[rule], self._kids[rule]
            for name in tree.paths[leaf]:
                used = self._ledger.used[name]
                below_kids = kids.get(name)
                inner = bool(tree.children.get(name))
                new: dict[FlavorResource, int] = {}
                for key, held in used.items():
                    give = held - levels.floor(name, key)
                    if inner:
                        give = min(give, below_kids.get(key, 0) if below_kids else 0)
                    if give > 0:
                        new[key] = give
                old = avail.get(name, {})
                avail[name] = new
                parent = tree.paths[name][1] if len(tree.paths[name]) > 1 else None
                target = self._top[rule] if parent is None else kids.setdefault(parent, {})
                for key in old.keys() | new.keys():
                    delta = new.get(key, 0) - old.get(key, 0)
                    if delta:
                        target[key] = target.get(key, 0) + delta
            if avail.get(leaf):
                self.giving[rule].add(leaf)
            else:
                self.giving[rule].discard(leaf)

    def sync(self) -> None:
        """Catch up with the ledger's charges since the last call."""
        touched = self._ledger.touched
        assert touched is not None
        if self._seen < len(touched):
            for name in sorted(set(touched[self._seen :])):
                if self._tree.is_leaf(name):
                    self._refresh(name)
            self._seen = len(touched)

    def available(self, rule: Rule) -> Mapping[str, Mapping[FlavorResource, int]]:
        """Per queue, what its subtree could give under `rule` (current after `sync`)."""
        return self._avail[rule]

    def freeable(
        self, rule: Rule, queue: str, keys: Iterable[FlavorResource]
    ) -> dict[FlavorResource, int]:
        """At most what reclaim under `rule` could free for `queue`: what every sibling
        subtree along its path could give."""
        self.sync()
        avail, kids, top = self._avail[rule], self._kids[rule], self._top[rule]
        path = self._tree.paths[queue]
        out: dict[FlavorResource, int] = {}
        for key in keys:
            total = 0
            for i, name in enumerate(path):
                pool = top if i + 1 == len(path) else kids.get(path[i + 1], {})
                total += pool.get(key, 0) - avail.get(name, {}).get(key, 0)
            out[key] = total
        return out


def _walk(
    preemptor: Workload,
    queue: QueueSpec,
    queues: Mapping[str, QueueSpec],
    tree: QueueTree,
    index: ReclaimIndex,
    excluded: set[str],
    relevant: set[FlavorResource],
    levels: _Levels,
    ledger: Ledger,
    now: float,
    meeting: Callable[[str], str | None],
    covered: Callable[[Mapping[FlavorResource, int]], bool],
) -> list[Candidate]:
    """Candidates this rule lets go, least important first, until enough could be freed.

    Every queue on the victim's side keeps its floor: each has a budget (what it holds above
    its floor) that accepted candidates use up, exactly as the removals would. Returns []
    when even every allowed candidate would not free enough.
    """
    lower_only = queue.reclaim == "LowerPriority"
    avail = index.available(levels.rule)
    # Per leaf with something to give, its least important workloads that fit in what its
    # subtree can give (checked against the leaf's own budget, cumulatively).
    pool: list[tuple[tuple[str, ...], Candidate]] = []
    for leaf in index.giving[levels.rule]:
        if leaf == queue.name:
            continue
        chain = below(tree, leaf, meeting(leaf))
        top = avail.get(chain[-1], _NOTHING)
        budget = {k: v for k, v in avail.get(leaf, _NOTHING).items() if k in relevant}
        if not budget or not any(top.get(k, 0) > 0 for k in budget):
            continue
        min_runtime = queues[leaf].min_runtime_reclaim_s
        for candidate in index.by_leaf.get(leaf, ()):
            w = candidate.workload
            if lower_only and w.priority >= preemptor.priority:
                break  # sorted by priority, lowest first
            fits_budget = touches = False
            for k, amount in candidate.usage.items():
                if k in relevant:
                    touches = True
                    fits_budget = budget.get(k, 0) >= amount and top.get(k, 0) >= amount
                    if not fits_budget:
                        break
            if not (touches and fits_budget):
                continue
            if w.key in excluded or (min_runtime and now - started_at(w) < min_runtime):
                continue
            for k, amount in candidate.usage.items():
                if k in budget:
                    budget[k] -= amount
            pool.append((chain, candidate))
            if all(v <= 0 for v in budget.values()):
                break
    pool.sort(key=lambda entry: victim_order(entry[1]))
    budgets: dict[str, dict[FlavorResource, int]] = {}
    freed: dict[FlavorResource, int] = {}
    out: list[Candidate] = []
    for chain, candidate in pool:
        taking = [(k, amount) for k, amount in candidate.usage.items() if k in relevant]
        within = True
        for name in chain:
            left = budgets.get(name)
            if left is None:
                used = ledger.used[name]
                left = {k: used.get(k, 0) - levels.floor(name, k) for k in relevant}
                budgets[name] = left
            if any(left[k] < amount for k, amount in taking):
                within = False
                break
        if not within:
            continue
        for name in chain:
            left = budgets[name]
            for k, amount in taking:
                left[k] -= amount
        for k, amount in taking:
            freed[k] = freed.get(k, 0) + amount
        out.append(candidate)
        if covered(freed):
            return out
    return []


def _reason(
    preemptor: Workload,
    reclaimer: str,
    victim: Candidate,
    victims: Sequence[Candidate],
    levels: _Levels,
    ledger: Ledger,
    relevant: set[FlavorResource],
) -> str:
    """Explain with numbers why `victim`'s queue had to give capacity back."""
    key = next((k for k in sorted(victim.usage) if k in relevant), next(iter(victim.usage)))
    flavor, resource = key
    held = ledger.used[victim.queue].get(key, 0) + sum(
        v.usage.get(key, 0) for v in victims if v.queue == victim.queue
    )
    level = levels.floor(victim.queue, key)
    amount = f"{format_amount(resource, held)} in use"
    if levels.rule == "fair share":
        return (
            f"reclaimed by queue {reclaimer}, below its fair share, for {preemptor.key}: queue "
            f"{victim.queue} is above its fair share of {resource} in flavor {flavor} "
            f"({amount}, keeps {format_amount(resource, level)})"
        )
    return (
        f"reclaimed by queue {reclaimer}, within its quota, for {preemptor.key}: queue "
        f"{victim.queue} uses more {resource} in flavor {flavor} than its quota "
        f"({amount}, quota {format_amount(resource, level)})"
    )
