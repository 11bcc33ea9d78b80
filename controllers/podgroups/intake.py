"""PodGroup intake: a Volcano or native PodGroup whose pods name Muster's scheduler becomes
one Workload, admitted whole under the queue it names and placed whole by the scheduler
loop; the PodGroup is told where it stands in its own API's terms.

Why a reconciler of its own rather than a kind behind `controllers.jobs.framework`: the
seam drives objects that Muster suspends and resumes (a Job's `spec.suspend`) and whose pod
template it rewrites on admission and restores on eviction. A PodGroup owns no pods and has
nothing to suspend; its pods already exist, immutable in what placement reads, and are held
simply because only Muster's scheduler loop binds pods that name it, and it binds only the
pods of admitted Workloads. Of the seam's eleven methods, suspend, hold_pods, run_with,
restore and elastic_sizes would be no-ops or lies, and stopping an evicted group means
deleting its bound pods, which the seam has no word for.

One reconcile per group (key: `controllers.state.foreigngroups.group_id`):

- its pods name `muster-scheduler` and it has no Workload: check it (minimum >= 1, a queue
  that maps to a LocalQueue by `controllers.podgroups.queues`), then create the Workload:
  one pod set of minMember / minCount pods, each asking for the most any of the group's
  pods asks for of each resource (so quota is never under-counted), with the scheduling
  fields of its oldest pod. The Workload is owned by the PodGroup (deleting the group
  deletes it) and holds Muster's resource-in-use finalizer until no pod of the group is
  bound any more;
- admitted: the scheduler loop places it (`controllers.scheduler.groups` reads foreign
  groups too); once it was placed whole and none of its pods is left unfinished, the
  Workload is Finished and its quota released;
- evicted (preemption): its bound pods are deleted (their owners may make new ones, which
  wait unbound), then its quota is released and it queues again;
- always: the PodGroup's status says where it stands (`controllers.podgroups.kinds`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from controllers.jobs.kinds import named
from controllers.jobs.reconciler import priority_classes
from controllers.podgroups.kinds import KINDS, NATIVE, ForeignKind, Told, kind_of
from controllers.podgroups.leaving import settle_leaving
from controllers.podgroups.queues import resolve
from controllers.runtime import apply
from controllers.runtime.informer import Informer
from controllers.runtime.resources import POD, WORKLOAD, Kube, Obj, object_key
from controllers.runtime.workers import WorkerPool
from controllers.runtime.workqueue import WorkQueue
from controllers.scheduler import pods as p
from controllers.scheduler.groups import scheduled_at
from controllers.state import workloads as wls
from controllers.state.caches import Context, served
from controllers.state.foreigngroups import (
    foreign_owner,
    group_id,
    group_id_of_pod,
    group_id_of_workload,
    parse_group_id,
)
from quota.api import ManifestError, parse_manifest
from quota.api.conditions import PodGroupConditions as PGC
from quota.api.conditions import WorkloadConditions as WC
from quota.api.meta import API_VERSION
from quota.api.names import JOB_POD_SET, QUEUE_LABEL, WORKLOAD_FINALIZER
from quota.api.quantity import format_quantity
from quota.api.topology import (
    ForeignTopologyError,
    kep5732_topology_request,
    network_topology_request,
)
from quota.model.convert import copied_annotations
from quota.model.nodeconvert import pod_requests
from quota.model.queues import admitted_to

log = logging.getLogger(__name__)

# Requeue while a leaving or evicted group's pods still hold room: their going brings an
# event to the key, but a pod that finishes leaves the watch without one for a bound pod.
RETRY_SECONDS = 1.0
# Labels on the Workload: which PodGroup (for `kubectl get wl -l muster.dev/podgroup=x`).
PODGROUP_LABEL = "muster.dev/podgroup"


def workload_name(name: str, uid: str) -> str:
    """Deterministic Workload name of a PodGroup: `podgroup-<name>-<hash of its uid>`."""
    digest = wls.short_hash(uid)
    room = wls.MAX_NAME - len("podgroup--") - len(digest)
    return f"podgroup-{name[:room]}-{digest}"


class Refused(ValueError):
    """The group cannot be queued: `reason` is a word, the message says what to fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def workload_spec(
    fk: ForeignKind,
    pg: Mapping[str, Any],
    pods: list[Obj],
    local_queues: list[Obj],
    priorities: Mapping[str, int],
    global_default: str | None,
) -> Obj:
    """The Workload spec of a group whose pods (`pods`, oldest first, at least one) name
    Muster's scheduler. Raises Refused naming the PodGroup's field and the rule."""
    meta = pg.get("metadata") or {}
    subject = f"{fk.label} PodGroup {meta.get('namespace')}/{meta.get('name')}"
    policy = (pg.get("spec") or {}).get("schedulingPolicy") or {}
    if fk is NATIVE and "basic" in policy:
        raise Refused(
            "InvalidPodGroup",
            f"{subject}: spec.schedulingPolicy.basic: Muster admits and places whole gangs; "
            "use spec.schedulingPolicy.gang.minCount, or another scheduler for pod-by-pod",
        )
    minimum = fk.min_count(pg)
    if minimum < 1:
        raise Refused("InvalidPodGroup", f"{subject}: {fk.min_count_field()} must be at least 1")
    queue, field = fk.queue(pg)
    if queue is None:
        raise Refused(
            "NoQueue",
            f"{subject}: {field} is not set: name the LocalQueue (or ClusterQueue) to queue in",
        )
    local_queue, how = resolve(str(meta.get("namespace")), queue, local_queues)
    if local_queue is None:
        raise Refused("QueueNotFound", f"{subject}: {field}: {how}")
    requests: dict[str, int] = {}
    for pod in pods:
        try:
            for resource, amount in pod_requests(p.spec_of(pod)).items():
                requests[resource] = max(requests.get(resource, 0), amount)
        except ValueError as error:
            raise Refused("InvalidPodGroup", f"{subject}: Pod {p.key_of(pod)}: {error}") from None
    first = p.spec_of(pods[0])
    template: Obj = {
        "nodeSelector": dict(first.get("nodeSelector") or {}),
        "tolerations": list(first.get("tolerations") or []),
    }
    if first.get("affinity"):
        template["affinity"] = first["affinity"]
    class_name, explicit = fk.priority(pg)
    class_name = class_name or first.get("priorityClassName") or global_default
    if explicit is not None:
        priority = explicit
    elif class_name:
        if class_name not in priorities:
            raise Refused(
                "InvalidPodGroup",
                f"{subject}: spec.priorityClassName: PriorityClass {class_name!r} does not exist",
            )
        priority = priorities[class_name]
    else:
        priority = 0
    spec: Obj = {
        "queueName": local_queue,
        "priority": priority,
        "podSets": [
            {
                "name": JOB_POD_SET,
                "count": minimum,
                "template": template,
                "requests": {r: format_quantity(v, r) for r, v in sorted(requests.items())},
            }
        ],
    }
    topology = _topology_request(fk, pg, subject)
    if topology:
        spec["podSets"][0]["topologyRequest"] = topology
    if class_name:
        spec["priorityClassName"] = class_name
    document = {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": "podgroup",
            "namespace": str(meta.get("namespace")),
            # Checked here, so a bad muster.dev/preemptible is refused naming the PodGroup.
            "annotations": copied_annotations(meta.get("annotations") or {}),
        },
        "spec": spec,
    }
    try:
        parse_manifest(document, 0)
    except ManifestError as error:
        problems = "; ".join(f"{path}: {rule}" for path, rule in error.problems)
        raise Refused("InvalidPodGroup", f"{subject}: {problems}") from None
    return spec


