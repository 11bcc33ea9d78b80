"""Binding pods to nodes through the pods/binding subresource, as kube-scheduler does.

Calls run on a small thread pool (bounded concurrency) and, when asked, under a rate limit
that protects the apiserver. Leadership is checked before every batch, so a replica that
stops leading stops binding within one batch. Outcomes are sorted for the caller:

- bound: the binding was accepted; the pod is on that node now.
- already: the apiserver says the pod is bound (409): someone, perhaps this loop before a
  restart, bound it; it counts as done and is never bound again.
- gone: the pod no longer exists (404): the Job controller will make another.
- failed: anything else; the caller places the pods left on a new view.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from controllers.metrics import definitions as metrics
from controllers.runtime.resources import POD, Kube
from controllers.scheduler import pods as p

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class Binder(Protocol):
    """Binds one pod to one node; raises ApiException as the apiserver answers."""

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


class ApiBinder:
    """The real thing: POST .../pods/NAME/binding."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        metadata = {"name": name, "namespace": namespace}
        if uid:
            # A precondition: a pod deleted and created again under the same name is a
            # different pod and is not bound by a decision taken for the old one.
            metadata["uid"] = uid
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.kube.create_subresource(POD, namespace, name, "binding", body)


class RateLimit:
    """At most `qps` calls per second, with bursts of up to `burst` (0 qps: unlimited)."""

    def __init__(self, qps: float, burst: int | None = None) -> None:
        self.qps = qps
        self.burst = float(burst if burst is not None else max(1, int(qps)))
        self._tokens = self.burst
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        if self.qps <= 0:
            return
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                wait = (1 - self._tokens) / self.qps
            time.sleep(wait)


@dataclass
class Outcome:
    """What became of each (pod, node) asked for, keyed by pod "namespace/name"."""

    bound: dict[str, str] = field(default_factory=dict)  # pod -> node
    already: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # pod -> error
    skipped: list[str] = field(default_factory=list)  # not tried: leadership lost

    @property
    def done(self) -> int:
        return len(self.bound) + len(self.already)


class BindPool:
    """Binds many pods, `workers` at a time, checking leadership before every batch."""

    def __init__(self, binder: Binder, *, workers: int = 16, qps: float = 0.0) -> None:
        if workers < 1:
            raise ValueError(f"bind workers must be at least 1 (got {workers})")
        if qps < 0:
            raise ValueError(f"bind qps must not be negative (got {qps})")
        self.binder = binder
        self.workers = workers
        self.limit = RateLimit(qps)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bind")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def bind(
        self,
        binds: Sequence[tuple[Obj, str]],
        is_leader: Callable[[], bool],
        on_batch: Callable[[Outcome, list[tuple[Obj, str]]], None] | None = None,
    ) -> Outcome:
        """Bind every (pod, node); `on_batch(outcome so far, batch)` runs after each batch."""
        outcome = Outcome()
        batch_size = self.workers * 2
        for start in range(0, len(binds), batch_size):
            batch = list(binds[start : start + batch_size])
            if not is_leader():
                outcome.skipped.extend(p.key_of(pod) for pod, _ in binds[start:])
                log.warning(
                    "stopped binding: no longer the leader", extra={"left": len(binds) - start}
                )
                break
            results = list(self._pool.map(self._one, batch))
            for (pod, node), error in zip(batch, results, strict=True):
                key = p.key_of(pod)
                if error is None:
                    outcome.bound[key] = node
                elif isinstance(error, ApiException) and error.status == 409:
                    outcome.already.append(key)
                elif isinstance(error, ApiException) and error.status == 404:
                    outcome.gone.append(key)
                else:
                    outcome.failed[key] = _text(error)
            if on_batch is not None:
                on_batch(outcome, batch)
        return outcome

    def _one(self, item: tuple[Obj, str]) -> BaseException | None:
        pod, node = item
        meta = pod.get("metadata") or {}
        self.limit.acquire()
        started = time.monotonic()
        try:
            self.binder.bind(str(meta.get("namespace")), str(meta.get("name")), p.uid_of(pod), node)
        except Exception as error:  # every failure is sorted by the caller, none is fatal
            metrics.bind(time.monotonic() - started, ok=False)
            return error
        metrics.bind(time.monotonic() - started, ok=True)
        return None


def _text(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"HTTP {error.status}: {str(error.body or error.reason)[:300]}"
    return f"{type(error).__name__}: {str(error)[:300]}"
