"""From API objects to the engine's snapshot types: the one place that knows both shapes.

The controller builds its snapshot from the watch caches, `muster fairshare` / `muster admit`
from a file and the simulator from a scenario; all three go through these functions (and
`queues.py` for the queues), so a flavor or a Workload means the same thing to each of them.
Everything here is pure: models and plain dicts (decoded manifests such as Nodes and Jobs) in,
frozen snapshot values out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from quota.api import ManifestError, parse_manifest
from quota.api.meta import Toleration as TolerationModel
from quota.api.names import (
    DISRUPTION_MODE_ANNOTATION,
    ELASTIC_ANNOTATION,
    JOB_POD_SET,
    LAST_CHECKPOINT_ANNOTATION,
    MIN_PARALLELISM_ANNOTATION,
    PREEMPTIBLE_ANNOTATION,
    PREFERRED_TOPOLOGY_ANNOTATION,
    QUEUE_LABEL,
    REQUIRED_TOPOLOGY_ANNOTATION,
    SLICE_SIZE_ANNOTATION,
    SLICE_TOPOLOGY_ANNOTATION,
    UNCONSTRAINED_TOPOLOGY_ANNOTATION,
)
from quota.api.quantity import format_quantity
from quota.api.resourceflavor import ResourceFlavor
from quota.api.topology import TopologyRequest
from quota.api.workload import PodSetAssignment, preemptible_override
from quota.api.workload import Workload as WorkloadModel
from quota.model.nodeconvert import affinity_terms, node_from_manifest, pod_shape_from_spec
from quota.model.nodes import Node, Taint, Toleration
from quota.model.resources import FlavorResource
from quota.model.snapshot import (
    Assignment,
    Flavor,
    PodSet,
    PodSetTopology,
    TopologyMode,
    Workload,
)


def toleration(model: TolerationModel) -> Toleration | None:
    """A pod toleration for the engine; None for Lt/Gt, which never match a flavor's taints."""
    if model.operator not in (None, "Equal", "Exists"):
        return None
    return Toleration(
        key=model.key or "",
        operator="Exists" if model.operator == "Exists" else "Equal",
        value=model.value or "",
        effect=model.effect or "",
    )


def _tolerations(models: Iterable[TolerationModel]) -> tuple[Toleration, ...]:
    return tuple(t for t in (toleration(m) for m in models) if t is not None)


def flavor(rf: ResourceFlavor) -> Flavor:
    """A ResourceFlavor as the engine sees it: node labels, taints, added tolerations."""
    return Flavor(
        name=rf.name,
        node_labels=dict(rf.spec.node_labels),
        taints=tuple(Taint(t.key, t.value or "", t.effect) for t in rf.spec.node_taints),
        tolerations=_tolerations(rf.spec.tolerations),
        topology=rf.spec.topology_name,
    )


def pod_set_topology(request: TopologyRequest | None) -> PodSetTopology | None:
    """A pod set's topologyRequest for the engine; None when it asks for nothing (its
    levels are checked against the flavor's Topology at placement)."""
    if request is None:
        return None
    if request.required is not None or request.required_tier is not None:
        mode: TopologyMode = "Required"
    elif request.preferred is not None or request.preferred_tier is not None:
        mode = "Preferred"
    else:
        mode = "Unconstrained"
    return PodSetTopology(
        mode,
        request.required or request.preferred,
        request.slice_size,
        request.slice_required_topology,
        request.required_tier or request.preferred_tier,
    )


def pod_sets(wl: WorkloadModel) -> tuple[PodSet, ...]:
    """The pod sets of a Workload, requests already in base units.

    Raises ManifestError naming the Workload and field for a malformed node affinity."""
    subject = f"Workload {wl.metadata.namespace}/{wl.metadata.name}"
    return tuple(
        PodSet(
            name=ps.name,
            count=ps.count,
            per_pod=dict(ps.requests),
            min_count=ps.min_count,
            protected_count=ps.protected_count,
            node_selector=dict(ps.template.node_selector),
            tolerations=_tolerations(ps.template.tolerations),
            affinity=affinity_terms(
                ps.template.affinity,
                subject=subject,
                where=f"spec.podSets[{i}].template.affinity",
            )
            if ps.template.affinity
            else (),
            topology=pod_set_topology(ps.topology_request),
        )
        for i, ps in enumerate(wl.spec.pod_sets)
    )


