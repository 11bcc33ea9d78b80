"""`muster controller`: the process that admits queue-labelled Jobs under quota.

Every replica runs the caches and serves the webhooks; only the holder of the
coordination.k8s.io Lease reconciles Jobs, runs the admission loop and writes. SIGTERM or
SIGINT stops the workers, releases the Lease (so a standby takes over at once) and exits.
Logs are JSON, one object per line.

Every replica also runs the history store (`controllers/history/store.py`): it migrates the
schema, records and samples in the background and never holds the controller up. The leader
records what it decides (the admission loop) and what it sees happen to Workloads (created,
requeued, finished, from the Workload cache); on taking over, it replays what every Workload's
status shows, which the store keeps once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from controllers.admission.loop import AdmissionLoop
from controllers.history import transitions as history
from controllers.history.engine import DatabaseURLError, database_url
from controllers.history.jobs import QueueReading
from controllers.history.queries import parse_duration
from controllers.history.records import WorkloadTransition
from controllers.history.store import HistorySettings, HistoryStore, queue_readings
from controllers.history.usage import FairnessSettings
from controllers.jobs.batchjob import JobReconciler, job_key_of_workload
from controllers.runtime.apply import ConflictRetriesExhausted
from controllers.runtime.events import EventRecorder
from controllers.runtime.leader import LeaderElector
from controllers.runtime.resources import NAMESPACE, Kube, Obj, object_key
from controllers.runtime.workqueue import WorkQueue
from controllers.state.caches import Caches, Context, Recorder
from controllers.webhooks import server as webhooks
from controllers.webhooks.certs import CertBundle, CertManager

log = logging.getLogger("muster.controller")

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and every `extra` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The client logs every retry of a dropped watch at WARNING; our informer reports those.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    # The history store logs its own "ready" line with the schema revision; APScheduler would
    # log every run of every periodic job.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def api_client(kubeconfig: str | None, pool_size: int = 64) -> client.ApiClient:
    """An ApiClient from a kubeconfig, else in-cluster config, else the default kubeconfig."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    else:
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except config.ConfigException:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    # Watches hold a connection each; workers and the admission loop need their own.
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


