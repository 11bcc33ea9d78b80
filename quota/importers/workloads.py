"""A source project's pending work as Muster Workloads: the demand `muster fairshare` shares
capacity by, and the jobs `muster import --simulate` runs.

Every source describes work as pod sets (a batch Job's template, a Kueue Workload's
podSets, a Volcano Job's tasks, the pods of a PodGroup); each becomes one Workload in the
LocalQueue the source's queue maps to, with the priority of its class.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Any

from quota.api import ManifestError
from quota.api.meta import parse_duration
from quota.api.names import (
    PREFERRED_TOPOLOGY_ANNOTATION,
    QUEUE_LABEL,
    REQUIRED_TOPOLOGY_ANNOTATION,
    SLICE_SIZE_ANNOTATION,
    SLICE_TOPOLOGY_ANNOTATION,
    UNCONSTRAINED_TOPOLOGY_ANNOTATION,
)
from quota.api.quantity import format_quantity
from quota.api.workload import MAX_POD_COUNT, MAX_POD_SETS
from quota.importers.build import (
    ClusterState,
    QueueDraft,
    local_queue,
    manifest,
    whole_cluster_flavor,
)
from quota.importers.reader import SourceObject
from quota.importers.report import (
    ImportedWorkload,
    ImportResult,
    Origin,
    Unmapped,
    from_manifest_error,
    refuse,
)
from quota.model.convert import job_to_workload_model, topology_annotations
from quota.model.nodeconvert import pod_shape_from_spec
from quota.simulation.scenario import RUN_FOR_ANNOTATION, SUBMIT_AT_ANNOTATION

MUSTER_PREFIX = "muster.dev/"  # of Muster's own pod-template annotations
# The kinds of pod owners whose pods are counted through their owner (an import reads the
# owner object: `quota.importers.owners`), not one by one.
POD_OWNER_KINDS = frozenset({"Job", "ReplicaSet", "StatefulSet", "LeaderWorkerSet", "RayCluster"})
TOPOLOGY_ANNOTATIONS = frozenset(
    (
        REQUIRED_TOPOLOGY_ANNOTATION,
        PREFERRED_TOPOLOGY_ANNOTATION,
        UNCONSTRAINED_TOPOLOGY_ANNOTATION,
        SLICE_TOPOLOGY_ANNOTATION,
        SLICE_SIZE_ANNOTATION,
    )
)


@dataclass(frozen=True)
class PodSetSource:
    """Identical pods in a source object: `count` of `pod_spec`, found at `path`."""

    name: str
    count: int
    pod_spec: Mapping[str, Any]
    path: str  # of the pod spec in its source object, for errors
    min_count: int | None = None
    source: SourceObject | None = None  # the object holding the spec, when not the workload's
    topology: Mapping[str, Any] | None = None  # its Muster topologyRequest, if it asks


def timing(obj: SourceObject) -> tuple[float, float | None]:
    """(submit at, run for) in seconds from the annotations muster.dev/submit-at and
    muster.dev/run-for, as in scenarios; run for None when unset."""
    annotations = obj.meta_strings("annotations")
    out: list[float | None] = []
    for key, default in ((SUBMIT_AT_ANNOTATION, "0s"), (RUN_FOR_ANNOTATION, None)):
        raw = annotations.get(key, default)
        if raw is None:
            out.append(None)
            continue
        path = f"metadata.annotations[{key}]"
        try:
            seconds = parse_duration(raw).total_seconds()
        except ValueError as error:
            refuse(obj.origin, path, str(error))
        if key == RUN_FOR_ANNOTATION and seconds <= 0:
            refuse(obj.origin, path, "must be a positive duration")
        out.append(seconds)
    submit = out[0]
    assert submit is not None
    return submit, out[1]


def resolve_priority(
    obj: SourceObject, class_name: str, path: str, state: ClusterState
) -> tuple[str | None, int]:
    """The class and value a workload runs with: the named class, else the default class,
    else none and 0. A class the files do not define is refused."""
    if class_name:
        if class_name not in state.priority_classes:
            refuse(obj.origin, path, f"priority class {class_name!r} is not defined in the files")
        return class_name, state.priority_classes[class_name]
    if state.default_class is not None:
        return state.default_class, state.priority_classes[state.default_class]
    return None, 0


def workload(
    obj: SourceObject,
    *,
    name: str,
    local_queue: str,
    priority: tuple[str | None, int],
    pod_sets: Sequence[PodSetSource],
) -> ImportedWorkload:
    """One Muster Workload of `pod_sets`, queued in `local_queue` of the object's namespace."""
    if not pod_sets:
        refuse(obj.origin, "spec", "has no pods to run")
    if len(pod_sets) > MAX_POD_SETS:
        refuse(
            obj.origin,
            "spec",
            f"{len(pod_sets)} kinds of pods; a Muster Workload holds at most {MAX_POD_SETS}",
        )
    sets: list[dict[str, Any]] = []
    for ps in pod_sets:
        if ps.count > MAX_POD_COUNT:
            refuse(obj.origin, ps.path, f"{ps.count} pods; at most {MAX_POD_COUNT} per pod set")
        holder = ps.source or obj  # a pod of a group: errors name that pod
        try:
            shape = pod_shape_from_spec(
                ps.pod_spec,
                subject=holder.origin.subject,
                where=ps.path,
                index=holder.origin.index,
            )
        except ManifestError as error:
            raise from_manifest_error(holder.origin, error) from None
        entry: dict[str, Any] = {
            "name": ps.name,
            "count": ps.count,
            "template": {
                "nodeSelector": dict(shape.node_selector),
                "tolerations": list(holder.items(ps.pod_spec.get("tolerations"), ps.path)),
            },
            "requests": {r: format_quantity(v, r) for r, v in shape.requests.items()},
        }
        affinity = ps.pod_spec.get("affinity")
        if affinity:
            entry["template"]["affinity"] = affinity
        if ps.min_count is not None and ps.min_count < ps.count:
            entry["minCount"] = ps.min_count
        if ps.topology:
            entry["topologyRequest"] = dict(ps.topology)
        sets.append(entry)
    class_name, value = priority
    spec: dict[str, Any] = {"queueName": local_queue, "priority": value, "podSets": sets}
    if class_name:
        spec["priorityClassName"] = class_name
    doc = manifest(
        obj.origin,
        "Workload",
        {"metadata": {"name": name, "namespace": obj.namespace}, "spec": spec},
    )
    submit, run_for = timing(obj)
    return ImportedWorkload(doc, submit, run_for, obj.origin)


