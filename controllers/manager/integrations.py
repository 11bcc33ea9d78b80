"""The workload kinds behind the seam beyond batch Jobs (JobSet, TrainJob): each is watched,
reconciled and queued only when the apiserver serves its CRD, so a cluster without JobSet
or Kubeflow Trainer runs Muster as before. A CRD installed later is picked up on restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

# Imported for their registration with the seam (`framework.register`).
from controllers.jobs import jobset as _jobset  # noqa: F401
from controllers.jobs import trainjob as _trainjob  # noqa: F401
from controllers.jobs.batchjob import BATCH_JOB
from controllers.jobs.framework import Integration, integrations, owner_of
from controllers.jobs.reconciler import Reconciler
from controllers.runtime.informer import Informer
from controllers.runtime.resources import Kind, Kube, Obj, object_key
from controllers.runtime.workers import WorkerPool
from controllers.runtime.workqueue import WorkQueue
from controllers.state.caches import Caches, Context
from quota.api.names import QUEUE_LABEL

log = logging.getLogger(__name__)


def extra_name(kind: Kind) -> str:
    """The name an informer of `kind` has in `Caches.extra` (an Integration's name for its
    own kind)."""
    return f"{kind.group}/{kind.version}/{kind.name}"


def served(kube: Kube, kind: Kind) -> bool:
    try:
        kube.list_page(kind, limit=1)
    except ApiException as error:
        if error.status in (404, 403):
            return False
        raise
    return True


@dataclass
class Running:
    """One served kind: its reconciler, work queue and workers."""

    integration: Integration
    reconciler: Reconciler
    queue: WorkQueue[str]
    workers: WorkerPool

    @property
    def informer(self) -> Informer:
        return self.integration.cache(self.reconciler.ctx.caches)


class Integrations:
    """Discovers which extra kinds are served, adds their informers to the caches, and runs
    one reconciler per kind."""

    def __init__(
        self,
        ctx: Context,
        kube: Kube,
        is_leader: Callable[[], bool],
        stop_event: threading.Event,
        watch_timeout: int = 300,
    ) -> None:
        self.ctx = ctx
        self.kube = kube
        self.is_leader = is_leader
        self.stop_event = stop_event
        self.watch_timeout = watch_timeout
        self.running: list[Running] = []

    def discover(self, caches: Caches) -> list[str]:
        """Add informers (to `caches.extra`) for every served kind and what it reads; return
        the names of the kinds integrated."""
        for integration in integrations():
            if integration is BATCH_JOB:
                continue
            if not served(self.kube, integration.kind) or not all(
                served(self.kube, k) for k in integration.reads
            ):
                log.info(
                    "workload kind not integrated (CRD not served)",
                    extra={"kind": integration.name},
                )
                continue
            caches.add_extra(
                integration.name,
                Informer(
                    self.kube,
                    integration.kind,
                    label_selector=QUEUE_LABEL,
                    watch_timeout=self.watch_timeout,
                    name=integration.kind.plural,
                ),
            )
            for kind in integration.reads:
                if extra_name(kind) not in caches.extra:
                    caches.add_extra(
                        extra_name(kind),
                        Informer(
                            self.kube, kind, watch_timeout=self.watch_timeout, name=kind.plural
                        ),
                    )
            queue: WorkQueue[str] = WorkQueue(integration.kind.plural)
            reconciler = Reconciler(self.ctx, integration)
            workers = WorkerPool(
                integration.kind.name.lower(),
                queue,
                reconciler.reconcile,
                self.is_leader,
                self.stop_event,
            )
            self.running.append(Running(integration, reconciler, queue, workers))
        return [r.integration.name for r in self.running]

    def wire(self) -> None:
        for running in self.running:
            queue = running.queue

            def on_object(
                kind: str, old: Obj | None, new: Obj | None, q: WorkQueue[str] = queue
            ) -> None:
                q.add(object_key(new or old or {}))

            running.informer.add_handler(on_object)
            for kind in running.integration.reads:
                # A TrainJob's runtime created or changed after it: look at its objects again
                # (one whose runtime was missing has no Workload yet).
                def on_read(
                    kind_: str, old: Obj | None, new: Obj | None, r: Running = running
                ) -> None:
                    for key in r.informer.list_keys():
                        r.queue.add(key)

                self.ctx.caches.extra[extra_name(kind)].add_handler(on_read)

    def on_workload(self, wl: Obj) -> None:
        """Queue the object a Workload belongs to, if it is of one of these kinds."""
        found = owner_of(wl)
        if found is None:
            return
        for running in self.running:
            if running.integration is found[0]:
                running.queue.add(found[1])

    def requeue_all(self) -> None:
        for running in self.running:
            for key in running.informer.list_keys():
                running.queue.add(key)

    def start_workers(
        self, spawn: Callable[[str, Callable[[], object]], None], resync_period: float
    ) -> None:
        for running in self.running:
            name = running.integration.kind.name.lower()
            spawn(f"worker-{name}", running.workers.work)
            spawn(
                f"resync-{name}",
                lambda r=running: r.workers.resync(resync_period, r.informer.list_keys),
            )

    def shutdown(self) -> None:
        for running in self.running:
            running.queue.shutdown()
