"""Kueue's queue objects as Muster's (kueue.x-k8s.io v1beta1 and v1beta2, Cohort v1alpha1).

A Kueue cohort becomes a parent ClusterQueue whose quota is what its members pool (their
nominal quotas plus the cohort's own), capped at that pool when the cohort has no parent,
since a Kueue root cohort never lends beyond its members. A ClusterQueue's nominalQuota is
its Muster quota and nominalQuota + borrowingLimit its limit (no limit when it may borrow
without bound; exactly the quota when it has no cohort and so cannot borrow). The mapping,
field by field, is in docs/import.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

from quota.api.meta import INT32_MAX, INT32_MIN
from quota.api.names import GANG_ANNOTATION
from quota.api.quantity import QuantityError, format_quantity, parse_quantity
from quota.importers.build import (
    ClusterState,
    QueueDraft,
    cluster_queues,
    local_queue,
    manifest,
    ordered,
    priority_class,
    priority_value,
)
from quota.importers.owners import is_owner, owner_groups
from quota.importers.reader import SourceObject
from quota.importers.report import ImportedWorkload, ImportResult, Unmapped, refuse
from quota.importers.topologies import level_topologies
from quota.importers.workloads import (
    POD_OWNER_KINDS,
    PodSetSource,
    batch_job,
    finished,
    owned_by,
    owner_stem,
    pod_group_sets,
    prefixed_topology,
    refuse_other_source,
    resolve_priority,
    skipped,
    skipped_fields,
    workload,
)

GROUP = "kueue.x-k8s.io"
ANNOTATION_PREFIX = "kueue.x-k8s.io/"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
CONFIG_GROUP = "config.kueue.x-k8s.io"
OWNERS = "owners"  # by_kind's key for the kinds `quota.importers.owners` reads
# Kueue's integrations.frameworks names of the kinds Muster queues itself.
MUSTER_FRAMEWORKS = frozenset(
    (
        "batch/job",
        "jobset.x-k8s.io/jobset",
        "trainer.kubeflow.org/trainjob",
        "leaderworkerset.x-k8s.io/leaderworkerset",
        "deployment",
        "statefulset",
        "pod",
        "ray.io/raycluster",
        "ray.io/rayjob",
    )
)
WPC_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
_UNMAPPED_KINDS = {
    "AdmissionCheck": "Muster has no admission checks (provisioning requests, MultiKueue)",
    "ProvisioningRequestConfig": "Muster has no admission checks",
    "MultiKueueConfig": "Muster manages one cluster",
    "MultiKueueCluster": "Muster manages one cluster",
}
# A Workload pod set's topologyRequest: Kueue's field -> Muster's.
_REQUEST_FIELDS = {
    "required": "required",
    "preferred": "preferred",
    "unconstrained": "unconstrained",
    "podSetSliceRequiredTopology": "sliceRequiredTopology",
    "podSetSliceSize": "sliceSize",
}
# What Kueue's integrations write for its own ordering of pods into domains (pod and
# replicated-job indexes): not the user's request; Muster orders pods itself.
_REQUEST_BOOKKEEPING = {"podIndexLabel", "subGroupIndexLabel", "subGroupCount"}
_REQUEST_UNMAPPED = {
    "podSetGroupName": "Muster places each pod set by its own request; pod sets are not "
    "kept in one domain together",
    "podsetSliceRequiredTopologyConstraints": "Muster has one slice level per pod set",
}
_CQ_UNMAPPED = {
    "flavorFungibility": "Muster tries flavors in order and always moves on to the next one",
    "admissionChecks": "Muster has no admission checks",
    "admissionChecksStrategy": "Muster has no admission checks",
    "admissionScope": "Muster has no admission checks",
}


class _Pool:
    """Quota per flavor and resource, kept in first-seen order."""

    def __init__(self) -> None:
        self.quota: dict[str, dict[str, int]] = {}
        self.limit: dict[str, dict[str, int] | None] = {}

    def add(self, flavor: str, resource: str, amount: int) -> None:
        row = self.quota.setdefault(flavor, {})
        row[resource] = row.get(resource, 0) + amount

    def flavors(self, limits: dict[str, dict[str, int]] | None) -> list[dict[str, Any]]:
        out = []
        for flavor, quota in self.quota.items():
            entry: dict[str, Any] = {
                "name": flavor,
                "quota": {r: format_quantity(v, r) for r, v in quota.items()},
            }
            cap = (limits or {}).get(flavor)
            if cap:
                entry["limit"] = {r: format_quantity(v, r) for r, v in cap.items()}
            out.append(entry)
        return out


def _weight(obj: SourceObject, spec: dict[str, Any] | Any) -> Fraction:
    fair = obj.mapping(spec.get("fairSharing"), "spec.fairSharing")
    raw = fair.get("weight")
    if raw is None:
        return Fraction(1)
    try:
        # A Kueue weight is a quantity ("0.5", "2", "500m"): read it in thousandths.
        return Fraction(parse_quantity(raw, "cpu", field="spec.fairSharing.weight"), 1000)
    except QuantityError as error:
        refuse(obj.origin, "spec.fairSharing.weight", str(error).partition(": ")[2])


def _resource_groups(
    obj: SourceObject,
    spec: Any,
    pool: _Pool,
    borrow: dict[str, dict[str, int]],
    unmapped: list[Unmapped],
) -> None:
    """Read spec.resourceGroups into `pool` (nominal quotas) and `borrow` (borrowing
    limits); lending limits and the pods resource are reported."""
    seen: set[str] = set()
    for g, group in enumerate(obj.items(spec.get("resourceGroups"), "spec.resourceGroups")):
        gpath = f"spec.resourceGroups[{g}]"
        group = obj.mapping(group, gpath)
        covered = [
            obj.text(r, f"{gpath}.coveredResources[{i}]", required=True)
            for i, r in enumerate(
                obj.items(group.get("coveredResources"), f"{gpath}.coveredResources")
            )
        ]
        for f, flavor in enumerate(obj.items(group.get("flavors"), f"{gpath}.flavors")):
            fpath = f"{gpath}.flavors[{f}]"
            flavor = obj.mapping(flavor, fpath)
            name = obj.ref(flavor.get("name"), f"{fpath}.name", required=True)
            if name in seen:
                refuse(obj.origin, f"{fpath}.name", f"flavor {name!r} appears twice")
            seen.add(name)
            pool.quota.setdefault(name, {})
            for r, res in enumerate(obj.items(flavor.get("resources"), f"{fpath}.resources")):
                rpath = f"{fpath}.resources[{r}]"
                res = obj.mapping(res, rpath)
                resource = obj.text(res.get("name"), f"{rpath}.name", required=True)
                if covered and resource not in covered:
                    refuse(
                        obj.origin,
                        f"{rpath}.name",
                        f"{resource!r} is not among the group's coveredResources",
                    )
                if "nominalQuota" not in res:
                    refuse(obj.origin, f"{rpath}.nominalQuota", "required field is missing")
                nominal = obj.quantity(res["nominalQuota"], f"{rpath}.nominalQuota", resource)
                if resource == "pods":
                    unmapped.append(
                        Unmapped(
                            obj.origin,
                            rpath,
                            "Muster's quota does not count pods (placement counts them on "
                            "nodes): the pods quota is left out",
                        )
                    )
                    continue
                pool.add(name, resource, nominal)
                if res.get("borrowingLimit") is not None:
                    amount = obj.quantity(
                        res["borrowingLimit"], f"{rpath}.borrowingLimit", resource
                    )
                    borrow.setdefault(name, {})[resource] = amount
                if res.get("lendingLimit") is not None:
                    unmapped.append(
                        Unmapped(
                            obj.origin,
                            f"{rpath}.lendingLimit",
                            "Muster lends all unused quota and reclaims it when needed; a "
                            "lending limit has no equivalent",
                        )
                    )


def _limits(
    pool: _Pool, borrow: dict[str, dict[str, int]], can_borrow: bool
) -> dict[str, dict[str, int]]:
    """Muster limits: quota + borrowing limit where one is set; the quota itself when the
    queue cannot borrow at all."""
    out: dict[str, dict[str, int]] = {}
    for flavor, quota in pool.quota.items():
        row: dict[str, int] = {}
        for resource, amount in quota.items():
            if not can_borrow:
                row[resource] = amount
            elif resource in borrow.get(flavor, {}):
                row[resource] = amount + borrow[flavor][resource]
        if row:
            out[flavor] = row
    return out


def _flavors(
    objs: Sequence[SourceObject], topologies: set[str], unmapped: list[Unmapped]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for obj in objs:
        spec = obj.spec()
        taints = [
            {
                k: v
                for k, v in obj.mapping(t, f"spec.nodeTaints[{i}]").items()
                if k in ("key", "value", "effect")  # timeAdded is the node's business
            }
            for i, t in enumerate(obj.items(spec.get("nodeTaints"), "spec.nodeTaints"))
        ]
        body = {
            "nodeLabels": obj.strings(spec.get("nodeLabels"), "spec.nodeLabels"),
            "nodeTaints": taints,
            "tolerations": obj.items(spec.get("tolerations"), "spec.tolerations"),
        }
        topology = obj.ref(spec.get("topologyName"), "spec.topologyName")
        if topology:
            body["topologyName"] = topology
            if topology not in topologies:
                skipped(
                    obj,
                    "spec.topologyName",
                    f"Topology {topology} is not in the files: workloads that need this flavor "
                    "wait until it exists",
                    unmapped,
                )
        if obj.name in names:
            refuse(obj.origin, "metadata.name", "ResourceFlavor defined twice")
        names.add(obj.name)
        out.append(
            manifest(obj.origin, "ResourceFlavor", {"metadata": {"name": obj.name}, "spec": body})
        )
    return out


def _workload_priority_classes(
    objs: Sequence[SourceObject], state: ClusterState
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    values: dict[str, int] = {}
    docs: list[dict[str, Any]] = []
    for obj in objs:
        value = priority_value(obj, "value")
        if obj.name in state.priority_classes or obj.name in values:
            refuse(
                obj.origin,
                "metadata.name",
                f"a priority class {obj.name!r} is already in the files; Muster has one kind "
                "of priority class, so the two would clash (rename one)",
            )
        values[obj.name] = value
        description = obj.text(obj.doc.get("description"), "description")
        docs.append(priority_class(obj.name, value, description))
    return values, docs


def _known_flavors(obj: SourceObject, pool: _Pool, flavor_names: set[str]) -> None:
    for flavor in pool.quota:
        if flavor not in flavor_names:
            refuse(
                obj.origin, "spec.resourceGroups", f"ResourceFlavor {flavor!r} is not in the files"
            )


def _cluster_queue(
    obj: SourceObject, flavor_names: set[str], unmapped: list[Unmapped]
) -> tuple[QueueDraft, _Pool, str]:
    """A ClusterQueue's draft, its nominal quotas, and its cohort ("" when none)."""
    spec = obj.spec()
    cohort_path = "spec.cohortName" if "cohortName" in spec else "spec.cohort"
    cohort = obj.ref(spec.get("cohortName", spec.get("cohort")), cohort_path)
    pool = _Pool()
    borrow: dict[str, dict[str, int]] = {}
    _resource_groups(obj, spec, pool, borrow, unmapped)
    _known_flavors(obj, pool, flavor_names)
    preemption = obj.mapping(spec.get("preemption"), "spec.preemption")
    within = obj.choice(
        preemption.get("withinClusterQueue"),
        "spec.preemption.withinClusterQueue",
        ("Never", "LowerPriority", "LowerOrNewerEqualPriority"),
        "Never",
    )
    # Kueue's default is Never, Muster's Any: written out either way.
    reclaim = obj.choice(
        preemption.get("reclaimWithinCohort"),
        "spec.preemption.reclaimWithinCohort",
        ("Never", "LowerPriority", "Any"),
        "Never",
    )
    path = "spec.preemption.borrowWithinCohort"
    if obj.mapping(preemption.get("borrowWithinCohort"), path).get("policy") not in (None, "Never"):
        skipped(
            obj,
            path,
            "Muster preempts to borrow only by reclaiming from queues above their fair share",
            unmapped,
        )
    body: dict[str, Any] = {
        "flavors": pool.flavors(_limits(pool, borrow, bool(cohort))),
        "queueingStrategy": obj.choice(
            spec.get("queueingStrategy"),
            "spec.queueingStrategy",
            ("StrictFIFO", "BestEffortFIFO"),
            "BestEffortFIFO",
        ),
        "stopPolicy": obj.choice(
            spec.get("stopPolicy"), "spec.stopPolicy", ("None", "Hold", "HoldAndDrain"), "None"
        ),
        # Every Kueue workload may borrow and be preempted: none is below this threshold's
        # reach (Muster's default, 100, would keep priorities 100 and up within quota).
        "preemption": {
            "withinQueue": within,
            "reclaim": reclaim,
            "preemptibleBelowPriority": INT32_MAX,
        },
    }
    if spec.get("namespaceSelector") is not None:
        body["namespaceSelector"] = obj.mapping(spec["namespaceSelector"], "spec.namespaceSelector")
    else:
        skipped(
            obj,
            "spec.namespaceSelector",
            "unset: Kueue admits from no namespace, Muster from every namespace",
            unmapped,
        )
    skipped_fields(obj, spec, _CQ_UNMAPPED, unmapped)
    draft = QueueDraft(
        obj.name, obj.origin, weight=_weight(obj, spec), weight_path="spec.fairSharing.weight"
    )
    draft.spec = body
    return draft, pool, cohort


