"""The two foreign PodGroup APIs, read and told in their own terms.

- Volcano, `scheduling.volcano.sh/v1beta1` PodGroup: `spec.minMember`, `spec.minResources`,
  `spec.queue` (default "default") or the annotation `scheduling.volcano.sh/queue-name`,
  `spec.priorityClassName`. Its pods name it by the annotation `scheduling.k8s.io/group-name`
  (what Kubeflow Trainer writes). Status: `phase` Pending -> Inqueue (Muster reserved its
  quota) -> Running (minMember pods bound) -> Completed (its pods finished), conditions
  `Unschedulable` / `Scheduled` as Volcano's scheduler writes them, and `running`. Volcano's
  CRD has no status subresource (its Go types carry no `+kubebuilder:subresource:status`), so
  status is written on the main resource.
- Native, `scheduling.k8s.io/v1beta1` PodGroup (Kubernetes 1.37, GenericWorkload):
  `spec.schedulingPolicy.gang.minCount` (a `basic` group, pod by pod, is refused),
  `spec.priorityClassName` / `spec.priority`. Its pods name it in
  `spec.schedulingGroup.podGroupName`. Status: the condition `PodGroupInitiallyScheduled`
  (False with reason `Unschedulable` and why, True once the gang is bound; terminal once
  True), through the status subresource.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from controllers.runtime.resources import Kind, Obj
from controllers.state import workloads as wls
from controllers.state.foreigngroups import (
    NATIVE_GROUP,
    VOLCANO_GROUP,
    VOLCANO_QUEUE_ANNOTATION,
)
from quota.api.conditions import PodGroupConditions as PGC
from quota.api.names import QUEUE_LABEL

VOLCANO_KIND = Kind("PodGroup", True, group=VOLCANO_GROUP, version="v1beta1", plural="podgroups")
NATIVE_KIND = Kind("PodGroup", True, group=NATIVE_GROUP, version="v1beta1", plural="podgroups")

# Where a group stands, as both APIs are told it.
Stage = Literal["refused", "queued", "admitted", "placed", "finished"]

# Volcano's phases and condition types (volcano.sh/apis scheduling/v1beta1).
PENDING, INQUEUE, RUNNING, COMPLETED = "Pending", "Inqueue", "Running", "Completed"
VOLCANO_UNSCHEDULABLE, VOLCANO_SCHEDULED = "Unschedulable", "Scheduled"


@dataclass(frozen=True)
class Told:
    """What a foreign PodGroup should say: its stage, a reason word, a message people read,
    and how many of its pods are bound to nodes."""

    stage: Stage
    reason: str
    message: str
    bound: int


@dataclass(frozen=True)
class ForeignKind:
    """One foreign PodGroup API."""

    api_group: str
    kind: Kind
    status_subresource: bool

    @property
    def api_version(self) -> str:
        return f"{self.api_group}/v1beta1"

    @property
    def label(self) -> str:
        return "Volcano" if self.api_group == VOLCANO_GROUP else "native"

    def min_count(self, pg: Mapping[str, Any]) -> int:
        spec = pg.get("spec") or {}
        if self.api_group == VOLCANO_GROUP:
            value = spec.get("minMember")
        else:
            value = ((spec.get("schedulingPolicy") or {}).get("gang") or {}).get("minCount")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def min_count_field(self) -> str:
        if self.api_group == VOLCANO_GROUP:
            return "spec.minMember"
        return "spec.schedulingPolicy.gang.minCount"

    def queue(self, pg: Mapping[str, Any]) -> tuple[str | None, str]:
        """The queue the group names and the field it was read from."""
        meta = pg.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if labels.get(QUEUE_LABEL):
            return str(labels[QUEUE_LABEL]), f"metadata.labels[{QUEUE_LABEL}]"
        if annotations.get(VOLCANO_QUEUE_ANNOTATION):
            return (
                str(annotations[VOLCANO_QUEUE_ANNOTATION]),
                f"metadata.annotations[{VOLCANO_QUEUE_ANNOTATION}]",
            )
        if self.api_group == VOLCANO_GROUP:
            # The CRD defaults spec.queue to "default", as Volcano's scheduler reads it.
            return str((pg.get("spec") or {}).get("queue") or "default"), "spec.queue"
        return None, f"metadata.labels[{QUEUE_LABEL}]"

    def priority(self, pg: Mapping[str, Any]) -> tuple[str | None, int | None]:
        """(PriorityClass name, explicit priority) the group asks for, if any."""
        spec = pg.get("spec") or {}
        name = spec.get("priorityClassName") or None
        value = spec.get("priority") if self.api_group == NATIVE_GROUP else None
        explicit = value if isinstance(value, int) and not isinstance(value, bool) else None
        return (str(name) if name else None), explicit

    def tell(self, pg: Obj, told: Told, now: datetime) -> bool:
        """Write `told` into the PodGroup dict in its API's terms; False if it already says it."""
        if self.api_group == VOLCANO_GROUP:
            return _tell_volcano(pg, told, now)
        return _tell_native(pg, told, now)


