"""The one reconciler behind every workload kind: one Workload per object, started when
admitted, stopped when evicted, finished when the object finishes.

It observes an object and its Workloads and moves the object towards what the Workloads say
(the admission loop decides; this module only carries decisions out), touching the object
only through `GenericJob`:

- no Workload yet: create it (deterministic name, owned by the object) and keep the object
  suspended;
- admitted: run it on the assigned flavors (the kind keeps the original template) and
  unsuspend;
- evicted: suspend, wait until its pods are gone, restore the original template, and give
  the quota back with a requeue backoff;
- finished: mark the Workload Finished, which releases its quota at once;
- leaving (the object deleted, its queue label removed outside a managed namespace, its
  namespace no longer managed, or the Workload deleted): the
  Workload's finalizer keeps it, and its quota, until no pod of the object runs or
  terminates any more (Kueue's resource-in-use finalizer); an object that lost its label
  gets its template restored and is left alone.

Elastic objects go through `controllers.jobs.slices` (and its gates) instead of resizing by
suspension; the slices call back into this reconciler through `framework.Driver`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from controllers.jobs import slices
from controllers.jobs.framework import (
    GenericJob,
    Integration,
    in_queue,
    owner_of,
    queue_of,
    same_request,
)
from controllers.runtime import apply
from controllers.runtime.resources import WORKLOAD, Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Context
from controllers.state.dispatch import awaits_manager
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import ELASTIC_ANNOTATION

log = logging.getLogger(__name__)

# Requeue delay while a leaving Workload's pods still terminate: once the object is gone,
# its pods' deletion brings no event to its key, so the reconcile looks again.
LEAVING_RETRY_SECONDS = 1.0


def priority_classes(ctx: Context) -> tuple[dict[str, int], str | None]:
    """PriorityClass values by name, and the global default class (if any)."""
    values: dict[str, int] = {}
    default = None
    for pc in ctx.caches.priority_classes.objects():
        name = pc["metadata"]["name"]
        values[name] = int(pc.get("value") or 0)
        if pc.get("globalDefault"):
            default = name
    return values, default


def granted_pods(wl: Obj) -> dict[str, int]:
    """Pod set -> pods the Workload's admission grants."""
    names = [ps.get("name") for ps in (wl.get("spec") or {}).get("podSets") or []]
    return {str(n): wls.admitted_count(wl, str(n)) for n in names if n}