def _topology_request(fk: ForeignKind, pg: Mapping[str, Any], subject: str) -> Obj:
    """The group's topology constraint as the Workload's topologyRequest, never dropped:
    what Muster cannot honour is refused naming the field. Native: KEP-5732's
    `schedulingConstraints.topology`; Volcano: `networkTopology` in HyperNode tiers, which
    the flavor's Topology resolves (`quota.placement.topology.domain_request`)."""
    spec = pg.get("spec") or {}
    if fk is NATIVE:
        field = "spec.schedulingConstraints.topology"
        value = (spec.get("schedulingConstraints") or {}).get("topology")
        convert: Callable[[object], Obj] = kep5732_topology_request
    else:
        field = "spec.networkTopology"
        value = spec.get("networkTopology")
        if value is None:
            return {}
        convert = network_topology_request
    try:
        return convert(value)
    except ForeignTopologyError as error:
        reason = "UnsupportedTopology" if error.unsupported else "InvalidPodGroup"
        raise Refused(reason, f"{subject}: {field}{error.path}: {error.rule}") from None


def _topology_words(fk: ForeignKind, request: Obj) -> str:
    """How the group's constraint was taken, for the Event that says its Workload exists."""
    if not request:
        return ""
    if fk is NATIVE:
        where = f"one domain of {request['required']}"
    elif "requiredTier" in request:
        where = f"one domain of tier {request['requiredTier']} (hard)"
    else:
        where = "one domain of tier 1 if one holds them, else of the lowest tier that can (soft)"
    return f", every pod in {where}"


