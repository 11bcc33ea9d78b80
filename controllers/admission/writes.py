"""Carrying out one cycle's decisions: evictions first (they release the room later cycles
use), then admissions (in parallel; they are independent), then pending reasons through a
coalescing writer.

A preemptor's hold on nodes (`status.nomination`) is written before any of its victims is
evicted: if the controller dies between the two, the next leader finds the room already
claimed; if the hold cannot be written, no one is evicted for it this cycle.

Every write names the resourceVersion the snapshot saw: if a Workload changed in the
meantime the write is refused and the next cycle decides again, so nothing is admitted from
a stale view, and nothing is admitted twice. Admissions, evictions, slice replacements and
preemption decisions go to the history store through `record_later`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from controllers.admission.view import View
from controllers.history import transitions as history
from controllers.jobs.batchjob import job_key_of_workload
from controllers.runtime import apply
from controllers.runtime.coalesce import CoalescingWriter
from controllers.runtime.resources import WORKLOAD, Obj
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.conditions import WorkloadConditions as WC
from quota.api.quantity import format_quantity
from quota.lifecycle.slices import slice_replaced_message
from quota.model.decisions import Admit, CycleResult, Victim
from quota.model.snapshot import Assignment, Hold, Workload

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

INADMISSIBLE = WC.INADMISSIBLE
PENDING = WC.PENDING


class DecisionWriter:
    """Writes what the engine decided onto Workloads and Jobs."""

    def __init__(
        self,
        ctx: Context,
        poke: Callable[[], None],
        *,
        write_workers: int = 4,
        status_interval: float = 1.0,
    ) -> None:
        self.ctx = ctx
        self.poke = poke
        self._pool = ThreadPoolExecutor(max_workers=write_workers, thread_name_prefix="admit")
        self.pending_writer: CoalescingWriter[str] = CoalescingWriter(
            "workload-pending", self._write_pending, interval=status_interval
        )
        self._is_leader: Callable[[], bool] = lambda: True
        self.admitted = 0

    def start(self, is_leader: Callable[[], bool]) -> None:
        """Start the pending-reason writer; it writes only while `is_leader()`."""
        self._is_leader = is_leader
        self.pending_writer.start(enabled=is_leader)

    def stop(self) -> None:
        """Stop writing; admissions under way finish first."""
        self.pending_writer.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def carry_out(self, view: View, result: CycleResult) -> None:
        if not self._is_leader():
            log.warning("lost leadership before writing decisions; dropping them")
            return
        holds = {p.workload: p.hold for p in result.pending}
        for preempt in result.preempt:
            hold = holds.get(preempt.preemptor)
            if hold is not None and not self._nominate(view, preempt.preemptor, hold):
                continue
            evicted = []
            for victim in preempt.victims:
                written = self._evict(view, victim, preemptor=preempt.preemptor)
                if written is not None:
                    evicted.append((written, victim.queue, victim.reason))
            if evicted:
                self._record_preemption(
                    view, preempt.preemptor, evicted, preempt.victims[0].kind, hold
                )
        for victim in result.drain:
            self._evict(view, victim, preemptor=None)
        if result.admit:
            list(self._pool.map(lambda a: self._admit(view, a), result.admit))
        for p in result.pending:
            engine = view.engine.get(p.workload)
            nomination = nomination_status(engine, p.hold) if engine is not None else None
            self._submit_pending(view, p.workload, PENDING, p.reason, nomination)
        for key, reason, message in view.blocked:
            self._submit_pending(view, key, reason, message, None)

    def _job_of(self, wl: Obj) -> Obj | None:
        job_key = job_key_of_workload(wl)
        return self.ctx.caches.jobs.get(job_key) if job_key else None

    def _admit(self, view: View, decision: Admit) -> None:
        key = decision.workload
        raw = view.raw.get(key)
        engine = view.engine.get(key)
        if raw is None or engine is None or not self._is_leader():
            return
        # A pending reason queued for it is moot now, and writing it would only make this
        # admission conflict.
        self.pending_writer.discard(key)
        admission = _assignment_status(engine, decision.queue, decision.assignments)
        generation = (raw.get("metadata") or {}).get("generation")
        now = self.ctx.now()
        done: list[bool] = []

        def mutate(w: Obj) -> bool:
            # Decided on this generation of the spec; a resized Workload is decided again.
            if (w.get("metadata") or {}).get("generation") != generation:
                return False
            if wls.mark_admitted(w, admission, decision.reason, now):
                wls.status_of(w).pop("nomination", None)  # its room is its own now
                done.append(True)
                return True
            return False

        try:
            written = apply.update(
                self.ctx.kube,
                WORKLOAD,
                key,
                mutate,
                cache=self.ctx.caches.workloads,
                current=raw,
                status=True,
            )
        except Exception as error:
            log.warning("admission write failed", extra={"workload": key, "error": str(error)})
            self.poke()
            return
        if written is None or not done:
            self.poke()
            return
        self.admitted += 1
        log.info(
            "admitted workload",
            extra={
                "workload": key,
                "queue": decision.queue,
                "borrowing": decision.borrowing,
                "reason": decision.reason,
                "identity": self.ctx.identity,
            },
        )
        # The Job hears of it when it is started (controllers.jobs.batchjob), in the same words.
        self.ctx.events.emit(written, "Normal", "Admitted", decision.reason)
        self._record(lambda: [history.admitted(written, at=now, reason=decision.reason)])
        if engine.replaces is not None:
            self._retire(view, engine.replaces, key)

    def _retire(self, view: View, old_key: str, new_key: str) -> None:
        """The old slice is now part of the new one: mark it Finished."""
        raw = view.raw.get(old_key) or self.ctx.caches.workloads.get(old_key)
        if raw is None:
            return
        now = self.ctx.now()
        message = slice_replaced_message(new_key.split("/", 1)[1])
        written = apply.update(
            self.ctx.kube,
            WORKLOAD,
            old_key,
            lambda w: wls.mark_finished(w, WC.SLICE_REPLACED, message, now),
            cache=self.ctx.caches.workloads,
            status=True,
        )
        if written is not None:
            self.ctx.events.emit(written, "Normal", WC.SLICE_REPLACED, message)
            self._record(lambda: [history.finished(written, at=now, actor=new_key)])

    def _evict(self, view: View, victim: Victim, preemptor: str | None) -> Obj | None:
        """Ask for the eviction; returns the Workload as evicted (None if it was not)."""
        raw = view.raw.get(victim.workload)
        if raw is None:
            return None
        if preemptor is None:
            reason = WC.CLUSTER_QUEUE_STOPPED
        elif victim.kind == "Reclaimed":
            reason = WC.EVICTED_BY_RECLAIM
        elif victim.kind == "Moved":
            reason = WC.MOVED
        else:
            reason = WC.EVICTED_BY_PREEMPTION
        message = victim.reason
        now = self.ctx.now()
        engine = view.engine.get(victim.workload)
        # A moved workload gets the room it goes to in the same write that evicts it.
        held = nomination_status(engine, victim.hold) if engine is not None else None

        def mutate(w: Obj) -> bool:
            if not wls.mark_evicted(w, reason, message, now):
                return False
            if held is not None:
                _set_nomination(w, held)
            return True

        try:
            written = apply.update(
                self.ctx.kube,
                WORKLOAD,
                victim.workload,
                mutate,
                cache=self.ctx.caches.workloads,
                current=raw,
                status=True,
            )
        except Exception as error:
            log.warning(
                "eviction write failed", extra={"workload": victim.workload, "error": str(error)}
            )
            self.poke()
            return None
        if written is None or not wls.is_evicted(written):
            return None
        log.info(
            "evicting workload",
            extra={
                "workload": victim.workload,
                "queue": victim.queue,
                "reason": reason,
                "preemptor": preemptor,
                "detail": message,
                "identity": self.ctx.identity,
            },
        )
        self.ctx.events.emit(written, "Warning", reason, message)
        job = self._job_of(written)
        if job is not None:
            self.ctx.events.emit(job, "Warning", reason, message)
        self._record(
            lambda: [
                history.evicted(written, at=now, actor=preemptor or "", cluster_queue=victim.queue)
            ]
        )
        return written

    def _submit_pending(
        self, view: View, key: str, reason: str, message: str, nomination: Obj | None
    ) -> None:
        raw = view.raw.get(key) or self.ctx.caches.workloads.get(key)
        if raw is None:
            return
        current = wls.condition(raw, wls.QUOTA_RESERVED) or {}
        if (
            current.get("reason") == reason
            and current.get("message") == message
            and wls.status_of(raw).get("nomination") == nomination
        ):
            self.pending_writer.discard(key)
            return
        self.pending_writer.submit(key, (reason, message, nomination))

    def _write_pending(self, key: str, desired: tuple[str, str, Obj | None]) -> None:
        reason, message, nomination = desired
        now = self.ctx.now()

        def mutate(w: Obj) -> bool:
            changed = wls.mark_pending(w, reason, message, now)
            if wls.has_quota(w) or wls.is_finished(w):
                return changed
            return _set_nomination(w, nomination) or changed

        apply.update(
            self.ctx.kube, WORKLOAD, key, mutate, cache=self.ctx.caches.workloads, status=True
        )

    def _nominate(self, view: View, key: str, hold: Hold) -> bool:
        """Write the preemptor's hold before its victims are evicted; False if it could not
        be written (the next cycle decides again, and no one was evicted)."""
        raw = view.raw.get(key)
        engine = view.engine.get(key)
        if raw is None or engine is None:
            return False
        nomination = nomination_status(engine, hold)
        if wls.status_of(raw).get("nomination") == nomination:
            return True
        try:
            written = apply.update(
                self.ctx.kube,
                WORKLOAD,
                key,
                lambda w: False if wls.has_quota(w) else _set_nomination(w, nomination),
                cache=self.ctx.caches.workloads,
                current=raw,
                status=True,
            )
        except Exception as error:
            log.warning("hold write failed", extra={"workload": key, "error": str(error)})
            self.poke()
            return False
        if written is None or wls.status_of(written).get("nomination") != nomination:
            self.poke()
            return False
        return True

    def _record(self, make: Callable[[], Iterable[Any]]) -> None:
        """Hand records to the history store, built on its thread from frozen objects (the
        Workloads as written, which nothing changes afterwards)."""
        if self.ctx.recorder is None:
            return

        def built() -> list[Any]:
            return [r for r in make() if r is not None]

        self.ctx.record_later(built)

    def _record_preemption(
        self,
        view: View,
        preemptor: str,
        evicted: list[tuple[Obj, str, str]],
        kind: str,
        hold: Hold | None,
    ) -> None:
        """The decision in the history store, and in an Event on the preemptor and its Job:
        whom it evicts (or moves), and where its room is held."""
        raw = view.raw.get(preemptor)
        engine = view.engine.get(preemptor)
        if raw is None or engine is None:
            return
        now = self.ctx.now()
        strategy = {"Reclaimed": "reclaim", "Moved": "consolidate"}.get(kind, "preempt")
        held = sorted({node for a in hold.assignments for node, _ in a.nodes}) if hold else []
        decision = history.preemption(
            raw, evicted, at=now, cluster_queue=engine.queue, strategy=strategy, held=held
        )
        names = ", ".join(
            f"{(w.get('metadata') or {}).get('namespace')}/{(w.get('metadata') or {}).get('name')}"
            for w, _, _ in evicted
        )
        verb = {"consolidate": "Moving", "reclaim": "Reclaiming"}.get(strategy, "Preempting")
        message = f"{decision.reason} ({names})"
        self.ctx.events.emit(raw, "Normal", verb, message)
        job = self._job_of(raw)
        if job is not None:
            self.ctx.events.emit(job, "Normal", verb, message)
        self._record(lambda: [decision])


def _assignment_status(engine: Workload, queue: str, assignments: Sequence[Assignment]) -> Obj:
    """status.admission for `assignments` (pod set, count, flavors, usage, planned nodes)."""
    per_pod = {ps.name: ps.per_pod for ps in engine.pod_sets}
    return wls.admission_status(
        queue,
        [
            (
                a.pod_set,
                a.count,
                a.flavors,
                {
                    r: format_quantity(v * a.count, r)
                    for r, v in per_pod.get(a.pod_set, {}).items()
                    if v
                },
            )
            for a in assignments
        ],
        nodes={a.pod_set: a.nodes for a in assignments if a.nodes},
    )


def nomination_status(engine: Workload, hold: Hold | None) -> Obj | None:
    """status.nomination for `hold` (None clears it): where the room is, in the same terms
    as status.admission."""
    if hold is None:
        return None
    held = _assignment_status(engine, engine.queue, hold.assignments)
    return {
        "since": wls.rfc3339(datetime.fromtimestamp(hold.since, UTC)),
        "victims": list(hold.victims),
        "podSetAssignments": held["podSetAssignments"],
    }


def _set_nomination(w: Obj, nomination: Obj | None) -> bool:
    status = wls.status_of(w)
    if status.get("nomination") == nomination:
        return False
    if nomination is None:
        status.pop("nomination", None)
    else:
        status["nomination"] = nomination
    return True