def _cohort_parent(obj: SourceObject) -> tuple[str, str]:
    spec = obj.spec()
    path = "spec.parentName" if "parentName" in spec else "spec.parent"
    return obj.ref(spec.get("parentName", spec.get("parent")), path), path


def _tree(
    cq_objects: Sequence[SourceObject],
    cohort_objects: Sequence[SourceObject],
    flavor_names: set[str],
    unmapped: list[Unmapped],
) -> tuple[list[dict[str, Any]], set[str]]:
    """ClusterQueue manifests for Kueue's ClusterQueues and cohorts, and the names of the
    leaf queues (Kueue's ClusterQueues)."""
    drafts: dict[str, QueueDraft] = {}
    pools: dict[str, _Pool] = {}
    cohort_of: dict[str, str] = {}
    for obj in cq_objects:
        if obj.name in drafts:
            refuse(obj.origin, "metadata.name", "ClusterQueue defined twice")
        draft, pools[obj.name], cohort = _cluster_queue(obj, flavor_names, unmapped)
        drafts[obj.name] = draft
        if cohort:
            cohort_of[obj.name] = cohort
    defined: dict[str, SourceObject] = {}
    for obj in cohort_objects:
        if obj.name in defined:
            refuse(obj.origin, "metadata.name", "Cohort defined twice")
        defined[obj.name] = obj
    # Every cohort named anywhere is a parent queue, defined by a Cohort object or not.
    names = set(cohort_of.values()) | set(defined)
    names |= {p for p, _ in map(_cohort_parent, defined.values()) if p}

    def renamed(name: str) -> str:
        # Cohorts and ClusterQueues have separate names in Kueue, one name space in Muster.
        return f"{name}-cohort" if name in drafts else name

    cohorts: dict[str, QueueDraft] = {}
    own_borrow: dict[str, dict[str, dict[str, int]]] = {}
    for name in sorted(names):
        pool = _Pool()
        borrow: dict[str, dict[str, int]] = {}
        obj_or_none = defined.get(name)
        if obj_or_none is not None:
            parent, parent_path = _cohort_parent(obj_or_none)
            _resource_groups(obj_or_none, obj_or_none.spec(), pool, borrow, unmapped)
            _known_flavors(obj_or_none, pool, flavor_names)
            draft = QueueDraft(
                renamed(name),
                obj_or_none.origin,
                parent=renamed(parent) if parent else None,
                parent_path=parent_path,
                weight=_weight(obj_or_none, obj_or_none.spec()),
                weight_path="spec.fairSharing.weight",
            )
        else:
            member = next(q for q, c in sorted(cohort_of.items()) if c == name)
            draft = QueueDraft(renamed(name), drafts[member].origin, parent_path="spec.cohort")
        if name in drafts:
            unmapped.append(
                Unmapped(
                    draft.origin,
                    "metadata.name" if obj_or_none is not None else "spec.cohort",
                    f"cohort {name!r} shares its name with a ClusterQueue; in Muster both are "
                    f"ClusterQueues, so the cohort is imported as {draft.name!r}",
                )
            )
        cohorts[draft.name] = draft
        pools[draft.name] = pool
        own_borrow[draft.name] = borrow
    for queue, cohort in cohort_of.items():
        drafts[queue].parent = renamed(cohort)
        drafts[queue].parent_path = "spec.cohort"
    everything = {**drafts, **cohorts}
    # A cohort holds what its subtree pools: every queue's own quota is added to each of its
    # ancestors (the tree is known to have no cycle once ordered).
    own = {name: {f: dict(r) for f, r in pool.quota.items()} for name, pool in pools.items()}
    for draft in ordered(everything):
        ancestor = draft.parent
        while ancestor is not None:
            for flavor, row in own[draft.name].items():
                for resource, amount in row.items():
                    pools[ancestor].add(flavor, resource, amount)
            ancestor = everything[ancestor].parent
    for name, draft in cohorts.items():
        pool = pools[name]
        # A root cohort lends nothing beyond its members; a nested one borrows from its
        # parent up to its borrowing limit, or without bound.
        draft.spec = {
            "flavors": pool.flavors(_limits(pool, own_borrow[name], draft.parent is not None))
        }
    return cluster_queues(everything, unmapped), set(drafts)