class Reconciler:
    """Moves one object of a kind towards what its Workloads say. Returns a delay to requeue
    after (or None); raising requeues with backoff."""

    def __init__(
        self,
        ctx: Context,
        integration: Integration,
        managed: Callable[[str], bool] = lambda namespace: False,
    ) -> None:
        self.ctx = ctx
        self.integration = integration
        self.wrap = integration.wrapper(ctx.caches)
        # Whether a namespace is managed (`controllers.manager.namespaces`).
        self.managed = managed

    def queue_of(self, obj: Obj) -> str | None:
        """The LocalQueue the object is in (`framework.queue_of`), None if not Muster's."""
        return queue_of(obj, managed=self.managed(str(obj["metadata"].get("namespace") or "")))

    # -- small writers
    def _update_object(self, job: GenericJob, mutate: Callable[[GenericJob], bool]) -> Obj | None:
        wrap = self.wrap
        return apply.update(
            self.ctx.kube,
            self.integration.kind,
            object_key(job.object),
            lambda obj: mutate(wrap(obj)),
            cache=self.integration.informer(self.ctx.caches),
            current=job.object,
            # Suspending, starting and restoring change the spec: conditional on the spec
            # read, so the Job controller's status writes do not make them conflict.
            spec_guarded=True,
        )

    def _suspended(self, written: Obj) -> bool:
        return self.wrap(written).is_suspended()

    def update_workload(
        self, wl: Obj, mutate: apply.Mutation, *, status: bool = False
    ) -> Obj | None:
        """Change a Workload from the version read (its status with `status`)."""
        return self.ctx.update_workload(wl, mutate, status=status)

    def _flavor_objects(self, wl: Obj) -> list[Obj]:
        names = sorted({f for m in wls.assigned_flavors(wl).values() for f in m.values()})
        found = []
        for name in names:
            flavor = self.ctx.caches.flavors.get(name)
            if flavor is None:
                raise RuntimeError(f"ResourceFlavor {name} assigned to {object_key(wl)} is gone")
            found.append(flavor)
        return found

    # -- the reconcile
    def reconcile(self, key: str) -> float | None:
        obj = self.integration.informer(self.ctx.caches).get(key)
        retry, waiting = self._settle_leaving(key, obj)
        if obj is None or waiting:
            return retry
        if not self.queue_of(obj):
            return retry
        job = self.wrap(obj)
        if wls.is_deleting(obj):
            return retry  # owner references take its Workloads; their finalizers wait above
        uid = obj["metadata"]["uid"]
        owned = [w for w in self.ctx.caches.workloads_of_job(uid) if not wls.is_deleting(w)]
        self._keep_finalizers(owned)
        active = [w for w in owned if wls.is_active(w)]

        done = job.finished()
        if done is not None:
            self._finish_all(active, *done)
            return None
        if self.integration.elastic and job.is_elastic():
            return slices.reconcile_elastic(self, job, owned)
        return self._reconcile_plain(job, active, owned)

    # -- leaving Workloads: held by their finalizer until their pods are gone
    def _settle_leaving(self, key: str, obj: Obj | None) -> tuple[float | None, bool]:
        """Deal with the Workloads of `key` that are leaving: delete those whose object is
        gone or no longer labelled, and let a deleted one go once none of its object's pods
        holds room. Returns (requeue delay, whether the object's own Workload still waits
        for its pods, so nothing new may be created for it yet)."""
        kind = self.integration.kind
        job_uid = obj["metadata"]["uid"] if obj is not None else None
        retry: float | None = None
        waiting = False
        live: Obj | None = None
        looked = False
        for wl in self.ctx.caches.workloads_of_job_key(key):
            owner = owner_of(wl)
            if owner is None or owner[0] is not self.integration:
                continue  # an object of another kind with the same name
            uid = wls.owner_job_uid(wl)
            if not wls.is_deleting(wl):
                if uid == job_uid:
                    continue  # its object is here: the normal path, or GC if it is deleted
                # The cache no longer holds its object: deleted, replaced by a new object of
                # the same name, or its queue label was removed. Ask the apiserver which.
                if not looked:
                    namespace, name = key.split("/", 1)
                    live, looked = self.ctx.kube.get(kind, namespace, name), True
                mine = live is not None and live["metadata"]["uid"] == uid
                if mine and live is not None and self.queue_of(live):
                    continue  # the cache lags; its event brings the object back
                self._let_go(wl, live if mine else None)
                retry = LEAVING_RETRY_SECONDS
                continue
            if not wls.holds_finalizer(wl):
                continue
            if wls.has_quota(wl) and uid and self.ctx.caches.live_pods_of_job(uid):
                if obj is not None and uid == job_uid and not wls.is_deleting(obj):
                    waiting = True
                    # Deleted by hand while its object runs: stop the object so its pods go.
                    self.suspend(self.wrap(obj))
                retry = LEAVING_RETRY_SECONDS
                continue
            job = self.wrap(obj) if obj is not None and uid == job_uid else None
            if job is not None and wls.has_quota(wl) and job.is_suspended():
                # It ran under this Workload: take the flavors out before it queues again.
                self._update_object(job, lambda j: j.restore() if j.is_suspended() else False)
            self.ctx.release_workload(wl, "workload")
        return retry, waiting

    def _let_go(self, wl: Obj, unlabelled: Obj | None) -> None:
        """Delete a Workload whose object left Muster. An object that only lost its queue
        label (`unlabelled`) gets its template back and stays as it is, suspended or not:
        it is its user's now, and adding the label again queues it afresh."""
        if unlabelled is not None:
            wrap = self.wrap

            def restore(o: Obj) -> bool:
                job = wrap(o)
                return job.restore() if job.is_suspended() else False

            # No cache: the Jobs cache holds labelled Jobs only.
            apply.update(
                self.ctx.kube,
                self.integration.kind,
                object_key(unlabelled),
                restore,
                current=unlabelled,
            )
            self.ctx.events.emit(
                unlabelled,
                "Normal",
                "LeftQueue",
                f"not queued any more (queue label removed, or its namespace no longer managed): "
                f"Workload {wl['metadata']['name']} deleted; its quota is "
                "released once the Job's pods are gone",
            )
        # Not forgotten from the cache: the finalizer keeps it, and the watch brings it back
        # with its deletion time; until then it must go on counting what it holds.
        apply.delete(self.ctx.kube, WORKLOAD, wl)
        self.ctx.poke_admission()

    def _keep_finalizers(self, owned: list[Obj]) -> None:
        """Active Workloads hold the finalizer (those created before it existed get it);
        finished ones, whose quota is released already, let it go, so that deleting them
        never waits on this controller."""

        def mutate(w: Obj) -> bool:
            return not wls.is_deleting(w) and wls.set_finalizer(w, wls.is_active(w))

        for wl in owned:
            if wls.is_active(wl) != wls.holds_finalizer(wl):
                self.update_workload(wl, mutate)

    def _finish_all(self, active: list[Obj], reason: str, message: str) -> None:
        for wl in active:
            now = self.ctx.now()

            def finish(w: Obj, t: datetime = now) -> bool:
                return wls.mark_finished(w, reason, message, t)

            written = self.update_workload(wl, finish, status=True)
            if written is not None and wls.is_finished(written):
                self.ctx.events.emit(written, "Normal", "Finished", f"{message}; quota released")
                self.ctx.poke_admission()

    def new_workload(self, job: GenericJob, spec: Obj, name: str) -> Obj:
        obj = job.object
        owner = (self.integration.api_version, self.integration.kind.name)
        body = wls.new_workload(name, obj["metadata"]["namespace"], obj, spec, owner)
        created, fresh = apply.create(
            self.ctx.kube, WORKLOAD, body, cache=self.ctx.caches.workloads
        )
        if fresh:
            self.ctx.events.emit(
                obj,
                "Normal",
                "CreatedWorkload",
                f"created Workload {name} for queue {spec.get('queueName')}",
            )
            self.ctx.poke_admission()
        return created

    def desired_spec(
        self,
        job: GenericJob,
        *,
        slice_name: str | None = None,
        replaces: str | None = None,
    ) -> Obj:
        """The Workload spec the object asks for; a slice also names itself and the slice
        it replaces."""
        values, default = priority_classes(self.ctx)
        queue = self.queue_of(job.object)
        if queue and queue != job.queue_name():
            # Unlabelled in a managed namespace: its Workload asks for the default queue.
            job = self.wrap(in_queue(job.object, queue))
        spec = job.workload_spec(values, global_default=default)
        if slice_name:
            spec["sliceName"] = slice_name
        if replaces:
            spec["replaces"] = replaces
        return spec

    def _reconcile_plain(
        self, job: GenericJob, active: list[Obj], owned: list[Obj]
    ) -> float | None:
        meta = job.object["metadata"]
        name = wls.workload_name(meta["name"], meta["uid"])
        wl = next((w for w in active if w["metadata"]["name"] == name), None)
        if wl is None and any(w["metadata"]["name"] == name for w in owned):
            return None  # finished for good; the object finishing will follow
        try:
            desired = self.desired_spec(job)
        except ValueError as error:  # ManifestError: says which field of the object, and why
            self.ctx.events.emit(job.object, "Warning", "InvalidJob", str(error)[:1000])
            return None
        if wl is None:
            self.suspend(job)
            self.new_workload(job, desired, name)
            return None
        return self.drive(job, wl, desired)

    def drive(self, job: GenericJob, wl: Obj, desired: Obj | None) -> float | None:
        """Carry a single Workload's state over to its object (shared by plain and elastic)."""
        if wls.owner_annotations(job.object) != wls.owner_annotations(wl):
            # Its checkpoint time moved: the next cycle's victim order reads it off the Workload.
            wl = (
                self.update_workload(wl, lambda w: wls.follow_owner_annotations(w, job.object))
                or wl
            )
        if not wls.has_quota(wl):
            if desired is not None and not same_request(wl.get("spec") or {}, desired):
                self.update_workload_spec(wl, desired)
            self.suspend(job)
            return None
        if wls.is_evicted(wl):
            return self.stop(job, wl)
        outgrown = None if job.is_elastic() else self._outgrown(job, wl, desired)
        if outgrown is not None:
            # As Kueue does: evicted, and queued again at the size it asks for now.
            now = self.ctx.now()
            written = self.update_workload(
                wl, lambda w: wls.mark_evicted(w, WC.JOB_RESIZED, outgrown, now), status=True
            )
            if written is not None and wls.is_evicted(written):
                self.ctx.events.emit(job.object, "Warning", WC.JOB_RESIZED, outgrown)
                return self.stop(job, written)
            return None
        if job.is_suspended() and not awaits_manager(job.object):
            self.start(job, wl)
        return None

    @staticmethod
    def _outgrown(job: GenericJob, wl: Obj, desired: Obj | None) -> str | None:
        """Why an admitted, non-elastic object no longer fits its admission, or None: it
        runs more pods than were admitted, or (not started yet) asks for another size."""
        granted = granted_pods(wl)
        if not job.is_suspended():
            for pod_set, count in job.pod_counts().items():
                if count > granted.get(pod_set, 0):
                    return (
                        f"resized while running: pod set {pod_set} asks for {count} pods, "
                        f"{granted.get(pod_set, 0)} admitted; queued again at the new size "
                        f'(annotation {ELASTIC_ANNOTATION}: "true" resizes without this)'
                    )
            return None
        if desired is None:
            return None
        asked = {ps.get("name"): ps.get("count") for ps in desired.get("podSets") or []}
        admitted = {ps.get("name"): ps.get("count") for ps in wl["spec"].get("podSets") or []}
        if asked != admitted:
            return f"resized after admission (pods {admitted} -> {asked}); queued again"
        return None

    def update_workload_spec(self, wl: Obj, desired: Obj) -> Obj | None:
        def mutate(w: Obj) -> bool:
            if wls.has_quota(w) or wls.is_finished(w):
                return False  # admitted meanwhile: the spec is what was admitted
            if same_request(w.get("spec") or {}, desired):
                return False
            w["spec"] = desired
            return True

        return self.update_workload(wl, mutate)

    def suspend(self, job: GenericJob) -> Obj | None:
        """Suspend an object that runs without admission (created while the webhook was
        down, or evicted); elastic objects also get their pods held back if they never
        started."""

        def mutate(j: GenericJob) -> bool:
            changed = j.suspend()
            if j.is_elastic():
                changed |= j.hold_pods()
            return changed

        before = job.is_suspended()
        written = self._update_object(job, mutate)
        if written is not None and not before and self._suspended(written):
            self.ctx.events.emit(
                job.object, "Normal", "Suspended", "suspended until admitted by Muster"
            )
        return written

    def start(self, job: GenericJob, wl: Obj) -> Obj | None:
        """Admitted: run the object on the assigned flavors and unsuspend it."""
        flavors = self._flavor_objects(wl)
        granted = granted_pods(wl)

        def mutate(j: GenericJob) -> bool:
            if not j.is_suspended():
                return False
            j.run_with(flavors, granted)
            return True

        written = self._update_object(job, mutate)
        if written is not None and not self._suspended(written):
            admission = (wl.get("status") or {}).get("admission") or {}
            names = ", ".join(f["metadata"]["name"] for f in flavors) or "no flavor"
            self.ctx.events.emit(
                job.object,
                "Normal",
                "Started",
                f"admitted by ClusterQueue {admission.get('clusterQueue')} on {names}; unsuspended",
            )
        return written

    def stop(self, job: GenericJob, wl: Obj) -> float | None:
        """Evicted: suspend, wait for the pods to go, restore the template, release quota."""
        if not job.is_suspended():
            evicted = wls.condition(wl, wls.EVICTED) or {}
            written = self._update_object(job, lambda j: j.suspend())
            if written is not None:
                self.ctx.events.emit(
                    job.object,
                    "Warning",
                    "Stopped",
                    f"suspended: {evicted.get('message') or 'evicted'}",
                )
            return None
        if not job.pods_gone():
            return None  # the object's status change will bring us back
        self._update_object(job, lambda j: j.restore() if j.is_suspended() else False)
        now = self.ctx.now()
        written = self.update_workload(wl, lambda w: wls.release_quota(w, now), status=True)
        if written is not None:
            requeued = wls.condition(written, wls.REQUEUED) or {}
            self.ctx.events.emit(written, "Normal", "Requeued", str(requeued.get("message")))
            self.ctx.poke_admission()
            when = wls.requeue_at(written)
            if when is not None:
                return max(0.0, (when - now).total_seconds())
        return None