@dataclass
class Options:
    namespace: str = "muster-system"
    webhook_port: int = 9443
    webhook_host: str = "127.0.0.1"
    webhook_bind: str | None = None
    webhook_service: str | None = None
    webhook_service_port: int = 443
    webhooks: bool = True
    leader_elect: bool = True
    lease_name: str = "muster-controller"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str | None = None
    workers: int = 4
    status_interval: float = 1.0
    resync_period: float = 300.0
    cert_secret: str = "muster-webhook-tls"
    events: bool = True
    # None: no history store (unless a recorder is passed to the Manager).
    history: HistorySettings | None = None


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
        self.events = EventRecorder(self.kube if options.events else None, self.identity)
        self.history: HistoryStore | None = None
        if recorder is None and options.history is not None:
            self.history = HistoryStore(options.history)
            recorder = self.history
        self.ctx = Context(
            kube=self.kube,
            caches=self.caches,
            events=self.events,
            identity=self.identity,
            recorder=recorder,
        )
        self.loop = AdmissionLoop(
            self.ctx,
            status_interval=options.status_interval,
            usage=self.history.usage if self.history is not None else None,
            busy=self.history.busy if self.history is not None else None,
        )
        self.ctx.poke_admission = self.loop.poke
        self.jobs = JobReconciler(self.ctx)
        self.queue: WorkQueue[str] = WorkQueue("jobs")
        self.elector: LeaderElector | None = None
        if options.leader_elect:
            self.elector = LeaderElector(
                self.kube,
                options.namespace,
                options.lease_name,
                self.identity,
                lease_duration=options.lease_duration,
                renew_deadline=options.renew_deadline,
                retry_period=options.retry_period,
                on_started_leading=self._started_leading,
                on_stopped_leading=self._stopped_leading,
            )
        self.certs: CertManager | None = None
        self.server: webhooks.WebhookServer | None = None
        self._threads: list[threading.Thread] = []
        self._was_leader = False
        # Set when leading: from then on Workload changes seen are recorded.
        self._recording = False

    # ------------------------------------------------------------------ leadership
    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else True

    def _started_leading(self) -> None:
        self._was_leader = True
        self._recording = self.ctx.recorder is not None
        self._replay_history()
        self._register_webhooks()
        for key in self.caches.jobs.list_keys():
            self.queue.add(key)
        self.loop.poke()

    def _stopped_leading(self) -> None:
        if self.stop_event.is_set():
            return
        # Another replica may be leading now; the safe course (as client-go's) is to stop
        # and let the supervisor start us again as a standby.
        log.error("leadership lost; exiting so that only one replica acts")
        self.exit_code = 1
        self.stop_event.set()

    # -------------------------------------------------------------------- history
    def _cluster_queue_of(self, wl: Obj) -> str:
        """The ClusterQueue a Workload's LocalQueue points at now ("" if unknown)."""
        namespace = (wl.get("metadata") or {}).get("namespace")
        lq_name = (wl.get("spec") or {}).get("queueName")
        lq = self.caches.local_queues.get(f"{namespace}/{lq_name}") if lq_name else None
        return str(((lq or {}).get("spec") or {}).get("clusterQueue") or "")

    def _record_workload_change(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Record what the leader sees happen to a Workload (creation, requeue, finish).

        Runs on whichever thread changed the cache, often an admission write: it only compares
        a few fields, and the records are built on the recorder's thread."""
        if new is None or not self._recording or not self.is_leader():
            return
        if old is not None and history.milestones(old) == history.milestones(new):
            return
        at = self.ctx.now()
        self.ctx.record_later(
            lambda: history.new_transitions(
                old, new, at=at, cluster_queue=self._cluster_queue_of(new)
            )
        )

    def _replay_history(self) -> None:
        """Record again what every Workload's status shows: whatever a previous leader decided
        but did not get into the store before it died is filled in, the rest is stored once."""
        if self.ctx.recorder is None:
            return
        objects = self.caches.workloads.objects()

        # Cached objects are replaced, never changed, so the recorder may read them later.
        def replay(chunk: list[Obj]) -> Callable[[], list[WorkloadTransition]]:
            return lambda: [
                t
                for wl in chunk
                for t in history.visible(wl, cluster_queue=self._cluster_queue_of(wl))
            ]

        for start in range(0, len(objects), 100):
            self.ctx.record_later(replay(objects[start : start + 100]))
        log.info("history: replaying what the cluster shows", extra={"workloads": len(objects)})

    def _history_readings(self) -> list[QueueReading]:
        # Standbys run no cycles; a leader samples its last cycle's figures.
        return queue_readings(self.loop.last_fair_share) if self.is_leader() else []

    # ------------------------------------------------------------------- webhooks
    def _url_base(self) -> str:
        return f"https://{self.options.webhook_host}:{self.server.port if self.server else 0}"

    def _register_webhooks(self) -> None:
        if not self.options.webhooks or self.certs is None or self.certs.current is None:
            return
        service = None
        if self.options.webhook_service:
            service = (
                self.options.namespace,
                self.options.webhook_service,
                self.options.webhook_service_port,
            )
        mutating, validating = webhooks.configurations(
            self.certs.current.ca_bundle,
            url_base=None if service else self._url_base(),
            service=service,
        )
        try:
            webhooks.register(self.kube, mutating, validating)
        except Exception:
            log.exception("could not register the webhook configurations")

    def _cert_changed(self, bundle: CertBundle) -> None:
        if self.server is not None:
            self.server.reload(bundle)
        if self.is_leader():
            self._register_webhooks()

    def _webhook_hosts(self) -> list[str]:
        if self.options.webhook_service:
            name, ns = self.options.webhook_service, self.options.namespace
            return [f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local", name]
        return [self.options.webhook_host]

    def _queue_warnings(self, obj: Any) -> list[str]:
        """Cross-object problems with a queue object, as admission warnings."""
        kind = obj.get("kind")
        spec = obj.get("spec") or {}
        warnings: list[str] = []
        if kind == "ClusterQueue":
            parent = spec.get("parent")
            if parent and self.caches.cluster_queues.get(parent) is None:
                warnings.append(
                    f"spec.parent {parent!r} does not exist yet: the queue stays inactive "
                    "(ParentNotFound) until it does"
                )
            for flavor in spec.get("flavors") or []:
                if self.caches.flavors.get(flavor.get("name", "")) is None:
                    warnings.append(
                        f"ResourceFlavor {flavor.get('name')!r} does not exist yet: the queue "
                        "stays inactive (FlavorNotFound) until it does"
                    )
        if kind == "LocalQueue":
            target = spec.get("clusterQueue")
            if target and self.caches.cluster_queues.get(target) is None:
                warnings.append(f"ClusterQueue {target!r} does not exist yet")
        return warnings

    def _start_webhooks(self) -> None:
        self.certs = CertManager(
            self.kube, self.options.namespace, self.options.cert_secret, self._webhook_hosts()
        )
        bind = self.options.webhook_bind or (
            "0.0.0.0" if self.options.webhook_service else self.options.webhook_host
        )
        self.server = webhooks.WebhookServer(
            bind, self.options.webhook_port, webhooks.WebhookHandlers(self._queue_warnings)
        )
        self.certs.on_change(self._cert_changed)
        self.certs.ensure()
        self.server.start()
        self._spawn("certs", lambda: self.certs.run(self.stop_event) if self.certs else None)

    # --------------------------------------------------------------------- wiring
    def _wire(self) -> None:
        queue, loop = self.queue, self.loop

        def on_job(kind: str, old: Obj | None, new: Obj | None) -> None:
            queue.add(object_key(new or old or {}))

        def on_workload(kind: str, old: Obj | None, new: Obj | None) -> None:
            # A Workload's own pending message changing (which the loop itself writes)
            # changes nothing anyone decides from; skipping it avoids a cycle per write.
            if old is not None and new is not None and decision_inputs(old) == decision_inputs(new):
                return
            obj = new or old or {}
            job_key = job_key_of_workload(obj)
            if job_key:
                queue.add(job_key)
            loop.poke()

        def on_pod(kind: str, old: Obj | None, new: Obj | None) -> None:
            obj = new or old or {}
            meta = obj.get("metadata") or {}
            job = (meta.get("labels") or {}).get("batch.kubernetes.io/job-name")
            if job:
                queue.add(f"{meta.get('namespace')}/{job}")

        def on_queue_object(kind: str, old: Obj | None, new: Obj | None) -> None:
            loop.poke()

        def on_node(kind: str, old: Obj | None, new: Obj | None) -> None:
            # Heartbeats change nothing the engine reads; capacity, labels and readiness do.
            if old is None or new is None or _node_shape(old) != _node_shape(new):
                loop.poke()

        self.caches.jobs.add_handler(on_job)
        self.caches.workloads.add_handler(on_workload)
        if self.ctx.recorder is not None:
            self.caches.workloads.add_handler(self._record_workload_change)
        self.caches.pods.add_handler(on_pod)
        for informer in (
            self.caches.cluster_queues,
            self.caches.local_queues,
            self.caches.flavors,
        ):
            informer.add_handler(on_queue_object)
        self.caches.nodes.add_handler(on_node)

    def _spawn(self, name: str, target: Callable[[], Any]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _worker(self) -> None:
        while not self.stop_event.is_set():
            if not self.is_leader():
                self.stop_event.wait(0.2)
                continue
            key = self.queue.get(timeout=0.5)
            if key is None:
                continue
            try:
                delay = self.jobs.reconcile(key)
                self.queue.forget(key)
                if delay:
                    self.queue.add_after(key, delay)
            except Exception as error:
                backoff = self.queue.add_rate_limited(key)
                level = logging.INFO if _is_conflict(error) else logging.WARNING
                log.log(
                    level,
                    "reconcile failed; retrying",
                    extra={"job": key, "error": str(error)[:500], "retry_in": round(backoff, 3)},
                )
            finally:
                self.queue.done(key)

    def _resync(self) -> None:
        # A safety net: every Job is looked at again now and then, whatever happened.
        while not self.stop_event.wait(self.options.resync_period):
            for key in self.caches.jobs.list_keys():
                self.queue.add(key)

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
        if self.history is not None:
            self.history.start(sampler=self._history_readings)
        self._ensure_namespace()
        if self.options.webhooks:
            self._start_webhooks()
        self._wire()
        self.caches.start()
        self.events.start()
        try:
            self.caches.wait_synced(120)
        except TimeoutError as error:
            raise RuntimeError(
                f"{error}; are Muster's CRDs installed (kubectl apply --server-side -f crds/) "
                "and may this identity list and watch them?"
            ) from error
        log.info("caches synced", extra={"jobs": len(self.caches.jobs)})
        self.loop.start_writers(self.is_leader)
        for i in range(self.options.workers):
            self._spawn(f"worker-{i}", self._worker)
        self._spawn("admission-loop", lambda: self.loop.run(self.stop_event, self.is_leader))
        self._spawn("resync", self._resync)
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
        self._recording = False
        self.queue.shutdown()
        for thread in self._threads:
            if thread.name.startswith(("worker", "admission-loop", "leader-election")):
                thread.join(timeout=10)
        self.loop.stop()
        if self.elector is not None:
            self.elector.release()
        if self.server is not None:
            if self._was_leader and not self.options.webhook_service:
                try:
                    webhooks.unregister(self.kube, self._url_base())
                except Exception:
                    log.exception("could not remove the webhook configurations")
            self.server.stop()
        if self.history is not None:
            # After the loop and the workers (their last records are in the recorder by now)
            # and after the Lease is released, so a standby does not wait for the drain.
            self.history.close()
        self.caches.stop()
        self.events.stop()
        log.info("stopped", extra={"identity": self.identity})


def decision_inputs(wl: Obj) -> tuple[Any, ...]:
    """What the Job reconciler and the admission loop read from a Workload."""
    status = wl.get("status") or {}
    conditions = {
        c.get("type"): c.get("status")
        for c in status.get("conditions") or []
        if c.get("type") in ("QuotaReserved", "Evicted", "Finished")
    }
    meta = wl.get("metadata") or {}
    return (
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        json.dumps(status.get("admission"), sort_keys=True),
        json.dumps(status.get("requeueState"), sort_keys=True),
        tuple(sorted(conditions.items())),
    )


def _node_shape(node: Obj) -> tuple[Any, ...]:
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    meta = node.get("metadata") or {}
    return (
        json.dumps(meta.get("labels") or {}, sort_keys=True),
        json.dumps(status.get("allocatable") or {}, sort_keys=True),
        json.dumps((node.get("spec") or {}).get("taints") or [], sort_keys=True),
        bool((node.get("spec") or {}).get("unschedulable")),
        ready,
    )


def _is_conflict(error: BaseException) -> bool:
    return isinstance(error, ConflictRetriesExhausted) or (
        isinstance(error, ApiException) and error.status == 409
    )


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


def history_options(
    *,
    enabled: bool,
    url: str | None,
    spool_dir: Path | None,
    usage_fairness: bool,
    window: str,
    half_life: str,
    k: float,
) -> HistorySettings | None:
    """The history settings from the command line; UsageError names the flag at fault."""
    if not enabled:
        if usage_fairness:
            raise click.UsageError(
                "--usage-fairness needs the history store (it reads past usage from it); "
                "drop --no-history"
            )
        return None
    try:
        fairness = FairnessSettings(
            enabled=usage_fairness,
            window=parse_duration(window, option="--usage-fairness-window"),
            half_life=parse_duration(half_life, option="--usage-fairness-half-life"),
            k=k,
        )
        return HistorySettings(url=database_url(url), spool_dir=spool_dir, fairness=fairness)
    except (DatabaseURLError, ValueError) as error:
        raise click.UsageError(str(error)) from None


@click.command("controller")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="Kubeconfig to use; in-cluster config when omitted.",
)
@click.option(
    "--namespace",
    default="muster-system",
    show_default=True,
    help="Namespace of the leader-election Lease and the webhook certificate Secret.",
)
@click.option(
    "--webhook-port",
    type=int,
    default=9443,
    show_default=True,
    help="Port the webhook server listens on (0: any free port).",
)
@click.option(
    "--webhook-host",
    default="127.0.0.1",
    show_default=True,
    help="Host the apiserver reaches the webhooks at (local cluster); the serving "
    "certificate names it.",
)
@click.option(
    "--webhook-bind",
    default=None,
    help="Address to listen on (default: --webhook-host, or 0.0.0.0 with a Service).",
)
@click.option(
    "--webhook-service",
    default=None,
    help="In-cluster: name of the Service in --namespace that fronts the webhooks; "
    "the configurations then use a service reference instead of a URL.",
)
@click.option("--webhook-service-port", type=int, default=443, show_default=True)
@click.option(
    "--webhooks/--no-webhooks",
    default=True,
    show_default=True,
    help="Serve and register the admission webhooks.",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=True,
    show_default=True,
    help="Elect a leader on a Lease so that only one replica acts.",
)
@click.option("--lease-name", default="muster-controller", show_default=True)
@click.option("--lease-duration", type=float, default=15.0, show_default=True)
@click.option("--renew-deadline", type=float, default=10.0, show_default=True)
@click.option("--retry-period", type=float, default=2.0, show_default=True)
@click.option("--identity", default=None, help="Leader-election identity (default: host_random).")
@click.option("--workers", type=int, default=4, show_default=True, help="Job reconciler threads.")
@click.option(
    "--status-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between status writes to one queue or pending Workload.",
)
@click.option(
    "--events/--no-events",
    default=True,
    show_default=True,
    help="Write Kubernetes Events on Jobs and Workloads.",
)
@click.option(
    "--database-url",
    "database_url_flag",
    metavar="URL",
    default=None,
    help="History store: postgresql+psycopg://... or sqlite:///PATH (default: "
    "$MUSTER_DATABASE_URL, else ~/.local/share/muster/history.db).",
)
@click.option(
    "--history/--no-history",
    default=True,
    show_default=True,
    help="Record transitions, preemptions and queue usage in the history store.",
)
@click.option(
    "--history-spool-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where records wait while the database is unreachable; one per replica (default: "
    "under ~/.local/share/muster/history-spool/, a free one per replica).",
)
@click.option(
    "--usage-fairness/--no-usage-fairness",
    default=False,
    show_default=True,
    help="Time-based fair share: recent usage adjusts over-quota weights among siblings.",
)
@click.option(
    "--usage-fairness-window",
    default="7d",
    show_default=True,
    help="How far back usage counts (90m, 24h, 7d, 2w).",
)
@click.option(
    "--usage-fairness-half-life",
    default="1d",
    show_default=True,
    help="Age at which past usage counts half.",
)
@click.option(
    "--usage-fairness-k",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Strength: weight' = max(0, w + k(w - u)); 0 leaves weights as configured.",
)
@click.option("--log-level", default="info", show_default=True)
def controller(
    kubeconfig: str | None,
    namespace: str,
    webhook_port: int,
    webhook_host: str,
    webhook_bind: str | None,
    webhook_service: str | None,
    webhook_service_port: int,
    webhooks: bool,
    leader_elect: bool,
    lease_name: str,
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    identity: str | None,
    workers: int,
    status_interval: float,
    events: bool,
    database_url_flag: str | None,
    history: bool,
    history_spool_dir: Path | None,
    usage_fairness: bool,
    usage_fairness_window: str,
    usage_fairness_half_life: str,
    usage_fairness_k: float,
    log_level: str,
) -> None:
    """Run the Muster controller: admit queue-labelled Jobs under quota."""
    history_settings = history_options(
        enabled=history,
        url=database_url_flag,
        spool_dir=history_spool_dir,
        usage_fairness=usage_fairness,
        window=usage_fairness_window,
        half_life=usage_fairness_half_life,
        k=usage_fairness_k,
    )
    setup_logging(log_level)
    options = Options(
        namespace=namespace,
        webhook_port=webhook_port,
        webhook_host=webhook_host,
        webhook_bind=webhook_bind,
        webhook_service=webhook_service,
        webhook_service_port=webhook_service_port,
        webhooks=webhooks,
        leader_elect=leader_elect,
        lease_name=lease_name,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
        identity=identity or os.environ.get("POD_NAME"),
        workers=workers,
        status_interval=status_interval,
        events=events,
        history=history_settings,
    )
    try:
        manager = Manager(api_client(kubeconfig), options)
    except OSError as error:  # the SQLite file's directory cannot be created
        raise click.ClickException(f"history store: {error}") from None
    code = run_manager(manager)
    # Daemon threads (watches, the webhook server) end with the process.
    time.sleep(0.05)
    sys.exit(code)
