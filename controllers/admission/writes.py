"""Carrying out one cycle's decisions without waiting on the apiserver: each is assumed
(`assumed.py`) and written in the background, at most `write_workers` at a time.

A preemptor's hold on nodes (`status.nomination`) is written before any of its victims is
evicted, in the same background task: if the controller dies between the two, the next
leader finds the room already claimed; if the hold cannot be written, no one is evicted for
it (their assumed evictions are rolled back).

Every write names the resourceVersion the snapshot saw: if a Workload changed in the
meantime the write is refused, re-read and re-decided by the same change (which refuses a
Workload admitted, finished, resized or deleted since), so nothing is admitted from a stale
view, and nothing is admitted twice. A write that failed for certain rolls its assumption
back and wakes the loop; one whose outcome is unknown keeps it until the watch shows the
Workload. Admissions, evictions, slice replacements and preemption decisions go to the
history store through `record_later` once written.

No decision is lost to a failure: a Workload is claimed (no other decision for it) only
from the moment its write is planned until the write ends, and its change is assumed only
once the write is queued. Planning that fails (a failed cycle) releases the claim and has
assumed nothing; a write that fails releases it too. Either way the next cycle, which the
loop runs within a second, decides that Workload again.

Cached Workloads are never changed here: every change is made on a deep copy
(`_change`, `apply.update`), and what is assumed is frozen as the cache is.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from kubernetes.client.exceptions import ApiException

from controllers.admission.assumed import Assumptions
from controllers.admission.view import View
from controllers.history import transitions as history
from controllers.runtime import apply
from controllers.runtime.client import NotLeaderError
from controllers.runtime.coalesce import CoalescingWriter
from controllers.runtime.resources import WORKLOAD, Obj
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.conditions import WorkloadConditions as WC
from quota.api.quantity import format_quantity
from quota.lifecycle.eviction import eviction_reason
from quota.lifecycle.slices import slice_replaced_message
from quota.model.decisions import Admit, CycleResult, Victim
from quota.model.snapshot import Assignment, Hold, Workload

log = logging.getLogger(__name__)

INADMISSIBLE = WC.INADMISSIBLE
PENDING = WC.PENDING


class DecisionWriter:
    """Writes what the engine decided onto Workloads and Jobs, in the background.

    `carry_out` returns at once: each decision is assumed (`assumed.py`) and its write goes
    to a pool of `write_workers` threads, so at most that many are in flight. A Workload with
    a write in flight gets no other decision until it ends (one write at a time per object,
    so a second never starts from a version the first is changing)."""

    def __init__(
        self,
        ctx: Context,
        poke: Callable[[], None],
        *,
        write_workers: int = 16,
        status_interval: float = 1.0,
        status_max_interval: float | None = None,
        assumed: Assumptions | None = None,
    ) -> None:
        self.ctx = ctx
        self.poke = poke
        self.assumed = assumed if assumed is not None else Assumptions()
        self._pool = ThreadPoolExecutor(max_workers=write_workers, thread_name_prefix="admit")
        self.pending_writer: CoalescingWriter[str] = CoalescingWriter(
            "workload-pending",
            self._write_pending,
            interval=status_interval,
            max_interval=status_max_interval,
        )
        self._is_leader: Callable[[], bool] = lambda: True
        self._lock = threading.Condition()
        self._in_flight: set[str] = set()
        self.admitted = 0

    def start(self, is_leader: Callable[[], bool]) -> None:
        """Start the pending-reason writer; it writes only while `is_leader()`."""
        self._is_leader = is_leader
        self.pending_writer.start(enabled=is_leader)

    def stop(self) -> None:
        """Stop writing; writes under way finish first, queued ones are dropped (the next
        leader decides them again)."""
        self.pending_writer.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def in_flight(self) -> int:
        """Workloads whose decision is being written."""
        with self._lock:
            return len(self._in_flight)

    # ------------------------------------------------------------------ the cycle's side
    def carry_out(self, view: View, result: CycleResult) -> None:
        """Assume every decision and queue its write; never waits on the apiserver.

        A decision is carried out whole or not at all (`_carry`): if this raises, the cycle
        fails with every decision it had not queued left as if never taken, and the next
        cycle decides those Workloads again."""
        if not self._is_leader():
            log.warning("lost leadership before writing decisions; dropping them")
            return
        holds = {p.workload: p.hold for p in result.pending}
        # When this cycle's reasons were decided: a pending write settles the requeue as of
        # then (`_write_pending`).
        decided = datetime.fromtimestamp(view.snapshot.now, UTC)
        for preempt in result.preempt:
            victims = preempt.victims
            self._carry(
                [preempt.preemptor, *(v.workload for v in victims)],
                partial(
                    self._plan_preemption,
                    view,
                    preempt.preemptor,
                    victims,
                    holds.get(preempt.preemptor),
                ),
            )
        for victim in result.drain:
            self._carry([victim.workload], partial(self._plan_drain, view, victim))
        for decision in result.admit:
            self._carry([decision.workload], partial(self._plan_admission, view, decision))
        with self._lock:
            busy = set(self._in_flight)
        now = self.ctx.now()
        for p in result.pending:
            if p.workload in busy:
                continue
            engine = view.engine.get(p.workload)
            nomination = nomination_status(engine, p.hold) if engine is not None else None
            self._submit_pending(view, p.workload, (PENDING, p.reason, nomination, decided), now)
        for key, reason, message in view.blocked:
            if key not in busy:
                self._submit_pending(view, key, (reason, message, None, decided), now)

    def _carry(self, keys: Sequence[str], plan: Callable[[], Task | None]) -> None:
        """Claim `keys`, plan their write and queue it (skipped if one is being written).

        The claim lasts until the write ends, and the planned changes are assumed only when
        the write is queued: a plan with nothing to write, or one that raises, leaves no
        claim and no assumption behind. (A claim left behind by a failed cycle kept its
        Workload from every later decision: issue 24's stranded Workload.)"""
        if not self._claim(keys):
            return
        queued = False
        try:
            task = plan()
            queued = task is not None and self._submit(keys, task)
        finally:
            if not queued:
                self._release(keys)

    def _claim(self, keys: Sequence[str]) -> bool:
        """Mark `keys` as being written; False (nothing marked) if any already is."""
        with self._lock:
            if any(k in self._in_flight for k in keys):
                return False
            self._in_flight.update(keys)
            return True

    def _release(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._in_flight.difference_update(keys)
            if not self._in_flight:
                self._lock.notify_all()

    def wait_written(self, timeout: float = 30.0) -> bool:
        """Wait until no decision is being written (tests and shutdown); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._in_flight, timeout)

    def _submit(self, keys: Sequence[str], task: Task) -> bool:
        """Assume the task's changes and queue its write; False if the pool is stopping (then
        nothing is assumed: the next leader decides again)."""
        for key, change in task.changes:
            self.assumed.assume(key, change.assumed)

        def run() -> None:
            try:
                task.write()
            except Exception:
                log.exception("decision write failed", extra={"workloads": list(keys)})
                for key in keys:
                    self.assumed.forget(key)
                self.poke()
            finally:
                for key, _ in task.changes:
                    self.assumed.written(key)
                self._release(keys)

        try:
            self._pool.submit(run)
        except RuntimeError:  # stopping
            for key, _ in task.changes:
                self.assumed.forget(key)
            return False
        return True

    def _write(self, key: str, change: Change) -> Obj | None:
        """Write an assumed change (from the version the cycle saw, retrying on conflict);
        the Workload as written, or None. Settles the assumption: kept only while the
        outcome is unknown (the watch, or its age, ends it then)."""
        made: list[bool] = []

        def tracked(w: Obj) -> bool:
            made[:] = [change.mutate(w)]
            return made[0]

        try:
            if not self._is_leader():
                raise NotLeaderError(f"not writing {key}: this replica does not lead")
            written = apply.update(
                self.ctx.kube,
                WORKLOAD,
                key,
                tracked,
                cache=self.ctx.caches.workloads,
                current=change.base,
                status=True,
            )
        except Exception as error:
            if _certainly_failed(error):
                self.assumed.forget(key)
            log.warning("decision write failed", extra={"workload": key, "error": str(error)})
            self.poke()
            return None
        if written is None or not made or not made[0]:
            self.assumed.forget(key)
            self.poke()  # gone, or it changed so that the decision no longer applies
            return None
        # Not forgotten here: the written version is in the cache now, which ends the
        # assumption the next time a view looks (a view that listed the cache just before
        # the write-through still sees the assumption, not the version before the write).
        return written

    # -------------------------------------------------------------------- admissions
    def _plan_admission(self, view: View, decision: Admit) -> Task | None:
        change = self._admission(view, decision)
        if change is None:
            return None
        return Task([(decision.workload, change)], partial(self._admit, view, decision, change))

    def _admission(self, view: View, decision: Admit) -> Change | None:
        key = decision.workload
        raw = view.raw.get(key)
        engine = view.engine.get(key)
        if raw is None or engine is None:
            return None
        admission = _assignment_status(engine, decision.queue, decision.assignments)
        generation = (raw.get("metadata") or {}).get("generation")
        now = self.ctx.now()

        def mutate(w: Obj) -> bool:
            # Decided on this generation of the spec; a resized Workload is decided again.
            if (w.get("metadata") or {}).get("generation") != generation:
                return False
            if wls.mark_admitted(w, admission, decision.reason, now):
                wls.status_of(w).pop("nomination", None)  # its room is its own now
                return True
            return False

        change = _change(raw, mutate)
        if change is not None:
            # A pending reason queued for it is moot now, and writing it would only make
            # this admission conflict.
            self.pending_writer.discard(key)
        return change

    def _admit(self, view: View, decision: Admit, change: Change) -> None:
        key = decision.workload
        written = self._write(key, change)
        if written is None:
            return
        with self._lock:
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
        now = self.ctx.now()
        self._record(lambda: [history.admitted(written, at=now, reason=decision.reason)])
        engine = view.engine.get(key)
        if engine is not None and engine.replaces is not None:
            self._retire(view, engine.replaces, key)

    def _retire(self, view: View, old_key: str, new_key: str) -> None:
        """The old slice is now part of the new one: mark it Finished."""
        raw = self.ctx.caches.workloads.get(old_key) or view.raw.get(old_key)
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

    # --------------------------------------------------------------------- evictions
    def _plan_drain(self, view: View, victim: Victim) -> Task | None:
        """Evict `victim` for its queue's stopPolicy (no preemptor)."""
        change = self._eviction(view, victim, None)
        if change is None:
            return None
        return Task([(victim.workload, change)], partial(self._evict, view, victim, change, None))

    def _eviction(self, view: View, victim: Victim, preemptor: str | None) -> Change | None:
        """`victim` evicted, or for single-pod disruption its admission shrunk by the pods
        it loses (None: there is nothing to evict now)."""
        raw = view.raw.get(victim.workload)
        if raw is None:
            return None
        if victim.pods is not None:
            taken, names = victim.pods, victim.pod_names
            return _change(raw, lambda w: wls.shed_pods(w, taken, names))
        # No preemptor: drained by its queue's stopPolicy.
        reason = eviction_reason(victim.kind if preemptor is not None else None)
        message = victim.reason
        now = self.ctx.now()
        engine = view.engine.get(victim.workload)
        # A moved workload gets the room it goes to in the same write that evicts it.
        held = nomination_status(engine, victim.hold) if engine is not None else None

        def mutate(w: Obj) -> bool:
            if not wls.mark_evicted(w, reason, message, now, preemptor):
                return False
            if held is not None:
                _set_nomination(w, held)
            return True

        return _change(raw, mutate)

    def _evict(
        self, view: View, victim: Victim, change: Change, preemptor: str | None
    ) -> Obj | None:
        """Write the eviction; returns the Workload as evicted (None if it was not)."""
        written = self._write(victim.workload, change)
        if written is None:
            return None
        if victim.pods is not None:
            return self._shed(victim, written, preemptor)
        if not wls.is_evicted(written):
            return None
        reason = str((wls.condition(written, wls.EVICTED) or {}).get("reason") or "")
        log.info(
            "evicting workload",
            extra={
                "workload": victim.workload,
                "queue": victim.queue,
                "reason": reason,
                "preemptor": preemptor,
                "detail": victim.reason,
                "identity": self.ctx.identity,
            },
        )
        # The recorder tells the victim's owner too, of any kind (jobs/ownerevents.py).
        self.ctx.events.emit(written, "Warning", reason, victim.reason)
        now = self.ctx.now()
        self._record(
            lambda: [
                history.evicted(written, at=now, actor=preemptor or "", cluster_queue=victim.queue)
            ]
        )
        return written

    def _shed(self, victim: Victim, written: Obj, preemptor: str | None) -> Obj:
        """Single-pod preemption written: the Workload's controller deletes the named pods
        (their owner may make them again, gated, to come back through a slice)."""
        log.info(
            "preempting single pods",
            extra={
                "workload": victim.workload,
                "queue": victim.queue,
                "pods": list(victim.pod_names),
                "preemptor": preemptor,
                "identity": self.ctx.identity,
            },
        )
        names = ", ".join(n.rpartition("/")[2] for n in victim.pod_names)
        self.ctx.events.emit(
            written, "Warning", WC.PODS_PREEMPTED, victim.reason + (f": {names}" if names else "")
        )
        return written

    # -------------------------------------------------------------------- preemption
    def _plan_preemption(
        self, view: View, preemptor: str, victims: Sequence[Victim], hold: Hold | None
    ) -> Task | None:
        """The preemptor's hold and its victims' evictions, written in one task: the hold
        first, then the victims (no one is evicted for a hold that could not be written)."""
        hold_change: Change | None = None
        raw = view.raw.get(preemptor)
        engine = view.engine.get(preemptor)
        if hold is not None:
            if raw is None or engine is None:
                return None
            nomination = nomination_status(engine, hold)
            if wls.nomination(raw) != nomination:
                hold_change = _change(
                    raw, lambda w: False if wls.has_quota(w) else _set_nomination(w, nomination)
                )
                if hold_change is None:
                    return None
        evictions: list[tuple[Victim, Change]] = []
        for victim in victims:
            change = self._eviction(view, victim, preemptor)
            if change is not None:
                evictions.append((victim, change))
        changes = [(v.workload, c) for v, c in evictions]
        if hold_change is not None:
            changes.insert(0, (preemptor, hold_change))
        return Task(changes, partial(self._preempt, view, preemptor, hold, hold_change, evictions))

    def _preempt(
        self,
        view: View,
        preemptor: str,
        hold: Hold | None,
        hold_change: Change | None,
        evictions: list[tuple[Victim, Change]],
    ) -> None:
        if hold_change is not None:
            written = self._write(preemptor, hold_change)
            if written is None:
                for victim, _ in evictions:  # not evicted for a hold that was not written
                    self.assumed.forget(victim.workload)
                return
        evicted = []
        for victim, change in evictions:
            done = self._evict(view, victim, change, preemptor)
            if done is not None:
                evicted.append((done, victim.queue, victim.reason))
        if evicted:
            kind = evictions[0][0].kind
            self._record_preemption(view, preemptor, evicted, kind, hold)

    # ---------------------------------------------------------------- pending reasons
    def _submit_pending(self, view: View, key: str, desired: Pending, now: datetime) -> None:
        raw = view.raw.get(key) or self.ctx.caches.workloads.get(key)
        if raw is None:
            return
        reason, message, nomination, _ = desired
        current = wls.condition(raw, wls.QUOTA_RESERVED) or {}
        if (
            current.get("reason") == reason
            and current.get("message") == message
            and wls.nomination(raw) == nomination
            and not wls.requeue_unsettled(raw, now)  # Requeued is due to turn True
        ):
            self.pending_writer.discard(key)
            return
        self.pending_writer.submit(key, desired)

    def _write_pending(self, key: str, desired: Pending) -> None:
        reason, message, nomination, decided = desired
        now = self.ctx.now()

        def mutate(w: Obj) -> bool:
            # Requeued turns True only with a reason decided once the backoff was over, so
            # the conditions never say "competes since" beside "competes from" (a reason
            # decided just before the backoff's end, written just after it).
            changed = wls.mark_pending(w, reason, message, now, settled_at=decided)
            if wls.has_quota(w) or wls.is_finished(w):
                return changed
            return _set_nomination(w, nomination) or changed

        apply.update(
            self.ctx.kube, WORKLOAD, key, mutate, cache=self.ctx.caches.workloads, status=True
        )

    # ----------------------------------------------------------------------- history
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
        verb = {"consolidate": WC.MOVING, "reclaim": WC.RECLAIMING}.get(strategy, WC.PREEMPTING)
        message = f"{decision.reason} ({names})"
        # The recorder tells the preemptor's owner too, of any kind (jobs/ownerevents.py).
        self.ctx.events.emit(raw, "Normal", verb, message)
        self._record(lambda: [decision])


# A pending Workload's QuotaReserved reason and message, the nomination to hold with it, and
# when the cycle decided them.
Pending = tuple[str, str, Obj | None, datetime]


@dataclass(frozen=True)
class Change:
    """A decision's write: the version it starts from, the change it makes, and the Workload
    as it makes it (assumed while the write is under way)."""

    base: Obj
    mutate: Callable[[Obj], bool]
    assumed: Obj


def _change(raw: Obj, mutate: Callable[[Obj], bool]) -> Change | None:
    """`mutate` applied to a copy of `raw` (a cached Workload, which no one changes in
    place); None if it changes nothing."""
    assumed = copy.deepcopy(raw)
    if not mutate(assumed):
        return None
    return Change(raw, mutate, assumed)


@dataclass(frozen=True)
class Task:
    """One decision's background write: the changes it makes, by Workload (assumed when
    it is queued), and the function that writes them."""

    changes: Sequence[tuple[str, Change]]
    write: Callable[[], object]


def _certainly_failed(error: BaseException) -> bool:
    """Whether a write surely changed nothing (so its assumption can go at once): refused by
    the apiserver, kept conflicting, or never sent. A timeout or a lost connection may have
    applied it."""
    if isinstance(error, NotLeaderError | apply.ConflictRetriesExhausted):
        return True
    return isinstance(error, ApiException) and error.status is not None and error.status < 500


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