def _local_queues(
    objs: Sequence[SourceObject], leaves: set[str], unmapped: list[Unmapped]
) -> tuple[list[dict[str, Any]], set[tuple[str, str]]]:
    out: list[dict[str, Any]] = []
    keys: set[tuple[str, str]] = set()
    for obj in objs:
        spec = obj.spec()
        target = obj.ref(spec.get("clusterQueue"), "spec.clusterQueue", required=True)
        if target not in leaves:
            refuse(obj.origin, "spec.clusterQueue", f"ClusterQueue {target!r} is not in the files")
        key = (obj.namespace, obj.name)
        if key in keys:
            refuse(obj.origin, "metadata.name", "LocalQueue defined twice")
        keys.add(key)
        for field, reason in (
            ("stopPolicy", "Muster stops whole ClusterQueues, not one namespace's LocalQueue"),
            ("fairSharing", "Muster shares fairly between ClusterQueues, not LocalQueues"),
        ):
            if spec.get(field) not in (None, "None"):
                skipped(obj, f"spec.{field}", reason, unmapped)
        out.append(local_queue(obj.origin, obj.namespace, obj.name, target))
    return out, keys


def _workload_priority(obj: SourceObject, state: ClusterState) -> tuple[str | None, int]:
    """A Kueue Workload's priority: spec.priority as Kueue resolved it, else its class
    (v1beta1 spec.priorityClassName, v1beta2 spec.priorityClassRef.name), else none."""
    spec = obj.spec()
    ref = obj.mapping(spec.get("priorityClassRef"), "spec.priorityClassRef")
    path = "spec.priorityClassRef.name" if ref else "spec.priorityClassName"
    class_name = obj.text(ref.get("name") if ref else spec.get("priorityClassName"), path)
    explicit = obj.integer(spec.get("priority"), "spec.priority", low=INT32_MIN, high=INT32_MAX)
    if explicit is not None:
        return class_name or None, explicit
    if class_name and class_name not in state.priority_classes:
        refuse(obj.origin, path, f"priority class {class_name!r} is not in the files")
    return (class_name, state.priority_classes[class_name]) if class_name else (None, 0)


