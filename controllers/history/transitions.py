"""History records read off Workload objects: what a Workload's status says happened to it.

The Workload status is the record of every decision (`controllers/state/workloads.py`), so each
transition can be rebuilt from the object alone, with the same natural key every time:

- `sequence` is the Workload's attempt number, `status.requeueState.count` (0 until the first
  requeue). An admission, eviction or finish belongs to the attempt it happened in; the
  requeue that starts attempt N has sequence N. A controller that restarts, or a new leader
  that takes over, reports what the cluster shows again and the store keeps one row per
  (uid, kind, sequence).
- A preemption decision is keyed by the admissions it ends: its sequence is a fingerprint of
  the victims' (uid, attempt) pairs, so the same decision replayed is stored once and a later
  decision by the same preemptor is a row of its own.

Times: `created` is always the Workload's creationTimestamp. A transition seen as it happens
takes the caller's clock (sub-second, so a timeline orders events within one second); rebuilt
after the fact it takes its condition's lastTransitionTime.

Quota reservation and admission are one write in Muster (there are no admission checks between
them), so only `admitted` is recorded; `quota_reserved` stays in the schema for integrations
that separate the two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from controllers.history.records import (
    PreemptionDecision,
    TransitionKind,
    Victim,
    WorkloadTransition,
)
from controllers.state import workloads as wls
from quota.api.conditions import WorkloadConditions as WC
from quota.api.quantity import parse_quantity
from quota.lifecycle.eviction import recorded_as
from quota.model.queues import admitted_to

Obj = Mapping[str, Any]
K = TransitionKind

# Recorded by whoever sees the Workload change (the leader's watch handler). The other kinds
# are recorded by the admission loop as it decides them, because only it knows the preemptor;
# they are rebuilt from the status only when a new leader replays what the cluster shows.
WATCHED_KINDS = frozenset({K.CREATED, K.REQUEUED, K.FINISHED})

_MAX_REASON = 2000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def attempt(wl: Obj) -> int:
    """The Workload's attempt number: how many times it has been requeued after an eviction."""
    state = (wl.get("status") or {}).get("requeueState") or {}
    try:
        return max(0, int(state.get("count") or 0))
    except (TypeError, ValueError):
        return 0


def milestones(wl: Obj | None) -> tuple[Any, ...]:
    """What decides which transitions a Workload shows; equal milestones, nothing new to record.

    Cheap enough for a watch handler on the admission path: no record is built here.
    """
    if wl is None:
        return ()
    return (
        (wl.get("metadata") or {}).get("uid"),
        attempt(wl),
        bool((wl.get("status") or {}).get("admission")),
        wls.is_true(wl, wls.QUOTA_RESERVED),
        wls.is_evicted(wl),
        wls.is_finished(wl),
    )


