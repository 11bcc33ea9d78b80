"""The reconciler of groups of pods queued by their owner (`controllers.state.ownergroups`).

One reconcile per group id, from the group's unfinished pods (gated or not), its Workloads
and, for the kinds it knows, the owner object (for sizes and settings):

- no Workload yet: check it and create one (`controllers.owners.workload`) for what the
  group asks now (`_shape`): a LeaderWorkerSet group, its leader and `size - 1` workers; a
  pod group, its total count; a Deployment or StatefulSet, its replicas; any other owner,
  the pods it has made (once none came for a second). A group that cannot be queued is told
  why by an Event on its owner (on its pods when it has none), and waits.
- admitted: the gates of as many pods per pod set as the admission grants are lifted, the
  assigned flavors' node labels and tolerations written into those pods as they are (a
  gated pod's may grow); the scheduler loop then places them whole. A pod set holding more
  ungated pods than its admission (single pods preempted from a degradable group) loses
  the extra ones; their owner makes them again, gated.
- grown (an elastic group's replicas, a degraded group's lost pods back): a slice for the
  whole new size replaces the admitted one, after Kueue's WorkloadSlices; the engine charges
  only the extra pods on the same flavors (`controllers.jobs.slices` retires the old one).
  Shrunk: the admitted one shrinks in place, never below the ungated pods still holding
  room, and the quota is free at once.
- evicted: its ungated pods are deleted (their owner makes new ones, gated), then its quota
  is released and it queues again.
- no pod left: the Workload is finished and its quota released (a Deployment scaled to zero,
  a LeaderWorkerSet scaled down, a custom operator's pods all done).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from controllers.jobs import preempted, slices
from controllers.jobs.framework import put_flavors
from controllers.jobs.reconciler import priority_classes
from controllers.owners.workload import Refused, Shape, group_spec, new_workload, workload_name
from controllers.podgroups.leaving import settle_leaving
from controllers.runtime import apply
from controllers.runtime.informer import Informer
from controllers.runtime.resources import (
    DEPLOYMENT,
    POD,
    STATEFUL_SET,
    WORKLOAD,
    Kind,
    Kube,
    Obj,
    object_key,
)
from controllers.runtime.workers import WorkerPool
from controllers.runtime.workqueue import WorkQueue
from controllers.scheduler import pods as p
from controllers.state import workloads as wls
from controllers.state.caches import Context, served
from controllers.state.ownergroups import (
    DEPLOYMENT_API,
    LWS_API,
    LWS_GROUP_INDEX_LABEL,
    LWS_KIND,
    LWS_NAME_LABEL,
    LWS_SIZE_ANNOTATION,
    POD_GROUP_KIND,
    PREFIX,
    OwnerGroup,
    gid_of,
    group_of,
    pod_set_of,
)
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import (
    ADMISSION_GATE,
    GANG_ANNOTATION,
    POD_GROUP_COUNT_ANNOTATION,
    POD_GROUP_LABEL,
    POD_SET_POD_LABEL,
    QUEUE_LABEL,
)
from quota.model.serving import (
    LEADER,
    MAIN,
    WORKERS,
    GroupPodSet,
    degradable_lws,
    lws_group,
    replicas_group,
)

log = logging.getLogger(__name__)

LWS = Kind(
    LWS_KIND, True, group="leaderworkerset.x-k8s.io", version="v1", plural="leaderworkersets"
)
# The owner kinds read for sizes and settings, by (apiVersion, kind).
OWNER_KINDS = {
    (DEPLOYMENT_API, "Deployment"): DEPLOYMENT,
    (DEPLOYMENT_API, "StatefulSet"): STATEFUL_SET,
    (LWS_API, LWS_KIND): LWS,
}
# Requeue while pods still hold room (eviction, leaving) or a group may still be growing.
RETRY_SECONDS = 1.0
# Pods of an owner Muster does not know keep coming for this long at most before they are
# taken as one group (they are made in one pass of their operator, well within it).
SETTLE_SECONDS = 1.0


class OwnerGroups:
    """Watches the owner kinds the cluster serves and reconciles every queued pod group."""

    def __init__(
        self,
        ctx: Context,
        read_kube: Kube,
        is_leader: Callable[[], bool],
        stop: threading.Event,
        *,
        watch_timeout: int = 300,
    ) -> None:
        self.ctx = ctx
        self.read_kube = read_kube
        self.watch_timeout = watch_timeout
        self.owners: dict[str, Informer] = {}
        self.queue: WorkQueue[str] = WorkQueue("owner-groups")
        self.workers = WorkerPool("owner-group", self.queue, self.reconcile, is_leader, stop)

    # ------------------------------------------------------------------ wiring
    def discover(self) -> list[str]:
        """Watch the labelled objects of each owner kind the apiserver serves."""
        for (api_version, name), kind in OWNER_KINDS.items():
            if kind.custom and not served(self.read_kube, kind):
                continue
            informer = Informer(
                self.read_kube,
                kind,
                label_selector=QUEUE_LABEL,
                watch_timeout=self.watch_timeout,
                name=f"owner-{name.lower()}s",
            )
            informer.add_handler(self._on_owner(api_version, name))
            self.owners[name] = informer
        return sorted(self.owners)

    def _on_owner(
        self, api_version: str, kind: str
    ) -> Callable[[str, Obj | None, Obj | None], None]:
        def handler(event: str, old: Obj | None, new: Obj | None) -> None:
            meta = (new or old or {}).get("metadata") or {}
            namespace, name = str(meta.get("namespace")), str(meta.get("name"))
            if kind != LWS_KIND:
                self.queue.add(OwnerGroup(api_version, kind, namespace, name).gid)
                return
            # Every group of the set: those its pods and Workloads name.
            caches = self.ctx.caches
            owner = OwnerGroup(api_version, kind, namespace, name).gid
            found = {gid_of(x) for x in caches.node_pods.by_index("owner", owner)}
            found |= {
                wls.owner_group_id(w) or "" for w in caches.workloads.by_index("owner", owner)
            }
            for gid in sorted(found - {""}):
                self.queue.add(gid)

        return handler

    def wire(self) -> None:
        """Enqueue a group when its pods, its Workloads or the LocalQueues change."""
        caches = self.ctx.caches

        def on_pod(event: str, old: Obj | None, new: Obj | None) -> None:
            if p.placement_inputs(old) == p.placement_inputs(new):
                return
            gid = gid_of(new or old or {})
            if gid:
                self.queue.add(gid)

        def on_workload(event: str, old: Obj | None, new: Obj | None) -> None:
            gid = wls.owner_group_id(new or old or {})
            if gid:
                self.queue.add(gid)

        def on_local_queue(event: str, old: Obj | None, new: Obj | None) -> None:
            if old is not None and new is not None and old.get("spec") == new.get("spec"):
                return
            for gid in self.group_ids():
                self.queue.add(gid)

        caches.node_pods.add_handler(on_pod)
        caches.workloads.add_handler(on_workload)
        caches.local_queues.add_handler(on_local_queue)

    def informer_list(self) -> list[Informer]:
        return list(self.owners.values())

    def group_ids(self) -> list[str]:
        """Every group with pods or Workloads in the caches."""
        caches = self.ctx.caches
        found = {k for k in caches.node_pods.index_values("job-uid") if k.startswith(PREFIX)}
        found |= {k for k in caches.workloads.index_values("job-uid") if k.startswith(PREFIX)}
        return sorted(found)

    # ---------------------------------------------------------------- reconcile
    def reconcile(self, gid: str) -> float | None:
        caches = self.ctx.caches
        pods = caches.live_pods_of_job(gid)
        workloads = caches.workloads_of_job(gid)
        retry = self._settle_leaving(workloads, pods)
        active = [w for w in workloads if not wls.is_finished(w) and not wls.is_deleting(w)]
        group = next((g for g in map(group_of, pods) if g is not None), None)
        present = [x for x in pods if not p.is_deleting(x)]
        if group is None or not present:
            if pods:
                return RETRY_SECONDS  # going: their room is still held
            self._finish(active, "every pod of the group is gone")
            return retry
        owner = self._owner(group)
        active, failed = slices.retire_replaced(self, active, _elastic_set(group))
        admitted = sorted((w for w in active if wls.has_quota(w)), key=_created)
        pending = sorted((w for w in active if not wls.has_quota(w)), key=_created)
        current = admitted[-1] if admitted else None
        if current is not None and wls.is_evicted(current):
            slices.delete_pending(self, pending)
            return self._stop(group, owner, current, pods)
        try:
            shape = self._shape(group, owner, present)
        except Refused as refused:
            # What waits is withdrawn (it asked for what the group no longer says); what
            # runs is left alone.
            slices.delete_pending(self, pending)
            self._refuse(group, owner, present, refused)
            return retry
        if shape is None:
            return RETRY_SECONDS  # still growing
        by_set = _by_pod_set(group, present)
        try:
            values, default = priority_classes(self.ctx)
            spec = group_spec(group, shape, by_set, caches.local_queues.objects(), values, default)
        except Refused as refused:
            slices.delete_pending(self, pending)
            self._refuse(group, owner, present, refused)
            return retry
        # Every Workload of the group is a slice of one family, named after its first.
        spec["sliceName"] = workload_name(group, 0)
        if current is None:
            keep = pending[-1] if pending else None
            slices.delete_pending(self, pending[:-1])
            if keep is None:
                self._create(group, owner, present, spec, len(workloads))
            elif not _same_ask(keep, spec):
                self._respec(keep, spec)
            else:
                self._tell_pending(group, owner, keep)
            return retry
        granted = {name: wls.admitted_count(current, name) for name in shape.counts}
        grow = any(shape.counts[n] > granted[n] for n in shape.counts)
        shrink = shape.elastic and any(shape.counts[n] < granted[n] for n in shape.counts)
        requeue = retry or (RETRY_SECONDS if failed else None)
        if grow:
            want = {**spec, "replaces": current["metadata"]["name"]}
            keep = pending[-1] if pending else None
            slices.delete_pending(self, pending[:-1])
            if keep is None:
                self._create(group, owner, present, want, len(workloads))
            elif not _same_ask(keep, want):
                self._respec(keep, want)
            else:
                self._tell_pending(group, owner, keep)
        else:
            slices.delete_pending(self, pending)
        if shrink:
            # Keep admitted what ungated pods still hold: quota comes back as they go.
            pod_set = _elastic_set(group)
            holding = sum(1 for x in present if not p.is_gated(x))
            target = max(shape.counts[pod_set], holding)
            if target < granted[pod_set]:
                current = slices.scale_down(self, current, target, pod_set) or current
            if target > shape.counts[pod_set]:
                requeue = RETRY_SECONDS
        return self._run(group, current, present) or requeue

    # ------------------------------------------------------------------ reading
    def _owner(self, group: OwnerGroup) -> Obj | None:
        informer = self.owners.get(group.kind)
        if informer is None or OWNER_KINDS.get((group.api_version, group.kind)) is None:
            return None
        return informer.get(f"{group.namespace}/{group.name}")

    def _shape(self, group: OwnerGroup, owner: Obj | None, pods: list[Obj]) -> Shape | None:
        """What the group asks for now; None while an unknown owner may still add pods."""
        spec = (owner or {}).get("spec") or {}
        annotations = ((owner or {}).get("metadata") or {}).get("annotations") or {}
        if group.is_lws:
            size = _agreed(group, pods, LWS_SIZE_ANNOTATION)
            single = degradable_lws(
                spec.get("leaderWorkerTemplate") or {},
                annotations,
                lambda path, rule: Refused(
                    "InvalidDisruptionMode", f"{group.subject}: {path}: {rule}"
                ),
            )
            templates = _lws_templates(spec)
            return Shape(lws_group(size, single), elastic=False, single=single, templates=templates)
        if group.kind == POD_GROUP_KIND:
            total = _agreed(group, pods, POD_GROUP_COUNT_ANNOTATION)
            return Shape((GroupPodSet(MAIN, total, total),), elastic=False)
        if owner is not None and group.kind in ("Deployment", "StatefulSet"):
            replicas = spec.get("replicas")
            count = 1 if replicas is None else int(replicas)
            template = (spec.get("template") or {}).get("spec") or {}
            gang = str(annotations.get(GANG_ANNOTATION) or "").lower() == "true"
            if gang and group.kind == "StatefulSet":
                if spec.get("podManagementPolicy") != "Parallel":
                    raise Refused(
                        "InvalidStatefulSet",
                        f"{group.subject}: metadata.annotations[{GANG_ANNOTATION}]: a gang "
                        "needs spec.podManagementPolicy Parallel (OrderedReady makes pod 1 "
                        "only once pod 0 runs, which no pod of a gang does before all are "
                        "admitted)",
                    )
                return Shape(replicas_group(count), elastic=False, templates={MAIN: template})
            if count == 0:
                count = len(pods)  # scaled to zero: what is left goes as it goes
            return Shape(replicas_group(count), elastic=True, templates={MAIN: template})
        newest = max(str((x.get("metadata") or {}).get("creationTimestamp") or "") for x in pods)
        made = wls.parse_time(newest)
        if made is not None and (self.ctx.now() - made).total_seconds() < SETTLE_SECONDS:
            return None
        return Shape(replicas_group(len(pods)), elastic=True)

    # ------------------------------------------------------------------ writing
    def update_workload(
        self, wl: Obj, mutate: apply.Mutation, *, status: bool = False
    ) -> Obj | None:
        return self.ctx.update_workload(wl, mutate, status=status)

    def _create(
        self, group: OwnerGroup, owner: Obj | None, pods: list[Obj], spec: Obj, serial: int
    ) -> None:
        name = workload_name(group, serial)
        body = new_workload(group, name, spec, owner, pods)
        _, fresh = apply.create(self.ctx.kube, WORKLOAD, body, cache=self.ctx.caches.workloads)
        if not fresh:
            return
        sizes = ", ".join(f"{ps['count']} {ps['name']}" for ps in spec["podSets"])
        slice_words = f", replacing {spec['replaces']}" if spec.get("replaces") else ""
        self._tell(
            group,
            owner,
            pods,
            "Normal",
            "CreatedWorkload",
            f"created Workload {name} in LocalQueue {spec['queueName']} for {group.subject}: "
            f"{sizes} pod(s){slice_words}",
        )
        self.ctx.poke_admission()

    def _respec(self, wl: Obj, spec: Obj) -> None:
        """Ask a pending Workload for what the group asks now (from the version read, so one
        admitted meanwhile is never rewritten)."""

        def mutate(w: Obj) -> bool:
            if wls.has_quota(w):
                return False
            w["spec"] = {**(w.get("spec") or {}), **spec}
            return True

        if apply.update(self.ctx.kube, WORKLOAD, object_key(wl), mutate, current=wl, attempts=1):
            self.ctx.poke_admission()

    def _finish(self, active: list[Obj], message: str) -> None:
        now = self.ctx.now()
        for wl in active:
            written = self.update_workload(
                wl, lambda w: wls.mark_finished(w, WC.SUCCEEDED, message, now), status=True
            )
            if written is not None and wls.is_finished(written):
                self.ctx.events.emit(written, "Normal", "Finished", f"{message}; quota released")
                self.ctx.poke_admission()

    def _settle_leaving(self, workloads: list[Obj], pods: list[Obj]) -> float | None:
        """Deleted Workloads go once no pod of the group is bound; finished ones lose their
        finalizer (nothing of them holds room any more)."""
        retry = settle_leaving(self.ctx, workloads, pods, "owner-group workload")
        for wl in workloads:
            if wls.is_finished(wl) and wls.holds_finalizer(wl) and not wls.is_deleting(wl):
                self.update_workload(wl, lambda w: wls.set_finalizer(w, False))
        return retry

    def _stop(self, group: OwnerGroup, owner: Obj | None, wl: Obj, pods: list[Obj]) -> float:
        """Evicted: delete its ungated pods, then give the quota back and queue again."""
        evicted = wls.condition(wl, wls.EVICTED) or {}
        running = [x for x in pods if not p.is_gated(x)]
        if running:
            for pod in running:
                if not p.is_deleting(pod):
                    apply.delete(self.ctx.kube, POD, pod)
            self._tell(
                group,
                owner,
                pods,
                "Warning",
                "Stopped",
                f"deleted {len(running)} pod(s) of {group.subject}: "
                f"{evicted.get('message') or 'evicted'}",
            )
            return RETRY_SECONDS
        now = self.ctx.now()
        written = self.update_workload(wl, lambda w: wls.release_quota(w, now), status=True)
        if written is not None:
            self.ctx.poke_admission()
        return RETRY_SECONDS

    def _run(self, group: OwnerGroup, wl: Obj, pods: list[Obj]) -> float | None:
        """Lift the gates of the pods the admission grants, per pod set; delete ungated pods
        past it (taken by preemption one by one)."""
        flavors = self._flavors(wl)
        taken = preempted.preempted_names(wl)
        requeue: float | None = None
        for pod_set, members in _by_pod_set(group, pods).items():
            allowed = wls.admitted_count(wl, pod_set)
            ungated = [x for x in members if not p.is_gated(x)]
            gated = sorted((x for x in members if p.is_gated(x)), key=p.age_order)
            extra = preempted.excess(ungated, allowed, taken)
            if extra:
                why = f"preempted by Muster: Workload {wl['metadata']['name']} grants fewer pods"
                preempted.delete_marked(self.ctx, extra, why, self.ctx.now())
                requeue = RETRY_SECONDS
                continue
            room = allowed - len(ungated)
            if room <= 0 or not gated:
                continue
            # The cache may lag a lift of a moment ago: ask the apiserver before lifting more.
            fresh = [x for x in self._fresh_pods(group) if pod_set_of(x, group) == pod_set]
            room = allowed - sum(1 for x in fresh if not p.is_gated(x) and not p.is_deleting(x))
            chosen = sorted((x for x in fresh if p.is_gated(x)), key=p.age_order)[: max(0, room)]
            for pod in chosen:
                self._lift(pod, pod_set, flavors.get(pod_set) or [])
        return requeue

    def _fresh_pods(self, group: OwnerGroup) -> list[Obj]:
        # As narrow a read as the group's labels allow: one set's group, one pod group.
        if group.is_lws:
            selector = f"{LWS_NAME_LABEL}={group.name},{LWS_GROUP_INDEX_LABEL}={group.index}"
        elif group.kind == POD_GROUP_KIND:
            selector = f"{POD_GROUP_LABEL}={group.name}"
        else:
            selector = QUEUE_LABEL
        found, _ = self.ctx.kube.list(POD, group.namespace, label_selector=selector)
        return [x for x in found if gid_of(x) == group.gid and not p.is_finished(x)]

    def _flavors(self, wl: Obj) -> dict[str, list[Obj]]:
        out: dict[str, list[Obj]] = {}
        for pod_set, by_resource in wls.assigned_flavors(wl).items():
            names = sorted(set(by_resource.values()))
            out[pod_set] = [f for f in map(self.ctx.caches.flavors.get, names) if f is not None]
        return out

    def _lift(self, pod: Obj, pod_set: str, flavors: list[Obj]) -> None:
        """Remove the admission gate, with the flavors' node labels and tolerations and the
        pod set label written in the same update (a gated pod's scheduling fields may grow)."""

        def mutate(x: Obj) -> bool:
            spec = x.get("spec") or {}
            gates = spec.get("schedulingGates") or []
            kept = [g for g in gates if g.get("name") != ADMISSION_GATE]
            if len(kept) == len(gates) or (x.get("metadata") or {}).get("deletionTimestamp"):
                return False
            spec["schedulingGates"] = kept
            put_flavors(spec, dict(spec), flavors)
            x["metadata"].setdefault("labels", {})[POD_SET_POD_LABEL] = pod_set
            return True

        apply.update(self.ctx.kube, POD, p.key_of(pod), mutate, current=pod)

    # ------------------------------------------------------------------- telling
    def _tell(
        self,
        group: OwnerGroup,
        owner: Obj | None,
        pods: list[Obj],
        type_: str,
        reason: str,
        message: str,
    ) -> None:
        """An Event on the group's owner, or on its oldest pod when the owner is not read."""
        subject = owner
        if subject is None and group.uid and group.kind != "Pod":
            subject = {
                "apiVersion": group.api_version,
                "kind": group.kind,
                "metadata": {"name": group.name, "namespace": group.namespace, "uid": group.uid},
            }
        if subject is None:
            oldest: Obj = min(pods, key=p.age_order)
            subject = {"apiVersion": "v1", "kind": "Pod", **oldest}
        self.ctx.events.emit(subject, type_, reason, message[:1000])

    def _refuse(
        self, group: OwnerGroup, owner: Obj | None, pods: list[Obj], refused: Refused
    ) -> None:
        self._tell(group, owner, pods, "Warning", refused.reason, str(refused))

    def _tell_pending(self, group: OwnerGroup, owner: Obj | None, wl: Obj) -> None:
        """Why its Workload waits, on the owner too (once per distinct reason)."""
        pending = wls.condition(wl, wls.QUOTA_RESERVED) or {}
        if pending.get("status") == "False" and pending.get("message"):
            self._tell(
                group,
                owner,
                self.ctx.caches.live_pods_of_job(group.gid),
                "Normal",
                str(pending.get("reason") or "Pending"),
                f"Workload {wl['metadata']['name']}: {pending['message']}",
            )


# ------------------------------------------------------------------------ helpers


def _created(wl: Obj) -> tuple[str, str]:
    meta = wl.get("metadata") or {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


def _elastic_set(group: OwnerGroup) -> str:
    return WORKERS if group.is_lws else MAIN


def _by_pod_set(group: OwnerGroup, pods: list[Obj]) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = {}
    for pod in sorted(pods, key=p.age_order):
        out.setdefault(pod_set_of(pod, group), []).append(pod)
    return out


def _same_ask(wl: Obj, spec: Mapping[str, Any]) -> bool:
    have = wl.get("spec") or {}
    return all(have.get(k) == spec.get(k) for k in ("queueName", "podSets", "replaces"))


def _agreed(group: OwnerGroup, pods: list[Obj], key: str) -> int:
    """The positive count every pod of the group states in its annotation `key`; Refused if
    one states none, a bad one, or another than the rest."""
    seen: dict[str, str] = {}
    for pod in pods:
        value = ((pod.get("metadata") or {}).get("annotations") or {}).get(key)
        seen[p.key_of(pod)] = str(value) if value is not None else ""
    values = set(seen.values())
    if len(values) == 1:
        (value,) = values
        if value.isdigit() and int(value) > 0:
            return int(value)
    detail = ", ".join(f"{k}: {v or 'none'}" for k, v in sorted(seen.items())[:5])
    field = f"metadata.annotations[{key}]"
    label = f" (group {POD_GROUP_LABEL})" if group.kind == POD_GROUP_KIND else ""
    raise Refused(
        "InconsistentGroup",
        f"{group.subject}{label}: {field} must be the same positive count on every pod "
        f"of the group ({detail})",
    )


def _lws_templates(spec: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """A LeaderWorkerSet's pod specs per pod set, for workers not created yet (with
    startupPolicy LeaderReady they come only once the leader runs)."""
    lwt = spec.get("leaderWorkerTemplate") or {}
    worker = (lwt.get("workerTemplate") or {}).get("spec") or {}
    leader = (lwt.get("leaderTemplate") or {}).get("spec") or worker
    return {LEADER: leader, WORKERS: worker}
