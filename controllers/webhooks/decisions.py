"""What Muster's admission webhooks decide, as pure functions of the object under review
(the same decisions `policies.py` writes in CEL for the apiserver to evaluate itself).

- Jobs with the queue-name label, on CREATE (`mutate_job`): set `spec.suspend: true` (users
  need not), hand the pods to Muster's scheduler (`spec.template.spec.schedulerName`,
  unless the user chose a scheduler of their own or Muster's scheduler is off), and for
  elastic Jobs add the `muster.dev/admission` scheduling gate and the elastic pod label to
  the pod template.
- Jobs with the queue-name label, on UPDATE and CREATE (`validate_job`): elastic together
  with partial admission is refused; a malformed min-parallelism is refused; the queue name
  cannot change while the Job runs; the elastic annotation cannot be added or removed; a
  running non-elastic Job cannot grow (Muster never runs more pods than it admitted:
  resizing is what elastic Jobs do). A LocalQueue that does not exist is accepted (the
  Workload's condition says so, and the queue may be created later).
- The other kinds Muster's generic rule admits (`controllers.jobs.framework.Admission`),
  on CREATE (`mutate_suspend`): created suspended; and their pods (`mutate_pod`): to
  Muster's scheduler.
- Muster's queue objects (`validate_queue_object`): the full API model check, which covers
  rules CEL cannot express (exact quantities, unique names), plus warnings for cross-object
  problems (missing parent, cycle, LocalQueue at a parent queue) that the Active condition
  reports.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

from controllers.jobs.batchjob import is_elastic, min_parallelism, queue_name
from quota.api import ManifestError, parse_manifest
from quota.api.names import (
    ADMISSION_GATE,
    ELASTIC_ANNOTATION,
    ELASTIC_POD_LABEL,
    MIN_PARALLELISM_ANNOTATION,
    QUEUE_LABEL,
    SCHEDULER_NAME,
)

# What an unset spec.schedulerName means: the pod is kube-scheduler's.
DEFAULT_SCHEDULER = "default-scheduler"


def mutate_suspend(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON patch for a labelled JobSet or TrainJob being created: created suspended, so that
    nothing runs before Muster admits it (its pods get Muster's scheduler at admission,
    through the owner label and `mutate_pod`)."""
    if not queue_name(obj) or not isinstance(obj.get("spec"), Mapping):
        return []
    if obj["spec"].get("suspend"):
        return []
    return [{"op": "add", "path": "/spec/suspend", "value": True}]


def mutate_pod(
    pod: Mapping[str, Any], scheduler_name: str = SCHEDULER_NAME
) -> list[dict[str, Any]]:
    """JSON patch for a pod of an admitted JobSet or TrainJob (it carries the owner label
    Muster put on its template at admission): Muster's scheduler places it, unless the user
    chose another scheduler by name or Muster's scheduler is off."""
    spec = pod.get("spec")
    if not scheduler_name or not isinstance(spec, Mapping):
        return []
    if (spec.get("schedulerName") or DEFAULT_SCHEDULER) != DEFAULT_SCHEDULER:
        return []
    return [{"op": "add", "path": "/spec/schedulerName", "value": scheduler_name}]


def _escape(segment: str) -> str:
    """JSON-pointer escaping of one path segment."""
    return segment.replace("~", "~0").replace("/", "~1")


def mutate_job(
    job: Mapping[str, Any], scheduler_name: str = SCHEDULER_NAME
) -> list[dict[str, Any]]:
    """JSON patch operations for a labelled Job being created.

    `scheduler_name` is the scheduler that places the Job's pods ("" leaves them to
    kube-scheduler). A schedulerName the user set to another scheduler is kept: they asked
    for it by name, and Muster still admits the Job under quota either way.
    """
    if not queue_name(job):
        return []
    ops: list[dict[str, Any]] = []
    if not (job.get("spec") or {}).get("suspend"):
        ops.append({"op": "add", "path": "/spec/suspend", "value": True})
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec")
    current = (pod_spec or {}).get("schedulerName") or DEFAULT_SCHEDULER
    if scheduler_name and isinstance(pod_spec, Mapping) and current == DEFAULT_SCHEDULER:
        # A pod's schedulerName is immutable: this is the one chance to set it.
        ops.append(
            {"op": "add", "path": "/spec/template/spec/schedulerName", "value": scheduler_name}
        )
    if is_elastic(job):
        template = (job.get("spec") or {}).get("template") or {}
        meta = template.get("metadata")
        if meta is None:
            ops.append({"op": "add", "path": "/spec/template/metadata", "value": {}})
            meta = {}
        labels = meta.get("labels")
        if labels is None:
            ops.append(
                {
                    "op": "add",
                    "path": "/spec/template/metadata/labels",
                    "value": {ELASTIC_POD_LABEL: "true"},
                }
            )
        elif labels.get(ELASTIC_POD_LABEL) != "true":
            ops.append(
                {
                    "op": "add",
                    "path": f"/spec/template/metadata/labels/{_escape(ELASTIC_POD_LABEL)}",
                    "value": "true",
                }
            )
        gates = (template.get("spec") or {}).get("schedulingGates")
        if gates is None:
            ops.append(
                {
                    "op": "add",
                    "path": "/spec/template/spec/schedulingGates",
                    "value": [{"name": ADMISSION_GATE}],
                }
            )
        elif not any(g.get("name") == ADMISSION_GATE for g in gates):
            ops.append(
                {
                    "op": "add",
                    "path": "/spec/template/spec/schedulingGates/-",
                    "value": {"name": ADMISSION_GATE},
                }
            )
    return ops


