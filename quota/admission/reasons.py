"""The words of a cycle's admissions and waits that quota decided: what was admitted where,
what it borrows, and why a workload does not fit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from quota.admission.requests import Request
from quota.admission.state import CycleState
from quota.model.flavorassign import FitFailure
from quota.model.resources import FlavorResource, format_amount
from quota.model.snapshot import Flavor, QueueSpec, Workload


class Reasons:
    """Words for one cycle (it remembers which flavors no node carries)."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        self._homeless: dict[str, str] = {}  # flavor -> why no node carries it ("" if one does)

    def borrowing(self, queue: str, usage: Mapping[FlavorResource, int]) -> str | None:
        """Describe the first queue on the path now above its quota, if any."""
        state = self.state
        keys = sorted(usage)
        for name in state.tree.paths[queue]:
            used = state.held.used[name]
            quota = state.quotas[name]
            for key in keys:
                if used.get(key, 0) > quota.get(key, 0):
                    flavor, resource = key
                    return (
                        f"borrows idle capacity beyond the quota of queue {name} for {resource} "
                        f"in flavor {flavor} ({format_amount(resource, used.get(key, 0))} in use, "
                        f"quota {format_amount(resource, quota.get(key, 0))})"
                    )
        return None

    @staticmethod
    def admitted(
        spec: QueueSpec,
        request: Request,
        counts: Sequence[int],
        usage: Mapping[FlavorResource, int],
        borrowed: str | None,
    ) -> str:
        w = request.workload
        flavors = sorted({flavor for flavor, _ in usage})
        where = f" on flavor {', '.join(flavors)}" if flavors else ""
        parts = [f"admitted to queue {spec.name}{where}"]
        if request.running is not None:
            grown = sum(counts)
            parts[0] = (
                f"scale-up slice replacing {request.running.key} admitted to queue {spec.name}: "
                f"{grown} more pods charged on the flavors it already runs on"
                if grown
                else f"scale-down slice replacing {request.running.key}: quota freed at once"
            )
        else:
            for i, ps in enumerate(w.pod_sets):
                if counts[i] < ps.count:
                    parts.append(
                        f"partial admission: pod set {ps.name} gets {counts[i]} of {ps.count} "
                        f"pods (minCount {ps.min_count})"
                    )
        if borrowed is not None:
            parts.append(borrowed)
        return "; ".join(parts)

    def not_fitting(self, spec: QueueSpec, w: Workload, failure: FitFailure, partial: bool) -> str:
        """Why `w` does not fit quota: per resource short, the binding limit or the quota
        and fair share left."""
        state = self.state
        shares = state.fair.shares.get(spec.name, {})
        parts: list[str] = []
        for short in failure.shortfalls:
            key = (short.flavor, short.resource)
            # The tighter of the two ledgers (the held one when they are equal).
            held = state.held.binding(spec.name, key)
            planned = state.planned.binding(spec.name, key)
            available, binder, bound = planned if planned[0] < held[0] else held
            r = short.resource
            requested = format_amount(r, short.requested)
            if binder is not None:
                parts.append(
                    f"exceeds limit of queue {binder} for {r} in flavor {short.flavor}: "
                    f"requested {requested}, limit {format_amount(r, bound)}, "
                    f"in use {format_amount(r, bound - available)}"
                )
            else:
                parts.append(
                    f"insufficient quota for {r} in flavor {short.flavor}: requested "
                    f"{requested}, available {format_amount(r, max(0, available))}, "
                    f"fair share {format_amount(r, shares.get(key, 0))}"
                )
            homeless = self._no_node_carries(short.flavor)
            if homeless is not None:
                parts[-1] = f"{homeless}; {parts[-1]}"
        text = "; ".join(parts)
        if len(w.pod_sets) > 1:
            text = f"pod set {failure.pod_set}: {text}"
        if failure.skipped:
            text += "; " + "; ".join(failure.skipped)
        if partial:
            text += "; not even minCount pods fit"
        return text

    def _no_node_carries(self, flavor: str) -> str | None:
        """ "no Ready node carries flavor h100's labels (...)" when the cluster has nodes but
        none of that flavor: its capacity is zero for a reason more quota cannot fix."""
        snapshot = self.state.snapshot
        nodes = snapshot.nodes
        if not nodes:
            return None
        known = self._homeless.get(flavor)
        if known is None:
            spec = snapshot.flavors.get(flavor)
            labels = spec.node_labels if spec is not None else {}
            carried = any(
                n.ready
                and not n.unschedulable
                and all(n.labels.get(k) == v for k, v in labels.items())
                for n in nodes
            )
            known = (
                ""
                if carried
                else (f"no Ready node carries flavor {flavor}'s labels{_flavor_labels(spec)}")
            )
            self._homeless[flavor] = known
        return known or None


def no_victim_set(spec: QueueSpec) -> str:
    """ "its queue may reclaim from queues above their fair share or quota, but no set of
    workloads it may evict makes room": a victim search that found nothing."""
    return (
        f"its queue may {eviction_policies(spec)}, but no set of workloads it may evict makes room"
    )


def waits_before_evicting(spec: QueueSpec, w: Workload, now: float) -> str:
    """While `w` is in its queue's wait before evicting (waitBeforeEvicting, counted from its
    arrival: its creation on the cluster, its latest queueing in the simulator), why it
    evicts no one: "it may evict from 14:05:32 UTC (in 1.5s): queue a waits 30s
    (waitBeforeEvicting) for room to free by completions first"; "" once it may."""
    start = w.arrival + spec.wait_before_evicting_s
    if now >= start:
        return ""
    when = datetime.fromtimestamp(start, UTC).strftime("%H:%M:%S UTC")
    return (
        f"it may evict from {when} (in {_seconds(start - now)}): queue {spec.name} waits "
        f"{_seconds(spec.wait_before_evicting_s)} (waitBeforeEvicting) for room to free by "
        "completions first"
    )


def held_back_words(first: Workload) -> str:
    """Why a lower-priority workload is not started while `first`, of its queue, waits
    before it may preempt: starting it would take the quota `first` waits for, only for it
    to be evicted when the wait ends."""
    return (
        f"held back for {first.key} (priority {first.priority}) of its queue, which waits for "
        "room and may preempt lower priorities when its waitBeforeEvicting ends: starting "
        "this one now would only take that room and have it evicted"
    )


def _seconds(amount: float) -> str:
    return f"{amount:.0f}s" if amount >= 10 else f"{round(amount, 1):g}s"


def eviction_policies(spec: QueueSpec) -> str:
    """What `spec`'s policies let its workloads evict, in words ("" for nothing)."""
    within = {
        "LowerPriority": "preempt lower priorities in it",
        "LowerOrNewerEqualPriority": "preempt lower priorities and newer equal ones in it",
    }.get(spec.within_queue, "")
    reclaim = {
        "Any": "reclaim from queues above their fair share or quota",
        "LowerPriority": "reclaim lower priorities from queues above their fair share or quota",
    }.get(spec.reclaim, "")
    return " or ".join(part for part in (within, reclaim) if part)


def _flavor_labels(flavor: Flavor | None) -> str:
    if flavor is None or not flavor.node_labels:
        return ""
    return " (" + ", ".join(f"{k}={v}" for k, v in sorted(flavor.node_labels.items())) + ")"
