"""Serving workloads in scenarios: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) becomes
one gang per replica group, a Deployment (apps/v1) one elastic workload of its replicas,
each with the pod sets the controller gives them (`quota.model.serving`), so a scenario can
mix training Jobs with multi-host inference.

They carry the queue label and the simulated timing annotations as Jobs do
(`muster.dev/submit-at`, `muster.dev/run-for`); a Deployment's `replicas` may change through
a ScaleEvent naming it, as an elastic Job's parallelism does. A LeaderWorkerSet annotated
`muster.dev/disruption-mode: single` may lose single workers (never its leader) to
preemption. Pure: documents in, frozen values out, or ManifestError naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from quota.api import ManifestError, parse_manifest
from quota.api.meta import API_VERSION
from quota.api.names import DISRUPTION_MODE_ANNOTATION, QUEUE_LABEL
from quota.api.quantity import format_quantity
from quota.manifests.documents import invalid
from quota.model import convert
from quota.model.nodeconvert import pod_requests
from quota.model.serving import LEADER, GroupPodSet, lws_group, replicas_group
from quota.model.snapshot import PodSet

LWS_API = "leaderworkerset.x-k8s.io/v1"
DEPLOYMENT_API = "apps/v1"
# The kinds this module reads, by kind: the apiVersion each needs.
SERVING_KINDS = {"LeaderWorkerSet": LWS_API, "Deployment": DEPLOYMENT_API}


def _int(index: int, doc: Mapping[str, Any], path: str, value: object, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(index, doc, path, f"must be a whole number >= 0 (got {value!r})")
    return value


def _template_spec(
    index: int, doc: Mapping[str, Any], path: str, template: object
) -> Mapping[str, Any]:
    spec = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(spec, Mapping):
        raise invalid(index, doc, f"{path}.spec", "required: the pod spec")
    return spec


def _workload_pod_sets(
    index: int,
    doc: Mapping[str, Any],
    sets: Sequence[GroupPodSet],
    specs: Mapping[str, tuple[str, Mapping[str, Any]]],
    *,
    degradable: bool,
) -> tuple[PodSet, ...]:
    """The pod sets of one group, through the Workload model the controller's Workloads are
    read with (`convert.pod_sets`). `specs`: pod set -> (its template's path, pod spec)."""
    meta = doc.get("metadata") or {}
    pod_sets: list[dict[str, Any]] = []
    for group_set in sets:
        path, spec = specs[group_set.name]
        try:
            requests = pod_requests(spec)
        except ValueError as error:
            raise invalid(index, doc, path, str(error)) from None
        pod_set: dict[str, Any] = {
            "name": group_set.name,
            "count": group_set.count,
            "template": {
                "nodeSelector": dict(spec.get("nodeSelector") or {}),
                "tolerations": list(spec.get("tolerations") or []),
            },
            "requests": {r: format_quantity(v, r) for r, v in sorted(requests.items())},
        }
        if degradable:
            pod_set["protectedCount"] = group_set.protected
        pod_sets.append(pod_set)
    body: dict[str, Any] = {"queueName": "q", "podSets": pod_sets}
    if degradable:
        body["disruptionMode"] = "Single"
    document = {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {"name": str(meta.get("name") or "x"), "namespace": "default"},
        "spec": body,
    }
    try:
        model = parse_manifest(document, index)
        return convert.pod_sets(model)  # type: ignore[arg-type]
    except ManifestError as error:
        problems = [(f"(as a Workload) {p}", rule) for p, rule in error.problems]
        raise ManifestError(index, f"{doc.get('kind')} {meta.get('name')}", problems) from None


def _degradable(index: int, doc: Mapping[str, Any]) -> bool:
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    value = str(annotations.get(DISRUPTION_MODE_ANNOTATION) or "all").lower()
    if value not in ("single", "all"):
        raise invalid(
            index,
            doc,
            f"metadata.annotations[{DISRUPTION_MODE_ANNOTATION}]",
            f'must be "single" or "all" (got {value!r})',
        )
    return value == "single"


def serving_groups(
    index: int, doc: Mapping[str, Any]
) -> list[tuple[str, tuple[PodSet, ...], bool, bool]]:
    """(name suffix, pod sets, elastic, degradable) of each workload a serving document
    makes (degradable: preemption may take its unprotected pods one by one): one per
    LeaderWorkerSet group ("-0", "-1", ...), one for a Deployment (""). Raises ManifestError
    naming the field for a bad document."""
    kind = str(doc.get("kind") or "")
    if doc.get("apiVersion") != SERVING_KINDS[kind]:
        raise invalid(index, doc, "apiVersion", f"{kind} needs apiVersion {SERVING_KINDS[kind]}")
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise invalid(index, doc, "spec", "required field is missing")
    replicas = _int(index, doc, "spec.replicas", spec.get("replicas"), 1)
    if kind == "Deployment":
        template = _template_spec(index, doc, "spec.template", spec.get("template"))
        sets = replicas_group(replicas)
        pods = _workload_pod_sets(
            index, doc, sets, {s.name: ("spec.template", template) for s in sets}, degradable=False
        )
        return [("", pods, True, False)]
    lwt = spec.get("leaderWorkerTemplate")
    if not isinstance(lwt, Mapping):
        raise invalid(index, doc, "spec.leaderWorkerTemplate", "required field is missing")
    size = _int(index, doc, "spec.leaderWorkerTemplate.size", lwt.get("size"), 1)
    if size < 1:
        raise invalid(index, doc, "spec.leaderWorkerTemplate.size", "must be at least 1")
    where = "spec.leaderWorkerTemplate.workerTemplate"
    worker = _template_spec(index, doc, where, lwt.get("workerTemplate"))
    specs: dict[str, tuple[str, Mapping[str, Any]]] = {}
    if lwt.get("leaderTemplate") is not None:
        leader_path = "spec.leaderWorkerTemplate.leaderTemplate"
        specs[LEADER] = (
            leader_path,
            _template_spec(index, doc, leader_path, lwt["leaderTemplate"]),
        )
    else:
        specs[LEADER] = (where, worker)
    degradable = _degradable(index, doc)
    sets = lws_group(size, degradable)
    for s in sets:
        specs.setdefault(s.name, (where, worker))
    pods = _workload_pod_sets(index, doc, sets, specs, degradable=degradable)
    return [(f"-{i}", pods, False, degradable) for i in range(replicas)]


def queue_of(
    index: int, doc: Mapping[str, Any], local: Callable[[str, str], str | None]
) -> tuple[str, str]:
    """(LocalQueue, ClusterQueue) a serving document names; ManifestError if none exists."""
    meta = doc.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    queue = str((meta.get("labels") or {}).get(QUEUE_LABEL) or "")
    path = f"metadata.labels[{QUEUE_LABEL}]"
    if not queue:
        raise invalid(index, doc, path, "required: the LocalQueue it is queued in")
    cluster_queue = local(namespace, queue)
    if cluster_queue is None:
        raise invalid(
            index, doc, path, f"LocalQueue {namespace}/{queue} does not exist in the scenario"
        )
    return queue, cluster_queue