def _topology_request(
    obj: SourceObject, pod_set: Any, path: str, unmapped: list[Unmapped]
) -> dict[str, Any]:
    """A Kueue Workload pod set's topologyRequest as Muster's (same levels and slices, other
    field names); what Muster has no word for is reported."""
    request = obj.mapping(pod_set.get("topologyRequest"), path)
    out: dict[str, Any] = {}
    for field, value in request.items():
        if field in _REQUEST_FIELDS:
            out[_REQUEST_FIELDS[field]] = value
        elif field not in _REQUEST_BOOKKEEPING:
            skipped(obj, f"{path}.{field}", _REQUEST_UNMAPPED.get(field, "not mapped"), unmapped)
    return out


def _kueue_workload(
    obj: SourceObject, state: ClusterState, unmapped: list[Unmapped]
) -> ImportedWorkload:
    spec = obj.spec()
    if obj.mapping(obj.doc.get("status"), "status").get("admission"):
        skipped(
            obj,
            "status.admission",
            "imported as pending: its admission is not carried over",
            unmapped,
        )
    sets = []
    for i, raw in enumerate(obj.items(spec.get("podSets"), "spec.podSets")):
        path = f"spec.podSets[{i}]"
        ps = obj.mapping(raw, path)
        template = obj.mapping(ps.get("template"), f"{path}.template")
        sets.append(
            PodSetSource(
                obj.text(ps.get("name"), f"{path}.name") or "main",
                obj.integer(ps.get("count", 1), f"{path}.count", low=0) or 0,
                obj.mapping(template.get("spec"), f"{path}.template.spec"),
                f"{path}.template.spec",
                obj.integer(ps.get("minCount"), f"{path}.minCount", low=1),
                topology=_topology_request(obj, ps, f"{path}.topologyRequest", unmapped),
            )
        )
    queue = obj.ref(spec.get("queueName"), "spec.queueName", required=True)
    priority = _workload_priority(obj, state)
    return workload(obj, name=obj.name, local_queue=queue, priority=priority, pod_sets=sets)


