"""Choosing victims: the greedy-then-reprieve search, and preemption within a queue.

The search removes candidates least important first until the preemptor fits, then puts
back, most important first, every victim whose removal turns out not to be needed. The
result is a small set made of the least important workloads that together make room.
Reclaim across queues (quota/preemption/reclaim.py) uses the same search with its own candidates and
guards.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from quota.model.ledger import Ledger
from quota.model.resources import FlavorResource
from quota.model.snapshot import WithinQueuePolicy, Workload
from quota.model.transaction import Transaction
from quota.preemption.partial import is_whole, pods_usage, takeable


class Candidate(NamedTuple):
    """An admitted workload that could be evicted, with the quota it would release.

    A named tuple rather than a frozen dataclass: a cycle makes one per admitted workload of
    every queue it searches (tens of thousands), and a tuple is made several times faster.
    """

    workload: Workload
    queue: str
    usage: Mapping[FlavorResource, int]
    # Single-pod disruption: ((pod set, pods taken), ...), `usage` being theirs; None: the
    # whole workload (quota/preemption/partial.py).
    pods: tuple[tuple[str, int], ...] | None = None


def started_at(workload: Workload) -> float:
    """When an admitted workload started holding quota (arrival when not recorded)."""
    return workload.admitted_at if workload.admitted_at is not None else workload.arrival


def saved_at(workload: Workload) -> float:
    """Up to when an admitted workload's work would survive an eviction: its last checkpoint
    (annotation muster.dev/last-checkpoint) if it checkpointed since it started, else its
    start. An eviction loses the work done since (now - saved_at)."""
    start = started_at(workload)
    checkpoint = workload.checkpointed_at
    return checkpoint if checkpoint is not None and checkpoint > start else start


VictimKey = tuple[int, bool, bool, float, float, str]


def victim_order(candidate: Candidate) -> VictimKey:
    """Least important first: lowest priority, then those whose eviction keeps every
    PodDisruptionBudget (best effort: a budget never stops a needed eviction), then those
    that lose single pods (disruptionMode Single: fewer pods disrupted), then least
    work lost (latest checkpoint, or start without one: KEP-5710's cost of preemption), then
    most recently started, then key."""
    return workload_order(candidate.workload)


def workload_order(w: Workload) -> VictimKey:
    """`victim_order` of an admitted workload."""
    return (
        w.priority,
        w.disrupts_budget,
        not w.disruption_single,
        -saved_at(w),
        -started_at(w),
        w.key,
    )


def in_victim_order(
    workloads: Sequence[tuple[Workload, Mapping[FlavorResource, int]]], queue: str
) -> tuple[list[Candidate], list[VictimKey]]:
    """`workloads` of `queue`, each with its usage, as candidates sorted by `victim_order`,
    and their keys in that order.

    The same as sorting the candidates with `key=victim_order`, but the keys are kept for
    the reclaim search's merge, and the candidates made after sorting: a cycle sorts most
    of the admitted workloads of a full cluster this way.
    """
    keys = [workload_order(w) for w, _ in workloads]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    candidates = [Candidate(w, queue, usage) for w, usage in map(workloads.__getitem__, order)]
    return candidates, [keys[i] for i in order]


def select_victims(
    candidates: Sequence[Candidate],
    ledger: Ledger,
    fits: Callable[[Sequence[Candidate]], bool],
    allowed: Callable[[Candidate], bool] | None = None,
    enough: Callable[[Mapping[FlavorResource, int]], bool] | None = None,
    short: bool = False,
    tx: Transaction | None = None,
    single: bool = True,
) -> list[Candidate] | None:
    """Release candidates from `ledger` in order until `fits(chosen)`; then reprieve.

    On success the chosen victims stay released in `ledger` and are returned; on failure the
    ledger is left as it was and None is returned. `allowed` is asked just before each removal,
    with earlier victims already released, so guards see the state the removal would leave.
    `enough(freed)`, when given (and `allowed` is not), is a necessary condition for fitting
    once `freed` is released, judged without touching the ledger: candidates are then only
    counted until it holds, and `fits` is asked from there on. `short` says the caller knows
    that `fits([])` is False as the ledger is (the preemptor was just seen not to fit).
    With `tx`, the victims' release is journaled there for the caller to keep or roll back
    (a decision that may still fall through); without, it is kept.
    With `single`, a disruptionMode Single candidate loses only single unprotected pods,
    as few as needed (the victim's `pods`); without, it goes whole like any other.
    """
    journal = tx if tx is not None else Transaction()
    mark = journal.checkpoint()
    if single and any(c.workload.disruption_single for c in candidates):
        candidates = list(preemptible(candidates))
    if enough is not None and allowed is None:
        chosen = _release_until_fit(candidates, ledger, fits, enough, journal)
    else:
        chosen = _select_greedy(candidates, ledger, fits, allowed, journal)
    if chosen is None:
        journal.rollback(mark)
        return None
    needed = _reprieve(chosen, ledger, fits, journal, short)
    if single and any(c.workload.disruption_single for c in needed):
        needed = shrink(needed, ledger, fits, journal)
    if tx is None:
        journal.commit()
    return needed


def preemptible(candidates: Iterable[Candidate]) -> Iterator[Candidate]:
    """`candidates` as the search may take them: a Single workload holding only its
    unprotected pods (dropped when it has none), every other one unchanged."""
    for candidate in candidates:
        w = candidate.workload
        if not w.disruption_single:
            yield candidate
            continue
        taken = tuple(takeable(w).items())
        if not taken:
            continue  # every pod protected: never a victim
        if is_whole(w, taken):
            yield candidate
        else:
            yield Candidate(w, candidate.queue, pods_usage(w, taken), taken)


def shrink(
    needed: list[Candidate],
    ledger: Ledger,
    fits: Callable[[Sequence[Candidate]], bool],
    tx: Transaction,
) -> list[Candidate]:
    """Each Single victim of `needed`, most important first, keeps every pod the
    preemptor fits without: pods are given back one at a time (pod sets in order, last
    first), so a victim loses as few pods as the preemptor needs, never more."""
    out = list(needed)
    for index in range(len(out) - 1, -1, -1):
        victim = out[index]
        w = victim.workload
        if not w.disruption_single:
            continue
        taken = dict(victim.pods) if victim.pods is not None else takeable(w)
        for pod_set in reversed(list(taken)):
            while taken[pod_set] > 0:
                mark = tx.checkpoint()
                back = ((pod_set, 1),)
                tx.charge(ledger, victim.queue, pods_usage(w, back))
                taken[pod_set] -= 1
                kept = tuple((name, n) for name, n in taken.items() if n)
                trial = Candidate(w, victim.queue, pods_usage(w, kept), kept)
                if kept and fits([*out[:index], trial, *out[index + 1 :]]):
                    continue
                tx.rollback(mark)
                taken[pod_set] += 1
                break
        kept = tuple((name, n) for name, n in taken.items() if n)
        if not is_whole(w, kept):
            out[index] = Candidate(w, victim.queue, pods_usage(w, kept), kept)
        elif victim.pods is not None:
            out[index] = Candidate(w, victim.queue, victim.usage)
    return out


def _select_greedy(
    candidates: Sequence[Candidate],
    ledger: Ledger,
    fits: Callable[[Sequence[Candidate]], bool],
    allowed: Callable[[Candidate], bool] | None,
    tx: Transaction,
) -> list[Candidate] | None:
    """Release allowed candidates least important first until the preemptor fits."""
    # Cheap refusal first: if evicting every allowed candidate would not be enough, say so
    # after one fit check instead of one per candidate.
    mark = tx.checkpoint()
    everyone: list[Candidate] = []
    for candidate in candidates:
        if allowed is None or allowed(candidate):
            tx.release(ledger, candidate.queue, candidate.usage)
            everyone.append(candidate)
    enough_room = bool(everyone) and fits(everyone)
    tx.rollback(mark)
    if not enough_room:
        return None
    # Lazily filtered: each candidate is judged once those before it are released.
    return _release_until_fit(
        (c for c in candidates if allowed is None or allowed(c)), ledger, fits, None, tx
    )


def _release_until_fit(
    candidates: Iterable[Candidate],
    ledger: Ledger,
    fits: Callable[[Sequence[Candidate]], bool],
    enough: Callable[[Mapping[FlavorResource, int]], bool] | None,
    tx: Transaction,
) -> list[Candidate] | None:
    """Release candidates in order until the preemptor fits.

    With `enough`, a necessary condition on freed amounts, candidates are only counted until
    it holds: adding up usage is far cheaper than releasing from the ledger and assigning
    flavors, and most searches either fail that condition outright or need only the first
    few candidates."""
    freed: dict[FlavorResource, int] = {}
    chosen: list[Candidate] = []
    released = 0
    for candidate in candidates:
        chosen.append(candidate)
        if enough is not None and not released:
            for key, amount in candidate.usage.items():
                freed[key] = freed.get(key, 0) + amount
            if not enough(freed):
                continue
        for c in chosen[released:]:
            tx.release(ledger, c.queue, c.usage)
        released = len(chosen)
        if fits(chosen):
            return chosen
    return None


def _reprieve(
    chosen: list[Candidate],
    ledger: Ledger,
    fits: Callable[[Sequence[Candidate]], bool],
    tx: Transaction,
    short: bool = False,
) -> list[Candidate]:
    """Put back, most important first, every victim the preemptor fits without.

    With two or more chosen, the last one is needed by construction (the search saw the
    preemptor not fit, or not even come close, before releasing it), so it is kept without
    asking; a lone victim is asked about like the others, unless the caller knows the
    preemptor does not fit without any (`short`).
    """
    known = len(chosen) >= 2 or short
    needed: list[Candidate] = [chosen[-1]] if known else []
    for index in range(len(chosen) - (2 if known else 1), -1, -1):
        candidate = chosen[index]
        mark = tx.checkpoint()
        tx.charge(ledger, candidate.queue, candidate.usage)
        rest = needed + chosen[:index]
        if fits(rest):
            continue  # reprieved: the preemptor fits without evicting this one
        tx.rollback(mark)
        needed.append(candidate)
    needed.reverse()
    return needed


def within_queue_candidates(
    preemptor: Workload,
    policy: WithinQueuePolicy,
    queue: str,
    admitted: Sequence[tuple[Workload, Mapping[FlavorResource, int]]],
    excluded: set[str] | frozenset[str],
    contended: set[FlavorResource],
    now: float,
    min_runtime_s: float,
) -> list[Candidate]:
    """Workloads of the preemptor's own queue it may preempt, least important first.

    `admitted` holds the queue's admitted workloads with their usage, in any order: only
    those allowed are sorted (most searches find a few or none, and sorting the whole queue
    for each was a large part of a contended cycle). LowerPriority allows strictly lower
    priorities; LowerOrNewerEqualPriority also allows equal priority when the victim arrived
    after the preemptor. Workloads that started less than `min_runtime_s` ago, and those
    holding none of the `contended` (flavor, resource) pairs the preemptor is short of, are
    spared: evicting them could not make it fit.
    """
    if policy == "Never":
        return []
    allowed: list[tuple[Workload, Mapping[FlavorResource, int]]] = []
    priority = preemptor.priority
    equal_ok = policy == "LowerOrNewerEqualPriority"
    for w, usage in admitted:
        if w.priority >= priority and (
            w.priority > priority or not equal_ok or w.arrival <= preemptor.arrival
        ):
            continue  # equal priority only under LowerOrNewerEqualPriority, if it came later
        # The key last: it is another object to read, for every workload of the queue.
        if contended.isdisjoint(usage):
            continue
        if min_runtime_s and now - started_at(w) < min_runtime_s:
            continue
        if w.key in excluded:
            continue
        allowed.append((w, usage))
    if len(allowed) < 2:
        # Most searches allow one workload or none: nothing to sort.
        return [Candidate(w, queue, usage) for w, usage in allowed]
    return in_victim_order(allowed, queue)[0]


def pair_holders(
    workloads: Sequence[tuple[Workload, Mapping[FlavorResource, int]]],
    pair: FlavorResource,
    queue: str,
) -> tuple[list[Candidate], list[int]]:
    """Those of `workloads` of `queue` (each with its usage) that hold `pair`, as candidates
    in victim order, and their priorities in that order: what `within_queue_holders` reads."""
    candidates, keys = in_victim_order([c for c in workloads if pair in c[1]], queue)
    return candidates, [key[0] for key in keys]


def within_queue_holders(
    preemptor: Workload,
    policy: WithinQueuePolicy,
    holders: Sequence[Candidate],
    priorities: Sequence[int],
    excluded: set[str] | frozenset[str],
    now: float,
    min_runtime_s: float,
) -> list[Candidate]:
    """`within_queue_candidates` when the preemptor is short of one (flavor, resource) pair
    only (the usual case: GPUs): `holders` and `priorities` are the queue's admitted
    workloads that hold that pair (`pair_holders`).

    Victim order is by priority first, so the workloads the policy allows are a prefix,
    found by bisecting the priorities: a search reads neither the workloads of the queue
    that hold none of the pair nor those of too high a priority, and sorts nothing.
    """
    if policy == "Never":
        return []
    priority = preemptor.priority
    equal_ok = policy == "LowerOrNewerEqualPriority"
    end = (bisect_right if equal_ok else bisect_left)(priorities, priority)
    out: list[Candidate] = []
    for i in range(end):
        candidate = holders[i]
        w = candidate.workload
        if equal_ok and priorities[i] == priority and w.arrival <= preemptor.arrival:
            continue  # equal priority only if it came later
        if min_runtime_s and now - started_at(w) < min_runtime_s:
            continue
        if w.key in excluded:
            continue
        out.append(candidate)
    return out


def preemption_reason(preemptor: Workload, victim: Workload, queue: str) -> str:
    """Why a victim was chosen inside its own queue."""
    why = (
        f"lower priority ({victim.priority} < {preemptor.priority})"
        if victim.priority < preemptor.priority
        else f"equal priority {victim.priority} and arrived later"
    )
    return (
        f"preempted in queue {queue} to make room for {preemptor.key} "
        f"(priority {preemptor.priority}): {why}"
    )
