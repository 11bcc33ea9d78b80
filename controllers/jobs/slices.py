"""Elastic workloads as WorkloadSlices (after Kueue KEP-77), for any kind whose
`GenericJob.is_elastic()` says so; the "Job" below is such an object.

An elastic Job has at most two active Workloads: the admitted slice its running pods belong
to, and at most one pending slice asking for a new size. The pod sets that scale are those
`GenericJob.elastic_sizes()` names (a batch Job's one, each worker group of a RayCluster);
the others keep their size.

- Scale-down (of any pod set) updates the admitted slice in place (admission first, so the
  quota is free at once, then the spec); a pending scale-up slice is dropped unless another
  pod set grows at the same time. The admission never shrinks
  below the Job's ungated pods that still hold capacity: quota is freed as they go.
- Scale-up creates a slice for the full new size that `replaces` the admitted one; the
  engine charges only the extra pods, on the same flavors. Once it is admitted the old slice
  is marked Finished with reason WorkloadSliceReplaced and the new pods' gates are lifted.
- Another scale event while a slice is pending resizes that pending slice in place (with
  the resourceVersion it was read at, so a slice admitted meanwhile is never rewritten).

Every step is recomputed from the Job, its Workloads and its pods on each reconcile, so
rapid scale events and restarts converge to the same state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from controllers.jobs import gates, preempted
from controllers.jobs.framework import Driver, GenericJob, same_request
from controllers.runtime import apply
from controllers.runtime.resources import WORKLOAD, Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Context
from controllers.state.dispatch import awaits_manager
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import JOB_NAME_LABEL
from quota.api.quantity import format_quantity, parse_quantity
from quota.lifecycle.slices import slice_replaced_message, superseded_slice

log = logging.getLogger(__name__)


def _count(wl: Obj, pod_set: str) -> int:
    for ps in (wl.get("spec") or {}).get("podSets") or []:
        if ps.get("name") == pod_set:
            return int(ps.get("count") or 0)
    return 0


def _created(wl: Obj) -> tuple[str, str]:
    meta = wl.get("metadata") or {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


# Requeue delay when a step could not be written (a slice to retire, or pods still holding
# capacity past the Job's parallelism), in case no event brings the Job back.
RETRY_SECONDS = 1.0


class Writer(Protocol):
    """What the slice steps below need of their caller (a `Driver`, or the owner-group
    intake, `controllers.owners.intake`)."""

    ctx: Context

    def update_workload(
        self, wl: Obj, mutate: apply.Mutation, *, status: bool = False
    ) -> Obj | None: ...


def retire_replaced(
    rec: Writer, active: list[Obj], pod_sets: Iterable[str]
) -> tuple[list[Obj], bool]:
    """Finish every slice that an admitted slice replaces (its message counts the pods of
    `pod_sets`, those that scale); returns what stays active, and whether a retirement
    could not be written (so the caller requeues)."""
    scaling = tuple(pod_sets)
    by_name = {w["metadata"]["name"]: w for w in active}
    retired: set[str] = set()
    failed = False
    for wl in active:
        target = superseded_slice(wl["metadata"]["name"], wls.replaces(wl), by_name)
        if target is None or not wls.has_quota(wl):
            continue
        old = by_name[target]
        now = rec.ctx.now()
        pods = sum(_count(wl, pod_set) for pod_set in scaling)
        message = slice_replaced_message(wl["metadata"]["name"], pods)

        def finish(w: Obj, m: str = message, t: datetime = now) -> bool:
            return wls.mark_finished(w, WC.SLICE_REPLACED, m, t)

        try:
            written = rec.update_workload(old, finish, status=True)
        except Exception:
            log.warning("could not retire replaced slice", extra={"workload": object_key(old)})
            failed = True
            continue
        # None: the slice is gone, which retires it as well.
        retired.add(target)
        if written is not None and wls.is_finished(written):
            rec.ctx.events.emit(written, "Normal", WC.SLICE_REPLACED, message)
    return [w for w in active if w["metadata"]["name"] not in retired], failed


def delete_pending(rec: Writer, pending: list[Obj]) -> None:
    for wl in pending:
        # A pending slice holds no quota: its finalizer goes first, in a write that checks it
        # is still pending, so the delete below completes at once.
        def release(w: Obj) -> bool:
            return not wls.has_quota(w) and wls.set_finalizer(w, False)

        written = apply.update(
            rec.ctx.kube, WORKLOAD, object_key(wl), release, cache=None, current=wl
        )
        if written is None or wls.has_quota(written):
            continue  # gone already, or admitted meanwhile: the next reconcile sees it
        # Only the version we wrote: if the admission loop admitted it meanwhile, the
        # delete fails and the next reconcile sees the admitted slice.
        if apply.delete(
            rec.ctx.kube, WORKLOAD, written, cache=rec.ctx.caches.workloads, unchanged=True
        ):
            log.info("deleted pending slice", extra={"workload": object_key(wl)})
            rec.ctx.poke_admission()


def scale_down(rec: Writer, wl: Obj, count: int, pod_set: str) -> Obj | None:
    """Shrink an admitted slice in place: the admission first (frees quota immediately),
    then the spec."""
    per_pod: dict[str, int] = {}
    for ps in (wl.get("spec") or {}).get("podSets") or []:
        if ps.get("name") == pod_set:
            per_pod = {r: parse_quantity(v, r) for r, v in (ps.get("requests") or {}).items()}

    def shrink_admission(w: Obj) -> bool:
        if not wls.has_quota(w):
            return False
        changed = False
        for assignment in (w["status"].get("admission") or {}).get("podSetAssignments") or []:
            if assignment.get("name") == pod_set and int(assignment.get("count") or 0) > count:
                assignment["count"] = count
                assignment["resourceUsage"] = {
                    r: format_quantity(v * count, r) for r, v in per_pod.items()
                }
                changed = True
        return changed

    before = wls.admitted_count(wl, pod_set)
    written = rec.update_workload(wl, shrink_admission, status=True)
    if written is None:
        return None

    def shrink_spec(w: Obj) -> bool:
        changed = False
        for ps in (w.get("spec") or {}).get("podSets") or []:
            if ps.get("name") == pod_set and int(ps.get("count") or 0) > count:
                ps["count"] = count
                if ps.get("minCount") and ps["minCount"] > count:
                    ps["minCount"] = count
                changed = True
        return changed

    written = rec.update_workload(written, shrink_spec)
    if written is not None and before > count:
        rec.ctx.events.emit(
            written,
            "Normal",
            "ScaledDown",
            f"scaled down in place from {before} to {count} pods; quota released",
        )
        rec.ctx.poke_admission()
    return written


def reconcile_elastic(rec: Driver, job: GenericJob, owned: list[Obj]) -> float | None:
    """Bring an elastic Job's slices and gates in line with the size of each pod set that
    scales (a batch Job's parallelism)."""
    obj = job.object
    meta = obj["metadata"]
    uid, job_name = meta["uid"], meta["name"]
    first_name = wls.workload_name(job_name, uid)
    sizes = job.elastic_sizes()
    active, retry = retire_replaced(rec, [w for w in owned if wls.is_active(w)], sizes)
    if retry:
        return RETRY_SECONDS
    admitted = sorted((w for w in active if wls.has_quota(w)), key=_created)
    pending = sorted((w for w in active if not wls.has_quota(w)), key=_created)

    if len(admitted) > 1:
        # Two admitted slices neither of which replaces the other cannot come from this
        # controller; keep counting both (no quota is lost) and let a person look.
        log.warning(
            "job has several admitted slices",
            extra={"job": object_key(obj), "slices": [w["metadata"]["name"] for w in admitted]},
        )
    current = admitted[-1] if admitted else None

    if current is None and not job.is_suspended() and _cache_missed_admission(rec, obj):
        return RETRY_SECONDS
    if current is None:
        # Nothing admitted: one pending Workload for the whole Job, like a plain Job.
        slice_name = first_name
        keep = next((w for w in pending if w["metadata"]["name"] == first_name), None)
        keep = keep or (pending[-1] if pending else None)
        delete_pending(rec, [w for w in pending if w is not keep])
        desired = rec.desired_spec(job, slice_name=slice_name)
        if keep is None:
            rec.suspend(job)
            taken = {w["metadata"]["name"] for w in owned}
            name = first_name if first_name not in taken else _slice_name(obj)
            rec.new_workload(job, desired, name)
            return None
        return rec.drive(job, keep, desired)

    if wls.is_evicted(current):
        delete_pending(rec, pending)
        return rec.stop(job, current)
    if job.is_suspended():
        if not awaits_manager(obj):
            rec.start(job, current)
        return None  # the Job's pods appear next; their events bring us back to ungate

    slice_name = (current.get("spec") or {}).get("sliceName") or first_name
    requeue: float | None = None
    pods = rec.ctx.caches.pods_of_job(uid)
    only = len(sizes) == 1
    # Pods single-pod preemption took (preempted.py): they go, and the Job asks them back.
    shed = preempted.was_shed(current)
    if shed:
        _shed(rec, obj, current, {ps: gates.in_pod_set(pods, ps, only) for ps in sizes})
    for pod_set, size in sizes.items():
        if size < _count(current, pod_set) or size < wls.admitted_count(current, pod_set):
            # Keep admitted what ungated pods still hold: the Job controller may not have
            # deleted the excess pods yet, or never will if parallelism rises again before
            # it acts (7 -> 2 -> 9 within milliseconds). Quota is released as those pods go
            # (their deletion brings us back), down to the size; with kwok that is at once.
            holding = gates.ungated_holding(gates.in_pod_set(pods, pod_set, only))
            target = max(size, holding)
            if target < _count(current, pod_set) or target < wls.admitted_count(current, pod_set):
                current = scale_down(rec, current, target, pod_set) or current
            if target > size:
                requeue = RETRY_SECONDS
    grow = any(
        size > _count(current, pod_set) or (shed and size > wls.admitted_count(current, pod_set))
        for pod_set, size in sizes.items()
    )
    if grow:
        want = rec.desired_spec(job, slice_name=slice_name, replaces=current["metadata"]["name"])
        keep = pending[-1] if pending else None
        delete_pending(rec, pending[:-1])
        if keep is None:
            rec.new_workload(job, want, _slice_name(obj))
        elif not same_request(keep.get("spec") or {}, want):
            rec.update_workload_spec(keep, want)
    else:
        delete_pending(rec, pending)

    # Never release more pods than the Job asks for, even while the admission still covers
    # pods on their way out.
    allowed = {
        pod_set: min(wls.admitted_count(current, pod_set), size) for pod_set, size in sizes.items()
    }
    gates.lift(rec.ctx, obj, allowed, job.pods_selector())
    return requeue


def _shed(rec: Driver, job: Obj, wl: Obj, by_set: Mapping[str, list[Obj]]) -> None:
    """Delete the running pods past an admission single-pod preemption shrank, the named
    ones first, and tell the Job."""
    names = preempted.preempted_names(wl)
    gone = [
        pod
        for pod_set, members in by_set.items()
        for pod in preempted.excess(
            [x for x in members if gates.runs(x)],
            wls.admitted_count(wl, pod_set),
            names,
        )
    ]
    if not gone:
        return
    why = f"preempted by Muster: Workload {wl['metadata']['name']} was shrunk to its pods that stay"
    if preempted.delete_marked(rec.ctx, gone, why, rec.ctx.now()):
        lost = ", ".join(sorted(str(x["metadata"]["name"]) for x in gone))
        rec.ctx.events.emit(job, "Warning", WC.PODS_PREEMPTED, f"{why}: {lost}")


def _cache_missed_admission(rec: Driver, job: Obj) -> bool:
    """Before suspending a running elastic Job (which stops its pods), ask the apiserver, not
    the cache, whether a slice holds quota. The cache can briefly lag the admission loop's
    write of a fresh slice; acting on that lag would stop pods that are allowed to run.
    When the apiserver disagrees, its copies go into the cache and the Job is retried."""
    meta = job["metadata"]
    fresh, _ = rec.ctx.kube.list(
        WORKLOAD, meta["namespace"], label_selector=f"{JOB_NAME_LABEL}={meta['name']}"
    )
    admitted = [w for w in fresh if wls.has_quota(w)]
    if not admitted:
        return False
    for wl in fresh:
        rec.ctx.caches.workloads.write_through(wl)
    log.warning(
        "cache lagged an admitted slice; not suspending",
        extra={"job": object_key(job), "slices": [w["metadata"]["name"] for w in admitted]},
    )
    return True


def _slice_name(job: Obj) -> str:
    meta: dict[str, Any] = job["metadata"]
    return wls.workload_name(meta["name"], meta["uid"], int(meta.get("generation") or 0))