def _work(
    by_kind: dict[str, list[SourceObject]],
    lq_keys: set[tuple[str, str]],
    wpc: dict[str, int],
    state: ClusterState,
    unmapped: list[Unmapped],
) -> list[ImportedWorkload]:
    """Workloads, Jobs no Workload of the files stands for, and queued Pods (Kueue's pod
    integration, grouped by kueue.x-k8s.io/pod-group-name)."""
    out: list[ImportedWorkload] = []
    owners: set[tuple[str, str]] = set()
    workloads = by_kind.pop("Workload", [])
    for obj in workloads:
        owner = owned_by(obj, {"Job"})
        if owner:
            owners.add((obj.namespace, owner))

    def queued(obj: SourceObject, queue: str, path: str) -> bool:
        if (obj.namespace, queue) in lq_keys:
            return True
        skipped(
            obj, path, f"LocalQueue {obj.namespace}/{queue} is not in the files: left out", unmapped
        )
        return False

    for obj in workloads:
        queue = obj.ref(obj.spec().get("queueName"), "spec.queueName", required=True)
        if queued(obj, queue, "spec.queueName"):
            out.append(_kueue_workload(obj, state, unmapped))
    label_path = f"metadata.labels[{QUEUE_LABEL}]"
    for obj in by_kind.pop("Job", []):
        labels = obj.meta_strings("labels")
        queue = labels.get(QUEUE_LABEL, "")
        if (obj.namespace, obj.name) in owners:
            continue  # its Workload is in the files
        if not queue:
            skipped(obj, label_path, "the Job names no Kueue queue: left out", unmapped)
            continue
        if not queued(obj, queue, label_path):
            continue
        priority: tuple[str | None, int] | None = None
        wanted = labels.get(PRIORITY_LABEL)
        if wanted:
            if wanted not in wpc:
                refuse(
                    obj.origin,
                    f"metadata.labels[{PRIORITY_LABEL}]",
                    f"WorkloadPriorityClass {wanted!r} is not in the files",
                )
            priority = (wanted, wpc[wanted])
        out.append(
            batch_job(obj, queue, priority, state, unmapped, annotation_prefix=ANNOTATION_PREFIX)
        )
    for obj in by_kind.pop(OWNERS, []):
        out += _owner_work(obj, queued, wpc, state, unmapped)
    groups: dict[tuple[str, str], list[SourceObject]] = {}
    totals: dict[tuple[str, str], int] = {}
    for obj in by_kind.pop("Pod", []):
        labels = obj.meta_strings("labels")
        queue = labels.get(QUEUE_LABEL, "")
        if finished(obj) or owned_by(obj, POD_OWNER_KINDS) or not queue:
            continue  # done, counted through its owner, or not Kueue's
        if not queued(obj, queue, label_path):
            continue
        group = labels.get(POD_GROUP_LABEL)
        if group:
            groups.setdefault((obj.namespace, group), []).append(obj)
            totals[(obj.namespace, group)] = _total(obj, totals.get((obj.namespace, group)))
            continue
        # Pods of an owner no integration knows are one Workload, as Muster's controller
        # groups them (Kueue makes one per pod).
        groups.setdefault((obj.namespace, owner_stem(obj) or obj.name), []).append(obj)
    for (_, name), pods in groups.items():
        first = pods[0]
        queue = first.meta_strings("labels")[QUEUE_LABEL]
        wanted = first.meta_strings("labels").get(PRIORITY_LABEL)
        if wanted and wanted in wpc:
            resolved: tuple[str | None, int] = (wanted, wpc[wanted])
        else:
            class_name = first.text(first.spec().get("priorityClassName"), "spec.priorityClassName")
            resolved = resolve_priority(first, class_name, "spec.priorityClassName", state)
        # Kueue's pod integration reads the topology annotations off the pods themselves.
        sets = [
            replace(
                ps,
                topology=prefixed_topology(
                    ps.source or first,
                    (ps.source or first).doc,
                    ANNOTATION_PREFIX,
                    ps.count,
                    "metadata",
                    unmapped,
                ),
            )
            for ps in pod_group_sets(pods)
        ]
        total = totals.get((first.namespace, name))
        if total is not None and total != len(pods):
            skipped(
                first,
                f"metadata.annotations[{POD_GROUP_COUNT_ANNOTATION}]",
                f"{total} pods in the group, {len(pods)} in the files: imported as the "
                f"{len(pods)} there are (Kueue admits the group once all {total} exist)",
                unmapped,
            )
        out.append(workload(first, name=name, local_queue=queue, priority=resolved, pod_sets=sets))
    return out