def workload(
    wl: WorkloadModel,
    cluster_queue: str,
    *,
    arrival: float = 0.0,
    admitted_at: float | None = None,
    priority_classes: Mapping[str, int] | None = None,
    evicting: bool = False,
) -> Workload:
    """A Workload for the engine: admitted when `status.admission` is set, pending otherwise.

    `cluster_queue` is the leaf queue it counts in (`quota.model.queues.cluster_queue_of`).
    The priority is `workload_priority`'s; a pending Workload `priority_wait` holds back is
    the caller's to keep out of the snapshot.
    """
    namespace = wl.metadata.namespace or "default"
    priority = workload_priority(
        wl.spec.priority, wl.spec.priority_class_name, priority_classes or {}
    )
    admission = wl.status.admission
    assignments: tuple[Assignment, ...] | None = None
    if admission is not None:
        assignments = pod_set_assignments(admission.pod_set_assignments)
        if admitted_at is None:
            admitted_at = arrival
    else:
        admitted_at = None
    return Workload(
        key=f"{namespace}/{wl.name}",
        queue=cluster_queue,
        priority=priority,
        arrival=arrival,
        pod_sets=pod_sets(wl),
        admission=assignments,
        admitted_at=admitted_at,
        replaces=f"{namespace}/{wl.spec.replaces}" if wl.spec.replaces else None,
        evicting=evicting,
        checkpointed_at=last_checkpoint(wl.metadata.annotations),
        preemptible=wl.preemptible,
        disruption_single=wl.spec.disruption_mode == "Single",
    )


def last_checkpoint(annotations: Mapping[str, str]) -> float | None:
    """The time in annotation muster.dev/last-checkpoint, in seconds, or None.

    The workload writes it while it runs; a value that is not an RFC 3339 time with a zone
    counts as no checkpoint (the eviction order then falls back on the start time) rather
    than stopping the cycle."""
    text = annotations.get(LAST_CHECKPOINT_ANNOTATION)
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def priority_wait(
    priority: int | None, class_name: str | None, priority_classes: Mapping[str, int]
) -> str | None:
    """Why a workload cannot be decided yet, or None: it names a PriorityClass that does not
    exist and carries no priority of its own.

    The one rule for the controller, `muster fairshare` / `muster admit` and the simulator. The
    apiserver refuses a pod that names a missing PriorityClass; a workload is not refused but
    waits with this reason, and the first decision after the class is created takes its value.
    A priority already given (resolved when the workload was made, as a pod's is) stands even
    if its class is deleted later; so does an admission, whatever happens to the class.
    """
    if priority is not None or not class_name or class_name in priority_classes:
        return None
    return (
        f"{PRIORITY_WAIT} {class_name!r}, which does not exist (named by "
        "spec.priorityClassName): create it, or name a class that exists"
    )


PRIORITY_WAIT = "waits for PriorityClass"


def is_priority_wait(reason: str) -> bool:
    """Whether a pending reason is `priority_wait`'s (reports list such workloads apart: no
    admission cycle ever saw them)."""
    return reason.startswith(PRIORITY_WAIT)


def workload_priority(
    priority: int | None, class_name: str | None, priority_classes: Mapping[str, int]
) -> int:
    """The priority a workload is decided at: its own, else its PriorityClass's value, else 0
    (also for an admitted workload whose class no longer exists: see `priority_wait`)."""
    if priority is not None:
        return priority
    return priority_classes.get(class_name, 0) if class_name else 0


def pod_set_assignments(entries: Iterable[PodSetAssignment]) -> tuple[Assignment, ...]:
    """status.admission's (or status.nomination's) pod sets as the engine's plans."""
    return tuple(
        Assignment(a.name, a.count, dict(a.flavors), tuple((n.name, n.count) for n in a.nodes))
        for a in entries
    )


