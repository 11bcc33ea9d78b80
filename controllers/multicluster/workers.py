"""The worker clusters as the management cluster sees them: a client per WorkerCluster, built
from the kubeconfig in its Secret, read-only caches of its nodes and unfinished pods, caches
of the copies sent there and of its Workloads, and whether it answers.

A worker is probed every few seconds; one that has not answered for its `lostAfter` is lost.
The caches of a worker that stops answering keep what they last saw (they reconnect on their
own), so a decision about a lost worker is made from its last known state, never from an
empty cache.
"""

from __future__ import annotations

import base64
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from controllers.runtime.informer import Informer
from controllers.runtime.resources import JOB, NODE, POD, SECRET, WORKLOAD, Kube, Obj
from controllers.state.caches import UNFINISHED_PODS
from quota.api.names import ORIGIN_UID_LABEL
from quota.api.workercluster import WorkerCluster
from quota.model.nodeconvert import bound_pod_from_manifest, node_from_manifest
from quota.model.nodes import BoundPod, Node

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
# A remote call must not hold the dispatcher for the default 30s when a worker is down.
REMOTE_REQUEST_TIMEOUT_S = 10.0


class KubeconfigError(ValueError):
    """The WorkerCluster's Secret is missing or does not hold a usable kubeconfig."""


def remote_client(kubeconfig: Mapping[str, Any]) -> client.ApiClient:
    """An ApiClient for a worker from a parsed kubeconfig (its current context)."""
    configuration = client.Configuration()
    try:
        config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
            dict(kubeconfig), client_configuration=configuration
        )
    except (config.ConfigException, KeyError, TypeError, ValueError) as error:
        raise KubeconfigError(f"unusable kubeconfig: {error}") from error
    configuration.connection_pool_maxsize = 16
    configuration.retries = 0
    return client.ApiClient(configuration)


def read_kubeconfig(kube: Kube, namespace: str, wc: WorkerCluster) -> tuple[Mapping[str, Any], str]:
    """The kubeconfig the WorkerCluster names (its Secret in `namespace`, Muster's), and
    the Secret's resourceVersion."""
    ref = wc.spec.kubeconfig
    where = f"Secret {namespace}/{ref.name}"
    try:
        secret = kube.get(SECRET, namespace, ref.name)
    except ApiException as error:
        raise KubeconfigError(f"{where}: cannot be read ({error.status} {error.reason})") from None
    if secret is None:
        raise KubeconfigError(f"{where} does not exist")
    encoded = (secret.get("data") or {}).get(ref.key)
    if not encoded:
        raise KubeconfigError(f"{where} has no key {ref.key}")
    try:
        parsed = yaml.safe_load(base64.b64decode(encoded))
    except (ValueError, yaml.YAMLError) as error:
        raise KubeconfigError(f"{where}, key {ref.key}: not a kubeconfig: {error}") from None
    if not isinstance(parsed, Mapping):
        raise KubeconfigError(f"{where}, key {ref.key}: not a kubeconfig (not a mapping)")
    rv = str((secret.get("metadata") or {}).get("resourceVersion") or "")
    return parsed, rv


@dataclass
class Health:
    """What the probes have seen of one worker."""

    last_ok: float | None = None  # time.time() of the last answer
    since: float = 0.0  # when the manager started watching it
    error: str = ""  # the last failure, if the last probe failed

    def silent_for(self, now: float) -> float:
        """Seconds without an answer (0 while it answers)."""
        if not self.error:
            return 0.0
        return now - (self.last_ok if self.last_ok is not None else self.since)


