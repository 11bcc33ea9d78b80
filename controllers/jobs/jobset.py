"""JobSet (jobset.x-k8s.io/v1alpha2) behind the workload seam (`controllers.jobs.framework`).

A labelled JobSet becomes one Workload with one pod set per replicated job (named after it,
`replicas` x the Job's pods at once), admitted whole. It is suspend-based like a batch Job:
created suspended (the webhook), unsuspended on admission with the assigned flavors' node
labels and tolerations merged into every replicated job's pod template (the JobSet
controller allows those fields to change while the JobSet is suspended), and suspended
again on eviction, which makes the JobSet controller suspend its Jobs and their pods go.
The user's templates are kept in an annotation and put back once the pods are gone.

Not elastic: a JobSet cannot be resized while it runs (its replicated jobs' replicas are
immutable), so a changed JobSet is queued again at its new size, as a batch Job is.

The functions over replicated jobs are shared with TrainJob (`controllers.jobs.trainjob`),
whose Trainer runs it as a JobSet.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controllers.jobs.framework import Integration, SuspendedObject, put_flavors, register
from controllers.runtime.resources import Kind, Obj
from quota.api import ManifestError
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import ORIGINAL_SCHEDULING_ANNOTATION, OWNER_UID_POD_LABEL
from quota.model import convert

# On every pod of a JobSet: the replicated job (the Workload's pod set) it belongs to.
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"

API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET = Kind("JobSet", True, group="jobset.x-k8s.io", version="v1alpha2", plural="jobsets")


# ------------------------------------------------------- replicated jobs (shared)


def replicas_of(rj: Mapping[str, Any]) -> int:
    value = rj.get("replicas")
    return 1 if value is None else int(value)


def pods_of(rj: Mapping[str, Any]) -> int:
    """Pods a replicated job runs at once: its replicas x its Job's pods at once."""
    job_spec = (rj.get("template") or {}).get("spec") or {}
    return replicas_of(rj) * convert.job_pod_count({"spec": job_spec})


def pod_spec_of(rj: Mapping[str, Any]) -> dict[str, Any]:
    """The replicated job's pod spec (created if absent, for writing)."""
    job = rj.setdefault("template", {}).setdefault("spec", {})  # type: ignore[attr-defined]
    spec: dict[str, Any] = job.setdefault("template", {}).setdefault("spec", {})
    return spec


def workload_spec_of(
    owner: Mapping[str, Any],
    replicated_jobs: Sequence[Mapping[str, Any]],
    priorities: Mapping[str, int],
    *,
    global_default: str | None,
    where: str,
    at: Callable[[int, str], str] | None = None,
) -> Obj:
    """The Workload spec of an object that runs as replicated jobs: one pod set per replicated
    job, through the one Job -> Workload conversion. `where` is the field of the object the
    replicated jobs come from (for errors); `at` maps (index, a field of the replicated job's
    Job spec such as "spec.template.spec") to the object's field where the replicated jobs
    are another kind's groups (Ray's). Raises ManifestError naming the object's field."""

    def field(i: int, path: str) -> str:
        if at is not None:
            return at(i, path)
        return f"{where}[{i}]" + (f".template.{path}" if path else "")

    meta = owner.get("metadata") or {}
    subject = f"{owner.get('kind') or 'JobSet'} {meta.get('namespace')}/{meta.get('name')}"
    if not replicated_jobs:
        raise ManifestError(0, subject, [(where, "at least one replicated job is required")])
    spec: Obj = {}
    pod_sets: list[Obj] = []
    for i, rj in enumerate(replicated_jobs):
        name = str(rj.get("name") or "")
        job_spec = (rj.get("template") or {}).get("spec")
        as_job = {"kind": owner.get("kind"), "metadata": meta, "spec": job_spec}
        try:
            model = convert.job_to_workload_model(
                as_job, priorities, global_default=global_default, count=pods_of(rj)
            )
        except ManifestError as error:
            problems = [(field(i, path), rule) for path, rule in error.problems]
            raise ManifestError(0, subject, problems) from None
        except (TypeError, ValueError) as error:
            raise ManifestError(0, subject, [(field(i, ""), str(error))]) from None
        body = model.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        pod_set = body["podSets"][0]
        pod_set["name"] = name
        pod_set.pop("minCount", None)  # admitted whole: no partial admission
        pod_sets.append(pod_set)
        if not spec or body.get("priority", 0) > spec.get("priority", 0):
            spec = {k: v for k, v in body.items() if k != "podSets"}
    spec["podSets"] = pod_sets
    return spec