def _total(pod: SourceObject, agreed: int | None) -> int:
    """A pod group's `kueue.x-k8s.io/pod-group-total-count`: a positive whole number, the
    same on every pod of the group (`agreed`, once one pod gave it)."""
    path = f"metadata.annotations[{POD_GROUP_COUNT_ANNOTATION}]"
    raw = pod.meta_strings("annotations").get(POD_GROUP_COUNT_ANNOTATION)
    if raw is None:
        refuse(pod.origin, path, "required on a pod of a pod group (Kueue refuses it without)")
    if not raw.isdecimal() or int(raw) < 1:
        refuse(pod.origin, path, f"{raw!r}: must be a positive whole number")
    if agreed is not None and int(raw) != agreed:
        refuse(pod.origin, path, f"{raw}: another pod of its group says {agreed}")
    return int(raw)


def _owner_work(
    obj: SourceObject,
    queued: Callable[[SourceObject, str, str], bool],
    wpc: dict[str, int],
    state: ClusterState,
    unmapped: list[Unmapped],
) -> list[ImportedWorkload]:
    """A LeaderWorkerSet, Deployment, StatefulSet or Ray object queued by Kueue's label (on
    the object, or a Deployment's or StatefulSet's pod template) as the controller's
    Workloads; not queued: reported."""
    queue, path = obj.meta_strings("labels").get(QUEUE_LABEL, ""), f"metadata.labels[{QUEUE_LABEL}]"
    if not queue:
        template = obj.mapping(obj.spec().get("template"), "spec.template")
        meta = obj.mapping(template.get("metadata"), "spec.template.metadata")
        labels = obj.strings(meta.get("labels"), "spec.template.metadata.labels")
        queue, path = labels.get(QUEUE_LABEL, ""), f"spec.template.metadata.labels[{QUEUE_LABEL}]"
    if not queue:
        skipped(
            obj,
            f"metadata.labels[{QUEUE_LABEL}]",
            f"the {obj.kind} names no Kueue queue: left out",
            unmapped,
        )
        return []
    if not queued(obj, queue, path):
        return []
    wanted = obj.meta_strings("labels").get(PRIORITY_LABEL)
    if wanted and wanted not in wpc:
        refuse(
            obj.origin,
            f"metadata.labels[{PRIORITY_LABEL}]",
            f"WorkloadPriorityClass {wanted!r} is not in the files",
        )
    annotations = obj.meta_strings("annotations")
    if (
        obj.kind == "StatefulSet"
        and annotations.get(ELASTIC_ANNOTATION) != "true"
        and annotations.get(GANG_ANNOTATION) != "true"
    ):
        skipped(
            obj,
            f"metadata.annotations[{ELASTIC_ANNOTATION}]",
            "unset: Kueue admits the replicas together; Muster admits a StatefulSet's replicas "
            f'one by one unless annotated {GANG_ANNOTATION}: "true" (with podManagementPolicy '
            "Parallel)",
            unmapped,
        )
    out = []
    for group in owner_groups(obj, unmapped):
        priority = (
            (wanted, wpc[wanted])
            if wanted
            else resolve_priority(
                obj, group.class_name, "spec.template.spec.priorityClassName", state
            )
        )
        out.append(
            workload(
                obj, name=group.name, local_queue=queue, priority=priority, pod_sets=group.pod_sets
            )
        )
    return out