def batch_job(
    obj: SourceObject,
    local_queue: str,
    priority: tuple[str | None, int] | None,
    state: ClusterState,
    unmapped: list[Unmapped],
    *,
    topology: Mapping[str, Any] | None = None,
    annotation_prefix: str | None = None,
) -> ImportedWorkload:
    """A batch/v1 Job queued in `local_queue`, converted exactly as Muster converts Jobs
    (one pod set of min(parallelism, completions) pods). `priority` overrides the pod
    template's PriorityClass (Kueue's WorkloadPriorityClass label). Its topology request is
    `topology`, or its pod template's annotations under `annotation_prefix` (Kueue's
    `kueue.x-k8s.io/podset-*-topology`, read as Muster reads its own)."""
    meta = obj.mapping(obj.doc.get("metadata"), "metadata")
    labels = {**obj.meta_strings("labels"), QUEUE_LABEL: local_queue}
    job = {**obj.doc, "metadata": {**meta, "namespace": obj.namespace, "labels": labels}}
    try:
        model = job_to_workload_model(
            job,
            state.priority_classes,
            global_default=state.default_class,
            index=obj.origin.index,
        )
    except ManifestError as error:
        raise from_manifest_error(obj.origin, error) from None
    body = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    pod_set = body["spec"]["podSets"][0]
    if annotation_prefix is not None:
        template = obj.mapping(obj.spec().get("template"), "spec.template")
        topology = prefixed_topology(
            obj,
            template,
            annotation_prefix,
            pod_set["count"],
            "spec.template.metadata",
            unmapped,
        )
    if topology:
        pod_set["topologyRequest"] = dict(topology)
    if priority is not None:
        class_name, value = priority
        body["spec"]["priority"] = value
        body["spec"].pop("priorityClassName", None)
        if class_name:
            body["spec"]["priorityClassName"] = class_name
    body.pop("status", None)
    body.pop("apiVersion", None)
    body.pop("kind", None)
    doc = manifest(obj.origin, "Workload", body)
    submit, run_for = timing(obj)
    return ImportedWorkload(doc, submit, run_for, obj.origin)