def validate_job(job: Mapping[str, Any], old: Mapping[str, Any] | None) -> str | None:
    """Why a labelled Job is refused, or None."""
    if not queue_name(job) and not (old and queue_name(old)):
        return None
    name = (job.get("metadata") or {}).get("name") or "(generated)"
    minimum = min_parallelism(job)
    if is_elastic(job) and minimum is not None:
        return (
            f"Job {name}: annotations {ELASTIC_ANNOTATION} and {MIN_PARALLELISM_ANNOTATION} "
            "cannot be combined: an elastic Job changes size by scaling its parallelism, "
            "while partial admission fixes the size when the Job is admitted; remove one of "
            "the two annotations"
        )
    if minimum is not None:
        parallelism = (job.get("spec") or {}).get("parallelism")
        parallelism = 1 if parallelism is None else int(parallelism)
        # At most 9 ASCII digits, as the admission policy's CEL rule reads them.
        if not re.fullmatch("[0-9]{1,9}", minimum) or not 1 <= int(minimum) <= parallelism:
            return (
                f"Job {name}: annotation {MIN_PARALLELISM_ANNOTATION} must be a whole number "
                f'between 1 and spec.parallelism ({parallelism}), got "{minimum}"'
            )
    if old is not None:
        running = not (old.get("spec") or {}).get("suspend")
        if running and queue_name(old) != queue_name(job):
            return (
                f"Job {name}: label {QUEUE_LABEL} cannot change while the Job runs "
                f'("{queue_name(old) or ""}" -> "{queue_name(job) or ""}"); suspend the Job first'
            )
        if is_elastic(old) != is_elastic(job):
            # Its pods and its Workloads were made for one path or the other (gated pods
            # and slices, or suspension): switching would strand one or the other.
            return (
                f"Job {name}: annotation {ELASTIC_ANNOTATION} cannot be added or removed "
                "once the Job exists; create a new Job to change it"
            )
        grown = _grown_while_running(job, old) if running and not is_elastic(job) else None
        if grown is not None:
            return (
                f"Job {name}: spec.parallelism cannot grow while the Job runs ({grown[0]} -> "
                f"{grown[1]} pods): Muster admitted {grown[0]} and never runs more than it "
                f'admitted. Create the Job with annotation {ELASTIC_ANNOTATION}: "true" to '
                "resize it while it runs, or delete it and create it again at the new size"
            )
    return None


def _pods_at_once(job: Mapping[str, Any]) -> int | None:
    """min(parallelism, completions) as written now; None if either is not a number."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    if not isinstance(parallelism, int) or isinstance(parallelism, bool):
        return None
    if completions is None:
        return parallelism
    if not isinstance(completions, int) or isinstance(completions, bool):
        return None
    return min(parallelism, completions)


def _grown_while_running(job: Mapping[str, Any], old: Mapping[str, Any]) -> tuple[int, int] | None:
    """(before, after) pods at once if a running Job asks for more than before."""
    before, after = _pods_at_once(old), _pods_at_once(job)
    if before is None or after is None or after <= before:
        return None
    return before, after


def malformed_job(job: object) -> str | None:
    """Which field of a Job has the wrong shape for the rules above, or None. The apiserver
    checks Jobs before any webhook sees them; this keeps a malformed review from becoming a
    server error."""
    if not isinstance(job, Mapping):
        return "a Job must be a mapping"
    shapes: list[tuple[str, object, type]] = [
        ("metadata", job.get("metadata"), dict),
        ("spec", job.get("spec"), dict),
    ]
    meta = job.get("metadata") if isinstance(job.get("metadata"), Mapping) else {}
    spec = job.get("spec") if isinstance(job.get("spec"), Mapping) else {}
    template = spec.get("template") if isinstance(spec.get("template"), Mapping) else {}
    shapes += [
        ("metadata.labels", meta.get("labels"), dict),
        ("metadata.annotations", meta.get("annotations"), dict),
        ("spec.template", spec.get("template"), dict),
        ("spec.template.metadata", template.get("metadata"), dict),
        ("spec.template.spec", template.get("spec"), dict),
    ]
    pod_spec = template.get("spec") if isinstance(template.get("spec"), Mapping) else {}
    shapes.append(("spec.template.spec.schedulingGates", pod_spec.get("schedulingGates"), list))
    for field, value, kind in shapes:
        if value is not None and not isinstance(value, kind):
            return f"{field} must be a {'mapping' if kind is dict else 'list'}"
    for field in ("labels", "annotations"):
        values = meta.get(field) or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
            return f"metadata.{field} must map strings to strings"
    for field in ("parallelism", "completions"):
        value = spec.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"spec.{field} must be a whole number (got {value!r})"
    if not all(isinstance(g, Mapping) for g in pod_spec.get("schedulingGates") or []):
        return "spec.template.spec.schedulingGates entries must be mappings"
    return None


def validate_queue_object(
    obj: Mapping[str, Any], warnings_for: Callable[[Mapping[str, Any]], list[str]] | None = None
) -> tuple[str | None, list[str]]:
    """(refusal, warnings) for a Muster queue object."""
    doc = copy.deepcopy(dict(obj))
    # Server-populated metadata is not part of what the user wrote; the model would accept
    # most of it, but managedFields is noise for validation.
    if isinstance(doc.get("metadata"), dict):
        doc["metadata"].pop("managedFields", None)
    try:
        parse_manifest(doc, 0)
    except ManifestError as error:
        return str(error).replace("document 0 (", "(", 1), []
    return None, (warnings_for(obj) if warnings_for else [])