def _configuration(obj: SourceObject, unmapped: list[Unmapped]) -> None:
    """Kueue's Configuration: an import writes queues, not a controller's settings, so each
    one is reported with the Muster setting that does its work."""
    manage = obj.doc.get("manageJobsWithoutQueueName")
    selector = obj.mapping(
        obj.doc.get("managedJobsNamespaceSelector"), "managedJobsNamespaceSelector"
    )
    if manage:
        skipped(
            obj,
            "manageJobsWithoutQueueName",
            "set Muster's managedNamespaceSelector (chart value, docs/tenancy.md) to "
            + ("managedJobsNamespaceSelector" if selector else "the namespaces Kueue manages")
            + ": unlabelled work there is queued in the namespace's LocalQueue default",
            unmapped,
        )
    elif selector:
        skipped(
            obj,
            "managedJobsNamespaceSelector",
            "without manageJobsWithoutQueueName it only narrows where Kueue's pod "
            "integrations act; Muster queues labelled pods in every namespace",
            unmapped,
        )
    integrations = obj.mapping(obj.doc.get("integrations"), "integrations")
    for i, name in enumerate(obj.items(integrations.get("frameworks"), "integrations.frameworks")):
        if name not in MUSTER_FRAMEWORKS:
            skipped(
                obj,
                f"integrations.frameworks[{i}]",
                f"{name}: Muster does not queue this kind (only its pods, by their queue label)",
                unmapped,
            )
    options = obj.mapping(integrations.get("podOptions"), "integrations.podOptions")
    if options:
        skipped(
            obj,
            "integrations.podOptions",
            "deprecated in Kueue (managedJobsNamespaceSelector replaces it); Muster queues "
            "the pods that carry its queue label, whatever their namespace",
            unmapped,
        )


