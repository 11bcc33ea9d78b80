"""Which changes to watched objects are worth acting on.

Informers call back on every update, most of them heartbeats and status writes that change
nothing anyone decides from; comparing the few fields that matter keeps the admission loop
from running a cycle per write.
"""

from __future__ import annotations

import json
from typing import Any

from controllers.runtime.resources import Obj


def decision_inputs(wl: Obj) -> tuple[Any, ...]:
    """What the Job reconciler and the admission loop read from a Workload."""
    status = wl.get("status") or {}
    conditions = {
        c.get("type"): c.get("status")
        for c in status.get("conditions") or []
        if c.get("type") in ("QuotaReserved", "Evicted", "Finished")
    }
    meta = wl.get("metadata") or {}
    return (
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        json.dumps(status.get("admission"), sort_keys=True),
        json.dumps(status.get("requeueState"), sort_keys=True),
        tuple(sorted(conditions.items())),
    )


def node_shape(node: Obj) -> tuple[Any, ...]:
    """What the engine reads from a Node: labels, allocatable, taints, schedulability."""
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    meta = node.get("metadata") or {}
    return (
        json.dumps(meta.get("labels") or {}, sort_keys=True),
        json.dumps(status.get("allocatable") or {}, sort_keys=True),
        json.dumps((node.get("spec") or {}).get("taints") or [], sort_keys=True),
        bool((node.get("spec") or {}).get("unschedulable")),
        ready,
    )