def new_workload(fk: ForeignKind, pg: Mapping[str, Any], name: str, spec: Obj) -> Obj:
    """A Workload owned by the PodGroup, held by the resource-in-use finalizer."""
    meta = pg["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "finalizers": [WORKLOAD_FINALIZER],
            "labels": {PODGROUP_LABEL: str(meta["name"])[:63]},
            "annotations": copied_annotations(meta.get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": fk.api_version,
                    "kind": "PodGroup",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def _queue_shape(lq: Obj) -> tuple[object, object]:
    """What the mapping rule reads of a LocalQueue (its name is the cache key)."""
    return (lq.get("spec"), (lq.get("metadata") or {}).get("deletionTimestamp"))


class PodGroupIntake:
    """Watches the foreign PodGroup APIs the cluster serves and reconciles their groups."""

    def __init__(
        self,
        ctx: Context,
        read_kube: Kube,
        scheduler_name: str,
        is_leader: Callable[[], bool],
        stop: threading.Event,
        *,
        watch_timeout: int = 300,
    ) -> None:
        self.ctx = ctx
        self.read_kube = read_kube
        self.scheduler_name = scheduler_name
        self.watch_timeout = watch_timeout
        self.informers: dict[str, Informer] = {}
        self.queue: WorkQueue[str] = WorkQueue("podgroups")
        self.workers = WorkerPool("podgroup", self.queue, self.reconcile, is_leader, stop)

    # ------------------------------------------------------------------ wiring
    def discover(self) -> list[str]:
        """Start watching each foreign PodGroup API the apiserver serves (a cluster without
        Volcano's CRD, or without the GenericWorkload gate, serves one or none); returns
        the API versions watched. An API installed later is picked up on restart."""
        for fk in KINDS:
            if not served(self.read_kube, fk.kind):
                log.info("PodGroup API not watched (not served)", extra={"api": fk.api_version})
                continue
            informer = Informer(
                self.read_kube,
                fk.kind,
                watch_timeout=self.watch_timeout,
                name=f"{fk.label.lower()}-podgroups",
            )
            informer.add_handler(self._on_pod_group(fk))
            self.informers[fk.api_group] = informer
        return [kind_of(g).api_version for g in self.informers]

    def _on_pod_group(self, fk: ForeignKind) -> Callable[[str, Obj | None, Obj | None], None]:
        def handler(kind: str, old: Obj | None, new: Obj | None) -> None:
            meta = (new or old or {}).get("metadata") or {}
            self.queue.add(
                group_id(fk.api_group, str(meta.get("namespace")), str(meta.get("name")))
            )

        return handler

    def wire(self) -> None:
        """Enqueue groups when their Workload, pods, Muster PodGroup or queues change."""
        caches = self.ctx.caches

        def on_workload(kind: str, old: Obj | None, new: Obj | None) -> None:
            gid = group_id_of_workload(new or old or {})
            if gid:
                self.queue.add(gid)

        def on_pod(kind: str, old: Obj | None, new: Obj | None) -> None:
            # Status heartbeats tell a group nothing; appearing, binding, going do.
            if p.placement_inputs(old) == p.placement_inputs(new):
                return
            gid = group_id_of_pod(new or old or {})
            if gid:
                self.queue.add(gid)

        def on_muster_pod_group(kind: str, old: Obj | None, new: Obj | None) -> None:
            wl = caches.workloads.get(object_key(new or old or {}))
            gid = group_id_of_workload(wl) if wl is not None else None
            if gid:
                self.queue.add(gid)

        def on_local_queue(kind: str, old: Obj | None, new: Obj | None) -> None:
            # A group refused for a missing queue may fit now; a status write changes nothing.
            if old is not None and new is not None and _queue_shape(old) == _queue_shape(new):
                return
            for key in self.group_ids():
                self.queue.add(key)

        caches.workloads.add_handler(on_workload)
        caches.node_pods.add_handler(on_pod)
        caches.pod_groups.add_handler(on_muster_pod_group)
        caches.local_queues.add_handler(on_local_queue)

    def informer_list(self) -> list[Informer]:
        return list(self.informers.values())

    def group_ids(self) -> list[str]:
        out = []
        for api_group, informer in self.informers.items():
            for key in informer.list_keys():
                namespace, _, name = key.partition("/")
                out.append(group_id(api_group, namespace, name))
        return out

    # ---------------------------------------------------------------- reconcile
    def reconcile(self, gid: str) -> float | None:
        api_group, namespace, name = parse_group_id(gid)
        informer = self.informers.get(api_group)
        if informer is None:
            return None
        fk = kind_of(api_group)
        pg = informer.get(f"{namespace}/{name}")
        caches = self.ctx.caches
        workloads = caches.workloads_of_job(gid)
        pods = caches.live_pods_of_job(gid)
        retry = settle_leaving(self.ctx, workloads, pods, "podgroup workload")
        if pg is None or wls.is_deleting(pg):
            return retry
        uid = pg["metadata"]["uid"]
        own = [
            w
            for w in workloads
            if (foreign_owner(w) or {}).get("uid") == uid and not wls.is_deleting(w)
        ]
        mine = sorted(
            (x for x in pods if p.scheduler_of(x) == self.scheduler_name), key=p.age_order
        )
        if not own and not mine:
            return retry  # not Muster's group (yet): its pods name another scheduler, or none exist
        wl = next((w for w in own if not wls.is_finished(w)), None)
        if wl is None and own:
            self._tell(fk, pg, Told("finished", "Completed", "every pod of the group finished", 0))
            return retry
        if wl is None:
            if self._queued_by_owner(pg):
                return retry
            self._admit(fk, pg, mine)
            return retry
        return self._drive(fk, pg, wl, mine, pods) or retry

    def _queued_by_owner(self, pg: Obj) -> bool:
        """Whether the group's owner is an object Muster queues itself (a TrainJob with the
        queue-name label, behind `controllers.jobs`): its Workload admits these pods, and a
        second one for the PodGroup would count them twice."""
        namespace = pg["metadata"]["namespace"]
        for ref in pg["metadata"].get("ownerReferences") or []:
            integration = named(f"{ref.get('apiVersion')}/{ref.get('kind')}")
            if integration is None:
                continue
            try:
                owner = integration.informer(self.ctx.caches).get(f"{namespace}/{ref.get('name')}")
            except KeyError:  # its kind's CRD is not served, so nothing of it is queued
                continue
            labels = ((owner or {}).get("metadata") or {}).get("labels") or {}
            if labels.get(QUEUE_LABEL):
                return True
        return False

    def _admit(self, fk: ForeignKind, pg: Obj, mine: list[Obj]) -> None:
        values, default = priority_classes(self.ctx)
        try:
            spec = workload_spec(
                fk, pg, mine, self.ctx.caches.local_queues.objects(), values, default
            )
        except Refused as refused:
            self._tell(fk, pg, Told("refused", refused.reason, str(refused), 0))
            self.ctx.events.emit(pg, "Warning", refused.reason, str(refused)[:1000])
            return
        meta = pg["metadata"]
        name = workload_name(meta["name"], meta["uid"])
        body = new_workload(fk, pg, name, spec)
        _, fresh = apply.create(self.ctx.kube, WORKLOAD, body, cache=self.ctx.caches.workloads)
        if fresh:
            self.ctx.events.emit(
                pg,
                "Normal",
                "CreatedWorkload",
                f"created Workload {name} in LocalQueue {spec['queueName']} for "
                f"{spec['podSets'][0]['count']} pods"
                + _topology_words(fk, spec["podSets"][0].get("topologyRequest") or {}),
            )
            self.ctx.poke_admission()
        self._tell(
            fk,
            pg,
            Told(
                "queued",
                "Queued",
                f"queued as Workload {name} in LocalQueue {spec['queueName']}",
                0,
            ),
        )

    def _drive(
        self, fk: ForeignKind, pg: Obj, wl: Obj, mine: list[Obj], pods: list[Obj]
    ) -> float | None:
        bound = sum(1 for x in mine if p.node_of(x) and not p.is_deleting(x))
        name = wl["metadata"]["name"]
        if not wls.has_quota(wl):
            pending = wls.condition(wl, wls.QUOTA_RESERVED) or {}
            message = str(pending.get("message") or f"Workload {name} waits for admission")
            self._tell(fk, pg, Told("queued", "NotEnoughResources", message, bound))
            return None
        if wls.is_evicted(wl):
            return self._stop(fk, pg, wl, pods)
        reserved = str(
            (wls.condition(wl, wls.QUOTA_RESERVED) or {}).get("lastTransitionTime") or ""
        )
        muster_pg = self.ctx.caches.pod_groups.get(object_key(wl))
        since = scheduled_at(muster_pg)
        placed = since is not None and since >= reserved
        if placed and not pods:
            now = self.ctx.now()
            message = f"every pod of PodGroup {pg['metadata']['name']} finished"
            written = apply.update(
                self.ctx.kube,
                WORKLOAD,
                object_key(wl),
                lambda w: wls.mark_finished(w, WC.SUCCEEDED, message, now),
                cache=self.ctx.caches.workloads,
                current=wl,
                status=True,
            )
            if written is not None and wls.is_finished(written):
                self.ctx.events.emit(written, "Normal", "Finished", f"{message}; quota released")
                self.ctx.poke_admission()
            self._tell(fk, pg, Told("finished", "Completed", message, 0))
            return None
        minimum = fk.min_count(pg)
        queue = admitted_to(wl)
        if placed or bound >= minimum > 0:
            self._tell(
                fk,
                pg,
                Told("placed", "Scheduled", f"{bound} of {minimum} pods bound by Muster", bound),
            )
            return None
        found = wls.condition(muster_pg or {}, PGC.INITIALLY_SCHEDULED) or {}
        detail = str(found.get("message") or "waiting for placement")
        self._tell(
            fk,
            pg,
            Told(
                "admitted",
                "NotEnoughResources" if found.get("reason") == PGC.UNSCHEDULABLE else "Admitted",
                f"admitted by ClusterQueue {queue} as Workload {name}; {detail}",
                bound,
            ),
        )
        return None

    def _stop(self, fk: ForeignKind, pg: Obj, wl: Obj, pods: list[Obj]) -> float | None:
        """Evicted: delete the bound pods, then give the quota back and queue again."""
        evicted = wls.condition(wl, wls.EVICTED) or {}
        on_nodes = [x for x in pods if p.node_of(x)]
        if on_nodes:
            for pod in on_nodes:
                if not p.is_deleting(pod):
                    apply.delete(self.ctx.kube, POD, pod)
            self.ctx.events.emit(
                pg,
                "Warning",
                "Stopped",
                f"deleted {len(on_nodes)} bound pod(s): {evicted.get('message') or 'evicted'}",
            )
            return RETRY_SECONDS
        now = self.ctx.now()
        written = apply.update(
            self.ctx.kube,
            WORKLOAD,
            object_key(wl),
            lambda w: wls.release_quota(w, now),
            cache=self.ctx.caches.workloads,
            current=wl,
            status=True,
        )
        if written is not None:
            self.ctx.poke_admission()
            message = f"evicted: {evicted.get('message') or 'preempted'}; queued again"
            self._tell(fk, pg, Told("queued", str(evicted.get("reason") or "Evicted"), message, 0))
        return None

    # ------------------------------------------------------------------- telling
    def _tell(self, fk: ForeignKind, pg: Obj, told: Told) -> None:
        """Write what the group should say, in its API's terms, if it does not say it yet."""
        now: datetime = self.ctx.now()
        informer = self.informers[fk.api_group]
        key = object_key(pg)
        if fk.status_subresource:
            apply.update(
                self.ctx.kube,
                fk.kind,
                key,
                lambda o: fk.tell(o, told, now),
                cache=informer,
                current=pg,
                status=True,
            )
            return
        # No status subresource (Volcano's CRD): the status is part of the main resource,
        # which `apply.update` leaves out of its patch, so it is patched here.
        desired = {"status": dict(pg.get("status") or {}), "metadata": pg["metadata"]}
        if not fk.tell(desired, told, now):
            return
        patch = apply.merge_patch({"status": pg.get("status") or {}}, {"status": desired["status"]})
        if not patch:
            return
        patch.setdefault("metadata", {})["resourceVersion"] = pg["metadata"]["resourceVersion"]
        namespace, name = key.split("/", 1)
        try:
            written = self.ctx.kube.patch(fk.kind, namespace, name, patch, status=False)
        except ApiException as error:
            if error.status == 404:
                return
            raise  # a conflict: the work queue retries from the newer object
        informer.write_through(written)