def _time(text: Any) -> datetime | None:
    try:
        parsed = wls.parse_time(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed is not None else None


def _condition_time(wl: Obj, type_: str) -> datetime:
    found = _time((wls.condition(wl, type_) or {}).get("lastTransitionTime"))
    return found or _created_at(wl)


def _created_at(wl: Obj) -> datetime:
    return _time((wl.get("metadata") or {}).get("creationTimestamp")) or _EPOCH


def _sentence(reason: str, message: str) -> str:
    text = f"{reason}: {message}" if reason and message else reason or message
    return text[:_MAX_REASON]


def _base(
    wl: Obj, kind: TransitionKind, at: datetime, sequence: int, **extra: Any
) -> WorkloadTransition:
    meta = wl.get("metadata") or {}
    return WorkloadTransition(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        kind=kind,
        at=at.astimezone(UTC),
        sequence=sequence,
        local_queue=str((wl.get("spec") or {}).get("queueName") or ""),
        **extra,
    )


def admission_amounts(wl: Obj) -> tuple[dict[str, str], dict[str, int]]:
    """(resource -> flavor, resource -> amount in base units) of the Workload's admission."""
    admission = (wl.get("status") or {}).get("admission") or {}
    flavors: dict[str, str] = {}
    amounts: dict[str, int] = {}
    for assignment in admission.get("podSetAssignments") or []:
        for resource, flavor in (assignment.get("flavors") or {}).items():
            flavors.setdefault(str(resource), str(flavor))
        for resource, quantity in (assignment.get("resourceUsage") or {}).items():
            try:
                amount = parse_quantity(quantity, str(resource))
            except ValueError:
                continue  # a hand-edited status: the transition is worth more than one figure
            amounts[str(resource)] = amounts.get(str(resource), 0) + amount
    return flavors, amounts


def created(wl: Obj, *, cluster_queue: str = "") -> WorkloadTransition:
    """The Workload was created (for its Job), at its creationTimestamp."""
    return _base(
        wl,
        K.CREATED,
        _created_at(wl),
        0,
        cluster_queue=cluster_queue,
        reason=f"queued in LocalQueue {(wl.get('spec') or {}).get('queueName') or '(none)'}",
    )


def admitted(
    wl: Obj, *, at: datetime | None = None, reason: str | None = None
) -> WorkloadTransition | None:
    """The admission the status holds (this attempt's), or None if it holds none."""
    admission = (wl.get("status") or {}).get("admission")
    if not admission or not wls.is_true(wl, wls.QUOTA_RESERVED):
        return None
    cond = wls.condition(wl, wls.QUOTA_RESERVED) or {}
    flavors, amounts = admission_amounts(wl)
    return _base(
        wl,
        K.ADMITTED,
        at or _condition_time(wl, wls.QUOTA_RESERVED),
        attempt(wl),
        cluster_queue=admitted_to(wl) or "",
        flavors=flavors,
        resources=amounts,
        reason=(reason if reason is not None else str(cond.get("message") or ""))[:_MAX_REASON],
    )


def evicted(
    wl: Obj, *, at: datetime | None = None, actor: str = "", cluster_queue: str = ""
) -> WorkloadTransition | None:
    """The eviction the status shows (preempted, reclaimed, or evicted for another reason)."""
    cond = wls.condition(wl, wls.EVICTED)
    if cond is None or cond.get("status") != "True":
        return None
    # Releasing the quota after the pods are gone starts the next attempt; the eviction still
    # belongs to the attempt it ended.
    released = not (wl.get("status") or {}).get("admission")
    sequence = max(0, attempt(wl) - 1) if released else attempt(wl)
    flavors, amounts = admission_amounts(wl)
    return _base(
        wl,
        K(recorded_as(str(cond.get("reason") or ""))),
        at or _condition_time(wl, wls.EVICTED),
        sequence,
        cluster_queue=admitted_to(wl) or cluster_queue,
        flavors=flavors,
        resources=amounts,
        reason=_sentence(str(cond.get("reason") or ""), str(cond.get("message") or "")),
        actor=actor,
    )


def requeued(
    wl: Obj, *, at: datetime | None = None, cluster_queue: str = ""
) -> WorkloadTransition | None:
    """The requeue that started the current attempt, or None before the first one."""
    count = attempt(wl)
    if count < 1:
        return None
    cond = wls.condition(wl, wls.REQUEUED) or {}
    message = str(cond.get("message") or "")
    if cond.get("reason") == "Admitted":
        # Admitted again since: the requeue's own words are gone from the status.
        message = f"queued again after an eviction (requeue #{count})"
    return _base(
        wl,
        K.REQUEUED,
        at or _condition_time(wl, wls.REQUEUED),
        count,
        cluster_queue=admitted_to(wl) or cluster_queue,
        reason=message[:_MAX_REASON],
    )


def finished(
    wl: Obj, *, at: datetime | None = None, actor: str = "", cluster_queue: str = ""
) -> WorkloadTransition | None:
    """Finished, or for an elastic Job's old slice, replaced by the next slice."""
    cond = wls.condition(wl, wls.FINISHED)
    if cond is None or cond.get("status") != "True":
        return None
    reason = str(cond.get("reason") or "")
    flavors, amounts = admission_amounts(wl)
    return _base(
        wl,
        K.SLICE_REPLACED if reason == WC.SLICE_REPLACED else K.FINISHED,
        at or _condition_time(wl, wls.FINISHED),
        attempt(wl),
        cluster_queue=admitted_to(wl) or cluster_queue,
        flavors=flavors,
        resources=amounts,
        reason=_sentence(reason, str(cond.get("message") or "")),
        actor=actor,
    )


def visible(wl: Obj, *, cluster_queue: str = "") -> list[WorkloadTransition]:
    """Every transition the Workload's status still shows, oldest first (for a replay).

    Earlier attempts' admissions and evictions are no longer in the status; they were recorded
    when they happened.
    """
    out: list[WorkloadTransition | None] = [created(wl, cluster_queue=cluster_queue)]
    if wls.is_evicted(wl) and not (wl.get("status") or {}).get("admission"):
        # Evicted and released: the eviction ended the previous attempt, the requeue began this.
        out += [evicted(wl, cluster_queue=cluster_queue), requeued(wl, cluster_queue=cluster_queue)]
    else:
        out += [
            requeued(wl, cluster_queue=cluster_queue),
            admitted(wl),
            evicted(wl, cluster_queue=cluster_queue),
        ]
    out.append(finished(wl, cluster_queue=cluster_queue))
    return [t for t in out if t is not None and t.uid]


def new_transitions(
    old: Obj | None,
    new: Obj,
    *,
    at: datetime,
    kinds: Iterable[TransitionKind] = WATCHED_KINDS,
    cluster_queue: str = "",
) -> list[WorkloadTransition]:
    """Transitions of `kinds` that `new` shows and `old` did not, timed `at` (when seen)."""
    wanted = frozenset(kinds)
    before = {t.key() for t in visible(old)} if old is not None else set()
    out: list[WorkloadTransition] = []
    for t in visible(new, cluster_queue=cluster_queue):
        if t.kind not in wanted or t.key() in before:
            continue
        out.append(t if t.kind is K.CREATED else replace(t, at=at.astimezone(UTC)))
    return out


def dispatched(wl: Obj, cluster: str, reason: str, *, at: datetime) -> WorkloadTransition:
    """The Workload sent to worker `cluster`: one row per (attempt, cluster), so a workload
    sent elsewhere after its worker was lost has a row for each worker, and a replay none."""
    meta = wl.get("metadata") or {}
    digest = hashlib.sha256(f"{attempt(wl)}:{cluster}".encode()).digest()
    return WorkloadTransition(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        kind=K.DISPATCHED,
        at=at.astimezone(UTC),
        sequence=int.from_bytes(digest[:7], "big"),
        local_queue=str((wl.get("spec") or {}).get("queueName") or ""),
        cluster_queue=admitted_to(wl) or "",
        reason=reason[:_MAX_REASON],
        actor=cluster,
    )


def preemption_sequence(victims: Iterable[Obj]) -> int:
    """The same number for the same victims at the same attempts, whoever computes it."""
    parts = sorted(f"{(v.get('metadata') or {}).get('uid')}:{attempt(v)}" for v in victims)
    digest = hashlib.sha256("|".join(parts).encode()).digest()
    return int.from_bytes(digest[:7], "big")  # 56 bits: within the BIGINT column


def preemption(
    preemptor: Obj,
    victims: Sequence[tuple[Obj, str, str]],
    *,
    at: datetime,
    cluster_queue: str,
    strategy: str,
    held: Sequence[str] = (),
) -> PreemptionDecision:
    """A preemptor and its victims, each given as (Workload as evicted, its queue, why);
    `held` names the nodes whose room is held for it meanwhile."""
    meta = preemptor.get("metadata") or {}
    chosen = tuple(
        Victim(
            namespace=str((v.get("metadata") or {}).get("namespace") or ""),
            name=str((v.get("metadata") or {}).get("name") or ""),
            uid=str((v.get("metadata") or {}).get("uid") or ""),
            cluster_queue=queue,
            priority=int((v.get("spec") or {}).get("priority") or 0),
            reason=why[:_MAX_REASON],
        )
        for v, queue, why in victims
    )
    verb = {"reclaim": "reclaiming from", "consolidate": "moving"}.get(strategy, "preempting")
    who = f"{meta.get('namespace')}/{meta.get('name')}"
    reason = (
        f"{verb} {len(chosen)} workload{'s' if len(chosen) != 1 else ''} so that {who} fits "
        f"in ClusterQueue {cluster_queue}"
    )
    if held:
        shown = ", ".join(held[:8]) + (f" and {len(held) - 8} more" if len(held) > 8 else "")
        reason += f"; room held on {shown}"
    return PreemptionDecision(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        at=at.astimezone(UTC),
        victims=chosen,
        sequence=preemption_sequence(v for v, _, _ in victims),
        cluster_queue=cluster_queue,
        strategy=strategy,
        reason=reason,
    )