def original_templates(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Replicated job -> its pod template's nodeSelector and tolerations as the user wrote
    them, if Muster changed them (None otherwise)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    saved = annotations.get(ORIGINAL_SCHEDULING_ANNOTATION)
    if not saved:
        return None
    data: dict[str, dict[str, Any]] = json.loads(saved)
    return data


def pod_specs(replicated_jobs: Sequence[Obj]) -> dict[str, Obj]:
    """Replicated job name -> its pod spec (the object's own, for writing)."""
    return {str(rj.get("name")): pod_spec_of(rj) for rj in replicated_jobs}


def inject_flavors(
    obj: Obj, pod_specs: Mapping[str, Obj], flavors: Sequence[Mapping[str, Any]]
) -> None:
    """Merge the flavors' node labels and tolerations into every named pod spec of the object
    (its replicated jobs', or another kind's groups'), saving the user's originals first
    (once, by name)."""
    annotations = obj.setdefault("metadata", {}).setdefault("annotations", {})
    saved = original_templates(obj)
    if saved is None:
        saved = {
            name: {
                "nodeSelector": dict(spec.get("nodeSelector") or {}),
                "tolerations": list(spec.get("tolerations") or []),
            }
            for name, spec in pod_specs.items()
        }
        annotations[ORIGINAL_SCHEDULING_ANNOTATION] = json.dumps(saved, sort_keys=True)
    for name, spec in pod_specs.items():
        put_flavors(spec, saved.get(name) or {}, flavors)


def restore_templates(obj: Obj, pod_specs: Mapping[str, Obj]) -> bool:
    """Put the user's nodeSelector and tolerations back into the named pod specs; False if
    nothing was injected."""
    saved = original_templates(obj)
    if saved is None:
        return False
    for name, pod_spec in pod_specs.items():
        original = saved.get(name) or {}
        for field in ("nodeSelector", "tolerations"):
            if original.get(field):
                pod_spec[field] = original[field]
            else:
                pod_spec.pop(field, None)
    del obj["metadata"]["annotations"][ORIGINAL_SCHEDULING_ANNOTATION]
    return True


def as_written(obj: Mapping[str, Any], replicated_jobs: Sequence[Mapping[str, Any]]) -> list[Obj]:
    """Copies of the replicated jobs with the user's nodeSelector and tolerations."""
    saved = original_templates(obj) or {}
    out: list[Obj] = []
    for rj in replicated_jobs:
        copy: Obj = json.loads(json.dumps(rj))
        original = saved.get(str(rj.get("name")))
        if original is not None:
            pod_spec = pod_spec_of(copy)
            pod_spec["nodeSelector"] = original.get("nodeSelector") or {}
            pod_spec["tolerations"] = original.get("tolerations") or []
        out.append(copy)
    return out


def first_started(
    spec: Mapping[str, Any], replicated_jobs: Sequence[Mapping[str, Any]]
) -> list[str] | None:
    """The replicated jobs a JobSet-shaped spec starts first: with `startupPolicy` InOrder
    only the first, else those that depend on no other (`dependsOn`); None if all start at
    once."""
    names = [str(rj.get("name")) for rj in replicated_jobs]
    order = (spec.get("startupPolicy") or {}).get("startupPolicyOrder") or "AnyOrder"
    if order == "InOrder":
        return names[:1] if len(names) > 1 else None
    first = [str(rj.get("name")) for rj in replicated_jobs if not rj.get("dependsOn")]
    return first if len(first) < len(names) else None


def jobset_finished(obj: Mapping[str, Any], what: str) -> tuple[str, str] | None:
    """(reason, message) once a JobSet-shaped object's Completed or Failed condition is True."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete" or cond.get("type") == "Completed":
            return WC.SUCCEEDED, f"the {what} completed"
        if cond.get("type") == "Failed":
            detail = cond.get("message") or cond.get("reason") or ""
            return WC.FAILED, f"the {what} failed{': ' + detail if detail else ''}"
    return None


# ------------------------------------------------------------------ the adapter


class ReplicatedJobs(SuspendedObject):
    """The part of `GenericJob` a kind that runs as a JobSet's replicated jobs shares (JobSet;
    TrainJob, whose Trainer makes one): one pod set per replicated job, finished by the
    JobSet's conditions, its pods gone once no replicated job counts an active Job."""

    # Its kind, in messages, and the status field that counts each replicated job's Jobs.
    what = "JobSet"
    jobs_status = "replicatedJobsStatus"

    def _jobs(self) -> list[Obj]:
        """Its replicated jobs, as they run."""
        raise NotImplementedError

    def finished(self) -> tuple[str, str] | None:
        return jobset_finished(self._obj, self.what)

    def pods_gone(self) -> bool:
        statuses = (self._obj.get("status") or {}).get(self.jobs_status) or []
        return all(not s.get("active") and not s.get("ready") for s in statuses)

    def pod_counts(self) -> dict[str, int]:
        return {str(rj.get("name")): pods_of(rj) for rj in self._jobs()}


class JobSet(ReplicatedJobs):
    """A JobSet seen as a `GenericJob`."""

    def _jobs(self) -> list[Obj]:
        # Read, never set: the object may be the informer's, which no one changes in place.
        jobs: list[Obj] = (self._obj.get("spec") or {}).get("replicatedJobs") or []
        return jobs

    def run_with(self, flavors: Sequence[Mapping[str, Any]], granted: Mapping[str, int]) -> None:
        inject_flavors(self._obj, pod_specs(self._jobs()), flavors)
        uid = str(self._obj["metadata"]["uid"])
        for rj in self._jobs():
            template = (
                rj.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
            )
            template.setdefault("metadata", {}).setdefault("labels", {})[OWNER_UID_POD_LABEL] = uid
        self._obj["spec"]["suspend"] = False

    def restore(self) -> bool:
        return restore_templates(self._obj, pod_specs(self._jobs()))

    def workload_spec(self, priorities: Mapping[str, int], *, global_default: str | None) -> Obj:
        return workload_spec_of(
            self._obj,
            as_written(self._obj, self._jobs()),
            priorities,
            global_default=global_default,
            where="spec.replicatedJobs",
        )

    def first_pod_sets(self) -> list[str] | None:
        return first_started(self._obj.get("spec") or {}, self._jobs())


JOBSET_INTEGRATION = register(Integration(API_VERSION, JOBSET, JobSet))
