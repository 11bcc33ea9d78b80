"""Reclaim: a queue below its fair share takes capacity back from queues above theirs.

Two rules are tried in turn, both judged at the level where the two queues meet (every queue
on each side's path below their lowest common ancestor). The victim's side is judged only on
the resources in contention: the (flavor, resource) pairs the preemptor is short of. A team
borrowing GPUs far beyond its quota gives them back even while its cpu is within quota, as
in Kueue and KAI; judging every resource a victim holds would let in-quota cpu shield
borrowed GPUs forever. The reclaimer's side is judged on everything it would use.

1. fair share: after the transfer the reclaimer's queues stay at or below their fair share
   and the victim's queues stay at or above theirs (and never below their quota);
2. quota: while the reclaimer's queues stay within their quota, the victim's queues may be
   taken down to their quota, even if that leaves them below their fair share.

Either way in-quota usage of a queue at or below its quota is never reclaimed, and because
the reclaimer ends no higher than the level the victim keeps, the victim can never
reclaim the same capacity straight back (no ping-pong). Minimum runtimes protect young
workloads, and policy LowerPriority only reclaims workloads of lower priority.

A search that cannot succeed stops before looking at any workload: if a queue on the
reclaimer's path has no room under its ceiling or limit, only its subtree is searched
(`_reach`), and if all that the reachable subtrees hold above their floors would not be
enough, nothing is searched (`ReclaimIndex.freeable`, kept up to date per leaf). Otherwise
the reachable leaves' candidates, each leaf's already in victim order, are merged lazily and
taken while every queue on the victim's side stays above its floor, until the freed room
could be enough. Where small candidates use up a floor's budget that one larger candidate
alone would fit, sets anchored on each candidate the greedy set left out follow, in victim
order (`_walk`), so a single sufficient victim is always found. The usual
greedy-then-reprieve search (victims.py) then picks the final victims of the first set that
makes room.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from quota.model.flavorassign import Fit
from quota.model.ledger import Ledger
from quota.model.resources import FlavorResource, format_amount
from quota.model.snapshot import QueueSpec, QueueTree, Workload
from quota.model.transaction import Transaction
from quota.preemption.victims import Candidate, VictimKey, select_victims, started_at

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

    __slots__ = ("_floors", "quotas", "rule", "shares")

    def __init__(
        self, rule: Rule, shares: Mapping[str, Vector], quotas: Mapping[str, Vector]
    ) -> None:
        self.rule = rule
        self.shares = shares
        self.quotas = quotas
        self._floors: dict[str, Vector] = {}

    def floor(self, queue: str, key: FlavorResource) -> int:
        return self.floors(queue).get(key, 0)

    def floors(self, queue: str) -> Vector:
        """`floor(queue, key)` for every key (a missing key: 0): the queue's quota, or under
        the fair-share rule the larger of quota and fair share. Worked out once per queue:
        the reclaim index asks for every key a queue holds each time it is refreshed."""
        found = self._floors.get(queue)
        if found is None:
            quota = self.quotas.get(queue, _NOTHING)
            if self.rule == "quota":
                found = quota
            else:
                larger = dict(quota)
                for key, share in self.shares.get(queue, _NOTHING).items():
                    if share > larger.get(key, 0):
                        larger[key] = share
                found = larger
            self._floors[queue] = found
        return found

    def ceiling(self, queue: str, key: FlavorResource) -> int:
        return self.ceilings(queue).get(key, 0)

    def ceilings(self, queue: str) -> Vector:
        """`ceiling(queue, key)` for every key (a missing key: 0)."""
        source = self.shares if self.rule == "fair share" else self.quotas
        return source.get(queue, _NOTHING)


def plan_reclaim(
    preemptor: Workload,
    queue: QueueSpec,
    queues: Mapping[str, QueueSpec],
    tree: QueueTree,
    index: ReclaimIndex,
    excluded: set[str],
    contended: set[FlavorResource],
    ledger: Ledger,
    now: float,
    try_fit: Callable[[], Fit | None],
    could_stay_under: Callable[[str, Vector, Vector | None], bool],
    covered: Callable[[Mapping[FlavorResource, int]], bool],
    tx: Transaction | None = None,
    single: bool = True,
) -> ReclaimPlan | None:
    """Find workloads of other queues whose eviction lets `preemptor` fit, or None.

    `contended` holds the (flavor, resource) pairs the preemptor is short of: victims must
    hold some of them, and their queues' floors are judged on them alone. The reclaimer's
    ceiling is judged on everything it would use: ending above its level on any resource
    would only make it the next queue to be reclaimed from.
    Floors and ceilings come from the fair shares and quotas `index` was built with.
    `ledger` is the cycle's planned usage; on success the victims stay released in it
    (journaled in `tx` when given, see `select_victims`, as is `single`).
    `try_fit` assigns flavors to the preemptor against that ledger;
    `could_stay_under(queue, ceiling, limits)` tells whether some flavor choice keeps the
    planned usage of `queue` (the preemptor's leaf or an ancestor) plus the request within
    `ceiling` (a missing key: 0) and `limits` (a missing key: no limit);
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
        levels = index.levels(rule)
        reach = _reach(own_path, levels, ledger, could_stay_under)
        if not reach:
            continue  # the reclaimer's own queue has no room under its ceiling or limit
        if not covered(index.freeable(rule, queue.name, contended, reach)):
            continue  # even all that the reachable subtrees hold above their floors won't do
        sets = _walk(
            preemptor,
            queue,
            queues,
            tree,
            index,
            excluded,
            contended,
            levels,
            ledger,
            now,
            reach,
            covered,
        )

        def allowed(candidate: Candidate, levels: _Levels = levels) -> bool:
            for name in below(tree, candidate.queue, meeting(candidate.queue)):
                used = ledger.used[name]
                for key, amount in candidate.usage.items():
                    if key in contended and used.get(key, 0) - amount < levels.floor(name, key):
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

        for candidates in sets:
            victims = select_victims(candidates, ledger, fits, allowed, tx=tx, single=single)
            if victims is not None:
                reasons = {
                    v.workload.key: _reason(
                        preemptor, queue.name, v, victims, levels, ledger, contended
                    )
                    for v in victims
                }
                return ReclaimPlan(tuple(victims), rule, reasons)
    return None


def _reach(
    own_path: Sequence[str],
    levels: _Levels,
    ledger: Ledger,
    could_stay_under: Callable[[str, Vector, Vector | None], bool],
) -> int:
    """How far up the reclaimer's path victims may be sought: victims must meet it at
    `own_path[d]` with d <= the result (len(own_path) for anywhere, 0 for nowhere).

    Taking from a subtree that meets the path at `own_path[d]` leaves the usage of every queue
    below d on the reclaimer's side as it is, plus the request: each of them must then stay
    within its ceiling under the rule and within its limit. The first queue that cannot
    (for any flavor choice) bounds the search: evicting outside its subtree could never
    help, however much it freed. Without this a department above its share would search,
    and fail to use, every other department's workloads.
    """
    reach = 0
    for name in own_path:
        if not could_stay_under(name, levels.ceilings(name), ledger.limits.get(name)):
            break
        reach += 1
    return reach


def _spare(used: Vector, floor: Vector, below: Vector | None) -> dict[FlavorResource, int]:
    """What a queue can give back: its usage above its floor, and for an inner queue
    (`below` not None: what its children can give) no more than that."""
    out: dict[FlavorResource, int] = {}
    for key, held in used.items():
        give = held - floor.get(key, 0)
        if below is not None:
            give = min(give, below.get(key, 0))
        if give > 0:
            out[key] = give
    return out


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
        "_candidates",
        "_holding",
        "_keys",
        "_kids",
        "_ledger",
        "_levels",
        "_seen",
        "_tree",
        "giving",
        "giving_below",
        "leaves",
        "top",
    )

    def __init__(
        self,
        leaves: Iterable[str],
        candidates: Callable[[str], Sequence[Candidate]],
        keys: Callable[[str], Sequence[VictimKey]],
        ledger: Ledger,
        tree: QueueTree,
        shares: Mapping[str, Vector],
        quotas: Mapping[str, Vector],
    ) -> None:
        """`leaves`: the leaves with admitted workloads; `candidates(leaf)`: a leaf's admitted
        workloads as candidates, in victim order, and `keys(leaf)` their `victim_order`
        (asked only for leaves a search walks)."""
        self.leaves = frozenset(leaves)
        self._candidates = candidates
        self._keys = keys
        # Per leaf, built on first use: most searches look at a few leaves, or none.
        self._holding: dict[str, dict[FlavorResource, list[int]]] = {}
        self._ledger = ledger
        self._tree = tree
        self._levels = {rule: _Levels(rule, shares, quotas) for rule in _RULES}
        # Per rule and queue: what the subtree can give (min of its own spare above its floor
        # and what its children can give), and the sum of that over its children; _top sums
        # the roots. `giving` holds the leaves with anything to give.
        self._avail: dict[Rule, dict[str, dict[FlavorResource, int]]] = {r: {} for r in _RULES}
        self._kids: dict[Rule, dict[str, dict[FlavorResource, int]]] = {r: {} for r in _RULES}
        self.top: dict[Rule, dict[FlavorResource, int]] = {r: {} for r in _RULES}
        self.giving: dict[Rule, set[str]] = {r: set() for r in _RULES}
        # Per rule and inner queue, the giving leaves of its subtree: a search confined to
        # one department looks at that department's leaves only.
        self.giving_below: dict[Rule, dict[str, set[str]]] = {r: {} for r in _RULES}
        if ledger.touched is None:
            ledger.touched = []
        self._seen = dict.fromkeys(_RULES, len(ledger.touched))
        self.build()

    def build(self) -> None:
        """Every figure at once, children before parents: each queue is worked out once,
        where refreshing leaf by leaf would work out each ancestor once per leaf below it.
        The result is the same as refreshing every leaf in `leaves` (see `refresh`)."""
        tree = self._tree
        paths = tree.paths
        included: set[str] = set()
        for leaf in self.leaves:
            for name in paths[leaf]:
                if name in included:
                    break  # and so are its ancestors
                included.add(name)
        # Deepest first: every queue comes after all its included children.
        order = sorted(included, key=lambda name: len(paths[name]), reverse=True)
        used_of = self._ledger.used
        for rule in _RULES:
            floors = self._levels[rule].floors
            avail, kids, top = self._avail[rule], self._kids[rule], self.top[rule]
            for name in order:
                path = paths[name]
                inner = bool(tree.children.get(name))
                below_kids = kids.get(name, _NOTHING) if inner else None
                new = _spare(used_of[name], floors(name), below_kids)
                avail[name] = new
                target = top if len(path) == 1 else kids.setdefault(path[1], {})
                for key, give in new.items():
                    target[key] = target.get(key, 0) + give
            below_ = self.giving_below[rule]
            for leaf in self.leaves:
                if avail.get(leaf):
                    self.giving[rule].add(leaf)
                    for name in paths[leaf][1:]:
                        below_.setdefault(name, set()).add(leaf)

    def levels(self, rule: Rule) -> _Levels:
        """Floors and ceilings under `rule`, shared by every search of the cycle (they keep
        the floors they have worked out)."""
        return self._levels[rule]

    def candidates(self, leaf: str) -> Sequence[Candidate]:
        """`leaf`'s admitted workloads as candidates, in victim order."""
        return self._candidates(leaf) if leaf in self.leaves else ()

    def order_keys(self, leaf: str) -> Sequence[VictimKey]:
        """The victim order of `leaf`'s candidates: the merge in `_walk` compares them again
        and again, so they are worked out once per leaf and cycle (with the candidates)."""
        return self._keys(leaf) if leaf in self.leaves else ()

    def refresh(self, leaf: str, rules: Iterable[Rule] = _RULES) -> None:
        """Work the figures of `leaf`'s path out again under `rules` (its usage changed)."""
        tree = self._tree
        for rule in rules:
            levels = self._levels[rule]
            avail, kids = self._avail[rule], self._kids[rule]
            for name in tree.paths[leaf]:
                inner = bool(tree.children.get(name))
                below_kids = kids.get(name, _NOTHING) if inner else None
                new = _spare(self._ledger.used[name], levels.floors(name), below_kids)
                old = avail.get(name, {})
                avail[name] = new
                parent = tree.paths[name][1] if len(tree.paths[name]) > 1 else None
                target = self.top[rule] if parent is None else kids.setdefault(parent, {})
                for key in old.keys() | new.keys():
                    delta = new.get(key, 0) - old.get(key, 0)
                    if delta:
                        target[key] = target.get(key, 0) + delta
            below_ = self.giving_below[rule]
            if avail.get(leaf):
                self.giving[rule].add(leaf)
                for name in tree.paths[leaf][1:]:
                    below_.setdefault(name, set()).add(leaf)
            else:
                self.giving[rule].discard(leaf)
                for name in tree.paths[leaf][1:]:
                    below_.get(name, set()).discard(leaf)

    def sync(self, rule: Rule) -> None:
        """Catch up with the ledger's charges since the last call, for `rule`.

        Per rule, because most searches are settled by the first rule and never ask about
        the second.
        """
        touched = self._ledger.touched
        assert touched is not None
        seen = self._seen[rule]
        if seen < len(touched):
            for name in sorted(set(touched[seen:])):
                if self._tree.is_leaf(name):
                    self.refresh(name, (rule,))
            self._seen[rule] = len(touched)

    def available(self, rule: Rule) -> Mapping[str, Mapping[FlavorResource, int]]:
        """Per queue, what its subtree could give under `rule` (current after `sync(rule)`)."""
        return self._avail[rule]

    def freeable(
        self, rule: Rule, queue: str, keys: Iterable[FlavorResource], reach: int
    ) -> dict[FlavorResource, int]:
        """At most what reclaim under `rule` could free for `queue`: what every sibling
        subtree along its path could give, up to the `reach` first levels of the path (see
        `_reach`)."""
        self.sync(rule)
        avail, kids, top = self._avail[rule], self._kids[rule], self.top[rule]
        path = self._tree.paths[queue]
        levels = min(reach, len(path))
        out: dict[FlavorResource, int] = {}
        for key in keys:
            total = 0
            for i in range(levels):
                pool = top if i + 1 == len(path) else kids.get(path[i + 1], {})
                total += pool.get(key, 0) - avail.get(path[i], {}).get(key, 0)
            out[key] = total
        return out

    def holding(self, leaf: str, key: FlavorResource) -> Sequence[int]:
        """Positions in `candidates(leaf)` of the workloads that hold `key`, in victim order.

        Built per leaf on first use: most cycles reclaim in a few departments only.
        """
        per_key = self._holding.get(leaf)
        if per_key is None:
            per_key = {}
            for position, candidate in enumerate(self.candidates(leaf)):
                for k, amount in candidate.usage.items():
                    if amount > 0:
                        per_key.setdefault(k, []).append(position)
            self._holding[leaf] = per_key
        return per_key.get(key, ())

    def leaves_within(self, rule: Rule, queue: str, reach: int) -> Iterator[tuple[str, int]]:
        """The giving leaves a search for `queue` may take from (see `_reach`), each with the
        number of queues on its own path below the point where it meets `queue`'s path."""
        self.sync(rule)
        path = self._tree.paths[queue]
        paths = self._tree.paths
        if reach >= len(path):
            pool: Iterable[str] = self.giving[rule]
        else:
            pool = self.giving_below[rule].get(path[reach], ())
        for leaf in pool:
            if leaf == queue:
                continue
            other = paths[leaf]
            shared = 0  # common ancestors, counted from the root down
            while (
                shared < len(other)
                and shared < len(path)
                and other[-1 - shared] == path[-1 - shared]
            ):
                shared += 1
            yield leaf, len(other) - shared


