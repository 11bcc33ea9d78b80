"""The workload kinds behind the seam (`controllers.jobs.kinds`), each run by the shared
reconciler with a work queue and workers of its own. A kind of a CRD (JobSet, TrainJob) is
watched, reconciled and queued only when the apiserver serves its CRD and what it reads, so
a cluster without JobSet or Kubeflow Trainer runs Muster as before; a CRD installed later
is picked up on restart. Built-in kinds (batch Jobs) are watched by the core caches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from controllers.jobs.framework import Integration, owner_of
from controllers.jobs.kinds import KINDS
from controllers.jobs.reconciler import Reconciler
from controllers.manager.namespaces import ManagedNamespaces
from controllers.runtime.informer import Informer
from controllers.runtime.resources import Kube, Obj, object_key
from controllers.runtime.workers import WorkerPool
from controllers.runtime.workqueue import WorkQueue
from controllers.state.caches import Caches, Context, served
from quota.api.names import QUEUE_LABEL

log = logging.getLogger(__name__)


@dataclass
class Running:
    """One served kind: its reconciler, work queue and workers."""

    integration: Integration
    reconciler: Reconciler
    queue: WorkQueue[str]
    workers: WorkerPool

    @property
    def informer(self) -> Informer:
        return self.integration.informer(self.reconciler.ctx.caches)


class Integrations:
    """Discovers which kinds are served, adds their informers to the caches, and runs one
    reconciler per kind."""

    def __init__(
        self,
        ctx: Context,
        kube: Kube,
        is_leader: Callable[[], bool],
        stop_event: threading.Event,
        managed: ManagedNamespaces,
        watch_timeout: int = 300,
    ) -> None:
        self.ctx = ctx
        # In managed namespaces unlabelled objects are queued too, so all are watched.
        self.managed = managed
        self.kube = kube
        self.is_leader = is_leader
        self.stop_event = stop_event
        self.watch_timeout = watch_timeout
        self.running: list[Running] = []

    def discover(self, caches: Caches) -> list[str]:
        """Add informers (to `caches.extra`) for every served kind and what it reads; return
        the names of the kinds integrated."""
        for integration in KINDS:
            if not integration.builtin and not self._watch(caches, integration):
                continue
            queue: WorkQueue[str] = WorkQueue(integration.plural)
            reconciler = Reconciler(self.ctx, integration, self.managed)
            workers = WorkerPool(
                integration.kind.name.lower(),
                queue,
                reconciler.reconcile,
                self.is_leader,
                self.stop_event,
            )
            self.running.append(Running(integration, reconciler, queue, workers))
        return [r.integration.name for r in self.running]

    def _watch(self, caches: Caches, integration: Integration) -> bool:
        """Add informers for a kind of a CRD and what it reads, if all are served."""
        if not all(served(self.kube, k) for k in (integration.kind, *integration.reads)):
            log.info(
                "workload kind not integrated (CRD not served)", extra={"kind": integration.name}
            )
            return False
        caches.add_extra(
            Informer(
                self.kube,
                integration.kind,
                label_selector=None if self.managed.enabled else QUEUE_LABEL,
                watch_timeout=self.watch_timeout,
                name=integration.kind.plural,
            ),
        )
        for kind in integration.reads:
            if caches.extra_of(kind) is None:
                caches.add_extra(
                    Informer(self.kube, kind, watch_timeout=self.watch_timeout, name=kind.plural)
                )
        return True

    def wire(self) -> None:
        """Queue an object when it, what it reads, or (for kinds that say how) one of its
        pods changes; Workloads are `on_workload`."""

        def on_pod(kind: str, old: Obj | None, new: Obj | None) -> None:
            pod = new or old or {}
            for running in self.running:
                owner = running.integration.owner_of_pod
                key = owner(pod) if owner is not None else None
                if key:
                    running.queue.add(key)

        self.ctx.caches.pods.add_handler(on_pod)
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

                informer = self.ctx.caches.extra_of(kind)
                assert informer is not None  # added by `discover` with its kind
                informer.add_handler(on_read)

    def on_workload(self, wl: Obj) -> None:
        """Queue the object a Workload belongs to, if it is of one of these kinds."""
        found = owner_of(wl)
        if found is None:
            return
        for running in self.running:
            if running.integration is found[0]:
                running.queue.add(found[1])

    def requeue_all(self, namespace: str | None = None) -> None:
        """Queue every object (of `namespace` only, if given)."""
        for running in self.running:
            for key in running.informer.list_keys():
                if namespace is None or key.startswith(f"{namespace}/"):
                    running.queue.add(key)

    def start_workers(
        self,
        spawn: Callable[[str, Callable[[], object]], None],
        resync_period: float,
        workers: int,
    ) -> None:
        for running in self.running:
            name = running.integration.kind.name.lower()
            for i in range(workers):
                spawn(f"worker-{name}-{i}", running.workers.work)
            spawn(
                f"resync-{name}",
                lambda r=running: r.workers.resync(resync_period, r.informer.list_keys),
            )

    def shutdown(self) -> None:
        for running in self.running:
            running.queue.shutdown()