def node_capacity(
    nodes: Iterable[Mapping[str, Any]], flavors: Mapping[str, Flavor]
) -> dict[FlavorResource, int]:
    """Allocatable capacity of Ready, schedulable Node objects per (flavor, resource)
    (`capacity_of`); a node whose fields cannot be read is left out, so that one node the
    kubelet reports oddly does not stop admission for everyone."""
    parsed = []
    for node in nodes:
        try:
            parsed.append(node_from_manifest(node))
        except ManifestError:
            continue
    return capacity_of(parsed, flavors)


def capacity_of(nodes: Iterable[Node], flavors: Mapping[str, Flavor]) -> dict[FlavorResource, int]:
    """Allocatable capacity of Ready, schedulable nodes per (flavor, resource).

    A node provides a flavor when it carries every one of the flavor's node labels; a flavor
    without node labels describes no particular node and gets no capacity. Every labelled
    flavor appears (with cpu 0 when no node matches), so that "no nodes of this kind" reads
    as zero capacity rather than as unknown. When this returns an empty mapping callers use
    quota-only mode (`Snapshot.capacity = None`).
    """
    labelled = [f for f in flavors.values() if f.node_labels]
    capacity: dict[FlavorResource, int] = {}
    for node in nodes:
        if not node.ready or node.unschedulable:
            continue
        labels = node.labels
        for fl in labelled:
            if any(labels.get(k) != v for k, v in fl.node_labels.items()):
                continue
            for resource, amount in node.allocatable.items():
                key = (fl.name, resource)
                capacity[key] = capacity.get(key, 0) + amount
    if capacity:
        for fl in labelled:
            if not any(key[0] == fl.name for key in capacity):
                capacity[(fl.name, "cpu")] = 0
    return capacity


# ------------------------------------------------------------------------ batch/v1 Job


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def job_queue_name(job: Mapping[str, Any]) -> str | None:
    """The LocalQueue a Job asks for (label muster.dev/queue-name), or None."""
    labels = _meta(job).get("labels") or {}
    value = labels.get(QUEUE_LABEL)
    return str(value) if value else None


def job_is_elastic(job: Mapping[str, Any]) -> bool:
    """Whether the Job opted into WorkloadSlices (annotation muster.dev/elastic-job: "true")."""
    annotations = _meta(job).get("annotations") or {}
    return str(annotations.get(ELASTIC_ANNOTATION, "")).lower() == "true"