def _walk(
    preemptor: Workload,
    queue: QueueSpec,
    queues: Mapping[str, QueueSpec],
    tree: QueueTree,
    index: ReclaimIndex,
    excluded: set[str],
    contended: set[FlavorResource],
    levels: _Levels,
    ledger: Ledger,
    now: float,
    reach: int,
    covered: Callable[[Mapping[FlavorResource, int]], bool],
) -> Iterator[list[Candidate]]:
    """Sets of candidates this rule lets go, each of which could free enough, in the
    documented victim order.

    The reachable leaves' candidate lists (each already in victim order) are merged lazily,
    and a candidate is taken while every queue on the victim's side keeps its floor: each has
    a budget (what it holds above its floor on the contended pairs) that taken candidates use
    up, exactly as the removals would. The merge stops as soon as the freed room could be
    enough, so a search that succeeds looks at a handful of workloads however many leaves
    have something to give: that greedy set comes first.

    A greedy set can fail where another succeeds: small candidates taken first can use up a
    budget that one larger candidate alone would fit, and stay within. So then every
    candidate the greedy set did not take is tried as an anchor, least important first (up
    to `_ANCHORS` of them): the anchor, then the candidates before it that still fit what
    it leaves of the budgets. Each set thus holds the anchor as its most important member,
    sets come in the order of that member, and a single sufficient victim is found at the
    latest when it is the anchor (the caller's reprieve drops the others it does not need).
    The anchor goes first in its set: the caller releases in the order given.
    """
    lower_only = queue.reclaim == "LowerPriority"
    floor = levels.floor
    used_of = ledger.used
    paths = tree.paths
    Budgets = dict[str, dict[FlavorResource, int]]
    budgets: Budgets = {}  # what the greedy set leaves above the floors

    def known(chain: Sequence[str], budgets: Budgets) -> Budgets:
        """`budgets` with every queue of `chain` in it: at first, all it holds above its
        floor on the contended pairs."""
        for name in chain:
            if name not in budgets:
                used = used_of[name]
                budgets[name] = {k: used.get(k, 0) - floor(name, k) for k in contended}
        return budgets

    def merge(
        dropping: bool,
    ) -> Iterator[tuple[Candidate, list[tuple[FlavorResource, int]], tuple[str, ...]]]:
        """The candidates this rule allows, in victim order, each with what it takes of the
        contended pairs and the queues on its side. With `dropping`, a leaf leaves the merge
        once the greedy takes leave it nothing above its floor."""
        # (victim order of the leaf's next candidate, step in the leaf's sequence, leaf,
        # length of its chain). With one contended pair (the usual case: GPUs) a leaf's
        # sequence is only its workloads holding that pair, so workloads that could not help
        # are never looked at.
        heap: list[tuple[VictimKey, int, str, int]] = []
        avail = index.available(levels.rule)
        single = next(iter(contended)) if len(contended) == 1 else None
        steps: dict[str, Sequence[int]] = {}
        for leaf, length in index.leaves_within(levels.rule, queue.name, reach):
            # Only leaves whose whole victim side has some contended pair to give are merged.
            mine = avail.get(leaf, _NOTHING)
            top = avail.get(paths[leaf][length - 1], _NOTHING)
            if not any(k in mine and k in top for k in contended):
                continue
            # (A leaf may hold only this cycle's admissions or reservations: nothing to take.)
            found = index.candidates(leaf)
            seq = index.holding(leaf, single) if single is not None else range(len(found))
            if seq:
                steps[leaf] = seq
                heap.append((index.order_keys(leaf)[seq[0]], 0, leaf, length))
        heapq.heapify(heap)
        while heap:
            _, step, leaf, length = heapq.heappop(heap)
            seq = steps[leaf]
            candidate = index.candidates(leaf)[seq[step]]
            w = candidate.workload
            if lower_only and w.priority >= preemptor.priority:
                continue  # sorted by priority: the rest of this leaf is no less important
            taking = [(k, amount) for k, amount in candidate.usage.items() if k in contended]
            min_runtime = queues[leaf].min_runtime_reclaim_s
            if (
                taking
                and w.key not in excluded
                and not (min_runtime and now - started_at(w) < min_runtime)
            ):
                yield candidate, taking, paths[leaf][:length]
            # The leaf stays in the merge while it holds anything above its floor.
            step += 1
            if step < len(seq) and (
                not dropping or any(v > 0 for v in known((leaf,), budgets)[leaf].values())
            ):
                heapq.heappush(heap, (index.order_keys(leaf)[seq[step]], step, leaf, length))

    def fits_budget(
        taking: Sequence[tuple[FlavorResource, int]],
        chain: Sequence[str],
        left: Mapping[str, Mapping[FlavorResource, int]],
    ) -> bool:
        return all(left[name][k] >= amount for name in chain for k, amount in taking)

    def take(
        taking: Sequence[tuple[FlavorResource, int]],
        chain: Sequence[str],
        left: Mapping[str, dict[FlavorResource, int]],
        freed: dict[FlavorResource, int],
    ) -> None:
        for name in chain:
            mine = left[name]
            for k, amount in taking:
                mine[k] -= amount
        for k, amount in taking:
            freed[k] = freed.get(k, 0) + amount

    freed: dict[FlavorResource, int] = {}
    out: list[Candidate] = []
    for candidate, taking, chain in merge(dropping=True):
        if fits_budget(taking, chain, known(chain, budgets)):
            take(taking, chain, budgets, freed)
            out.append(candidate)
            if covered(freed):
                yield out
                break
    greedy = {c.workload.key for c in out}
    fresh: Budgets = {}  # all each queue holds above its floor
    seen: list[tuple[Candidate, list[tuple[FlavorResource, int]], tuple[str, ...]]] = []
    anchors = 0
    for anchor, taking, chain in merge(dropping=False):
        known(chain, fresh)  # the set of a later anchor may take it
        if anchor.workload.key not in greedy and fits_budget(taking, chain, fresh):
            left = {name: dict(amounts) for name, amounts in fresh.items()}
            freed = {}
            take(taking, chain, left, freed)
            chosen = [anchor]
            enough = covered(freed)
            for earlier, their, theirs in seen:
                if enough:
                    break
                if fits_budget(their, theirs, left):
                    take(their, theirs, left, freed)
                    chosen.append(earlier)
                    enough = covered(freed)
            if enough:
                yield chosen
            anchors += 1
            if anchors >= _ANCHORS:
                return
        seen.append((anchor, taking, chain))


# How many candidates a failed greedy reclaim search tries as anchors (see `_walk`): failed
# searches are most of a contended cycle's work, so they stay bounded.
_ANCHORS = 32


def _reason(
    preemptor: Workload,
    reclaimer: str,
    victim: Candidate,
    victims: Sequence[Candidate],
    levels: _Levels,
    ledger: Ledger,
    contended: set[FlavorResource],
) -> str:
    """Explain with numbers why `victim`'s queue had to give capacity back."""
    key = next((k for k in sorted(victim.usage) if k in contended), next(iter(victim.usage)))
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
