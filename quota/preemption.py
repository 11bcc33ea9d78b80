"""Choosing victims: the greedy-then-reprieve search, and preemption within a queue.

The search removes candidates least important first until the preemptor fits, then puts
back, most important first, every victim whose removal turns out not to be needed. The
result is a small set made of the least important workloads that together make room.
Reclaim across queues (quota/reclaim.py) uses the same search with its own candidates and
guards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from quota.ledger import Ledger
from quota.resources import FlavorResource
from quota.snapshot import WithinQueuePolicy, Workload


@dataclass(frozen=True, slots=True)
class Candidate:
    """An admitted workload that could be evicted, with the quota it would release."""

    workload: Workload
    queue: str
    usage: Mapping[FlavorResource, int]


def started_at(workload: Workload) -> float:
    """When an admitted workload started holding quota (arrival when not recorded)."""
    return workload.admitted_at if workload.admitted_at is not None else workload.arrival


def victim_order(candidate: Candidate) -> tuple[int, float, str]:
    """Least important first: lowest priority, then most recently started, then key."""
    w = candidate.workload
    return (w.priority, -started_at(w), w.key)


def select_victims(
    candidates: Sequence[Candidate],
    ledger: Ledger,
    fits: Callable[[Sequence[Candidate]], bool],
    allowed: Callable[[Candidate], bool] | None = None,
) -> list[Candidate] | None:
    """Release candidates from `ledger` in order until `fits(chosen)`; then reprieve.

    On success the chosen victims stay released in `ledger` and are returned; on failure the
    ledger is left as it was and None is returned. `allowed` is asked just before each removal,
    with earlier victims already released, so guards see the state the removal would leave.
    """
    # Cheap refusal first: if evicting every allowed candidate would not be enough, say so
    # after one fit check instead of one per candidate.
    everyone: list[Candidate] = []
    for candidate in candidates:
        if allowed is None or allowed(candidate):
            ledger.charge(candidate.queue, candidate.usage, -1)
            everyone.append(candidate)
    enough = bool(everyone) and fits(everyone)
    for candidate in everyone:
        ledger.charge(candidate.queue, candidate.usage)
    if not enough:
        return None
    chosen: list[Candidate] = []
    found = False
    for candidate in candidates:
        if allowed is not None and not allowed(candidate):
            continue
        ledger.charge(candidate.queue, candidate.usage, -1)
        chosen.append(candidate)
        if fits(chosen):
            found = True
            break
    if not found:
        for candidate in chosen:
            ledger.charge(candidate.queue, candidate.usage)
        return None
    needed: list[Candidate] = []
    for index in range(len(chosen) - 1, -1, -1):
        candidate = chosen[index]
        ledger.charge(candidate.queue, candidate.usage)
        rest = needed + chosen[:index]
        if fits(rest):
            continue  # reprieved: the preemptor fits without evicting this one
        ledger.charge(candidate.queue, candidate.usage, -1)
        needed.append(candidate)
    needed.reverse()
    return needed


def within_queue_candidates(
    preemptor: Workload,
    policy: WithinQueuePolicy,
    admitted: Sequence[Workload],
    usage_of: Mapping[str, Mapping[FlavorResource, int]],
    excluded: set[str] | frozenset[str],
    relevant: set[FlavorResource],
    now: float,
    min_runtime_s: float,
) -> list[Candidate]:
    """Workloads of the preemptor's own queue it may preempt, least important first.

    LowerPriority allows strictly lower priorities; LowerOrNewerEqualPriority also allows
    equal priority when the victim arrived after the preemptor. Workloads that started less
    than `min_runtime_s` ago, and those holding nothing the preemptor could use, are spared.
    """
    if policy == "Never":
        return []
    out: list[Candidate] = []
    for w in admitted:
        if w.key in excluded:
            continue
        lower = w.priority < preemptor.priority
        newer_equal = (
            policy == "LowerOrNewerEqualPriority"
            and w.priority == preemptor.priority
            and w.arrival > preemptor.arrival
        )
        if not (lower or newer_equal):
            continue
        if now - started_at(w) < min_runtime_s:
            continue
        usage = usage_of[w.key]
        if not any(key in relevant for key in usage):
            continue
        out.append(Candidate(w, w.queue, usage))
    out.sort(key=victim_order)
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
