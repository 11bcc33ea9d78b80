"""Kubernetes Events on Jobs and Workloads: admission, preemption, eviction, scaling.

Events are written from a background thread so a slow or failing apiserver never holds up
a reconcile; an Event that cannot be written is logged and dropped (Events are best-effort
in Kubernetes too). Repeats of the same event within a short window are dropped.

Bursts are folded: per namespace, type, reason and kind of object, the first `burst` Events
of a `fold_window` are written as they come, and the rest of that window become one Event
on the Namespace ("Admitted: 246 more Workloads in this namespace within 30s: a, b, c, ...").
A person looking at one Job still finds its Events when little happens; when 1,000 Jobs
arrive at once, the apiserver is not asked for 3,000 Event writes (issue 14: writes per
admitted Job). `burst=0` turns folding off.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controllers.runtime.resources import EVENT, Kube

log = logging.getLogger(__name__)

COMPONENT = "muster-controller"
# Names a folded Event lists (the rest are counted).
FOLD_NAMES = 20


def involved(obj: Mapping[str, Any]) -> dict[str, str]:
    """The involvedObject reference for an object dict."""
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": str(obj.get("apiVersion", "")),
        "kind": str(obj.get("kind", "")),
        "name": str(meta.get("name", "")),
        "uid": str(meta.get("uid", "")),
    }
    if meta.get("namespace"):
        ref["namespace"] = str(meta["namespace"])
    if meta.get("resourceVersion"):
        ref["resourceVersion"] = str(meta["resourceVersion"])
    return ref


class EventRecorder:
    """Queue core/v1 Events and write them in the background."""

    def __init__(
        self,
        kube: Kube | None,
        identity: str,
        *,
        dedupe_window: float = 10.0,
        capacity: int = 10_000,
        burst: int = 5,
        fold_window: float = 30.0,
    ) -> None:
        self.kube = kube
        self.identity = identity
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(capacity)
        self._recent: dict[tuple[str, str, str], float] = {}
        self._window = dedupe_window
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0
        self.burst = burst
        self.fold_window = fold_window
        self._folds: dict[tuple[str, str, str, str], _Fold] = {}
        self.folded = 0  # Events written as part of a summary instead of one by one

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Flush what is queued (briefly) and stop."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)

    def backlog(self) -> int:
        """Events queued but not yet written."""
        return self._queue.qsize()

    def emit(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Record an Event about `obj` ("Normal" or "Warning")."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace")
        if not namespace:
            return  # cluster-scoped objects get conditions, not Events, here
        key = (str(meta.get("uid")), reason, message)
        now = time.monotonic()
        with self._lock:
            last = self._recent.get(key)
            if last is not None and now - last < self._window:
                return
            self._recent[key] = now
            if len(self._recent) > 50_000:
                self._recent = {k: t for k, t in self._recent.items() if now - t < self._window}
            if self.burst and self._fold(obj, namespace, type_, reason, now):
                return
        log.info(
            "event",
            extra={
                "object": f"{obj.get('kind')}/{namespace}/{meta.get('name')}",
                "reason": reason,
                "event_message": message,
            },
        )
        self._queue_event(
            str(meta.get("name", "object"))[:200],
            namespace,
            involved(obj),
            type_,
            reason,
            message,
            1,
        )

    def _fold(
        self, obj: Mapping[str, Any], namespace: str, type_: str, reason: str, now: float
    ) -> bool:
        """Count the Event in its burst; True if it is folded (caller holds the lock)."""
        key = (namespace, type_, reason, str(obj.get("kind", "")))
        fold = self._folds.get(key)
        if fold is None or now - fold.start >= self.fold_window:
            if fold is not None:
                self._summarize(key, fold)
            fold = self._folds[key] = _Fold(now)
        if fold.written < self.burst:
            fold.written += 1
            return False
        fold.names.append(str((obj.get("metadata") or {}).get("name", "")))
        self.folded += 1
        return True

    def _summarize(self, key: tuple[str, str, str, str], fold: _Fold) -> None:
        """Queue the one Event that stands for a window's folded ones (caller holds the lock)."""
        if not fold.names:
            return
        namespace, type_, reason, kind = key
        shown = ", ".join(fold.names[:FOLD_NAMES])
        more = len(fold.names) - FOLD_NAMES
        message = (
            f"{reason}: {len(fold.names)} more {kind}s in this namespace within "
            f"{self.fold_window:.0f}s (Events folded): {shown}"
            + (f", and {more} more" if more > 0 else "")
        )
        count, fold.names = len(fold.names), []
        # The apiserver takes an Event only in its involved object's namespace.
        namespace_object = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "name": namespace,
            "namespace": namespace,
        }
        self._queue_event(namespace, namespace, namespace_object, type_, reason, message, count)

    def _queue_event(
        self,
        name_prefix: str,
        namespace: str,
        involved_object: Mapping[str, Any],
        type_: str,
        reason: str,
        message: str,
        count: int,
    ) -> None:
        """Queue one Event for the writer thread; counted as dropped when the queue is full."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name_prefix}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
            "involvedObject": involved_object,
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": count,
        }
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def flush(self) -> None:
        """Queue the summaries of every window now, ended or not."""
        with self._lock:
            for key, fold in self._folds.items():
                self._summarize(key, fold)
            self._folds.clear()

    def _summarize_due(self) -> None:
        """Summaries of the windows that have ended."""
        now = time.monotonic()
        with self._lock:
            for key, fold in list(self._folds.items()):
                if now - fold.start >= self.fold_window:
                    self._summarize(key, fold)
                    del self._folds[key]

    def _run(self) -> None:
        while True:
            try:
                event = self._queue.get(timeout=1.0)
            except queue.Empty:
                self._summarize_due()
                continue
            if event is None:
                self.flush()  # what was folded when told to stop is still said
                self._write_queued()
                return
            self._write(event)
            self._summarize_due()

    def _write_queued(self) -> None:
        while True:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                return
            if event is not None:
                self._write(event)

    def _write(self, event: dict[str, Any]) -> None:
        if self.kube is None:
            return
        try:
            self.kube.create(EVENT, event["metadata"]["namespace"], event)
        except Exception as error:
            involved = event.get("involvedObject") or {}
            log.warning(
                "could not write event",
                extra={
                    "object": f"{involved.get('kind')}/{event['metadata']['namespace']}/"
                    f"{involved.get('name')}",
                    "error": str(error)[:200],
                },
            )


@dataclass
class _Fold:
    """One window of Events of one namespace, type, reason and kind of object."""

    start: float
    written: int = 0
    names: list[str] = field(default_factory=list)
