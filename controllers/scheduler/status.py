"""What the scheduler loop tells people: a PodGroup per placed Workload, its condition,
Events on the Workload and the Job, and a history record for every placement and every
reason a group waits.

PodGroups mirror scheduling.k8s.io/v1beta1: gang minCount (the admitted pods), priority,
disruptionMode single, and the condition `PodGroupInitiallyScheduled`: True with reason
`Scheduled` once every admitted pod is bound (and then never False again for that
admission, as the real API has it), False with `Unschedulable` (and the placement core's
reason) or `SchedulerError` (a binding failed, or the group's own objects are malformed)
until then. The PodGroup is owned by its Workload, so garbage collection deletes it with
the Workload. How many pods are bound is in the condition's message ("16 of 16 pods
bound"): the API has no count field yet.

Writes go through a coalescing writer (at most one per PodGroup per interval, none when
nothing changed); a group that keeps waiting for the same reason gets one Event and one
history record, not one per pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from kubernetes.client.exceptions import ApiException

from controllers.history.records import PlacementDecision
from controllers.runtime import apply
from controllers.runtime.coalesce import CoalescingWriter
from controllers.runtime.resources import POD_GROUP, Obj
from controllers.scheduler.groups import Group
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.conditions import PodGroupConditions as PGC
from quota.api.meta import ObjectMeta, OwnerReference
from quota.api.podgroup import (
    HIGHEST_USER_PRIORITY,
    GangSchedulingPolicy,
    PodGroup,
    PodGroupSchedulingPolicy,
    PodGroupSpec,
    WorkloadReference,
)

log = logging.getLogger(__name__)

SCHEDULED = "Scheduled"
WAITING_FOR_PODS = "WaitingForPods"
# A group that keeps waiting for the same reason is told again this often, no more.
REPEAT_AFTER = 300.0
_MAX_REASON = 2000


@dataclass(frozen=True)
class Desired:
    """What a PodGroup should say; compared whole, so equal requests cost nothing."""

    manifest: Obj  # the PodGroup to create when it is missing (spec included)
    status: str  # "True" / "False"
    reason: str
    message: str
    since: str  # QuotaReserved transition of the admission this speaks of
    scheduled: int  # pods of the group bound to nodes


def pod_group_manifest(group: Group) -> Obj:
    """The PodGroup of a Workload, validated through the API model."""
    meta = group.workload.get("metadata") or {}
    spec = group.workload.get("spec") or {}
    model = PodGroup(
        metadata=ObjectMeta(
            name=group.name,
            namespace=group.namespace,
            labels=dict(meta.get("labels") or {}),
            owner_references=[
                OwnerReference(
                    api_version=str(group.workload.get("apiVersion") or "muster.dev/v1alpha1"),
                    kind="Workload",
                    name=group.name,
                    uid=group.uid,
                    controller=True,
                )
            ],
        ),
        spec=PodGroupSpec(
            workload_ref=WorkloadReference(workload_name=group.name, template_name=group.pod_set),
            scheduling_policy=PodGroupSchedulingPolicy(
                gang=GangSchedulingPolicy(min_count=max(1, group.min_count))
            ),
            priority_class_name=spec.get("priorityClassName") or None,
            # System classes (2e9) sit above what a user may set, which is all the API takes.
            priority=min(group.priority, HIGHEST_USER_PRIORITY),
        ),
    )
    return model.to_manifest()


class Publisher:
    """PodGroup status, Events and history records for the groups a pass looked at."""

    def __init__(
        self, ctx: Context, *, interval: float = 1.0, max_interval: float | None = None
    ) -> None:
        self.ctx = ctx
        self.writer: CoalescingWriter[str] = CoalescingWriter(
            "podgroup-status", self._write, interval=interval, max_interval=max_interval
        )
        # Workload key -> (what it was last told about waiting, when): the coalescing.
        self._told: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def start(self, is_leader: Callable[[], bool]) -> None:
        self.writer.start(enabled=is_leader)

    def stop(self) -> None:
        self.writer.stop()

    # ----------------------------------------------------------------- telling
    def _submit(self, group: Group, status: str, reason: str, message: str, scheduled: int) -> None:
        since = str(
            (wls.condition(group.workload, wls.QUOTA_RESERVED) or {}).get("lastTransitionTime")
            or ""
        )
        try:
            manifest = pod_group_manifest(group)
        except ValueError as error:  # a Workload the PodGroup model refuses: say so once
            log.warning(
                "cannot describe PodGroup", extra={"workload": group.key, "error": str(error)[:300]}
            )
            return
        self.writer.submit(
            group.key, Desired(manifest, status, reason, message[:32768], since, scheduled)
        )

    def scheduled(self, group: Group, bound: int) -> None:
        """Every admitted pod of the group is bound (`bound` of them)."""
        with self._lock:
            self._told.pop(group.key, None)
        self._submit(
            group,
            "True",
            SCHEDULED,
            f"{bound} of {group.admitted} pods bound (gang minCount {group.min_count})",
            bound,
        )

    def waiting_for_pods(self, group: Group) -> None:
        """Not all of the gang's pods exist (or are ungated) yet."""
        have = len(group.bound) + len(group.waiting)
        self._submit(
            group,
            "False",
            WAITING_FOR_PODS,
            f"waiting for the gang's pods: {have} of {group.min_count} exist and may be "
            f"scheduled ({group.gated} held by a scheduling gate)",
            len(group.bound),
        )

    def placed(self, group: Group, counts: dict[str, int], how: str, nodes_text: str) -> None:
        """Pods of the group were bound (`counts`: node -> pods bound by this placement)."""
        now = self.ctx.now()
        total = sum(counts.values())
        waited = _since(group.admitted_at, now)
        where = f" ({how})" if how else ""
        message = f"placed {total} pod{'s' if total != 1 else ''} on {nodes_text}{where}"
        reason = f"{message}; {waited} after admission" if waited else message
        with self._lock:
            self._told.pop(group.key, None)
        for obj in (group.workload, group.job):
            self.ctx.events.emit(obj, "Normal", "Placed", message)
        self._record(group, now, dict(counts), reason)
        log.info(
            "placed group",
            extra={"workload": group.key, "pods": total, "nodes": len(counts), "detail": reason},
        )

    def unplaceable(self, group: Group, reason: str, *, error: bool = False) -> None:
        """The group waits: no placement (or its objects cannot be read, or binding failed)."""
        condition = PGC.SCHEDULER_ERROR if error else PGC.UNSCHEDULABLE
        message = f"cannot place: {reason}"
        if not group.scheduled:
            self._submit(group, "False", condition, message, len(group.bound))
        now = time.monotonic()
        with self._lock:
            told = self._told.get(group.key)
            if told is not None and told[0] == message and now - told[1] < REPEAT_AFTER:
                return
            self._told[group.key] = (message, now)
        for obj in (group.workload, group.job):
            self.ctx.events.emit(obj, "Warning", "FailedPlacement", message)
        self._record(group, self.ctx.now(), {}, message)
        log.info("cannot place group", extra={"workload": group.key, "reason": reason})

    def forget(self, keys: set[str]) -> None:
        """Drop what was told about groups that are no longer admitted."""
        with self._lock:
            for key in [k for k in self._told if k not in keys]:
                del self._told[key]

    def _record(self, group: Group, at: datetime, counts: dict[str, int], reason: str) -> None:
        # One record per decision: keyed by the millisecond it was taken, so two decisions
        # are two rows, and a replay of the same one (the spool) is one.
        sequence = int(at.timestamp() * 1000)
        namespace, name, uid, queue = group.namespace, group.name, group.uid, group.cluster_queue

        def make() -> list[PlacementDecision]:
            return [
                PlacementDecision(
                    namespace=namespace,
                    name=name,
                    uid=uid,
                    pod_group=name,
                    at=at,
                    sequence=sequence,
                    cluster_queue=queue,
                    assignments=counts,
                    reason=reason[:_MAX_REASON],
                )
            ]

        self.ctx.record_later(make)

    # ----------------------------------------------------------------- writing
    def _write(self, key: str, desired: Desired) -> None:
        caches, kube = self.ctx.caches, self.ctx.kube
        if caches.workloads.get(key) is None:
            return  # the Workload is gone (its PodGroup goes with it): nothing to say
        current = caches.pod_groups.get(key)
        if current is None:
            try:
                current, _ = apply.create(
                    kube, POD_GROUP, desired.manifest, cache=caches.pod_groups
                )
            except ApiException as error:
                if error.status in (403, 404):
                    # The namespace is being deleted (403) or gone (404): so is the
                    # Workload, whatever the cache says yet; retrying cannot succeed.
                    log.debug("no PodGroup", extra={"workload": key, "status": error.status})
                    return
                raise
        want_spec = desired.manifest["spec"]

        def set_spec(pg: Obj) -> bool:
            # minCount follows the admission (an elastic Job shrinks in place); the rest of
            # the spec is fixed at creation.
            spec = pg.setdefault("spec", {})
            changed = False
            for field in ("schedulingPolicy", "priority"):
                if spec.get(field) != want_spec.get(field):
                    spec[field] = want_spec.get(field)
                    changed = True
            return changed

        current = apply.update(
            kube, POD_GROUP, key, set_spec, cache=caches.pod_groups, current=current
        )
        if current is None:
            return

        def set_status(pg: Obj) -> bool:
            status = pg.setdefault("status", {})
            counted = bool(status.get("scheduled") != desired.scheduled)
            if counted:
                status["scheduled"] = desired.scheduled
            found = wls.condition(pg, PGC.INITIALLY_SCHEDULED) or {}
            # Terminal once True for this admission, as in scheduling.k8s.io.
            settled = (
                found.get("status") == "True"
                and str(found.get("lastTransitionTime") or "") >= desired.since
            )
            if settled and desired.status != "True":
                return counted
            changed = counted
            if found.get("status") == "True" and not settled:
                # True for an earlier admission: this one starts afresh, with its own time.
                changed = wls.remove_condition(pg, PGC.INITIALLY_SCHEDULED) or changed
            return changed | wls.set_condition(
                pg,
                PGC.INITIALLY_SCHEDULED,
                desired.status,
                desired.reason,
                desired.message,
                self.ctx.now(),
            )

        apply.update(
            kube, POD_GROUP, key, set_status, cache=caches.pod_groups, current=current, status=True
        )


def _since(start: datetime | None, now: datetime) -> str:
    if start is None:
        return ""
    seconds = max(0.0, (now - start).total_seconds())
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