def import_kueue(objects: Sequence[SourceObject]) -> ImportResult:
    """Muster manifests for Kueue's ResourceFlavors, ClusterQueues, Cohorts, LocalQueues,
    WorkloadPriorityClasses, and the pending Workloads, Jobs and Pods queued in them (plus
    Nodes and PriorityClasses)."""
    unmapped: list[Unmapped] = []
    state = ClusterState()
    by_kind: dict[str, list[SourceObject]] = {}
    for obj in objects:
        if state.take(obj):
            continue
        if obj.group == CONFIG_GROUP and obj.kind == "Configuration":
            _configuration(obj, unmapped)
        elif is_owner(obj):
            by_kind.setdefault(OWNERS, []).append(obj)
        elif obj.group == GROUP or (obj.api_version, obj.kind) in (
            ("batch/v1", "Job"),
            ("v1", "Pod"),
        ):
            by_kind.setdefault(obj.kind, []).append(obj)
        else:
            refuse_other_source(obj, "kueue", "Kueue")
            skipped(obj, "", "not a Kueue queue object, a Node or queued work: left out", unmapped)
    topologies = level_topologies(by_kind.pop("Topology", []), unmapped)
    named = {t["metadata"]["name"] for t in topologies}
    flavors = _flavors(by_kind.pop("ResourceFlavor", []), named, unmapped)
    flavor_names = {f["metadata"]["name"] for f in flavors}
    wpc, wpc_docs = _workload_priority_classes(by_kind.pop("WorkloadPriorityClass", []), state)
    queues, leaves = _tree(
        by_kind.pop("ClusterQueue", []), by_kind.pop("Cohort", []), flavor_names, unmapped
    )
    local, lq_keys = _local_queues(by_kind.pop("LocalQueue", []), leaves, unmapped)
    state.priority_classes.update(wpc)  # Muster has one kind of priority class
    work = _work(by_kind, lq_keys, wpc, state, unmapped)
    for kind, objs in sorted(by_kind.items()):
        reason = _UNMAPPED_KINDS.get(kind, f"Kueue {kind} has no Muster equivalent")
        for obj in objs:
            skipped(obj, "", reason, unmapped)
    manifests = [
        *state.class_docs,
        *wpc_docs,
        *topologies,
        *flavors,
        *queues,
        *local,
        *state.nodes,
    ]
    return ImportResult(tuple(manifests), tuple(work), tuple(unmapped))
