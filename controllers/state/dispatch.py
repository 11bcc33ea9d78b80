"""What the rest of the controller must know of dispatching to worker clusters
(controllers/multicluster): which objects are copies waiting for their manager, and which
workloads a dispatching queue cannot send. Here, below the Job reconciler and the admission
view that ask, so that neither depends on the dispatcher."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from controllers.runtime.resources import Obj
from controllers.state import workloads as wls
from quota.api.names import (
    DISPATCH_MANAGED_BY,
    DISPATCH_START_ANNOTATION,
    DISPATCHED_FROM_ANNOTATION,
)


class JobLookup(Protocol):
    def get(self, key: str) -> Obj | None: ...


def awaits_manager(obj: Mapping[str, Any]) -> bool:
    """A copy sent by a management cluster that has not let it start: the worker's Muster
    admits it and keeps it suspended (see the module's docstring)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return DISPATCHED_FROM_ANNOTATION in annotations and (
        annotations.get(DISPATCH_START_ANNOTATION) != "true"
    )


def not_dispatchable(workload: Mapping[str, Any], jobs: JobLookup, queue: str) -> str | None:
    """Why a Workload of a dispatching ClusterQueue cannot be sent to a worker cluster, or
    None. Only batch Jobs (elastic ones too) are sent (for now), and only those created with
    spec.managedBy
    muster.dev/multicluster: without it the Job controller here would run the Job here too
    (managedBy is immutable, so it must be set at creation)."""
    owner = wls.owner_reference(workload) or {}
    kind = owner.get("kind")
    if kind != "Job" or not str(owner.get("apiVersion") or "").startswith("batch/"):
        return (
            f"ClusterQueue {queue} runs its workloads in worker clusters, and only batch "
            f"Jobs are sent there (this workload is a {kind or 'workload without an owner'}); "
            "submit it to a queue that runs workloads here"
        )
    key = wls.owner_job_key(workload)
    job = jobs.get(key) if key else None
    if job is None:
        return None  # its Job is not in the cache yet: the next cycle sees it
    if (job.get("spec") or {}).get("managedBy") != DISPATCH_MANAGED_BY:
        return (
            f"ClusterQueue {queue} runs its workloads in worker clusters: Job {key} must be "
            f"created with spec.managedBy: {DISPATCH_MANAGED_BY} (it cannot be added later); "
            "delete it and create it again with that field"
        )
    return None
