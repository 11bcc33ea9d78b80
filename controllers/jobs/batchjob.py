"""batch/v1 Job integration: one Workload per Job, started when admitted, stopped when
evicted, finished when the Job finishes.

The Job reconciler observes a Job and its Workloads and moves the Job towards what the
Workloads say (the admission loop decides; this module only carries decisions out):

- no Workload yet: create it (deterministic name, owned by the Job) and keep the Job
  suspended;
- admitted: merge the assigned flavors' node labels and tolerations into the pod template
  (keeping the original in an annotation) and unsuspend;
- evicted: suspend, wait until the Job's pods are gone, restore the original template, and
  give the quota back with a requeue backoff;
- finished: mark the Workload Finished, which releases its quota at once.

Elastic Jobs (annotation muster.dev/elastic-job) go through `controllers.jobs.slices` and
`controllers.jobs.gates` instead of resizing by suspension.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from controllers.jobs import slices
from controllers.runtime import apply
from controllers.runtime.resources import JOB, WORKLOAD, Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import (
    ADMISSION_GATE,
    ELASTIC_POD_LABEL,
    JOB_POD_SET,
    MIN_PARALLELISM_ANNOTATION,
    ORIGINAL_SCHEDULING_ANNOTATION,
)
from quota.model import convert

log = logging.getLogger(__name__)

# Partial admission (see quota.model.convert); refused together with elastic by the webhook.
# The pod template's scheduling fields as the user wrote them, saved before the assigned
# flavor's node labels and tolerations are merged in, and restored on eviction.


# ------------------------------------------------------------------- reading a Job


queue_name = convert.job_queue_name
is_elastic = convert.job_is_elastic


def min_parallelism(job: Mapping[str, Any]) -> str | None:
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(MIN_PARALLELISM_ANNOTATION)
    return None if value is None else str(value)


def is_suspended(job: Mapping[str, Any]) -> bool:
    return bool((job.get("spec") or {}).get("suspend"))


def finished(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) if the Job has completed or failed."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return WC.SUCCEEDED, "the Job completed"
        if cond.get("type") == "Failed":
            detail = cond.get("message") or cond.get("reason") or ""
            return WC.FAILED, f"the Job failed{': ' + detail if detail else ''}"
    return None


def pods_gone(job: Mapping[str, Any]) -> bool:
    """No pod of the Job is running or terminating, and the Job controller has reset its
    start time (which it does on suspension; the template is mutable only after that)."""
    status = job.get("status") or {}
    return (
        not status.get("active") and not status.get("terminating") and not status.get("startTime")
    )


def as_written(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Job as its user wrote it: the saved nodeSelector, tolerations and parallelism in
    place of what Muster merged in at admission (a shallow copy; do not mutate)."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    if ORIGINAL_SCHEDULING_ANNOTATION not in annotations:
        return dict(job)
    original = original_scheduling(job)
    spec = dict(job.get("spec") or {})
    template = dict(spec.get("template") or {})
    pod_spec = dict(template.get("spec") or {})
    pod_spec["nodeSelector"] = original.get("nodeSelector") or {}
    pod_spec["tolerations"] = original.get("tolerations") or []
    template["spec"] = pod_spec
    spec["template"] = template
    if "parallelism" in original:
        spec["parallelism"] = original["parallelism"]
    view = dict(job)
    view["spec"] = spec
    return view


def pod_count(job: Mapping[str, Any]) -> int:
    """Pods the Job asks to run at once: min(parallelism, completions), with the user's
    parallelism while a partial admission has lowered it."""
    return convert.job_pod_count(as_written(job))


def original_scheduling(job: Mapping[str, Any]) -> dict[str, Any]:
    """The template's nodeSelector and tolerations as the user wrote them."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    saved = annotations.get(ORIGINAL_SCHEDULING_ANNOTATION)
    if saved:
        data: dict[str, Any] = json.loads(saved)
        return data
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return {
        "nodeSelector": dict(pod_spec.get("nodeSelector") or {}),
        "tolerations": list(pod_spec.get("tolerations") or []),
    }


