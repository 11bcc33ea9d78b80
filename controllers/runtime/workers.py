"""Worker threads that drain a work queue into a reconcile function while this replica leads.

A reconcile returns a delay to look again after, or None; a failure is retried with the
queue's rate limit. A periodic resync adds every key again, as a safety net against a missed
event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from kubernetes.client.exceptions import ApiException

from controllers.runtime.apply import ConflictRetriesExhausted
from controllers.runtime.workqueue import WorkQueue

K = TypeVar("K", bound=Hashable)

log = logging.getLogger("muster.controller")


class WorkerPool(Generic[K]):
    """Runs `reconcile(key)` for the keys of `queue` on the leader."""

    def __init__(
        self,
        name: str,
        queue: WorkQueue[K],
        reconcile: Callable[[K], float | None],
        is_leader: Callable[[], bool],
        stop: threading.Event,
    ) -> None:
        self.name = name
        self.queue = queue
        self.reconcile = reconcile
        self.is_leader = is_leader
        self.stop = stop

    def work(self) -> None:
        """One worker thread's loop, until `stop` is set."""
        while not self.stop.is_set():
            if not self.is_leader():
                self.stop.wait(0.2)
                continue
            key = self.queue.get(timeout=0.5)
            if key is None:
                continue
            try:
                delay = self.reconcile(key)
                self.queue.forget(key)
                if delay:
                    self.queue.add_after(key, delay)
            except Exception as error:
                if namespace_terminating(error):
                    # Nothing can be created there any more, and the namespace's deletion
                    # takes the object with it: retrying would only fill the log.
                    self.queue.forget(key)
                    log.debug("namespace terminating; not retried", extra={self.name: key})
                    continue
                backoff = self.queue.add_rate_limited(key)
                level = logging.INFO if is_conflict(error) else logging.WARNING
                log.log(
                    level,
                    "reconcile failed; retrying",
                    extra={
                        self.name: key,
                        "error": str(error)[:500],
                        "retry_in": round(backoff, 3),
                    },
                )
            finally:
                self.queue.done(key)

    def resync(self, period: float, keys: Callable[[], list[K]]) -> None:
        """Add every key again each `period` seconds, until `stop` is set."""
        while not self.stop.wait(period):
            for key in keys():
                self.queue.add(key)


def namespace_terminating(error: BaseException) -> bool:
    """A create refused because its namespace is being deleted (403, NamespaceTerminating)."""
    return (
        isinstance(error, ApiException)
        and error.status == 403
        and "NamespaceTerminating" in str(error.body or "")
    )


def is_conflict(error: BaseException) -> bool:
    """A write lost to a concurrent one: expected now and then, retried quietly."""
    return isinstance(error, ConflictRetriesExhausted) or (
        isinstance(error, ApiException) and error.status == 409
    )
