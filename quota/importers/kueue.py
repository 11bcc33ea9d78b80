"""Kueue's queue objects as Muster's (kueue.x-k8s.io v1beta1 and v1beta2, Cohort v1alpha1).

A Kueue cohort becomes a parent ClusterQueue whose quota is what its members pool (their
nominal quotas plus the cohort's own), capped at that pool when the cohort has no parent,
since a Kueue root cohort never lends beyond its members. A ClusterQueue's nominalQuota is
its Muster quota and nominalQuota + borrowingLimit its limit (no limit when it may borrow
without bound; exactly the quota when it has no cohort and so cannot borrow). The mapping,
field by field, is in docs/import.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

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
from quota.importers.reader import SourceObject
from quota.importers.report import ImportedWorkload, ImportResult, Unmapped, refuse
from quota.importers.workloads import PodSetSource, batch_job, skipped, workload

GROUP = "kueue.x-k8s.io"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
WPC_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
_UNMAPPED_KINDS = {
    "AdmissionCheck": "Muster has no admission checks (provisioning requests, MultiKueue)",
    "Topology": "Muster places gangs by its own scoring; topology levels are not modelled",
    "ProvisioningRequestConfig": "Muster has no admission checks",
    "MultiKueueConfig": "Muster manages one cluster",
    "MultiKueueCluster": "Muster manages one cluster",
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


def import_kueue(objects: Sequence[SourceObject]) -> ImportResult:
    """Muster manifests for Kueue's ResourceFlavors, ClusterQueues, Cohorts, LocalQueues,
    WorkloadPriorityClasses, Workloads and queued Jobs (plus Nodes and PriorityClasses)."""
    unmapped: list[Unmapped] = []
    state = ClusterState()
    by_kind: dict[str, list[SourceObject]] = {}
    for obj in objects:
        if state.take(obj):
            continue
        if obj.group == GROUP:
            by_kind.setdefault(obj.kind, []).append(obj)
        elif obj.api_version == "batch/v1" and obj.kind == "Job":
            by_kind.setdefault("Job", []).append(obj)
        elif obj.group in ("scheduling.run.ai", "scheduling.volcano.sh", "batch.volcano.sh"):
            refuse(
                obj.origin,
                "apiVersion",
                f"{obj.api_version} {obj.kind} is not a Kueue object (use `muster import "
                f"{'kai' if 'run.ai' in obj.group else 'volcano'}`)",
            )
        else:
            skipped(obj, "", "not a Kueue queue object, a Node or a queued Job: left out", unmapped)

    flavors: list[dict[str, Any]] = []
    flavor_names: set[str] = set()
    for obj in by_kind.pop("ResourceFlavor", []):
        spec = obj.spec()
        rf_spec: dict[str, Any] = {
            "nodeLabels": obj.strings(spec.get("nodeLabels"), "spec.nodeLabels"),
            "nodeTaints": [
                {
                    k: v
                    for k, v in obj.mapping(t, f"spec.nodeTaints[{i}]").items()
                    if k in ("key", "value", "effect")
                }
                for i, t in enumerate(obj.items(spec.get("nodeTaints"), "spec.nodeTaints"))
            ],
            "tolerations": obj.items(spec.get("tolerations"), "spec.tolerations"),
        }
        if spec.get("topologyName"):
            skipped(obj, "spec.topologyName", "topology-aware scheduling is not modelled", unmapped)
        if obj.name in flavor_names:
            refuse(obj.origin, "metadata.name", "ResourceFlavor defined twice")
        flavor_names.add(obj.name)
        flavors.append(
            manifest(
                obj.origin, "ResourceFlavor", {"metadata": {"name": obj.name}, "spec": rf_spec}
            )
        )

    classes: list[dict[str, Any]] = list(state.class_docs)
    wpc: dict[str, int] = {}
    for obj in by_kind.pop("WorkloadPriorityClass", []):
        value = priority_value(obj, "value")
        if obj.name in state.priority_classes:
            refuse(
                obj.origin,
                "metadata.name",
                f"a PriorityClass {obj.name!r} is also in the files; Muster has one kind of "
                "priority class, so the two would clash (rename one)",
            )
        wpc[obj.name] = value
        classes.append(
            priority_class(obj.name, value, obj.text(obj.doc.get("description"), "description"))
        )

    # ClusterQueues: leaves of the tree.
    drafts: dict[str, QueueDraft] = {}
    pools: dict[str, _Pool] = {}
    cohort_of: dict[str, str] = {}
    cq_objects = by_kind.pop("ClusterQueue", [])
    for obj in cq_objects:
        if obj.name in drafts:
            refuse(obj.origin, "metadata.name", "ClusterQueue defined twice")
        spec = obj.spec()
        cohort_path = "spec.cohortName" if "cohortName" in spec else "spec.cohort"
        cohort = obj.ref(spec.get("cohortName", spec.get("cohort")), cohort_path)
        pool = _Pool()
        borrow: dict[str, dict[str, int]] = {}
        _resource_groups(obj, spec, pool, borrow, unmapped)
        for flavor in pool.quota:
            if flavor not in flavor_names:
                refuse(
                    obj.origin,
                    "spec.resourceGroups",
                    f"ResourceFlavor {flavor!r} is not in the files",
                )
        preemption = obj.mapping(spec.get("preemption"), "spec.preemption")
        within = obj.choice(
            preemption.get("withinClusterQueue"),
            "spec.preemption.withinClusterQueue",
            ("Never", "LowerPriority", "LowerOrNewerEqualPriority"),
            "Never",
        )
        reclaim = obj.choice(
            preemption.get("reclaimWithinCohort"),
            "spec.preemption.reclaimWithinCohort",
            ("Never", "LowerPriority", "Any"),
            "Never",
        )
        borrow_within = obj.mapping(
            preemption.get("borrowWithinCohort"), "spec.preemption.borrowWithinCohort"
        )
        if borrow_within.get("policy") not in (None, "Never"):
            skipped(
                obj,
                "spec.preemption.borrowWithinCohort",
                "Muster preempts to borrow only through reclaim of queues above their fair share",
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
            "preemption": {"withinQueue": within, "reclaim": reclaim},
        }
        if spec.get("namespaceSelector") is not None:
            body["namespaceSelector"] = obj.mapping(
                spec["namespaceSelector"], "spec.namespaceSelector"
            )
        else:
            skipped(
                obj,
                "spec.namespaceSelector",
                "unset: Kueue admits from no namespace, Muster from every namespace",
                unmapped,
            )
        for key, reason in _CQ_UNMAPPED.items():
            if spec.get(key):
                skipped(obj, f"spec.{key}", reason, unmapped)
        drafts[obj.name] = QueueDraft(
            obj.name,
            obj.origin,
            weight=_weight(obj, spec),
            weight_path="spec.fairSharing.weight",
            spec=body,
        )
        pools[obj.name] = pool
        if cohort:
            cohort_of[obj.name] = cohort

    # Cohorts: parents. A cohort named like a ClusterQueue is renamed (one name space).
    cohort_objects = {}
    for obj in by_kind.pop("Cohort", []):
        if obj.name in cohort_objects:
            refuse(obj.origin, "metadata.name", "Cohort defined twice")
        cohort_objects[obj.name] = obj
    names = set(cohort_of.values()) | set(cohort_objects)
    for obj in cohort_objects.values():
        spec = obj.spec()
        path = "spec.parentName" if "parentName" in spec else "spec.parent"
        parent = obj.ref(spec.get("parentName", spec.get("parent")), path)
        if parent:
            names.add(parent)

    def cohort_name(name: str) -> str:
        return f"{name}-cohort" if name in drafts else name

    for name in sorted(names):
        if name in drafts:
            origin = cohort_objects[name].origin if name in cohort_objects else drafts[name].origin
            unmapped.append(
                Unmapped(
                    origin,
                    "metadata.name",
                    f"cohort {name!r} shares its name with a ClusterQueue; in Muster both are "
                    f"ClusterQueues, so the cohort is imported as {cohort_name(name)!r}",
                )
            )
    cohort_drafts: dict[str, QueueDraft] = {}
    cohort_borrow: dict[str, dict[str, dict[str, int]]] = {}
    for name in sorted(names):
        obj_or_none = cohort_objects.get(name)
        pool = _Pool()
        own_borrow: dict[str, dict[str, int]] = {}
        parent = ""
        weight = Fraction(1)
        if obj_or_none is not None:
            obj = obj_or_none
            spec = obj.spec()
            path = "spec.parentName" if "parentName" in spec else "spec.parent"
            parent = obj.ref(spec.get("parentName", spec.get("parent")), path)
            _resource_groups(obj, spec, pool, own_borrow, unmapped)
            weight = _weight(obj, spec)
            origin = obj.origin
            parent_path = path
        else:
            member = next(q for q, c in cohort_of.items() if c == name)
            origin = drafts[member].origin
            parent_path = "spec.cohort"
        cohort_drafts[name] = QueueDraft(
            cohort_name(name),
            origin,
            parent=cohort_name(parent) if parent else None,
            parent_path=parent_path,
            weight=weight,
            weight_path="spec.fairSharing.weight",
        )
        pools[cohort_name(name)] = pool
        cohort_borrow[name] = own_borrow
    for queue, cohort in cohort_of.items():
        drafts[queue].parent = cohort_name(cohort)
        drafts[queue].parent_path = "spec.cohort"
    all_drafts = {**drafts, **{d.name: d for d in cohort_drafts.values()}}
    # A cohort pools its members' quota: add every subtree's quota into its ancestors, once
    # the tree is known to have no cycle.
    order = ordered(all_drafts)
    own = {name: {f: dict(r) for f, r in pool.quota.items()} for name, pool in pools.items()}
    for draft in order:
        seen: set[str] = set()
        ancestor = draft.parent
        while ancestor is not None and ancestor not in seen:
            seen.add(ancestor)
            for flavor, row in own[draft.name].items():
                for resource, amount in row.items():
                    pools[ancestor].add(flavor, resource, amount)
            ancestor = all_drafts[ancestor].parent
    for name, draft in ((n, cohort_drafts[n]) for n in sorted(cohort_drafts)):
        pool = pools[draft.name]
        draft.spec = {
            "flavors": pool.flavors(_limits(pool, cohort_borrow[name], draft.parent is not None))
        }

    queues = cluster_queues(all_drafts, unmapped)

    # LocalQueues.
    local: list[dict[str, Any]] = []
    lq_target: dict[tuple[str, str], str] = {}
    for obj in by_kind.pop("LocalQueue", []):
        spec = obj.spec()
        target = obj.ref(spec.get("clusterQueue"), "spec.clusterQueue", required=True)
        if target not in drafts:
            refuse(obj.origin, "spec.clusterQueue", f"ClusterQueue {target!r} is not in the files")
        lq_key = (obj.namespace, obj.name)
        if lq_key in lq_target:
            refuse(obj.origin, "metadata.name", "LocalQueue defined twice")
        lq_target[lq_key] = target
        for field, reason in (
            ("stopPolicy", "Muster stops whole ClusterQueues, not one namespace's LocalQueue"),
            ("fairSharing", "Muster shares fairly between ClusterQueues, not LocalQueues"),
        ):
            if spec.get(field) not in (None, "None"):
                skipped(obj, f"spec.{field}", reason, unmapped)
        local.append(local_queue(obj.origin, obj.namespace, obj.name, target))

    # Workloads, and Jobs that no Workload in the files already stands for.
    state.priority_classes.update(wpc)
    work: list[ImportedWorkload] = []
    owners: set[tuple[str, str]] = set()
    for obj in by_kind.pop("Workload", []):
        for ref in obj.items(
            obj.mapping(obj.doc.get("metadata"), "metadata").get("ownerReferences"),
            "metadata.ownerReferences",
        ):
            if isinstance(ref, dict) and ref.get("kind") == "Job":
                owners.add((obj.namespace, str(ref.get("name"))))
        spec = obj.spec()
        queue = obj.ref(spec.get("queueName"), "spec.queueName", required=True)
        if (obj.namespace, queue) not in lq_target:
            skipped(
                obj,
                "spec.queueName",
                f"LocalQueue {obj.namespace}/{queue} is not in the files: workload left out",
                unmapped,
            )
            continue
        if obj.mapping(obj.doc.get("status"), "status").get("admission"):
            skipped(
                obj,
                "status.admission",
                "imported as pending: its admission is not carried over",
                unmapped,
            )
        sets = []
        for i, ps in enumerate(obj.items(spec.get("podSets"), "spec.podSets")):
            path = f"spec.podSets[{i}]"
            ps = obj.mapping(ps, path)
            count = obj.integer(ps.get("count", 1), f"{path}.count", low=0)
            template = obj.mapping(ps.get("template"), f"{path}.template")
            sets.append(
                PodSetSource(
                    obj.text(ps.get("name"), f"{path}.name") or "main",
                    count or 0,
                    obj.mapping(template.get("spec"), f"{path}.template.spec"),
                    f"{path}.template.spec",
                    obj.integer(ps.get("minCount"), f"{path}.minCount", low=1),
                )
            )
        class_name = obj.text(spec.get("priorityClassName"), "spec.priorityClassName")
        explicit = obj.integer(spec.get("priority"), "spec.priority", low=-(2**31), high=2**31 - 1)
        if explicit is not None:
            priority: tuple[str | None, int] = (class_name or None, explicit)
        elif class_name:
            if class_name not in state.priority_classes:
                refuse(
                    obj.origin,
                    "spec.priorityClassName",
                    f"priority class {class_name!r} is not in the files",
                )
            priority = (class_name, state.priority_classes[class_name])
        else:
            priority = (None, 0)
        work.append(
            workload(obj, name=obj.name, local_queue=queue, priority=priority, pod_sets=sets)
        )
    for obj in by_kind.pop("Job", []):
        labels = obj.meta_strings("labels")
        job_queue = labels.get(QUEUE_LABEL, "")
        if not job_queue:
            skipped(
                obj,
                f"metadata.labels[{QUEUE_LABEL}]",
                "the Job names no Kueue queue: left out",
                unmapped,
            )
            continue
        if (obj.namespace, obj.name) in owners:
            continue  # its Workload is in the files
        if (obj.namespace, job_queue) not in lq_target:
            skipped(
                obj,
                f"metadata.labels[{QUEUE_LABEL}]",
                f"LocalQueue {obj.namespace}/{job_queue} is not in the files: Job left out",
                unmapped,
            )
            continue
        job_priority = None
        wanted = labels.get(PRIORITY_LABEL)
        if wanted:
            if wanted not in wpc:
                refuse(
                    obj.origin,
                    f"metadata.labels[{PRIORITY_LABEL}]",
                    f"WorkloadPriorityClass {wanted!r} is not in the files",
                )
            job_priority = (wanted, wpc[wanted])
        work.append(batch_job(obj, job_queue, job_priority, state))
    for kind, objs in sorted(by_kind.items()):
        reason = _UNMAPPED_KINDS.get(kind, f"Kueue {kind} has no Muster equivalent")
        for obj in objs:
            skipped(obj, "", reason, unmapped)

    manifests = [*classes, *flavors, *queues, *local, *state.nodes]
    return ImportResult(tuple(manifests), tuple(work), tuple(unmapped))
