"""`muster controller`: the process that admits queue-labelled Jobs under quota.

Every replica runs the caches and serves the webhooks; only the holder of the
coordination.k8s.io Lease reconciles Jobs, runs the admission loop and writes. SIGTERM or
SIGINT stops the workers, releases the Lease (so a standby takes over at once) and exits.
Logs are JSON, one object per line.
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
from typing import Any

import click
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from controllers import webhooks
from controllers.admission_loop import AdmissionLoop
from controllers.caches import Caches, Context, Recorder
from controllers.certs import CertBundle, CertManager
from controllers.events import EventRecorder
from controllers.jobs import JobReconciler, job_key_of_workload
from controllers.runtime.apply import ConflictRetriesExhausted
from controllers.runtime.leader import LeaderElector
from controllers.runtime.resources import NAMESPACE, Kube, Obj, object_key
from controllers.runtime.workqueue import WorkQueue

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
        self.ctx = Context(
            kube=self.kube,
            caches=self.caches,
            events=self.events,
            identity=self.identity,
            recorder=recorder,
        )
        self.loop = AdmissionLoop(self.ctx, status_interval=options.status_interval)
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

    # ------------------------------------------------------------------ leadership
    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else True

    def _started_leading(self) -> None:
        self._was_leader = True
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
    log_level: str,
) -> None:
    """Run the Muster controller: admit queue-labelled Jobs under quota."""
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
    )
    manager = Manager(api_client(kubeconfig), options)
    code = run_manager(manager)
    # Daemon threads (watches, the webhook server) end with the process.
    time.sleep(0.05)
    sys.exit(code)
