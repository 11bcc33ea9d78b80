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
- In managed namespaces (docs/tenancy.md): objects without the queue label are queued in the
  namespace's LocalQueue `default` (`mutate_job`, `mutate_suspend` with `managed`); only
  Muster starts a workload (`refuse_start`) or lifts the admission gate from a pod, no pod
  is created on a node by name (`refuse_pod`), and a pod that tolerates a ResourceFlavor's
  taint must be one Muster's scheduler places (`refuse_toleration`): Muster's admission is
  the only way onto a flavor's nodes.
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

from controllers.jobs.batchjob import is_elastic, min_parallelism
from controllers.jobs.framework import child_of_managed_kind, queue_of
from controllers.state.ownergroups import OwnerKind, is_grouped
from quota.api import ManifestError, parse_manifest
from quota.api.names import (
    ADMISSION_GATE,
    ELASTIC_ANNOTATION,
    ELASTIC_POD_LABEL,
    JOB_UID_POD_LABEL,
    MIN_PARALLELISM_ANNOTATION,
    OWNER_UID_POD_LABEL,
    QUEUE_LABEL,
    SCHEDULER_NAME,
)

# What an unset spec.schedulerName means: the pod is kube-scheduler's.
DEFAULT_SCHEDULER = "default-scheduler"
# Who creates the pods of Jobs: the Job controller, under its own ServiceAccount
# (kube-controller-manager's --use-service-account-credentials) or as kube-controller-manager.
JOB_CONTROLLERS = (
    "system:serviceaccount:kube-system:job-controller",
    "system:kube-controller-manager",
)
# Kubelets (mirror pods of static pods carry spec.nodeName).
NODES_GROUP = "system:nodes"
# The labels Muster's scheduler finds a workload's pods by (`state.caches.job_uid_of_pod`):
# only the Job controller, creating the pods of a Job, may set them in a managed namespace.
POD_OWNER_LABELS = (OWNER_UID_POD_LABEL, JOB_UID_POD_LABEL, "controller-uid")
MANAGED_RULE = "Muster manages every workload in this namespace (managedNamespaceSelector)"


def queue_name(obj: Mapping[str, Any], managed: bool = False) -> str | None:
    """The LocalQueue of an object under review (`framework.queue_of`)."""
    return queue_of(obj, managed=managed)


def mutate_suspend(obj: Mapping[str, Any], managed: bool = False) -> list[dict[str, Any]]:
    """JSON patch for a JobSet or TrainJob in a queue being created (`managed`: in a managed
    namespace): created suspended, so that nothing runs before Muster admits it (its pods
    get Muster's scheduler at admission, through the owner label and `mutate_pod`)."""
    if not queue_name(obj, managed) or not isinstance(obj.get("spec"), Mapping):
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


def mutate_owner(obj: Mapping[str, Any], kind: OwnerKind) -> list[dict[str, Any]]:
    """JSON patch for a labelled object of a kind queued by its pods (Deployment,
    StatefulSet, LeaderWorkerSet), created or updated: its queue label into every pod
    template it has, so that its pods are gated (`mutate_queued_pod`)."""
    queue = queue_name(obj)
    if not queue:
        return []
    ops: list[dict[str, Any]] = []
    optional = [t for t in kind.optional if _at(obj, t) is not None]
    for pointer in (*kind.templates, *optional):
        template = _at(obj, pointer)
        if not isinstance(template, Mapping):
            continue
        meta = template.get("metadata")
        if not isinstance(meta, Mapping):
            ops.append(
                {
                    "op": "add",
                    "path": f"{pointer}/metadata",
                    "value": {"labels": {QUEUE_LABEL: queue}},
                }
            )
        elif not isinstance(meta.get("labels"), Mapping):
            ops.append(
                {"op": "add", "path": f"{pointer}/metadata/labels", "value": {QUEUE_LABEL: queue}}
            )
        else:
            path = f"{pointer}/metadata/labels/{_escape(QUEUE_LABEL)}"
            ops.append({"op": "add", "path": path, "value": queue})
    return ops


def _at(obj: Mapping[str, Any], pointer: str) -> Any:
    """The member of `obj` at a JSON pointer (of plain keys), or None."""
    found: Any = obj
    for key in pointer.strip("/").split("/"):
        found = found.get(key) if isinstance(found, Mapping) else None
    return found


