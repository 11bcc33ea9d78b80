"""A workload's copy in a worker cluster: what it is made from, how it is recognised, when it
may start, and what of it flows back to the user's object in the management cluster.

The copy is the user's Job as they wrote it (Muster's flavor merge undone: the worker's own
Muster merges its own flavors), suspended, under the same name, namespace and queue label,
marked with the management cluster's Workload. It never starts on the worker's say alone:
the worker's Muster admits and places it, and then waits for the manager's start
annotation. So the manager always knows which copies may be running, and a worker it loses
touch with can never start a copy behind its back.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from controllers.jobs.batchjob import restore_template
from controllers.runtime.resources import Obj
from quota.api.names import (
    DISPATCH_START_ANNOTATION,
    DISPATCHED_FROM_ANNOTATION,
    ELASTIC_ANNOTATION,
    ORIGIN_UID_LABEL,
)

# Set by the apiserver or the Job controller on the original: never copied.
_SERVER_LABELS = frozenset(
    {
        "controller-uid",
        "job-name",
        "batch.kubernetes.io/controller-uid",
        "batch.kubernetes.io/job-name",
    }
)
# Job status fields the management cluster's Job mirrors from its copy. Not
# uncountedTerminatedPods: it names pods of the worker, meaningless here, and being a map a
# merge patch would only ever add to it, so a Job that finished there would be refused here
# ("must be empty for finished job").
STATUS_FIELDS = (
    "active",
    "ready",
    "succeeded",
    "failed",
    "terminating",
    "startTime",
    "completionTime",
    "conditions",
    "completedIndexes",
    "failedIndexes",
)


def _labels(meta: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for k, v in (meta.get("labels") or {}).items() if k not in _SERVER_LABELS}


def job_copy(job: Obj, workload_key: str, job_uid: str) -> Obj:
    """The copy of the management cluster's `job` to create in a worker cluster."""
    original = copy.deepcopy(dict(job))
    restore_template(original)  # the user's nodeSelector and tolerations, not our flavors'
    meta = original.get("metadata") or {}
    spec = original.get("spec") or {}
    spec.pop("selector", None)  # generated from the original's uid; the copy gets its own
    spec.pop("managedBy", None)  # the worker's Job controller runs the copy
    spec["suspend"] = True
    template = spec.setdefault("template", {})
    template_meta = template.setdefault("metadata", {})
    template_meta["labels"] = {**_labels(template_meta), ORIGIN_UID_LABEL: job_uid}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not k.startswith("kubectl.kubernetes.io/") and k != DISPATCH_START_ANNOTATION
    }
    annotations[DISPATCHED_FROM_ANNOTATION] = workload_key
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {**_labels(meta), ORIGIN_UID_LABEL: job_uid},
            "annotations": annotations,
        },
        "spec": spec,
    }


def is_copy_of(remote: Mapping[str, Any], job_uid: str) -> bool:
    """Whether `remote` is the copy of that Job here (not a stranger's object of the same
    name, nor the copy of an earlier Job of the same name)."""
    labels = (remote.get("metadata") or {}).get("labels") or {}
    return bool(job_uid) and labels.get(ORIGIN_UID_LABEL) == job_uid


def is_elastic(remote: Mapping[str, Any]) -> bool:
    """A copy that resizes through WorkloadSlices in its worker."""
    annotations = (remote.get("metadata") or {}).get("annotations") or {}
    return annotations.get(ELASTIC_ANNOTATION) == "true"


def size_patch(pods: int) -> Obj:
    """The merge patch that resizes an elastic copy."""
    return {"spec": {"parallelism": pods}}


def start_patch() -> Obj:
    """The merge patch with which the manager lets a copy start."""
    return {"metadata": {"annotations": {DISPATCH_START_ANNOTATION: "true"}}}


def mirrored_status(remote: Mapping[str, Any], local: Mapping[str, Any]) -> Obj | None:
    """The status the management cluster's Job takes from its copy, or None if it has it."""
    theirs = remote.get("status") or {}
    ours = local.get("status") or {}
    wanted = {f: theirs.get(f) for f in STATUS_FIELDS}
    # Left by an earlier version that mirrored it: cleared, or the Job could never finish.
    wanted["uncountedTerminatedPods"] = None
    if all(ours.get(f) == v for f, v in wanted.items()):
        return None
    # A merge patch: fields the copy no longer has are removed (null).
    return wanted
