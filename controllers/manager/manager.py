"""The controller process: wires caches, reconcilers, the admission loop, the scheduler loop,
webhooks, the history store and leader election, and nothing else.

Every replica runs the caches and serves the webhooks; only the holder of the
coordination.k8s.io Lease reconciles Jobs, runs the admission and scheduler loops (so only
it binds pods) and writes. SIGTERM or SIGINT stops the workers, releases the Lease (so a
standby takes over at once) and exits.
Every replica also runs the history store (`controllers/history/store.py`), which never holds
the controller up; the leader feeds it (`controllers/history/feed.py`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controllers.admission.loop import AdmissionLoop
from controllers.history.feed import HistoryFeed
from controllers.history.jobs import QueueReading
from controllers.history.store import HistoryStore, queue_readings
from controllers.jobs.orphans import OrphanSweeper
from controllers.jobs.ownerevents import OwnerEventRecorder
from controllers.manager.integrations import Integrations
from controllers.manager.namespaces import ManagedNamespaces
from controllers.manager.options import Options
from controllers.metrics.collector import Sources, StateCollector
from controllers.metrics.definitions import REGISTRY
from controllers.metrics.server import MetricsServer
from controllers.metrics.workloads import WorkloadCounters
from controllers.multicluster.dispatcher import Dispatcher
from controllers.owners.intake import OwnerGroups
from controllers.podgroups.intake import PodGroupIntake
from controllers.runtime.client import FencedKube
from controllers.runtime.gcpause import freeze_startup_heap
from controllers.runtime.informer import Informer, wait_all_synced
from controllers.runtime.leader import LeaderElector, lease_request_timeout
from controllers.runtime.resources import JOB, NAMESPACE, WORKER_CLUSTER, Kube, Obj, object_key
from controllers.scheduler.loop import SchedulerLoop
from controllers.scheduler.pods import node_of, placement_inputs
from controllers.state.caches import Caches, Context, Recorder, served
from controllers.state.changes import decision_inputs, node_shape
from controllers.webhooks.serving import WebhookServing, WebhookSettings

log = logging.getLogger("muster.controller")


class Manager:
    """Wires caches, reconcilers, the admission loop, webhooks and leader election."""

    def __init__(
        self,
        api: client.ApiClient,
        options: Options,
        *,
        recorder: Recorder | None = None,
    ) -> None:
        self.options = options
        self.kube = Kube(api)
        self.identity = options.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.stop_event = threading.Event()
        self.exit_code = 0
        self.caches = Caches.create(self.kube)
        self.managed = ManagedNamespaces(self.caches.namespaces, options.managed_namespace_selector)
        if self.managed.enabled:
            # Unlabelled Jobs are queued too in managed namespaces: watch every Job.
            self.caches = replace(self.caches, jobs=Informer(self.kube, JOB))
        # Workload Events an owner takes reach it too, whatever its kind.
        self.events = OwnerEventRecorder(self.kube if options.events else None, self.identity)
        self.history: HistoryStore | None = None
        if recorder is None and options.history is not None:
            self.history = HistoryStore(options.history)
            recorder = self.history
        self.elector: LeaderElector | None = None
        leader_kube: Kube = self.kube
        if options.leader_elect:
            self.elector = LeaderElector(
                Kube(
                    api,
                    request_timeout=lease_request_timeout(
                        options.renew_deadline, options.retry_period
                    ),
                ),
                options.namespace,
                options.lease_name,
                self.identity,
                lease_duration=options.lease_duration,
                renew_deadline=options.renew_deadline,
                retry_period=options.retry_period,
                on_started_leading=self._started_leading,
                on_stopped_leading=self._stopped_leading,
            )
            # Everything only the leader does writes through the fence (issue 16, hole 6).
            leader_kube = FencedKube(api, self.elector.leadership_left)
        self.ctx = Context(
            kube=leader_kube,
            caches=self.caches,
            events=self.events,
            identity=self.identity,
            recorder=recorder,
        )
        self.loop = AdmissionLoop(
            self.ctx,
            status_interval=options.status_interval,
            status_max_interval=options.status_max_interval,
            hold_timeout_s=options.preemption_hold_timeout,
            usage=self.history.usage if self.history is not None else None,
            busy=self.history.busy if self.history is not None else None,
        )
        self.ctx.poke_admission = self.loop.poke
        # No scheduler name: kube-scheduler places every pod, as before Muster had a scheduler.
        self.scheduler: SchedulerLoop | None = None
        if options.scheduler_name:
            self.scheduler = SchedulerLoop(
                self.ctx,
                scheduler_name=options.scheduler_name,
                bind_workers=options.bind_workers,
                bind_qps=options.bind_qps,
                status_interval=options.status_interval,
                status_max_interval=options.status_max_interval,
                hold_timeout_s=options.preemption_hold_timeout,
            )
        # Foreign PodGroups (Volcano's, the native API's) are Muster's only when it places
        # pods: their pods name its scheduler, and nothing else would hold them.
        self.intake: PodGroupIntake | None = None
        if options.scheduler_name:
            self.intake = PodGroupIntake(
                self.ctx, self.kube, options.scheduler_name, self.is_leader, self.stop_event
            )
        # Pods queued by their owner (LeaderWorkerSets, Deployments, StatefulSets, any other
        # owner): gated by Muster's pod admission whether or not its scheduler places them.
        self.owner_groups = OwnerGroups(self.ctx, self.kube, self.is_leader, self.stop_event)
        # The workload kinds (Jobs; JobSet, TrainJob only where their CRDs are served).
        self.integrations = Integrations(
            self.ctx, self.kube, self.is_leader, self.stop_event, self.managed
        )
        self.orphans = OrphanSweeper(self.ctx, self.is_leader)
        # Many clusters: only where the WorkerCluster CRD is served (docs/multicluster.md).
        self.dispatcher: Dispatcher | None = None
        if served(self.kube, WORKER_CLUSTER):
            self.dispatcher = Dispatcher(
                self.ctx, Informer(self.kube, WORKER_CLUSTER), options.namespace
            )
            self.loop.views.remote_capacity = self.dispatcher.capacity
        self.feed = HistoryFeed(self.ctx, self.is_leader)
        settings = WebhookSettings(
            namespace=options.namespace,
            port=options.webhook_port,
            host=options.webhook_host,
            bind=options.webhook_bind,
            service=options.webhook_service,
            service_port=options.webhook_service_port,
            cert_secret=options.cert_secret,
            certs=options.webhook_certs,
            enabled=options.webhooks,
            scheduler_name=options.scheduler_name,
            job_admission=options.job_admission,
            managed_namespace_selector=self.managed.selector,
        )
        self.webhooks = WebhookServing(self.kube, settings, self.caches, self.is_leader)
        self._threads: list[threading.Thread] = []
        self._was_leader = False
        self.metrics: MetricsServer | None = None
        self._collector = StateCollector(
            Sources(self.caches, self.is_leader, history=self._history_figures)
        )

    # ------------------------------------------------------------------ health
    def _history_figures(self) -> tuple[int, int, bool] | None:
        recorder = self.history.recorder if self.history is not None else None
        if recorder is None:
            return None
        return recorder.backlog, recorder.spooled, recorder.database_up

    def _readiness(self) -> dict[str, Callable[[], str | None]]:
        """What /readyz checks: each None when fine, else why not."""

        def caches() -> str | None:
            waiting = [i.name for i in self.caches.all() if not i.synced]
            return f"informers not synced: {', '.join(waiting)}" if waiting else None

        def certificate() -> str | None:
            certs = self.webhooks.certs
            if not self.options.webhooks or (certs is not None and certs.current is not None):
                return None
            return "webhook serving certificate not loaded yet"

        def history() -> str | None:
            recorder = self.history.recorder if self.history is not None else None
            if self.history is None or (recorder is not None and recorder.database_up):
                return None
            if recorder is not None and os.access(recorder.spool_dir, os.W_OK):
                return None  # the database is down, and records wait in the spool
            return "history database unreachable and its spool directory not writable"

        return {"caches": caches, "certificate": certificate, "history": history}

    # ------------------------------------------------------------------ leadership
    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else True

    def _started_leading(self) -> None:
        self._was_leader = True
        self.feed.start_recording()
        self.webhooks.register()
        self.integrations.requeue_all()
        if self.intake is not None:
            for key in self.intake.group_ids():
                self.intake.queue.add(key)
        for key in self.owner_groups.group_ids():
            self.owner_groups.queue.add(key)
        self.loop.poke()
        self._poke_scheduler()

    def _stopped_leading(self) -> None:
        if self.stop_event.is_set():
            return
        # Another replica may be leading now; the safe course (as client-go's) is to stop
        # and let the supervisor start us again as a standby.
        log.error("leadership lost; exiting so that only one replica acts")
        self.exit_code = 1
        self.stop_event.set()

    def _history_readings(self) -> list[QueueReading]:
        # Standbys run no cycles; a leader samples its last cycle's figures.
        return queue_readings(self.loop.last_fair_share) if self.is_leader() else []

    def _poke_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.poke()

    # --------------------------------------------------------------------- wiring
    def _wire(self) -> None:
        loop, poke_scheduler = self.loop, self._poke_scheduler
        integrations = self.integrations

        dispatcher = self.dispatcher

        def on_workload(kind: str, old: Obj | None, new: Obj | None) -> None:
            # A Workload's own pending message changing (which the loop itself writes)
            # changes nothing anyone decides from; skipping it avoids a cycle per write.
            if old is not None and new is not None and decision_inputs(old) == decision_inputs(new):
                return
            integrations.on_workload(new or old or {})
            # A decision's own write landing as assumed: the cycles since already saw it.
            if old is None or new is None or not loop.lands_as_assumed(object_key(new), new):
                loop.poke()
            poke_scheduler()
            if dispatcher is not None:
                dispatcher.poke()

        def on_node_pod(kind: str, old: Obj | None, new: Obj | None) -> None:
            # Status heartbeats change no placement; binding, gates, deletion and finishing do.
            if placement_inputs(old) == placement_inputs(new):
                return
            poke_scheduler()
            # Room on a node was taken or freed: the admission cycle plans with it, when
            # something waits for room.
            if loop.room_matters() and (
                (old is not None and node_of(old)) or (new is not None and node_of(new))
            ):
                loop.poke()

        def on_queue_object(kind: str, old: Obj | None, new: Obj | None) -> None:
            loop.poke()

        def on_node(kind: str, old: Obj | None, new: Obj | None) -> None:
            # Heartbeats change nothing the engine reads; capacity, labels and readiness do.
            if old is None or new is None or node_shape(old) != node_shape(new):
                loop.poke()
                poke_scheduler()

        self.caches.workloads.add_handler(on_workload)
        if self.ctx.recorder is not None:
            self.caches.workloads.add_handler(self.feed.on_workload)
        counters = WorkloadCounters(self.caches.local_queues, self.is_leader)
        self.caches.workloads.add_handler(counters.on_workload)
        self.caches.node_pods.add_handler(on_node_pod)
        for informer in (
            self.caches.cluster_queues,
            self.caches.local_queues,
            self.caches.flavors,
            self.caches.topologies,  # the levels a flavor's gangs are placed in
            self.caches.namespaces,  # their labels decide which LocalQueues are active
        ):
            informer.add_handler(on_queue_object)
        self.caches.nodes.add_handler(on_node)
        if self.managed.enabled:

            def on_namespace(kind: str, old: Obj | None, new: Obj | None) -> None:
                # Labelled into or out of the selector: its objects are queued afresh, or let
                # go. (A new namespace has no objects yet, a deleted one none left, and the
                # leader looks at every object when it starts.)
                if old is None or new is None:
                    return
                if old["metadata"].get("labels") != new["metadata"].get("labels"):
                    integrations.requeue_all(new["metadata"]["name"])

            self.caches.namespaces.add_handler(on_namespace)

    def _spawn(self, name: str, target: Callable[[], Any]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _ensure_namespace(self) -> None:
        try:
            self.kube.create(
                NAMESPACE,
                None,
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": self.options.namespace},
                },
            )
            log.info("created namespace", extra={"namespace": self.options.namespace})
        except ApiException as error:
            if error.status not in (409, 403):
                raise

    # ------------------------------------------------------------------------ run
    def start(self) -> None:
        """Start everything and return (the process's main thread waits on `stop_event`)."""
        log.info(
            "starting",
            extra={"identity": self.identity, "leader_elect": self.options.leader_elect},
        )
        if self.options.metrics_port is not None:
            self.metrics = MetricsServer(
                self.options.metrics_bind, self.options.metrics_port, self._readiness()
            )
            REGISTRY.register(self._collector)
            self.metrics.start()
        if self.history is not None:
            self.history.start(sampler=self._history_readings)
        self._ensure_namespace()
        if self.options.webhooks:
            self.webhooks.start(self._spawn, self.stop_event)
        kinds = self.integrations.discover(self.caches)
        self._wire()
        self.integrations.wire()
        owner_kinds = self.owner_groups.discover()
        self.owner_groups.wire()
        for informer in self.owner_groups.informer_list():
            informer.start()
        foreign = self.intake.discover() if self.intake is not None else []
        if self.intake is not None:
            self.intake.wire()
            for informer in self.intake.informer_list():
                informer.start()
        self.caches.start()
        self.events.start()
        try:
            self.caches.wait_synced(120)
            if self.intake is not None:
                wait_all_synced(self.intake.informer_list(), 120)
            wait_all_synced(self.owner_groups.informer_list(), 120)
        except TimeoutError as error:
            raise RuntimeError(
                f"{error}; are Muster's CRDs installed (kubectl apply --server-side -f crds/) "
                "and may this identity list and watch them?"
            ) from error
        freeze_startup_heap()
        log.info(
            "caches synced",
            extra={
                "jobs": len(self.caches.jobs),
                "podgroup_apis": foreign,
                "kinds": kinds,
                "owner_kinds": owner_kinds,
            },
        )
        self.loop.start_writers(self.is_leader)
        self.integrations.start_workers(
            self._spawn, self.options.resync_period, self.options.workers
        )
        intake = self.intake
        if intake is not None:
            for i in range(max(1, self.options.workers // 2)):
                self._spawn(f"worker-podgroup-{i}", intake.workers.work)
            self._spawn(
                "resync-podgroups",
                lambda: intake.workers.resync(self.options.resync_period, intake.group_ids),
            )
        owner_groups = self.owner_groups
        for i in range(max(1, self.options.workers // 2)):
            self._spawn(f"worker-owner-group-{i}", owner_groups.workers.work)
        self._spawn(
            "resync-owner-groups",
            lambda: owner_groups.workers.resync(self.options.resync_period, owner_groups.group_ids),
        )
        self._spawn("admission-loop", lambda: self.loop.run(self.stop_event, self.is_leader))
        self._spawn("orphaned-workloads", lambda: self.orphans.run(self.stop_event))
        dispatcher = self.dispatcher
        if dispatcher is not None:
            dispatcher.clusters.start()
            self._spawn("dispatcher", lambda: dispatcher.run(self.stop_event, self.is_leader))
        scheduler = self.scheduler
        if scheduler is not None:
            scheduler.start_writers(self.is_leader)
            self._spawn("scheduler-loop", lambda: scheduler.run(self.stop_event, self.is_leader))
        if self.elector is not None:
            self._spawn(
                "leader-election",
                lambda: self.elector.run(self.stop_event) if self.elector else None,
            )
        else:
            self._started_leading()

    def shutdown(self) -> None:
        """Stop acting, give up the Lease, stop serving."""
        log.info("shutting down", extra={"identity": self.identity})
        self.stop_event.set()
        self.feed.stop_recording()
        self.integrations.shutdown()
        if self.intake is not None:
            self.intake.queue.shutdown()
        self.owner_groups.queue.shutdown()
        for thread in self._threads:
            if thread.name.startswith(
                ("worker", "admission-loop", "scheduler-loop", "leader-election")
            ):
                thread.join(timeout=10)
        self.loop.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.elector is not None:
            self.elector.release()
        self.webhooks.stop(registered=self._was_leader)
        if self.history is not None:
            # After the loop and the workers (their last records are in the recorder by now)
            # and after the Lease is released, so a standby does not wait for the drain.
            self.history.close()
        self.caches.stop()
        if self.intake is not None:
            for informer in self.intake.informer_list():
                informer.stop()
        for informer in self.owner_groups.informer_list():
            informer.stop()
        if self.dispatcher is not None:
            # Its worker clusters' informers stop with its loop; its WorkerCluster one here.
            self.dispatcher.clusters.stop()
        self.events.stop()
        if self.metrics is not None:
            self.metrics.stop()
            REGISTRY.unregister(self._collector)
        log.info("stopped", extra={"identity": self.identity})


def run_manager(manager: Manager) -> int:
    """Run until SIGTERM/SIGINT (or lost leadership); returns the exit code."""

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal received", extra={"signal": signal.Signals(signum).name})
        manager.stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        manager.start()
    except Exception:
        log.exception("startup failed")
        manager.shutdown()
        return 1
    while not manager.stop_event.wait(1.0):
        pass
    manager.shutdown()
    return manager.exit_code
