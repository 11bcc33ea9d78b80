"""The groups the scheduler loop places: one per admitted Workload whose pods carry Muster's
scheduler name, with the pods it has bound, the pods waiting for a node and its plan.

Read from the caches each pass and never remembered: a restarted controller sees the same
groups, so each pod still waiting is bound once, and a pod bound before the restart is
never bound again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controllers.jobs.batchjob import BATCH_JOB
from controllers.jobs.framework import owner_of
from controllers.runtime.resources import Obj, object_key
from controllers.scheduler import pods as p
from controllers.scheduler.topology import Domains, Topologies
from controllers.state import workloads as wls
from controllers.state.caches import Caches
from controllers.state.foreigngroups import foreign_owner
from quota.api.conditions import PodGroupConditions as PGC
from quota.api.quantity import QuantityError, parse_resource_list
from quota.model.queues import admitted_to

# Pod set -> ((node, pods), ...): the nodes an admission was planned on.
Plan = dict[str, tuple[tuple[str, int], ...]]


@dataclass
class Group:
    """One admitted Workload as the scheduler loop sees it."""

    key: str  # the Workload, "namespace/name"; its PodGroup has the same name
    workload: Obj
    job: Obj
    pod_set: str  # the Workload's pod set its pods belong to
    admitted: int  # pods the admission grants now
    priority: int
    cluster_queue: str
    admitted_at: datetime | None  # when quota was reserved (second precision)
    scheduled: bool  # PodGroupInitiallyScheduled already True for this admission
    plan: Plan
    per_pod: dict[str, int]  # what one pod requests, from the Workload (for reservations)
    pods_key: str  # its pods' id in the caches: the Job's uid, or a foreign group's id
    bound: list[Obj] = field(default_factory=list)  # on a node, not terminating
    waiting: list[Obj] = field(default_factory=list)  # to bind now, oldest first
    unbound: int = 0  # ungated and not bound, before the cap to `admitted`
    gated: int = 0
    # Every pod set: (name, pods admitted, what one pod requests); `pod_set`, `admitted` and
    # `per_pod` speak of the first and of the whole.
    pod_sets: tuple[tuple[str, int, dict[str, int]], ...] = ()
    # Pods of the pod sets started first, when the kind starts them in stages (else 0).
    first_stage: int = 0
    # Node labels its pods must land on beyond their own spec: the assigned flavors' labels
    # for a foreign PodGroup, whose existing pods Muster cannot rewrite (a Job's template
    # carries them already).
    node_labels: dict[str, str] = field(default_factory=dict)
    # Pod set -> the domains of its flavors' Topology its pods keep to (topology.py), or
    # why they cannot be placed as the Workload asks.
    domains: Domains = field(default_factory=dict)
    topology_refused: str | None = None

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]

    @property
    def uid(self) -> str:
        return str((self.workload.get("metadata") or {}).get("uid") or "")

    @property
    def min_count(self) -> int:
        """The gang's minimum: every admitted pod (a partial admission admitted its minimum
        or more, and lowered the Job to that many), or, for a kind that starts some pod sets
        only after others finish or are ready, every pod of those it starts first (placed
        whole; the later ones as they come, in the room the admission planned for them)."""
        return self.first_stage or self.admitted

    @property
    def ready(self) -> bool:
        """Enough pods exist to place the group whole.

        Before its first placement the whole gang must be there (bound ones count: a
        restart may have cut a binding short). After it, replacement pods (a Job with more
        completions than parallelism, a failed pod retried) are placed as they come.
        """
        if not self.waiting:
            return False
        return self.scheduled or len(self.bound) + len(self.waiting) >= self.min_count

    def bound_on(self) -> dict[str, int]:
        """Node -> pods of this group bound there."""
        out: dict[str, int] = {}
        for pod in self.bound:
            node = p.node_of(pod)
            out[node] = out.get(node, 0) + 1
        return out

    def order(self) -> tuple[int, str, str]:
        """Higher priority first, then the longest admitted, then by name."""
        since = self.admitted_at.isoformat() if self.admitted_at else ""
        return (-self.priority, since, self.key)


def plan_of(wl: Mapping[str, Any]) -> Plan:
    """The planned nodes of each pod set, from status.admission (empty in quota-only mode)."""
    admission = (wl.get("status") or {}).get("admission") or {}
    plan: Plan = {}
    for assignment in admission.get("podSetAssignments") or []:
        pairs = tuple(
            (str(n.get("name")), int(n.get("count") or 0))
            for n in assignment.get("nodes") or []
            if n.get("name") and int(n.get("count") or 0) > 0
        )
        if pairs:
            plan[str(assignment.get("name"))] = pairs
    return plan


def scheduled_at(pod_group: Mapping[str, Any] | None) -> str | None:
    """When the PodGroup was first fully placed (its condition's transition time), or None."""
    if not pod_group:
        return None
    found = wls.condition(pod_group, PGC.INITIALLY_SCHEDULED)
    if found is None or found.get("status") != "True":
        return None
    return str(found.get("lastTransitionTime") or "") or None


def _scheduled(wl: Obj, pod_group: Obj | None, remembered: Collection[tuple[str, str]]) -> bool:
    """Whether this admission of the Workload was already placed whole.

    A Workload evicted and admitted again keeps its PodGroup, whose condition then speaks
    of the earlier admission: only a condition that turned True at or after the current
    QuotaReserved transition counts (both are RFC 3339 UTC, so they compare as text).
    """
    reserved = str((wls.condition(wl, wls.QUOTA_RESERVED) or {}).get("lastTransitionTime") or "")
    uid = str((wl.get("metadata") or {}).get("uid") or "")
    if (uid, reserved) in remembered:
        return True
    since = scheduled_at(pod_group)
    return since is not None and since >= reserved


def admitted_workloads(caches: Caches) -> list[Obj]:
    """Workloads holding quota, not evicted, and not replaced by an admitted newer slice
    (an elastic Job's old slice is retired right after its successor is admitted)."""
    holding = [
        wl for wl in caches.workloads.objects() if wls.has_quota(wl) and not wls.is_evicted(wl)
    ]
    replaced = {
        f"{(wl.get('metadata') or {}).get('namespace')}/{old}"
        for wl in holding
        if (old := wls.replaces(wl))
    }
    return [wl for wl in holding if object_key(wl) not in replaced]


def collect(
    caches: Caches,
    scheduler_name: str,
    *,
    bound_by_us: Mapping[str, str],
    remembered: Collection[tuple[str, str]] = (),
    on_error: Callable[[str, str], None] | None = None,
    topologies: Topologies | None = None,
) -> list[Group]:
    """Every admitted Workload whose Job's pods carry `scheduler_name`, as a Group.

    `bound_by_us` maps pods this loop bound to their node, for pods whose binding the watch
    has not shown yet. `on_error(workload key, message)` hears of Workloads that cannot be
    read (their group is skipped; everything else goes on). `topologies`, read at the start
    of the pass, gives each group the domains its pod sets keep to.
    """
    groups: list[Group] = []
    for wl in admitted_workloads(caches):
        key = object_key(wl)
        owner = foreign_owner(wl)
        if owner is None and wls.owner_group_id(wl) is not None:
            # Pods queued by their owner (controllers/owners): as a foreign group's, they
            # exist before admission and are not rewritten by it; Events go to the owner
            # (or, for a group of bare pods, to the Workload itself).
            owner = wls.owner_reference(wl) or {
                "apiVersion": wl.get("apiVersion"),
                "kind": "Workload",
                "name": (wl.get("metadata") or {}).get("name"),
                "uid": (wl.get("metadata") or {}).get("uid"),
            }
        first: list[str] | None = None  # every pod set starts at once
        if owner is not None:
            # A foreign PodGroup's pods (controllers/podgroups), or a group queued by its
            # owner: they name the scheduler themselves, and `_sort_pods` takes only those
            # that name this one. The owner reference is all the Events about it need.
            job: Obj | None = {
                "apiVersion": owner.get("apiVersion"),
                "kind": owner.get("kind"),
                "metadata": {
                    "name": owner.get("name"),
                    "namespace": (wl.get("metadata") or {}).get("namespace"),
                    "uid": owner.get("uid"),
                },
            }
        else:
            found = owner_of(wl)
            if found is None:
                continue
            integration, job_key = found
            cache = caches.extra.get(integration.name) if integration is not BATCH_JOB else None
            job = caches.jobs.get(job_key) if integration is BATCH_JOB else None
            if cache is not None:
                # Kinds whose pods are their Jobs' (JobSet, TrainJob): the pods name the
                # scheduler (Muster's pod webhook), and `_sort_pods` takes only those.
                job = cache.get(job_key)
            if job is None:
                continue
            if integration is BATCH_JOB:
                template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
                if template.get("schedulerName") != scheduler_name:
                    continue  # kube-scheduler's (or another's) to place
            else:
                try:
                    first = integration.wrapper(caches)(job).first_pod_sets()
                except ValueError:  # its runtime is gone: placed as one gang
                    first = None
        assert job is not None
        # Every pod set of the Workload is one gang: placed whole, all sets together.
        sets: list[tuple[str, int, dict[str, int]]] = []
        try:
            for i, ps in enumerate((wl.get("spec") or {}).get("podSets") or []):
                name = str(ps.get("name") or "main")
                requests = parse_resource_list(
                    ps.get("requests") or {}, field=f"spec.podSets[{i}].requests"
                )
                sets.append((name, wls.admitted_count(wl, name), requests))
        except QuantityError as error:
            if on_error is not None:
                on_error(key, f"Workload {key}: {error}")
            continue
        if not sets:
            continue
        pod_set, _, per_pod = sets[0]
        first_stage = sum(n for name, n, _ in sets if name in first) if first else 0
        since = wls.parse_time(
            (wls.condition(wl, wls.QUOTA_RESERVED) or {}).get("lastTransitionTime")
        )
        group = Group(
            key=key,
            workload=wl,
            job=job,
            pod_set=pod_set,
            admitted=sum(count for _, count, _ in sets),
            priority=int((wl.get("spec") or {}).get("priority") or 0),
            cluster_queue=admitted_to(wl) or "",
            admitted_at=since,
            scheduled=_scheduled(wl, caches.pod_groups.get(key), remembered),
            plan=plan_of(wl),
            per_pod=per_pod,
            pods_key=wls.owner_job_uid(wl) or "",
            node_labels=_flavor_labels(caches, wl, pod_set) if owner is not None else {},
            pod_sets=tuple(sets),
            first_stage=first_stage,
        )
        if topologies is not None:
            group.domains, group.topology_refused = topologies.domains(wl)
        _sort_pods(group, caches, scheduler_name, bound_by_us)
        groups.append(group)
    return groups


def _flavor_labels(caches: Caches, wl: Obj, pod_set: str) -> dict[str, str]:
    """The node labels of the flavors assigned to the pod set."""
    labels: dict[str, str] = {}
    for name in sorted(set(wls.assigned_flavors(wl).get(pod_set, {}).values())):
        flavor = caches.flavors.get(name) or {}
        labels.update((flavor.get("spec") or {}).get("nodeLabels") or {})
    return labels


def _sort_pods(
    group: Group, caches: Caches, scheduler_name: str, bound_by_us: Mapping[str, str]
) -> None:
    """Split the Job's unfinished pods into bound, waiting and gated."""
    unbound: list[Obj] = []
    for pod in caches.live_pods_of_job(group.pods_key):
        if p.scheduler_of(pod) != scheduler_name or p.is_deleting(pod):
            continue  # terminating pods still hold room, which the node view counts
        if p.node_of(pod):
            group.bound.append(pod)
        elif p.key_of(pod) in bound_by_us:
            # Bound a moment ago; the watch has not caught up. Seen as bound on that node.
            spec = dict(p.spec_of(pod))
            spec["nodeName"] = bound_by_us[p.key_of(pod)]
            group.bound.append({**pod, "spec": spec})
        elif p.is_gated(pod):
            group.gated += 1
        else:
            unbound.append(pod)
    unbound.sort(key=p.age_order)
    group.unbound = len(unbound)
    # Never more pods on nodes than the admission grants: an extra pod (the Job controller
    # replacing one that is still terminating) waits until there is room in the grant.
    room = max(0, group.admitted - len(group.bound))
    group.waiting = unbound[:room]