def prefixed_topology(
    obj: SourceObject,
    holder: Mapping[str, Any],
    prefix: str,
    pods: int,
    where: str,
    unmapped: list[Unmapped],
) -> dict[str, Any]:
    """The topology request of `holder`'s (a pod template's or a pod's) annotations that
    another project spells as Muster does under its own `prefix` (Kueue's
    `kueue.x-k8s.io/podset-required-topology` and the rest): read by Muster's one rule for
    its own (`convert.topology_annotations`), refused in the source's words at `where`.
    Its other `podset-` annotations (Kueue's podset-group-name, say) are reported."""
    meta = obj.mapping(holder.get("metadata"), f"{where}")
    annotations = obj.mapping(meta.get("annotations"), f"{where}.annotations")
    renamed: dict[str, Any] = {}
    for key, value in annotations.items():
        if not key.startswith(prefix + "podset-"):
            continue
        ours = MUSTER_PREFIX + key[len(prefix) :]
        if ours in TOPOLOGY_ANNOTATIONS:
            renamed[ours] = value
        else:
            skipped(
                obj,
                f"{where}.annotations[{key}]",
                "Muster has no equivalent: each pod set is placed by its own topology request",
                unmapped,
            )

    def fail(path: str, rule: str) -> ManifestError:
        return ManifestError(obj.origin.index, obj.origin.subject, [(path, rule)])

    try:
        return topology_annotations({"metadata": {"annotations": renamed}}, pods, fail)
    except ManifestError as error:
        path, rule = error.problems[0]
        path = f"{where}.annotations" + path.removeprefix("spec.template.metadata.annotations")
        refuse(obj.origin, path.replace(MUSTER_PREFIX, prefix), rule.replace(MUSTER_PREFIX, prefix))


def _signature(pod_spec: Mapping[str, Any]) -> str:
    keep = {k: pod_spec.get(k) for k in ("containers", "initContainers", "nodeSelector")}
    keep["tolerations"] = pod_spec.get("tolerations")
    keep["affinity"] = pod_spec.get("affinity")
    keep["overhead"] = pod_spec.get("overhead")
    return json.dumps(keep, sort_keys=True, default=str)


def pod_group_sets(pods: Sequence[SourceObject]) -> list[PodSetSource]:
    """The pods of one group as pod sets, one per distinct pod spec, in order of appearance."""
    counts: dict[str, int] = {}
    first: dict[str, SourceObject] = {}
    for pod in pods:
        key = _signature(pod.spec())
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, pod)
    return [
        PodSetSource(
            f"pods-{i}" if len(counts) > 1 else "main",
            count,
            first[key].spec(),
            "spec",
            source=first[key],
        )
        for i, (key, count) in enumerate(counts.items())
    ]


def unique(work: Sequence[ImportedWorkload]) -> None:
    """Refuse two workloads of one name in one namespace (a Job and a pod group, say):
    Muster's Workloads are named objects."""
    seen: dict[tuple[str, str], Origin] = {}
    for item in work:
        meta = item.manifest["metadata"]
        key = (str(meta["namespace"]), str(meta["name"]))
        if key in seen:
            refuse(
                item.origin,
                "metadata.name",
                f"a workload {key[0]}/{key[1]} is already imported from "
                f"{seen[key].where()}; Muster names Workloads uniquely (rename one)",
            )
        seen[key] = item.origin


def skipped(obj: SourceObject, path: str, reason: str, unmapped: list[Unmapped]) -> None:
    """Record that a source object (or field) was left out, and why."""
    unmapped.append(Unmapped(obj.origin, path, reason))


