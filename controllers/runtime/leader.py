"""Leader election on a coordination.k8s.io/v1 Lease, as client-go does it.

A candidate takes the Lease when it is free or its holder has not renewed it for a whole
lease duration, measured on the candidate's own clock from the moment it last saw the
Lease change (so clock skew between machines cannot make two holders). Every write carries
the resourceVersion it read, so of two candidates racing for one Lease exactly one wins.

The leader renews every `retry_period`. It considers itself leader only while its last
successful renewal is younger than `renew_deadline`, which is shorter than the lease
duration: a leader cut off from the apiserver stops acting before anyone else may start.
A renewal counts from the moment its request was sent, not from when the answer came: a slow
answer must not stretch the lead past what the standby (which counts from when it saw the
renewal) allows. `leadership_left()` is how long this replica may still act; the leader's
API client (`controllers/runtime/client.py`) refuses a write when it is up and gives every
write no longer than it to finish.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from controllers.runtime.resources import LEASE, Kube, Obj

log = logging.getLogger(__name__)


def lease_request_timeout(renew_deadline: float, retry_period: float) -> float:
    """How long one Lease request may take: short enough that a hung renewal is abandoned and
    retried (after `retry_period`) while the renew deadline still leaves room for it."""
    return max(0.5, (renew_deadline - retry_period) / 2)


def micro_time(moment: datetime) -> str:
    """A metav1.MicroTime string."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire and hold one Lease; `is_leader()` says whether this process may act now."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callable[[], None] = lambda: None,
        on_stopped_leading: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._last_renew: float | None = None  # monotonic time of our last successful write
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._leading = False
        self.transitions = 0

    # ------------------------------------------------------------------ queries
    def is_leader(self) -> bool:
        """True only while our last renewal is recent enough to be safe to act on."""
        with self._lock:
            return (
                self._leading
                and self._last_renew is not None
                and self._clock() - self._last_renew < self.renew_deadline
            )

    def leadership_left(self) -> float:
        """Seconds this replica may still act as leader by its own clock (0 if it does not lead)."""
        with self._lock:
            if not self._leading or self._last_renew is None:
                return 0.0
            return max(0.0, self._last_renew + self.renew_deadline - self._clock())

    def wait_leader(self, stop: threading.Event, poll: float = 0.1) -> bool:
        """Block until this process leads (True) or `stop` is set (False)."""
        while not stop.is_set():
            if self.is_leader():
                return True
            stop.wait(poll)
        return False

    # --------------------------------------------------------------------- loop
    def run(self, stop: threading.Event) -> None:
        """Try to acquire, then renew, until `stop`; release the Lease on the way out."""
        try:
            while not stop.is_set():
                ok = self.try_acquire_or_renew()
                # After a failed renewal we stay leader until the renew deadline passes.
                self._set_leading(ok or self.is_leader())
                stop.wait(self.retry_period)
        finally:
            if self._leading:
                self.release()
            self._set_leading(False)

    def _set_leading(self, leading: bool) -> None:
        with self._lock:
            changed = leading != self._leading
            self._leading = leading
        if not changed:
            return
        if leading:
            log.info("became leader", extra={"lease": f"{self.namespace}/{self.name}"})
            self._on_started()
        else:
            log.warning("stopped leading", extra={"lease": f"{self.namespace}/{self.name}"})
            self._on_stopped()

    def _spec(self, lease: Obj | None, acquiring: bool) -> dict[str, Any]:
        now = micro_time(self._wall())
        old = (lease or {}).get("spec") or {}
        transitions = int(old.get("leaseTransitions") or 0)
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "renewTime": now,
            "acquireTime": old.get("acquireTime") or now,
            "leaseTransitions": transitions,
        }
        if acquiring:
            spec["acquireTime"] = now
            if old.get("holderIdentity"):
                spec["leaseTransitions"] = transitions + 1
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True if we hold the Lease after it."""
        try:
            lease = self.kube.get(LEASE, self.namespace, self.name)
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(None, acquiring=True),
                }
                sent = self._clock()
                self.kube.create(LEASE, self.namespace, body)
                self._renewed(sent)
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            record = (holder, str(spec.get("renewTime") or ""))
            now = self._clock()
            if record != self._observed:
                self._observed = record
                self._observed_at = now
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            held_by_other = holder and holder != self.identity
            if held_by_other and now < self._observed_at + duration:
                return False
            patch = {
                "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": self._spec(lease, acquiring=holder != self.identity),
            }
            sent = self._clock()
            self.kube.patch(LEASE, self.namespace, self.name, patch)
            self._renewed(sent)
            return True
        except ApiException as error:
            if error.status in (409, 422):
                return False  # someone else wrote the Lease first
            log.warning("lease renewal failed", extra={"error": str(error)[:300]})
            return False
        except Exception as error:
            log.warning("lease renewal failed", extra={"error": str(error)[:300]})
            return False

    def _renewed(self, sent: float) -> None:
        with self._lock:
            if not self._leading:
                self.transitions += 1
            self._last_renew = sent

    def release(self) -> None:
        """Give the Lease up at once (on graceful shutdown) so a standby need not wait for
        it to expire."""
        with self._lock:
            self._leading = False
            self._last_renew = None
        try:
            lease = self.kube.get(LEASE, self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            now = micro_time(self._wall())
            patch = {
                "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": {"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": now},
            }
            self.kube.patch(LEASE, self.namespace, self.name, patch)
            log.info("released leadership", extra={"lease": f"{self.namespace}/{self.name}"})
        except Exception as error:
            log.warning("could not release the lease", extra={"error": str(error)[:300]})
