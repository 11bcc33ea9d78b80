"""Kubernetes Events on Jobs and Workloads: admission, preemption, eviction, scaling.

Events are written from a background thread so a slow or failing apiserver never holds up
a reconcile; an Event that cannot be written is logged and dropped (Events are best-effort
in Kubernetes too). Repeats of the same event within a short window are folded into one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from controllers.runtime.resources import EVENT, Kube

log = logging.getLogger(__name__)

COMPONENT = "muster-controller"


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
    ) -> None:
        self.kube = kube
        self.identity = identity
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(capacity)
        self._recent: dict[tuple[str, str, str], float] = {}
        self._window = dedupe_window
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0

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
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{str(meta.get('name', 'object'))[:200]}.{uuid.uuid4().hex[:12]}",
                "namespace": namespace,
            },
            "involvedObject": involved(obj),
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        log.info(
            "event",
            extra={
                "object": f"{obj.get('kind')}/{namespace}/{meta.get('name')}",
                "reason": reason,
                "event_message": message,
            },
        )
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            if self.kube is None:
                continue
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
