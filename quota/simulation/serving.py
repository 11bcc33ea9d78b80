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
from quota.api.names import QUEUE_LABEL
from quota.api.quantity import format_quantity
from quota.manifests.documents import invalid
from quota.model import convert
from quota.model.nodeconvert import pod_requests
from quota.model.serving import (
    LEADER,
    MAIN,
    WORKERS,
    GroupPodSet,
    PodSpecAt,
    leader_worker_set,
    lws_group,
    pod_spec_at,
    replicas_group,
    replicas_of,
    spec_of,
)
from quota.model.snapshot import PodSet

LWS_API = "leaderworkerset.x-k8s.io/v1"
DEPLOYMENT_API = "apps/v1"
# The kinds this module reads, by kind: the apiVersion each needs.
SERVING_KINDS = {"LeaderWorkerSet": LWS_API, "Deployment": DEPLOYMENT_API}


def _workload_pod_sets(
    index: int,
    doc: Mapping[str, Any],
    sets: Sequence[GroupPodSet],
    specs: Mapping[str, PodSpecAt],
    *,
    degradable: bool,
) -> tuple[PodSet, ...]:
    """The pod sets of one group, through the Workload model the controller's Workloads are
    read with (`convert.pod_sets`). `specs`: the pod spec of each pod set."""
    meta = doc.get("metadata") or {}
    pod_sets: list[dict[str, Any]] = []
    for group_set in sets:
        at = specs[group_set.name]
        spec = at.spec
        try:
            requests = pod_requests(spec)
        except ValueError as error:
            raise invalid(index, doc, at.path, str(error)) from None
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

    def fail(path: str, rule: str) -> ManifestError:
        return invalid(index, doc, path, rule)

    if kind == "Deployment":
        spec = spec_of(doc, fail)
        template = pod_spec_at(spec.get("template"), "spec.template", fail)
        sets = replicas_group(replicas_of(spec, fail))
        pods = _workload_pod_sets(index, doc, sets, {MAIN: template}, degradable=False)
        return [("", pods, True, False)]
    lws = leader_worker_set(doc, fail)
    sets = lws_group(lws.size, lws.degradable)
    specs = {LEADER: lws.leader, WORKERS: lws.workers}
    pods = _workload_pod_sets(index, doc, sets, specs, degradable=lws.degradable)
    return [(f"-{i}", pods, False, lws.degradable) for i in range(lws.replicas)]


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
