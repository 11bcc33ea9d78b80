"""batch/v1 Job behind the workload seam (`controllers.jobs.framework`): how a Job is
read, suspended, run on its assigned flavors and restored. The reconcile itself is the
shared one in `controllers.jobs.reconciler`, driving Jobs through `BATCH_JOB`.

Admission merges the assigned flavors' node labels and tolerations into the pod template
and, for a partial admission, lowers parallelism to the pods admitted; the user's
originals are kept in an annotation and put back on eviction. Elastic Jobs (annotation
muster.dev/elastic-job) resize through `controllers.jobs.slices` instead, with their pods
held behind the admission gate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from controllers.jobs import gates
from controllers.jobs.framework import Admission, Integration, put_flavors, register
from controllers.runtime.informer import Informer
from controllers.runtime.resources import JOB, Obj
from controllers.state.caches import Caches
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import (
    JOB_POD_SET,
    JOB_UID_POD_LABEL,
    MIN_PARALLELISM_ANNOTATION,
    ORIGINAL_SCHEDULING_ANNOTATION,
)
from quota.model import convert

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


def workload_spec(
    job: Mapping[str, Any],
    priorities: Mapping[str, int],
    *,
    global_default: str | None = None,
) -> Obj:
    """The Workload spec for a Job, through the one Job -> Workload conversion
    (`quota.model.convert`), from the Job as its user wrote it. Raises ManifestError naming the
    Job's field when the Job cannot be queued."""
    view = as_written(job)
    model = convert.job_to_workload_model(view, priorities, global_default=global_default)
    spec: Obj = model.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    affinity = (((view.get("spec") or {}).get("template") or {}).get("spec") or {}).get("affinity")
    if affinity:
        spec["podSets"][0].setdefault("template", {})["affinity"] = affinity
    return spec


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
    put_flavors(job["spec"]["template"].setdefault("spec", {}), original, flavors)


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


# ------------------------------------------------------------------ the adapter


class BatchJob:
    """A batch/v1 Job seen as a `GenericJob`."""

    def __init__(self, job: Obj) -> None:
        self._job = job

    @property
    def object(self) -> Obj:
        return self._job

    def queue_name(self) -> str | None:
        return queue_name(self._job)

    def is_suspended(self) -> bool:
        return is_suspended(self._job)

    def suspend(self) -> bool:
        if is_suspended(self._job):
            return False
        self._job["spec"]["suspend"] = True
        return True

    def hold_pods(self) -> bool:
        if (self._job.get("status") or {}).get("startTime"):
            return False  # started: its pods exist and were counted against the gate
        return gates.hold_template(self._job["spec"]["template"])

    def run_with(self, flavors: Sequence[Mapping[str, Any]], granted: Mapping[str, int]) -> None:
        # Elastic Jobs keep their parallelism: gates, not the Job controller, hold pods back.
        partial = None if is_elastic(self._job) else granted.get(JOB_POD_SET, 0)
        inject_flavors(self._job, flavors, partial)
        if partial is not None:
            # Not elastic (any more): no pod may wait at a gate nobody lifts.
            gates.drop_gate(self._job["spec"]["template"])
        self._job["spec"]["suspend"] = False

    def restore(self) -> bool:
        return restore_template(self._job)

    def workload_spec(self, priorities: Mapping[str, int], *, global_default: str | None) -> Obj:
        return workload_spec(self._job, priorities, global_default=global_default)

    def finished(self) -> tuple[str, str] | None:
        return finished(self._job)

    def pods_gone(self) -> bool:
        return pods_gone(self._job)

    def pod_counts(self) -> dict[str, int]:
        return {JOB_POD_SET: convert.job_pod_count(self._job)}

    def is_elastic(self) -> bool:
        return is_elastic(self._job)

    def first_pod_sets(self) -> list[str] | None:
        return None  # one pod set

    def elastic_sizes(self) -> dict[str, int]:
        return {JOB_POD_SET: pod_count(self._job)}

    def pods_selector(self) -> str:
        return f"{JOB_UID_POD_LABEL}={self._job['metadata']['uid']}"


def _jobs_cache(caches: Caches) -> Informer:
    return caches.jobs


def _job_of_pod(pod: Obj) -> str | None:
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get("batch.kubernetes.io/job-name")
    return f"{meta.get('namespace')}/{job}" if job else None


BATCH_JOB = register(
    Integration(
        "batch/v1",
        JOB,
        BatchJob,
        _jobs_cache,
        admission=Admission.BATCH_JOB,
        elastic=True,
        resource="jobs",
        owner_of_pod=_job_of_pod,
    )
)
