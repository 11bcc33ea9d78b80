"""Status conditions (the metav1.Condition shape) and the condition types and reasons Muster
writes. Reasons are CamelCase words a person can search for; the message says what to do."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, Field

from quota.api.meta import ApiModel

ConditionStatus = Literal["True", "False", "Unknown"]

# The patterns metav1.Condition enforces, so a condition we accept the apiserver accepts.
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

# Conditions form a map keyed by type (one condition per type), as metav1 declares them.
_CONDITIONS_LIST: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


def conditions_field(description: str) -> Any:
    """The `status.conditions` field of a kind; `description` names its types and reasons."""
    return Field(
        default_factory=list,
        max_length=16,
        description=description,
        json_schema_extra=_CONDITIONS_LIST,
    )


class Condition(ApiModel):
    """One aspect of an object's current state, with the reason it is so."""

    type: str = Field(
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
        description="The aspect this condition describes, e.g. Active or Admitted.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=REASON_PATTERN,
        description="A CamelCase word for why the condition is in this state.",
    )
    message: str = Field(
        "", max_length=32768, description="A human-readable explanation, with numbers."
    )
    last_transition_time: AwareDatetime = Field(
        description="When status last changed (not when the message last changed)."
    )
    observed_generation: int | None = Field(
        None, ge=0, description="The metadata.generation this condition was computed from."
    )


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of the given type, if present."""
    return next((c for c in conditions if c.type == type_), None)


def is_true(conditions: Sequence[Condition], type_: str) -> bool:
    """Whether the condition of the given type is present and True."""
    found = find_condition(conditions, type_)
    return found is not None and found.status == "True"


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """Return the conditions with one type set; lastTransitionTime moves only when the status
    changes, so `kubectl get` keeps showing how long a queue has been inactive."""
    previous = find_condition(conditions, type_)
    since = previous.last_transition_time if previous and previous.status == status else now
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=observed_generation,
    )
    result = [c for c in conditions if c.type != type_]
    result.append(updated)
    return result


class ClusterQueueConditions:
    """Condition types and reasons of ClusterQueues and LocalQueues."""

    ACTIVE = "Active"
    # Reasons for Active.
    READY = "Ready"
    PARENT_NOT_FOUND = "ParentNotFound"
    CYCLE = "Cycle"
    FLAVOR_NOT_FOUND = "FlavorNotFound"
    ANCESTOR_INACTIVE = "AncestorInactive"
    STOPPED = "Stopped"
    CLUSTER_QUEUE_NOT_FOUND = "ClusterQueueNotFound"
    CLUSTER_QUEUE_NOT_LEAF = "ClusterQueueNotLeaf"
    CLUSTER_QUEUE_INACTIVE = "ClusterQueueInactive"
    NAMESPACE_NOT_SELECTED = "NamespaceNotSelected"


class WorkloadConditions:
    """Condition types and reasons of Workloads, in the style of Kueue and the native API."""

    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    REQUEUED = "Requeued"
    FINISHED = "Finished"
    PODS_READY = "PodsReady"

    # QuotaReserved / Admitted
    PENDING = "Pending"
    INADMISSIBLE = "Inadmissible"
    # Evicted
    EVICTED_BY_PREEMPTION = "Preempted"
    EVICTED_BY_RECLAIM = "Reclaimed"
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    CLUSTER_QUEUE_STOPPED = "ClusterQueueStopped"
    LOCAL_QUEUE_STOPPED = "LocalQueueStopped"
    DEACTIVATED = "Deactivated"
    JOB_RESIZED = "JobResized"  # a non-elastic Job asks for more pods than admitted
    MOVED = "Moved"  # consolidation: restarted on other nodes, room held for it there
    # Preempted
    WITHIN_QUEUE = "WithinQueue"
    RECLAIM = "Reclaim"
    # Requeued
    BACKOFF_FINISHED = "BackoffFinished"
    # Evicted and Preempted turn False with it once the pods are gone: the eviction is over
    # and the workload is queued again (Kueue ends them only when quota is reserved again).
    QUOTA_RELEASED = "QuotaReleased"
    # Finished
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    # Finished, for a slice replaced by a larger one
    SLICE_REPLACED = "WorkloadSliceReplaced"

    # Event reason on a disruptionMode Single victim that loses single pods, not evicted.
    PODS_PREEMPTED = "PodsPreempted"
    # Event reasons on a preemptor (and its owner): whom it evicts, by the plan's strategy.
    PREEMPTING = "Preempting"
    RECLAIMING = "Reclaiming"
    MOVING = "Moving"


class PodGroupConditions:
    """Condition types and reasons of PodGroups, as scheduling.k8s.io/v1beta1 names them
    in Kubernetes 1.37."""

    INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"
    DISRUPTION_TARGET = "DisruptionTarget"
    UNSCHEDULABLE = "Unschedulable"
    SCHEDULER_ERROR = "SchedulerError"
    PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