def mutate_queued_pod(
    pod: Mapping[str, Any], scheduler_name: str = SCHEDULER_NAME
) -> list[dict[str, Any]]:
    """JSON patch for a labelled pod queued by its owner (`controllers.state.ownergroups`):
    created behind the admission gate, for Muster's scheduler unless it names another."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping) or not is_grouped(pod):
        return []
    ops: list[dict[str, Any]] = []
    gates = spec.get("schedulingGates")
    if not isinstance(gates, list):
        ops.append(
            {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}]}
        )
    elif not any(isinstance(g, Mapping) and g.get("name") == ADMISSION_GATE for g in gates):
        ops.append(
            {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": ADMISSION_GATE}}
        )
    return ops + mutate_pod(pod, scheduler_name)


def _escape(segment: str) -> str:
    """JSON-pointer escaping of one path segment."""
    return segment.replace("~", "~0").replace("/", "~1")


def mutate_job(
    job: Mapping[str, Any], scheduler_name: str = SCHEDULER_NAME, managed: bool = False
) -> list[dict[str, Any]]:
    """JSON patch operations for a Job in a queue being created (`managed`: in a managed
    namespace, where a Job without the label is in the LocalQueue `default`).

    `scheduler_name` is the scheduler that places the Job's pods ("" leaves them to
    kube-scheduler). A schedulerName the user set to another scheduler is kept: they asked
    for it by name, and Muster still admits the Job under quota either way.
    """
    if not queue_name(job, managed):
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


def _subject(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or "(generated)"
    return f"{obj.get('kind') or 'object'} {meta.get('namespace') or ''}/{name}"


def _suspended(obj: Mapping[str, Any] | None) -> bool:
    return bool(((obj or {}).get("spec") or {}).get("suspend"))


def refuse_start(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None, user: str, controller_user: str
) -> str | None:
    """Why an update of a workload in a managed namespace is refused, or None: only Muster
    (`controller_user`) unsuspends it, once admitted under quota. An object owned by one
    Muster queues (a JobSet's Jobs) is started by its owner's controller."""
    if old is None or user == controller_user or child_of_managed_kind(old):
        return None
    if not _suspended(old) or _suspended(obj):
        return None
    return (
        f"{_subject(obj)}: spec.suspend cannot be set to false by {user}: {MANAGED_RULE}, "
        "and only Muster starts a workload, once it is admitted under quota in LocalQueue "
        f"{queue_name(obj, True)}"
    )


def _gated(pod: Mapping[str, Any] | None) -> bool:
    gates = ((pod or {}).get("spec") or {}).get("schedulingGates") or []
    return any(isinstance(g, Mapping) and g.get("name") == ADMISSION_GATE for g in gates)


def refuse_pod(
    pod: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: str,
    groups: list[str],
    controller_user: str,
) -> str | None:
    """Why a pod in a managed namespace is refused, or None: created on a node by name
    (past every scheduler and admission; kubelets' mirror pods excepted), created with a
    label that makes Muster's scheduler count it as a Job's pod by anyone but the Job
    controller (it would take an admitted pod's place, with a shape of its own), or its
    admission gate lifted by anyone but Muster (who lifts it only for the pods admission
    grants)."""
    node = (pod.get("spec") or {}).get("nodeName")
    labels = (pod.get("metadata") or {}).get("labels") or {}
    forged = [k for k in POD_OWNER_LABELS if k in labels]
    if old is None and forged and user not in JOB_CONTROLLERS:
        return (
            f"{_subject(pod)}: metadata.labels[{forged[0]}] cannot be set by {user}: "
            f"{MANAGED_RULE}, and only the Job controller labels a pod as a Job's"
        )
    if old is None and node and NODES_GROUP not in groups:
        return (
            f"{_subject(pod)}: spec.nodeName ({node}) cannot be set: {MANAGED_RULE}, and a "
            "pod reaches a node only through admission and a scheduler; leave spec.nodeName "
            "empty and run the pod in a Job"
        )
    if old is not None and _gated(old) and not _gated(pod) and user != controller_user:
        return (
            f"{_subject(pod)}: spec.schedulingGates: gate {ADMISSION_GATE} cannot be removed "
            f"by {user}: {MANAGED_RULE}, and only Muster lifts it, for the pods admission grants"
        )
    return None


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' matching of a toleration and a taint; a numeric comparison (Lt, Gt) of
    the taint's key counts as tolerating it (refused rather than evaluated)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return True


def refuse_toleration(
    pod: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    flavor: Mapping[str, Any],
    *,
    scheduler_name: str,
    user: str,
) -> str | None:
    """Why a pod in a managed namespace that tolerates one of the ResourceFlavor's
    `spec.nodeTaints` is refused, or None. Allowed: pods Muster's scheduler places (it binds
    only pods of admitted workloads, never more than admitted) and, with Muster's scheduler
    off, the Job controller's (of Jobs only Muster starts here). Checked at creation, and on
    an update that changes the tolerations."""
    spec = pod.get("spec") or {}
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    if old is not None and tolerations == list((old.get("spec") or {}).get("tolerations") or []):
        return None
    if scheduler_name and spec.get("schedulerName") == scheduler_name:
        return None
    if not scheduler_name and user in JOB_CONTROLLERS:
        return None
    taints = ((flavor.get("spec") or {}).get("nodeTaints")) or []
    tolerated = [
        str(t.get("key"))
        for t in taints
        if isinstance(t, Mapping) and any(_tolerates(o, t) for o in tolerations)
    ]
    if not tolerated:
        return None
    return (
        f"{_subject(pod)}: spec.tolerations tolerate the taint {tolerated[0]} of "
        f"ResourceFlavor {(flavor.get('metadata') or {}).get('name')}: {MANAGED_RULE}, and "
        "only Muster's admission puts a pod on a flavor's nodes; run it in a Job (queued "
        "under quota), without the toleration"
    )


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