class Worker:
    """One worker cluster: its client, caches and health."""

    def __init__(
        self,
        name: str,
        kube: Kube,
        lost_after: timedelta,
        version: str,
        api: client.ApiClient | None = None,
    ) -> None:
        self.name = name
        self.version = version  # the WorkerCluster spec and Secret it was built from
        self.lost_after_s = lost_after.total_seconds()
        self.api = api  # None: no connection to probe or close (an in-memory worker)
        self.kube = kube
        self.nodes = Informer(self.kube, NODE, name=f"{name}-nodes")
        self.pods = Informer(self.kube, POD, field_selector=UNFINISHED_PODS, name=f"{name}-pods")
        self.copies = Informer(self.kube, JOB, label_selector=ORIGIN_UID_LABEL, name=f"{name}-jobs")
        self.workloads = Informer(self.kube, WORKLOAD, name=f"{name}-workloads")
        self.health = Health(since=time.time())
        self._lock = threading.Lock()
        # Moves on every change of its nodes or pods: room may have been freed.
        self._counter = itertools.count(1)
        self.changes = 0
        self._parsed: dict[str, tuple[str, Node | None]] = {}  # node key -> (rv, parsed)
        self._pods: dict[str, tuple[str, BoundPod | None]] = {}  # pod key -> (rv, parsed)

    def parsed_nodes(self) -> tuple[Node, ...]:
        """Its nodes as placement reads them (one it cannot read is left out), parsed once
        per resourceVersion: both the admission loop and the dispatcher ask every cycle."""
        out: list[Node] = []
        with self._lock:
            known = self._parsed
            fresh: dict[str, tuple[str, Node | None]] = {}
            for key, raw in self.nodes.items():
                rv = str((raw.get("metadata") or {}).get("resourceVersion") or "")
                cached = known.get(key)
                if cached is None or cached[0] != rv:
                    try:
                        cached = (rv, node_from_manifest(raw))
                    except ValueError:
                        cached = (rv, None)
                fresh[key] = cached
                if cached[1] is not None:
                    out.append(cached[1])
            self._parsed = fresh
        return tuple(out)

    def bound_pods(self) -> list[tuple[BoundPod, Mapping[str, str]]]:
        """Its pods that hold room on a node, with their labels (whose copy's pods they are),
        parsed once per resourceVersion, as its nodes are."""
        out: list[tuple[BoundPod, Mapping[str, str]]] = []
        with self._lock:
            known = self._pods
            fresh: dict[str, tuple[str, BoundPod | None]] = {}
            for key, raw in self.pods.items():
                rv = str((raw.get("metadata") or {}).get("resourceVersion") or "")
                cached = known.get(key)
                if cached is None or cached[0] != rv:
                    try:
                        cached = (rv, bound_pod_from_manifest(raw))
                    except ValueError:
                        cached = (rv, None)
                fresh[key] = cached
                if cached[1] is not None:
                    out.append((cached[1], (raw.get("metadata") or {}).get("labels") or {}))
            self._pods = fresh
        return out

    def informers(self) -> Iterable[Informer]:
        return (self.nodes, self.pods, self.copies, self.workloads)

    def start(self) -> None:
        for informer in (self.nodes, self.pods):
            informer.add_handler(self._changed)
        for informer in self.informers():
            informer.start()

    def _changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        # next() on a count is atomic: informer threads never lose a change.
        self.changes = next(self._counter)

    def stop(self) -> None:
        for informer in self.informers():
            informer.stop()
        if self.api is not None:
            self.api.close()  # type: ignore[no-untyped-call]

    def probe(self) -> None:
        """Ask the worker's apiserver for its version; record whether it answered."""
        if self.api is None:
            return
        try:
            # Read whole, so that the connection goes back to the pool clean.
            _ = Kube(self.api).request("GET", "/version", timeout=PROBE_TIMEOUT_S).data
        except Exception as error:
            with self._lock:
                self.health = Health(self.health.last_ok, self.health.since, _short(error))
            return
        with self._lock:
            self.health = Health(time.time(), self.health.since, "")

    def synced(self) -> bool:
        return all(i.synced for i in (self.nodes, self.pods, self.copies))

    def available(self, now: float) -> tuple[bool, str]:
        """Whether copies may be sent there now, and if not, why."""
        health = self.health
        if health.error:
            silent = health.silent_for(now)
            return False, f"not answering for {silent:.0f}s ({health.error})"
        if not self.synced():
            return False, "its caches are not loaded yet"
        return True, ""

    def lost(self, now: float) -> bool:
        """Silent for longer than its lostAfter."""
        return self.health.silent_for(now) >= self.lost_after_s


def _short(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:200]


class Workers:
    """The live set of worker clusters, following the WorkerCluster objects."""

    def __init__(
        self, kube: Kube, namespace: str, on_change: Callable[[], None] = lambda: None
    ) -> None:
        self.kube = kube
        self.namespace = namespace  # where the kubeconfig Secrets are
        # Called when a worker's copies or Workloads change (the dispatcher acts sooner).
        self.on_change = on_change
        self._workers: dict[str, Worker] = {}
        self.problems: dict[str, str] = {}  # WorkerCluster name -> why it has no client

    def get(self, name: str) -> Worker | None:
        return self._workers.get(name)

    def all(self) -> list[Worker]:
        return list(self._workers.values())

    def sync(self, objects: Iterable[Obj]) -> None:
        """Start a worker for each new or changed WorkerCluster, stop those that went."""
        seen: set[str] = set()
        problems: dict[str, str] = {}
        # Replaced whole, never changed in place: the admission loop reads it too.
        workers = dict(self._workers)
        for raw in objects:
            name = str((raw.get("metadata") or {}).get("name") or "")
            seen.add(name)
            try:
                wc = WorkerCluster.model_validate(raw)
                kubeconfig, secret_rv = read_kubeconfig(self.kube, self.namespace, wc)
            except (ValidationError, KubeconfigError) as error:
                problems[name] = str(error)[:500]
                continue
            version = f"{wc.spec.model_dump_json()}@{secret_rv}"
            current = workers.get(name)
            if current is not None and current.version == version:
                continue
            try:
                api = remote_client(kubeconfig)
            except KubeconfigError as error:
                ref = wc.spec.kubeconfig
                problems[name] = f"Secret {self.namespace}/{ref.name}, key {ref.key}: {error}"
                continue
            if current is not None:
                current.stop()
            kube = Kube(api, request_timeout=REMOTE_REQUEST_TIMEOUT_S)
            worker = Worker(name, kube, wc.spec.lost_after, version, api)
            for informer in (worker.copies, worker.workloads):
                informer.add_handler(lambda kind, old, new: self.on_change())
            worker.start()
            workers[name] = worker
            log.info("watching worker cluster", extra={"cluster": name})
        for gone in set(workers) - seen:
            workers.pop(gone).stop()
        self._workers = workers
        self.problems = problems

    def stop(self) -> None:
        workers, self._workers = self._workers, {}
        for worker in workers.values():
            worker.stop()