VOLCANO = ForeignKind(VOLCANO_GROUP, VOLCANO_KIND, status_subresource=False)
NATIVE = ForeignKind(NATIVE_GROUP, NATIVE_KIND, status_subresource=True)
KINDS = (VOLCANO, NATIVE)


def kind_of(api_group: str) -> ForeignKind:
    return next(k for k in KINDS if k.api_group == api_group)


def _tell_native(pg: Obj, told: Told, now: datetime) -> bool:
    found = wls.condition(pg, PGC.INITIALLY_SCHEDULED) or {}
    if found.get("status") == "True":
        return False  # terminal once True, as kube-scheduler treats it
    if told.stage in ("placed", "finished"):
        return wls.set_condition(
            pg, PGC.INITIALLY_SCHEDULED, "True", "Scheduled", told.message, now
        )
    return wls.set_condition(
        pg, PGC.INITIALLY_SCHEDULED, "False", PGC.UNSCHEDULABLE, told.message, now
    )


_PHASE = {
    "refused": PENDING,
    "queued": PENDING,
    "admitted": INQUEUE,
    "placed": RUNNING,
    "finished": COMPLETED,
}


def _volcano_condition(
    pg: Obj, type_: str, status: str, reason: str, message: str, now: datetime
) -> bool:
    """Volcano's PodGroupCondition (no observedGeneration; its CRD would prune it, and then
    every comparison would differ)."""
    current = wls.conditions(pg)
    previous = next((c for c in current if c.get("type") == type_), None)
    since = (
        previous.get("lastTransitionTime")
        if previous and previous.get("status") == status and previous.get("lastTransitionTime")
        else wls.rfc3339(now)
    )
    updated = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since,
    }
    if previous is not None and {k: previous.get(k) for k in updated} == updated:
        return False
    wls.status_of(pg)["conditions"] = [c for c in current if c.get("type") != type_] + [updated]
    return True


def _tell_volcano(pg: Obj, told: Told, now: datetime) -> bool:
    status = wls.status_of(pg)
    changed = False
    phase = _PHASE[told.stage]
    if status.get("phase") != phase:
        status["phase"] = phase
        changed = True
    if status.get("running", 0) != told.bound:
        status["running"] = told.bound
        changed = True
    if told.stage in ("placed", "finished"):
        changed |= _volcano_condition(pg, VOLCANO_SCHEDULED, "True", told.reason, told.message, now)
        if wls.condition(pg, VOLCANO_UNSCHEDULABLE) is not None:
            changed |= _volcano_condition(
                pg, VOLCANO_UNSCHEDULABLE, "False", told.reason, told.message, now
            )
    else:
        changed |= _volcano_condition(
            pg, VOLCANO_UNSCHEDULABLE, "True", told.reason, told.message, now
        )
    return changed