def skipped_fields(
    obj: SourceObject, spec: Mapping[str, Any], reasons: Mapping[str, str], unmapped: list[Unmapped]
) -> None:
    """Record each field of `spec` in `reasons` that is set: Muster does not map it, and why."""
    for key, reason in reasons.items():
        if spec.get(key):
            skipped(obj, f"spec.{key}", reason, unmapped)


@dataclass(frozen=True)
class QueuedWork:
    """Work that names its queue directly (KAI, Volcano): a batch Job (`job`), or pod sets
    with a priority class; built once the LocalQueue standing for the queue is known."""

    obj: SourceObject
    queue: str
    queue_path: str
    job: bool = False
    pod_sets: Sequence[PodSetSource] = ()
    class_name: str = ""
    topology: Mapping[str, Any] | None = None  # for every pod set, when the source asks
    name: str = ""  # of the Workload, when not the object's (a LeaderWorkerSet's groups)


def pod_group_work(
    groups: Mapping[Any, SourceObject],
    members: dict[Any, list[SourceObject]],
    queue_of: Callable[[SourceObject], str],
    group_annotation: str,
    unmapped: list[Unmapped],
    topology_of: Callable[[SourceObject], Mapping[str, Any] | None],
) -> list[QueuedWork]:
    """Each PodGroup with its member pods (taken out of `members`) as one piece of work on
    the queue `queue_of` names, asking for the topology `topology_of` reads; groups without
    pods in the files and pods whose group is not in them are reported and left out."""
    work: list[QueuedWork] = []
    for key, group_obj in groups.items():
        spec = group_obj.spec()
        queue = queue_of(group_obj)
        group_pods = members.pop(key, [])
        if not group_pods:
            skipped(
                group_obj,
                "",
                "no pods of this PodGroup are in the files, so it asks for nothing: left out",
                unmapped,
            )
            continue
        min_member = group_obj.integer(spec.get("minMember"), "spec.minMember", low=0)
        if min_member is not None and 0 < min_member < len(group_pods):
            skipped(
                group_obj,
                "spec.minMember",
                f"{min_member} of {len(group_pods)} pods: Muster admits the group whole",
                unmapped,
            )
        class_name = group_obj.text(spec.get("priorityClassName"), "spec.priorityClassName")
        work.append(
            QueuedWork(
                group_obj,
                queue,
                "spec.queue",
                pod_sets=pod_group_sets(group_pods),
                class_name=class_name,
                topology=topology_of(group_obj),
            )
        )
    for (namespace, group), orphans in members.items():
        skipped(
            orphans[0],
            f"metadata.annotations[{group_annotation}]",
            f"PodGroup {namespace}/{group} is not in the files: its pods are left out",
            unmapped,
        )
    return work


# The API groups each source's import reads.
_SOURCES = {
    "kueue.x-k8s.io": "kueue",
    "scheduling.run.ai": "kai",
    "scheduling.volcano.sh": "volcano",
    "batch.volcano.sh": "volcano",
    "topology.volcano.sh": "volcano",
    "kai.scheduler": "kai",
}


def refuse_other_source(obj: SourceObject, source: str, name: str) -> None:
    """Refuse an object of another source's API (this import is `muster import {source}`,
    of `name`'s objects), naming the import that reads it."""
    other = _SOURCES.get(obj.group)
    if other is not None and other != source:
        refuse(
            obj.origin,
            "apiVersion",
            f"{obj.api_version} {obj.kind} is not a {name} object (use `muster import {other}`)",
        )


