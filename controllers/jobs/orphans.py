"""Workloads whose object was deleted with `--cascade=orphan`.

Deleting a Job (or a JobSet, a TrainJob) with orphan propagation makes the garbage collector
strip the ownerReferences from everything it owned instead of deleting it: the pods go on
running, unowned, and so does the Workload — which then belongs to no object the reconciler
watches, and would hold its quota forever. Muster treats such a Workload as its object
leaving: it is deleted, its finalizer keeps it (and its quota) while the orphaned pods run —
they still occupy their nodes — and lets it go once none of them runs or terminates.

A Workload is recognised by the label the reconciler puts on every Workload it creates
(`muster.dev/job-uid`, which the pods are indexed by) and by having no ownerReferences
left; Workloads written by hand carry no such label and are never touched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from controllers.runtime import apply
from controllers.runtime.resources import WORKLOAD, Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.names import JOB_UID_LABEL

log = logging.getLogger(__name__)

SWEEP_SECONDS = 5.0


def orphaned_uid(wl: Obj) -> str | None:
    """The uid of the deleted object an orphaned Workload belonged to, or None if it is not
    one (it has an owner, or Muster did not create it for an object)."""
    meta: dict[str, Any] = wl.get("metadata") or {}
    uid = (meta.get("labels") or {}).get(JOB_UID_LABEL)
    if not uid or meta.get("ownerReferences"):
        return None
    return str(uid)


class OrphanSweeper:
    """Deletes orphaned Workloads and releases them once their object's pods are gone."""

    def __init__(self, ctx: Context, is_leader: Callable[[], bool]) -> None:
        self.ctx = ctx
        self.is_leader = is_leader

    def sweep(self) -> int:
        """One pass over the cached Workloads; returns how many it wrote."""
        writes = 0
        for wl in self.ctx.caches.workloads.objects():
            uid = orphaned_uid(wl)
            if uid is None:
                continue
            if not wls.is_deleting(wl):
                log.info(
                    "workload orphaned: its object was deleted", extra={"workload": object_key(wl)}
                )
                # Not forgotten from the cache: the finalizer keeps it counting what it holds.
                apply.delete(self.ctx.kube, WORKLOAD, wl)
                writes += 1
            elif wls.holds_finalizer(wl) and not self.ctx.caches.live_pods_of_job(uid):
                self.ctx.release_workload(wl, "orphaned workload")
                writes += 1
        if writes:
            self.ctx.poke_admission()  # deleting an orphan changes nothing it counts yet
        return writes

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(SWEEP_SECONDS):
            if not self.is_leader():
                continue
            try:
                self.sweep()
            except Exception:  # one failed pass must not end the sweeper; the next retries
                log.exception("orphaned workload sweep failed")