def priority_classes(ctx: Context) -> tuple[dict[str, int], str | None]:
    """PriorityClass values by name, and the global default class (if any)."""
    values: dict[str, int] = {}
    default = None
    for pc in ctx.caches.priority_classes.objects():
        name = pc["metadata"]["name"]
        values[name] = int(pc.get("value") or 0)
        if pc.get("globalDefault"):
            default = name
    return values, default


def workload_spec(
    job: Mapping[str, Any],
    priorities: Mapping[str, int],
    *,
    global_default: str | None = None,
    count: int | None = None,
    slice_name: str | None = None,
    replaces: str | None = None,
) -> Obj:
    """The Workload spec for a Job, through the one Job -> Workload conversion
    (`quota.model.convert`), from the Job as its user wrote it. Raises ManifestError naming the
    Job's field when the Job cannot be queued."""
    view = as_written(job)
    model = convert.job_to_workload_model(
        view, priorities, global_default=global_default, count=count
    )
    spec: Obj = model.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    affinity = (((view.get("spec") or {}).get("template") or {}).get("spec") or {}).get("affinity")
    if affinity:
        spec["podSets"][0].setdefault("template", {})["affinity"] = affinity
    if slice_name:
        spec["sliceName"] = slice_name
    if replaces:
        spec["replaces"] = replaces
    return spec


