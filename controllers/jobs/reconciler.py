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
- finished: mark the Workload Finished, which releases its quota at once.

Elastic objects go through `controllers.jobs.slices` (and its gates) instead of resizing by
suspension; the slices call back into this reconciler through `framework.Driver`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from controllers.jobs import slices
from controllers.jobs.framework import GenericJob, Integration, same_request
from controllers.runtime import apply
from controllers.runtime.resources import WORKLOAD, Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Context

log = logging.getLogger(__name__)


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

    def __init__(self, ctx: Context, integration: Integration) -> None:
        self.ctx = ctx
        self.integration = integration

    # -- small writers
    def _update_object(self, job: GenericJob, mutate: Callable[[GenericJob], bool]) -> Obj | None:
        wrap = self.integration.wrap
        return apply.update(
            self.ctx.kube,
            self.integration.kind,
            object_key(job.object),
            lambda obj: mutate(wrap(obj)),
            cache=self.integration.cache(self.ctx.caches),
            current=job.object,
        )

    def _suspended(self, written: Obj) -> bool:
        return self.integration.wrap(written).is_suspended()

    def update_workload_status(self, wl: Obj, mutate: apply.Mutation) -> Obj | None:
        return apply.update(
            self.ctx.kube,
            WORKLOAD,
            object_key(wl),
            mutate,
            cache=self.ctx.caches.workloads,
            current=wl,
            status=True,
        )

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
        obj = self.integration.cache(self.ctx.caches).get(key)
        if obj is None:
            return None  # deleted: owner references take its Workloads with it
        job = self.integration.wrap(obj)
        if not job.queue_name():
            return None
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            return None
        uid = obj["metadata"]["uid"]
        owned = self.ctx.caches.workloads_of_job(uid)
        active = [w for w in owned if wls.is_active(w)]

        done = job.finished()
        if done is not None:
            self._finish_all(active, *done)
            return None
        if job.is_elastic():
            return slices.reconcile_elastic(self, job, owned)
        return self._reconcile_plain(job, active, owned)

    def _finish_all(self, active: list[Obj], reason: str, message: str) -> None:
        for wl in active:
            now = self.ctx.now()

            def finish(w: Obj, t: datetime = now) -> bool:
                return wls.mark_finished(w, reason, message, t)

            written = self.update_workload_status(wl, finish)
            if written is not None and wls.is_finished(written):
                self.ctx.events.emit(written, "Normal", "Finished", f"{message}; quota released")
                self.ctx.poke_admission()

    def new_workload(self, job: GenericJob, spec: Obj, name: str) -> Obj:
        obj = job.object
        body = wls.new_workload(name, obj["metadata"]["namespace"], obj, spec)
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
        count: int | None = None,
        slice_name: str | None = None,
        replaces: str | None = None,
    ) -> Obj:
        """The Workload spec the object asks for; a slice also names itself and the slice
        it replaces."""
        values, default = priority_classes(self.ctx)
        spec = job.workload_spec(values, global_default=default, count=count)
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
        if not wls.has_quota(wl):
            if desired is not None and not same_request(wl.get("spec") or {}, desired):
                self.update_workload_spec(wl, desired)
            self.suspend(job)
            return None
        if wls.is_evicted(wl):
            return self.stop(job, wl)
        if job.is_suspended():
            self.start(job, wl)
        return None

    def update_workload_spec(self, wl: Obj, desired: Obj) -> Obj | None:
        def mutate(w: Obj) -> bool:
            if wls.has_quota(w) or wls.is_finished(w):
                return False  # admitted meanwhile: the spec is what was admitted
            if same_request(w.get("spec") or {}, desired):
                return False
            w["spec"] = desired
            return True

        return apply.update(
            self.ctx.kube,
            WORKLOAD,
            object_key(wl),
            mutate,
            cache=self.ctx.caches.workloads,
            current=wl,
        )

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
        written = self.update_workload_status(wl, lambda w: wls.release_quota(w, now))
        if written is not None:
            requeued = wls.condition(written, wls.REQUEUED) or {}
            self.ctx.events.emit(written, "Normal", "Requeued", str(requeued.get("message")))
            self.ctx.poke_admission()
            when = wls.requeue_at(written)
            if when is not None:
                return max(0.0, (when - now).total_seconds())
        return None