def source_objects(
    objects: Sequence[SourceObject],
    state: ClusterState,
    found: GroupedWork,
    source: str,
    name: str,
    kinds: Sequence[tuple[str, str]],
    unmapped: list[Unmapped],
) -> dict[tuple[str, str], list[SourceObject]]:
    """The objects of an import of `source` (`name`'s objects), sorted: cluster state into
    `state`, PodGroups, Jobs and pods into `found`, and each of `kinds` ((group, kind)) in a
    list of its own, a name defined once; another source's object is refused, and anything
    else reported and left out."""
    out: dict[tuple[str, str], list[SourceObject]] = {kind: [] for kind in kinds}
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        if state.take(obj) or found.take(obj):
            continue
        refuse_other_source(obj, source, name)
        kind = (obj.group, obj.kind)
        if kind not in out:
            skipped(obj, "", f"not a {name} queue, a Node or queued work: left out", unmapped)
            continue
        # The namespace as written: a cluster-scoped kind's is not checked, so any value.
        written = obj.mapping(obj.doc.get("metadata"), "metadata").get("namespace")
        key = (*kind, str(written or ""), obj.name)
        if key in seen:
            refuse(obj.origin, "metadata.name", f"{obj.kind} defined twice")
        seen.add(key)
        out[kind].append(obj)
    return out


@dataclass
class GroupedWork:
    """The work objects of a source whose work names its queue (KAI, Volcano): its PodGroups
    (by namespace and name), batch Jobs and pods, in file order."""

    group: str  # the source's PodGroup API group
    groups: dict[tuple[str, str], SourceObject] = field(default_factory=dict)
    jobs: list[SourceObject] = field(default_factory=list)
    pods: list[SourceObject] = field(default_factory=list)

    def take(self, obj: SourceObject) -> bool:
        """Keep `obj` if it is one of those; whether it was."""
        if obj.group == self.group and obj.kind == "PodGroup":
            self.groups[(obj.namespace, obj.name)] = obj
        elif obj.api_version == "batch/v1" and obj.kind == "Job":
            self.jobs.append(obj)
        elif obj.api_version == "v1" and obj.kind == "Pod":
            self.pods.append(obj)
        else:
            return False
        return True


def pod_work(
    pods: Sequence[SourceObject],
    groups: Mapping[tuple[str, str], SourceObject],
    group_annotation: str,
    queue_of_group: Callable[[SourceObject], str],
    queue_of_pod: Callable[[SourceObject], tuple[str, str]],
    no_queue: tuple[str, str],
    unmapped: list[Unmapped],
    topology_of_group: Callable[[SourceObject], Mapping[str, Any] | None],
    *,
    by_owner: bool = False,
) -> list[QueuedWork]:
    """The pods that are neither done nor run by a Job: each alone, on the queue
    `queue_of_pod` names (queue, field naming it), then each PodGroup (`groups`, which
    `group_annotation` on a pod names) with its pods, asking for the topology
    `topology_of_group` reads off the group. A pod that names neither is left out with
    `no_queue` (field, reason). `by_owner`: the pods of the kinds the import reads
    (POD_OWNER_KINDS) are counted through them, and those of any other owner grouped by it,
    as Muster's controller groups them."""
    work: list[QueuedWork] = []
    members: dict[tuple[str, str], list[SourceObject]] = {}
    # By (namespace, owner stem, pod name): a pod without an owner is a group of its own.
    owned: dict[tuple[str, str, str], list[SourceObject]] = {}
    for obj in pods:
        if finished(obj) or owned_by(obj, POD_OWNER_KINDS if by_owner else {"Job"}):
            continue  # done, or counted through its owner
        group = obj.meta_strings("annotations").get(group_annotation)
        if group:
            members.setdefault((obj.namespace, group), []).append(obj)
            continue
        queue, path = queue_of_pod(obj)
        if not queue:
            skipped(obj, *no_queue, unmapped)
            continue
        owner = owner_stem(obj) if by_owner else ""
        owned.setdefault((obj.namespace, owner, "" if owner else obj.name), []).append(obj)
    for (_, owner, _), held in owned.items():
        first = held[0]
        queue, path = queue_of_pod(first)
        work.append(
            QueuedWork(
                first,
                queue,
                path,
                pod_sets=pod_group_sets(held),
                class_name=first.text(
                    first.spec().get("priorityClassName"), "spec.priorityClassName"
                ),
                name=owner,
            )
        )
    return work + pod_group_work(
        groups, members, queue_of_group, group_annotation, unmapped, topology_of_group
    )