def job_pod_count(job: Mapping[str, Any]) -> int:
    """Pods the Job runs at once: parallelism (default 1), at most completions."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism")
    count = 1 if parallelism is None else int(parallelism)
    completions = spec.get("completions")
    if completions is not None:
        count = min(count, int(completions))
    return max(count, 0)


def job_priority(
    job: Mapping[str, Any],
    priority_classes: Mapping[str, int],
    global_default: str | None = None,
) -> tuple[str | None, int]:
    """The Job's PriorityClass name and value: the named class, else the global default
    class, else (None, 0). Raises KeyError for a class that does not exist."""
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    name = pod_spec.get("priorityClassName")
    if name:
        return str(name), priority_classes[str(name)]
    if global_default is not None:
        return global_default, priority_classes[global_default]
    return None, 0


def _subject(job: Mapping[str, Any]) -> str:
    meta = _meta(job)
    namespace = meta.get("namespace") or "default"
    return f"{job.get('kind') or 'Job'} {namespace}/{meta.get('name') or '?'}"


def job_to_workload_model(
    job: Mapping[str, Any],
    priority_classes: Mapping[str, int],
    *,
    global_default: str | None = None,
    index: int = 0,
    name: str | None = None,
    count: int | None = None,
) -> WorkloadModel:
    """The Workload a batch/v1 Job becomes: one pod set of min(parallelism, completions) pods
    with the pod template's requests, node selector and tolerations.

    The queue is the Job's `muster.dev/queue-name` label (a LocalQueue in its namespace), the
    priority its PriorityClass (none if that class does not exist: `priority_wait`), and
    `muster.dev/min-parallelism` allows partial admission (not for elastic Jobs, which resize
    through slices instead). `count` overrides the pod count (a slice of an elastic Job).
    Raises ManifestError naming `index`, the field and the rule when the Job cannot be queued.
    """
    subject = _subject(job)

    def fail(path: str, rule: str) -> ManifestError:
        return ManifestError(index, subject, [(path, rule)])

    meta = _meta(job)
    for field in ("labels", "annotations"):
        value = meta.get(field)
        if value is not None and not isinstance(value, Mapping):
            raise fail(f"metadata.{field}", f"must be a mapping (got {type(value).__name__})")
    queue = job_queue_name(job)
    if queue is None:
        raise fail(
            f"metadata.labels[{QUEUE_LABEL}]",
            "required: the LocalQueue the Job is queued in",
        )
    spec = job.get("spec")
    if not isinstance(spec, Mapping):
        raise fail("spec", "required field is missing")
    for field in ("parallelism", "completions"):
        value = spec.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise fail(f"spec.{field}", f"must be a whole number (got {value!r})")
        if isinstance(value, int) and value < 0:
            raise fail(f"spec.{field}", f"must not be negative (got {value})")
    template = spec.get("template")
    pod_spec = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(pod_spec, Mapping):
        raise fail("spec.template.spec", "required field is missing")
    # Checks the type of every field placement reads (node selector, affinity, tolerations,
    # requests) and raises ManifestError naming the Job's field.
    requests = dict(
        pod_shape_from_spec(
            pod_spec, subject=subject, where="spec.template.spec", index=index
        ).requests
    )
    try:
        class_name, priority = job_priority(job, priority_classes, global_default)
    except KeyError:
        # A class that does not exist: the Workload names it, carries no priority, and waits
        # for it (`priority_wait`), as the Job's pods would wait for the apiserver to take them.
        class_name, priority = str(pod_spec.get("priorityClassName")), None
    pods = job_pod_count(job) if count is None else count
    pod_set: dict[str, Any] = {
        "name": JOB_POD_SET,
        "count": pods,
        "template": {
            "nodeSelector": dict(pod_spec.get("nodeSelector") or {}),
            "tolerations": list(pod_spec.get("tolerations") or []),
        },
        "requests": {r: format_quantity(v, r) for r, v in requests.items()},
    }
    annotations = meta.get("annotations") or {}
    # Partial admission, as Kueue's job-min-parallelism: the Job may start with fewer pods,
    # down to this many, when all of them do not fit. Elastic Jobs resize instead.
    minimum = annotations.get(MIN_PARALLELISM_ANNOTATION)
    if minimum is not None and not job_is_elastic(job) and pods:
        try:
            low = int(str(minimum))
        except ValueError:
            raise fail(
                f"metadata.annotations[{MIN_PARALLELISM_ANNOTATION}]",
                f"must be a whole number of pods (got {minimum!r})",
            ) from None
        if low < 1:
            raise fail(
                f"metadata.annotations[{MIN_PARALLELISM_ANNOTATION}]",
                f"must be at least 1 (got {low})",
            )
        pod_set["minCount"] = min(low, pods)
    try:
        preemptible_override(annotations)
    except ValueError as error:
        raise fail(f"metadata.annotations[{PREEMPTIBLE_ANNOTATION}]", str(error)) from None
    assert isinstance(template, Mapping)  # it holds pod_spec, checked above
    asked = topology_annotations(template, pods, fail)
    if asked:
        pod_set["topologyRequest"] = asked
    body: dict[str, Any] = {"queueName": queue, "podSets": [pod_set]}
    mode = annotations.get(DISRUPTION_MODE_ANNOTATION)
    if mode is not None:
        if mode not in ("single", "all"):
            raise fail(
                f"metadata.annotations[{DISRUPTION_MODE_ANNOTATION}]",
                f'must be "single" or "all" (got {mode!r})',
            )
        if mode == "single" and not job_is_elastic(job):
            # Its lost pods could never come back (no slices), and the Job controller would
            # replace them at once, ungated, on the nodes just freed.
            raise fail(
                f"metadata.annotations[{DISRUPTION_MODE_ANNOTATION}]",
                f'single needs the Job to be elastic ({ELASTIC_ANNOTATION}: "true")',
            )
        body["disruptionMode"] = "Single" if mode == "single" else "All"
    if priority is not None:
        body["priority"] = priority
    if class_name:
        body["priorityClassName"] = class_name
    document = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {
            "name": name or str(meta.get("name") or ""),
            "namespace": str(meta.get("namespace") or "default"),
            "annotations": copied_annotations(annotations),
        },
        "spec": body,
    }
    try:
        model = parse_manifest(document, index)
    except ManifestError as error:
        # Say it in the Job's terms: the user wrote a Job, not a Workload.
        problems = [(_job_field(path), rule) for path, rule in error.problems]
        raise ManifestError(index, subject, problems) from None
    assert isinstance(model, WorkloadModel)
    return model


# What admission reads off a Workload but a user sets on their own object.
COPIED_ANNOTATIONS = (PREEMPTIBLE_ANNOTATION, LAST_CHECKPOINT_ANNOTATION)


def copied_annotations(annotations: Mapping[str, Any]) -> dict[str, str]:
    """The annotations of a user's object (Job, JobSet, TrainJob, PodGroup, ...) its Workload
    carries too (`COPIED_ANNOTATIONS`): admission reads them from the Workload."""
    return {k: str(annotations[k]) for k in COPIED_ANNOTATIONS if k in annotations}


_TOPOLOGY_FIELDS = (
    (REQUIRED_TOPOLOGY_ANNOTATION, "required"),
    (PREFERRED_TOPOLOGY_ANNOTATION, "preferred"),
    (SLICE_TOPOLOGY_ANNOTATION, "sliceRequiredTopology"),
)


def topology_annotations(
    template: Mapping[str, Any], pods: int, fail: Callable[[str, str], ManifestError]
) -> dict[str, Any]:
    """A pod template's `muster.dev/podset-*-topology` annotations as a topologyRequest
    (empty when it has none); `fail(path, rule)` makes the error for a bad one."""
    meta = template.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return {}
    where = "spec.template.metadata.annotations"
    out: dict[str, Any] = {}
    for key, field in _TOPOLOGY_FIELDS:
        value = annotations.get(key)
        if value is not None:
            if not isinstance(value, str) or not value:
                raise fail(f"{where}[{key}]", f"must name a node label (got {value!r})")
            out[field] = value
    unconstrained = annotations.get(UNCONSTRAINED_TOPOLOGY_ANNOTATION)
    if unconstrained is not None:
        if unconstrained != "true":
            raise fail(
                f"{where}[{UNCONSTRAINED_TOPOLOGY_ANNOTATION}]",
                f'must be "true" (got {unconstrained!r})',
            )
        out["unconstrained"] = True
    if sum(k in out for k in ("required", "preferred", "unconstrained")) > 1:
        raise fail(
            where,
            f"at most one of {REQUIRED_TOPOLOGY_ANNOTATION}, {PREFERRED_TOPOLOGY_ANNOTATION} "
            f"and {UNCONSTRAINED_TOPOLOGY_ANNOTATION}",
        )
    size = annotations.get(SLICE_SIZE_ANNOTATION)
    if (size is None) != ("sliceRequiredTopology" not in out):
        raise fail(
            where,
            f"{SLICE_SIZE_ANNOTATION} and {SLICE_TOPOLOGY_ANNOTATION} go together",
        )
    if size is not None:
        path = f"{where}[{SLICE_SIZE_ANNOTATION}]"
        text = str(size)
        if not text.isdigit() or int(text) < 1:
            raise fail(path, f"must be a whole number of pods, at least 1 (got {size!r})")
        if pods % int(text):
            raise fail(path, f"{text} does not divide the Job's {pods} pods")
        out["sliceSize"] = int(text)
    return out


_WORKLOAD_TO_JOB = (
    ("spec.podSets[0].topologyRequest", "spec.template.metadata.annotations"),
    ("spec.podSets[0].count", "spec.parallelism"),
    ("spec.podSets[0].minCount", f"metadata.annotations[{MIN_PARALLELISM_ANNOTATION}]"),
    ("spec.podSets[0].requests", "spec.template.spec.containers[*].resources.requests"),
    ("spec.podSets[0].template", "spec.template.spec"),
    ("spec.queueName", f"metadata.labels[{QUEUE_LABEL}]"),
    ("spec.priority", "spec.template.spec.priorityClassName"),
)


def _job_field(path: str) -> str:
    for workload_path, job_path in _WORKLOAD_TO_JOB:
        if path.startswith(workload_path):
            return job_path + path[len(workload_path) :]
    return path
