"""A WorkerCluster's status as the dispatcher writes it (and `kubectl muster clusters` and
`kubectl get wc` show it): its health, its Ready nodes' capacity, what its pods use, and how
many workloads were sent there."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from controllers.multicluster.workers import Worker
from controllers.state import workloads as wls
from quota.api.quantity import format_quantity

# lastSeen is refreshed at most this often while nothing else changes: a healthy worker's
# status is not rewritten every pass, and its LAST SEEN never looks older than this.
LAST_SEEN_EVERY_S = 60.0


def same_status(current: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether writing `new` over `current` would tell a reader nothing new."""
    keys = ("nodes", "capacity", "usage", "dispatched")
    if any(current.get(k) != new.get(k) for k in keys):
        return False
    seen, fresh_seen = wls.parse_time(current.get("lastSeen")), wls.parse_time(new.get("lastSeen"))
    if fresh_seen is not None and (
        seen is None or (fresh_seen - seen).total_seconds() >= LAST_SEEN_EVERY_S
    ):
        return False
    old = {c.get("type"): c for c in current.get("conditions") or []}.get("Active") or {}
    fresh = new["conditions"][0]
    return bool(old.get("status") == fresh["status"] and old.get("reason") == fresh["reason"])


def worker_status(
    worker: Worker | None, problem: str | None, dispatched: int, now: float
) -> dict[str, Any]:
    """The status of one WorkerCluster, from its worker's caches and probes."""
    stamp = wls.rfc3339(wls.now_utc())
    status: dict[str, Any] = {"dispatched": dispatched}
    if worker is None:
        reason, message, state = "BadKubeconfig", problem or "not connected yet", "False"
    elif worker.health.error:
        lost = worker.lost(now)
        reason = "Lost" if lost else "Unreachable"
        state = "False"
        message = f"not answering for {worker.health.silent_for(now):.0f}s: {worker.health.error}"
    else:
        reason, message, state = "Connected", "answering", "True"
    if worker is not None and worker.health.last_ok is not None:
        status["lastSeen"] = wls.rfc3339(datetime.fromtimestamp(worker.health.last_ok, UTC))
    if worker is not None:
        capacity, usage, ready = totals(worker)
        status.update(nodes=ready, capacity=capacity, usage=usage)
    status["conditions"] = [
        {
            "type": "Active",
            "status": state,
            "reason": reason,
            "message": message[:1000],
            "lastTransitionTime": stamp,
        }
    ]
    return status


def totals(worker: Worker) -> tuple[dict[str, str], dict[str, str], int]:
    capacity: dict[str, int] = {}
    ready = 0
    for node in worker.parsed_nodes():
        if not node.ready:
            continue
        ready += 1
        for r, v in node.allocatable.items():
            capacity[r] = capacity.get(r, 0) + v
    usage: dict[str, int] = {}
    for pod, _ in worker.bound_pods():
        for r, v in pod.requests.items():
            usage[r] = usage.get(r, 0) + v
    return (
        {r: format_quantity(v, r) for r, v in sorted(capacity.items())},
        {r: format_quantity(v, r) for r, v in sorted(usage.items())},
        ready,
    )