def same_request(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two Workload specs ask for the same thing (queue, priority, pod sets)."""
    keys = ("queueName", "priority", "priorityClassName", "podSets", "sliceName", "replaces")
    return all(a.get(k) == b.get(k) for k in keys)


# --------------------------------------------------------------- changing a Job


def inject_flavors(
    job: Obj, flavors: Sequence[Mapping[str, Any]], admitted_pods: int | None = None
) -> None:
    """Merge the node labels and tolerations of the assigned flavors into the pod
    template, saving the user's originals first (once). A partial admission
    (`admitted_pods` below the Job's size) also lowers parallelism to what was admitted."""
    meta = job.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {})
    original = original_scheduling(job)
    if ORIGINAL_SCHEDULING_ANNOTATION not in annotations:
        saved = dict(original)
        if admitted_pods is not None and admitted_pods < pod_count(job):
            saved["parallelism"] = job["spec"].get("parallelism", 1)
            job["spec"]["parallelism"] = admitted_pods
        annotations[ORIGINAL_SCHEDULING_ANNOTATION] = json.dumps(saved, sort_keys=True)
    pod_spec = job["spec"]["template"].setdefault("spec", {})
    selector = dict(original.get("nodeSelector") or {})
    tolerations = list(original.get("tolerations") or [])
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        selector.update(spec.get("nodeLabels") or {})
        for toleration in spec.get("tolerations") or []:
            if toleration not in tolerations:
                tolerations.append(toleration)
    if selector:
        pod_spec["nodeSelector"] = selector
    if tolerations:
        pod_spec["tolerations"] = tolerations


def restore_template(job: Obj) -> bool:
    """Put the user's nodeSelector and tolerations back; False if nothing was injected."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    if ORIGINAL_SCHEDULING_ANNOTATION not in annotations:
        return False
    original = original_scheduling(job)
    pod_spec = job["spec"]["template"].setdefault("spec", {})
    for field in ("nodeSelector", "tolerations"):
        if original.get(field):
            pod_spec[field] = original[field]
        else:
            pod_spec.pop(field, None)
    if "parallelism" in original:
        job["spec"]["parallelism"] = original["parallelism"]
    del annotations[ORIGINAL_SCHEDULING_ANNOTATION]
    return True


def ensure_gate(job: Obj) -> bool:
    """Add the admission gate and the elastic pod label to the template (the webhook does
    this at creation; this covers Jobs created while it was unavailable)."""
    template = job["spec"]["template"]
    changed = False
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    if labels.get(ELASTIC_POD_LABEL) != "true":
        labels[ELASTIC_POD_LABEL] = "true"
        changed = True
    gates_list = template.setdefault("spec", {}).setdefault("schedulingGates", [])
    if not any(g.get("name") == ADMISSION_GATE for g in gates_list):
        gates_list.append({"name": ADMISSION_GATE})
        changed = True
    return changed


# ------------------------------------------------------------------ reconciling


class JobReconciler:
    """Moves one Job towards what its Workloads say. Returns a delay to requeue after (or
    None); raising requeues with backoff."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # -- small writers
    def _update_job(self, job: Obj, mutate: apply.Mutation) -> Obj | None:
        return apply.update(
            self.ctx.kube, JOB, object_key(job), mutate, cache=self.ctx.caches.jobs, current=job
        )

    def update_workload_status(self, wl: Obj, mutate: apply.Mutation) -> Obj | None:
        return apply.update(
            self.ctx.kube,
            WORKLOAD,
            object_key(wl),
            mutate,
            cache=self.ctx.caches.workloads,
            current=wl,
            status=True,
        )

    def _flavor_objects(self, wl: Obj) -> list[Obj]:
        names = sorted({f for m in wls.assigned_flavors(wl).values() for f in m.values()})
        found = []
        for name in names:
            flavor = self.ctx.caches.flavors.get(name)
            if flavor is None:
                raise RuntimeError(f"ResourceFlavor {name} assigned to {object_key(wl)} is gone")
            found.append(flavor)
        return found

    # -- the reconcile
    def reconcile(self, key: str) -> float | None:
        job = self.ctx.caches.jobs.get(key)
        if job is None or not queue_name(job):
            return None  # deleted: owner references take its Workloads with it
        if (job.get("metadata") or {}).get("deletionTimestamp"):
            return None
        uid = job["metadata"]["uid"]
        owned = self.ctx.caches.workloads_of_job(uid)
        active = [w for w in owned if wls.is_active(w)]

        done = finished(job)
        if done is not None:
            self._finish_all(job, active, *done)
            return None
        if is_elastic(job):
            return slices.reconcile_elastic(self, job, owned)
        return self._reconcile_plain(job, active, owned)

    def _finish_all(self, job: Obj, active: list[Obj], reason: str, message: str) -> None:
        for wl in active:
            now = self.ctx.now()

            def finish(w: Obj, t: datetime = now) -> bool:
                return wls.mark_finished(w, reason, message, t)

            written = self.update_workload_status(wl, finish)
            if written is not None and wls.is_finished(written):
                self.ctx.events.emit(written, "Normal", "Finished", f"{message}; quota released")
                self.ctx.poke_admission()

    def new_workload(self, job: Obj, spec: Obj, name: str) -> Obj:
        body = wls.new_workload(name, job["metadata"]["namespace"], job, spec)
        created, fresh = apply.create(
            self.ctx.kube, WORKLOAD, body, cache=self.ctx.caches.workloads
        )
        if fresh:
            self.ctx.events.emit(
                job,
                "Normal",
                "CreatedWorkload",
                f"created Workload {name} for queue {spec.get('queueName')}",
            )
            self.ctx.poke_admission()
        return created

    def desired_spec(self, job: Obj, **kwargs: Any) -> Obj:
        values, default = priority_classes(self.ctx)
        return workload_spec(job, values, global_default=default, **kwargs)

    def _reconcile_plain(self, job: Obj, active: list[Obj], owned: list[Obj]) -> float | None:
        uid = job["metadata"]["uid"]
        name = wls.workload_name(job["metadata"]["name"], uid)
        wl = next((w for w in active if w["metadata"]["name"] == name), None)
        if wl is None and any(w["metadata"]["name"] == name for w in owned):
            return None  # finished for good; the Job finishing will follow
        try:
            desired = self.desired_spec(job)
        except ValueError as error:  # ManifestError: says which field of the Job, and why
            self.ctx.events.emit(job, "Warning", "InvalidJob", str(error)[:1000])
            return None
        if wl is None:
            self.suspend(job)
            self.new_workload(job, desired, name)
            return None
        return self.drive(job, wl, desired)

    def drive(self, job: Obj, wl: Obj, desired: Obj | None) -> float | None:
        """Carry a single Workload's state over to its Job (shared by plain and elastic)."""
        if not wls.has_quota(wl):
            if desired is not None and not same_request(wl.get("spec") or {}, desired):
                self.update_workload_spec(wl, desired)
            self.suspend(job)
            return None
        if wls.is_evicted(wl):
            return self.stop(job, wl)
        if is_suspended(job):
            self.start(job, wl)
        return None

    def update_workload_spec(self, wl: Obj, desired: Obj) -> Obj | None:
        def mutate(w: Obj) -> bool:
            if wls.has_quota(w) or wls.is_finished(w):
                return False  # admitted meanwhile: the spec is what was admitted
            if same_request(w.get("spec") or {}, desired):
                return False
            w["spec"] = desired
            return True

        return apply.update(
            self.ctx.kube,
            WORKLOAD,
            object_key(wl),
            mutate,
            cache=self.ctx.caches.workloads,
            current=wl,
        )

    def suspend(self, job: Obj) -> Obj | None:
        """Suspend a Job that runs without admission (created while the webhook was down,
        or evicted); elastic Jobs also get their gate if they never started."""

        def mutate(j: Obj) -> bool:
            changed = False
            if not is_suspended(j):
                j["spec"]["suspend"] = True
                changed = True
            if is_elastic(j) and not (j.get("status") or {}).get("startTime"):
                changed |= ensure_gate(j)
            return changed

        before = is_suspended(job)
        written = self._update_job(job, mutate)
        if written is not None and not before and is_suspended(written):
            self.ctx.events.emit(job, "Normal", "Suspended", "suspended until admitted by Muster")
        return written

    def start(self, job: Obj, wl: Obj) -> Obj | None:
        """Admitted: merge the flavors into the template and unsuspend."""
        flavors = self._flavor_objects(wl)
        granted = wls.admitted_count(wl, JOB_POD_SET)
        partial = None if is_elastic(job) else granted

        def mutate(j: Obj) -> bool:
            if not is_suspended(j):
                return False
            inject_flavors(j, flavors, partial)
            j["spec"]["suspend"] = False
            return True

        written = self._update_job(job, mutate)
        if written is not None and not is_suspended(written):
            admission = (wl.get("status") or {}).get("admission") or {}
            names = ", ".join(f["metadata"]["name"] for f in flavors) or "no flavor"
            self.ctx.events.emit(
                job,
                "Normal",
                "Started",
                f"admitted by ClusterQueue {admission.get('clusterQueue')} on {names}; unsuspended",
            )
        return written

    def stop(self, job: Obj, wl: Obj) -> float | None:
        """Evicted: suspend, wait for the pods to go, restore the template, release quota."""
        if not is_suspended(job):
            evicted = wls.condition(wl, wls.EVICTED) or {}
            written = self._update_job(job, _suspend_only)
            if written is not None:
                self.ctx.events.emit(
                    job,
                    "Warning",
                    "Stopped",
                    f"suspended: {evicted.get('message') or 'evicted'}",
                )
            return None
        if not pods_gone(job):
            return None  # the Job's status change will bring us back
        self._update_job(job, lambda j: restore_template(j) if is_suspended(j) else False)
        now = self.ctx.now()
        written = self.update_workload_status(wl, lambda w: wls.release_quota(w, now))
        if written is not None:
            requeued = wls.condition(written, wls.REQUEUED) or {}
            self.ctx.events.emit(written, "Normal", "Requeued", str(requeued.get("message")))
            self.ctx.poke_admission()
            when = wls.requeue_at(written)
            if when is not None:
                return max(0.0, (when - now).total_seconds())
        return None


def _suspend_only(job: Obj) -> bool:
    if is_suspended(job):
        return False
    job["spec"]["suspend"] = True
    return True


def job_key_of_workload(wl: Mapping[str, Any]) -> str | None:
    """The Job key ("ns/name") a Workload belongs to."""
    meta = wl.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "Job":
            return f"{meta.get('namespace')}/{ref.get('name')}"
    return None
