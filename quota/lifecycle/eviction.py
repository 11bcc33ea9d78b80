"""Why a workload is evicted, and what an eviction does to it once its pods are gone.

The quota it held is released, its requeue count goes up by one, and it competes for quota
again only after the backoff for that count. The controller writes the reasons and texts
here into the Workload's conditions and the simulator into its history, so both tell the
same story.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, TypeVar

from quota.api.conditions import WorkloadConditions as WC
from quota.lifecycle.backoff import DEFAULT_BACKOFF, Backoff

# The controller keeps time as datetimes, the simulator as seconds.
Moment = TypeVar("Moment", float, datetime)

# The reason each kind of victim (quota.model.decisions.VictimKind) is evicted with.
_REASONS = {
    "Preempted": WC.EVICTED_BY_PREEMPTION,
    "Reclaimed": WC.EVICTED_BY_RECLAIM,
    "Moved": WC.MOVED,
}


def eviction_reason(victim_kind: str | None) -> str:
    """The reason of an eviction (its Evicted condition's): that of the victim's kind, or
    ClusterQueueStopped for a workload drained by its queue's stopPolicy (`None`)."""
    if victim_kind is None:
        return WC.CLUSTER_QUEUE_STOPPED
    return _REASONS[victim_kind]


def recorded_as(reason: str) -> Literal["preempted", "reclaimed", "evicted"]:
    """What the history calls an eviction with this reason: a preemption or a reclaim (both
    name their preemptor), else an eviction whose reason says why (a drain, a move)."""
    if reason == WC.EVICTED_BY_PREEMPTION:
        return "preempted"
    if reason == WC.EVICTED_BY_RECLAIM:
        return "reclaimed"
    return "evicted"


@dataclass(frozen=True, slots=True)
class Requeue:
    """An evicted workload queued again: its quota is released and it waits `delay_s`."""

    count: int  # requeues so far, this one included
    delay_s: float
    # QuotaReserved and Admitted turn False with this reason.
    pending_reason: str
    # Requeued (False until the backoff ends) says why and for how long.
    requeued_reason: str
    requeued_message: str

    def competes_at(self, released_at: Moment) -> Moment:
        """When the workload may be admitted again, its quota having been released at
        `released_at`."""
        if isinstance(released_at, datetime):
            return released_at + timedelta(seconds=self.delay_s)
        return released_at + self.delay_s


def requeue_after_eviction(
    requeues: int,
    *,
    reason: str = "",
    backoff: Backoff = DEFAULT_BACKOFF,
) -> Requeue:
    """The requeue that follows an eviction of a workload requeued `requeues` times before.

    `reason` is the eviction's (its Evicted condition's), if known.
    """
    if reason == WC.MOVED:
        # A move is not a failure to be paced: the room it goes to is held for it now.
        return Requeue(
            count=requeues,
            delay_s=0.0,
            pending_reason=WC.PENDING,
            requeued_reason=WC.MOVED,
            requeued_message="queued again at once, to be admitted on the room held for it",
        )
    count = requeues + 1
    delay = backoff.delay(count)
    return Requeue(
        count=count,
        delay_s=delay,
        pending_reason=WC.PENDING,
        requeued_reason=reason or WC.EVICTED,
        requeued_message=(
            f"queued again; competes for quota after {delay:.0f}s backoff (requeue #{count})"
        ),
    )