def queue_work(
    work: Sequence[QueuedWork],
    leaves: Mapping[str, Origin],
    parents: set[str],
    state: ClusterState,
    unmapped: list[Unmapped],
) -> tuple[list[dict[str, Any]], list[ImportedWorkload]]:
    """For sources whose jobs name a queue, not a namespace's door into it: one LocalQueue
    named after the queue in every namespace that has work for it, and the work itself.
    Work for a queue the files do not define, or for a parent queue, is left out."""
    local: dict[tuple[str, str], dict[str, Any]] = {}
    out: list[ImportedWorkload] = []
    for item in work:
        if item.queue in parents:
            skipped(
                item.obj,
                item.queue_path,
                f"queue {item.queue!r} has child queues; only leaf queues run work: left out",
                unmapped,
            )
            continue
        if item.queue not in leaves:
            skipped(
                item.obj,
                item.queue_path,
                f"queue {item.queue!r} is not in the files: left out",
                unmapped,
            )
            continue
        key = (item.obj.namespace, item.queue)
        if key not in local:
            local[key] = local_queue(leaves[item.queue], key[0], item.queue, item.queue)
        asked = item.topology
        if item.job:
            out.append(
                batch_job(item.obj, item.queue, None, state, unmapped, topology=item.topology)
            )
            continue
        priority = resolve_priority(item.obj, item.class_name, "spec.priorityClassName", state)
        out.append(
            workload(
                item.obj,
                name=item.name or item.obj.name,
                local_queue=item.queue,
                priority=priority,
                pod_sets=[replace(ps, topology=asked) for ps in item.pod_sets]
                if asked
                else item.pod_sets,
            )
        )
    return list(local.values()), out


def queued_import(
    drafts: Mapping[str, QueueDraft],
    queues: Sequence[dict[str, Any]],
    work: Sequence[QueuedWork],
    state: ClusterState,
    unmapped: list[Unmapped],
    topologies: Sequence[dict[str, Any]] = (),
) -> ImportResult:
    """The import of a source whose work names its queue (KAI, Volcano): its priority
    classes, its Topologies (the first one named by the flavor), one flavor for the whole
    cluster, the ClusterQueues (`queues`, built from `drafts`), a LocalQueue per queue and
    namespace with work, the nodes; and the work."""
    parents = {d.parent for d in drafts.values() if d.parent}
    leaves = {name: d.origin for name, d in drafts.items() if name not in parents}
    first = next(iter(drafts.values()), None)
    named = topologies[0]["metadata"]["name"] if topologies else None
    flavor = [whole_cluster_flavor(first.origin, state.nodes, named)] if first is not None else []
    local, imported = queue_work(work, leaves, parents, state, unmapped)
    manifests = [*state.class_docs, *topologies, *flavor, *queues, *local, *state.nodes]
    return ImportResult(tuple(manifests), tuple(imported), tuple(unmapped))


def owned_by(obj: SourceObject, kinds: Set[str]) -> str | None:
    """The name of the owner of one of `kinds`, if the object has one."""
    meta = obj.mapping(obj.doc.get("metadata"), "metadata")
    for ref in obj.items(meta.get("ownerReferences"), "metadata.ownerReferences"):
        if isinstance(ref, Mapping) and ref.get("kind") in kinds:
            return str(ref.get("name"))
    return None


def owner_stem(obj: SourceObject) -> str:
    """`KIND-NAME` of a pod's controlling owner (the name Muster's controller gives the
    Workload of that owner's pods), "" when it has none."""
    meta = obj.mapping(obj.doc.get("metadata"), "metadata")
    for i, ref in enumerate(obj.items(meta.get("ownerReferences"), "metadata.ownerReferences")):
        ref = obj.mapping(ref, f"metadata.ownerReferences[{i}]")
        if ref.get("controller") is True:
            kind = obj.text(ref.get("kind"), f"metadata.ownerReferences[{i}].kind", required=True)
            name = obj.text(ref.get("name"), f"metadata.ownerReferences[{i}].name", required=True)
            return f"{kind.lower()}-{name}"
    return ""


def finished(obj: SourceObject) -> bool:
    """A pod that has already succeeded or failed asks for nothing."""
    status = obj.mapping(obj.doc.get("status"), "status")
    return status.get("phase") in ("Succeeded", "Failed")
