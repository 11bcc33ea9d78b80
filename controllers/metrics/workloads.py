"""Counting Workload transitions as the watch shows them: admitted (with the wait before
it), evicted, preempted, finished.

Counted from the cache's events rather than at the writes, so a write that the apiserver
refused (a conflict, a deposed leader) never counts; and only while this replica leads, so
the sum over replicas counts each transition once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from controllers.metrics import definitions as m
from controllers.runtime.informer import Informer
from controllers.state import workloads as wls
from quota.model.queues import cluster_queue_of


def _since(wl: Mapping[str, Any], type_: str) -> str:
    return str((wls.condition(wl, type_) or {}).get("lastTransitionTime") or "")


def _became(old: Mapping[str, Any], new: Mapping[str, Any], type_: str) -> bool:
    """`type_` is True in `new` and was not True (or was True since another time) in `old`."""
    if not wls.is_true(new, type_):
        return False
    return not wls.is_true(old, type_) or _since(old, type_) != _since(new, type_)


def _shed(old: Mapping[str, Any], new: Mapping[str, Any]) -> int:
    """Pods single-pod preemption took in this change: the admission shrank and the
    preempted pods (`status.preemptedPods`) were written with it."""
    before, after = old.get("status") or {}, new.get("status") or {}
    taken = after.get("preemptedPods")
    if taken is None or ("preemptedPods" in before and before["preemptedPods"] == taken):
        return 0

    def admitted(status: Mapping[str, Any]) -> int:
        assignments = (status.get("admission") or {}).get("podSetAssignments") or []
        return sum(int(a.get("count") or 0) for a in assignments)

    return max(0, admitted(before) - admitted(after))


def wait_seconds(wl: Mapping[str, Any]) -> float | None:
    """Seconds from creation, or from the last requeue, to the quota reservation."""
    reserved = wls.parse_time(_since(wl, wls.QUOTA_RESERVED))
    created = wls.parse_time((wl.get("metadata") or {}).get("creationTimestamp"))
    requeued = wls.parse_time(_since(wl, wls.REQUEUED)) if wls.is_true(wl, wls.REQUEUED) else None
    start = max((t for t in (created, requeued) if t is not None), default=None)
    if reserved is None or start is None or reserved < start:
        return None
    return (reserved - start).total_seconds()


class WorkloadCounters:
    """An informer handler (`on_workload`) for the Workload cache."""

    def __init__(self, local_queues: Informer, is_leader: Callable[[], bool]) -> None:
        self.local_queues = local_queues
        self.is_leader = is_leader

    def on_workload(self, kind: str, old: Any, new: Any) -> None:
        # A Workload first seen (the initial list, a new replica) is no transition: only a
        # change this replica watched happen counts.
        if old is None or new is None or not self.is_leader():
            return
        cq = cluster_queue_of(new, self.local_queues.get) or ""
        if _became(old, new, wls.QUOTA_RESERVED) and wls.has_quota(new):
            m.ADMITTED_WORKLOADS.labels(cq).inc()
            waited = wait_seconds(new)
            if waited is not None:
                m.ADMISSION_WAIT_TIME.labels(cq).observe(waited)
        if _became(old, new, wls.EVICTED):
            reason = str((wls.condition(new, wls.EVICTED) or {}).get("reason") or "")
            m.EVICTED_WORKLOADS.labels(cq, reason).inc()
        if _became(old, new, wls.PREEMPTED):
            reason = str((wls.condition(new, wls.PREEMPTED) or {}).get("reason") or "")
            m.PREEMPTED_WORKLOADS.labels(cq, reason).inc()
        lost = _shed(old, new)
        if lost:
            m.PREEMPTED_PODS.labels(cq).inc(lost)
        if _became(old, new, wls.FINISHED):
            m.FINISHED_WORKLOADS.labels(cq).inc()
