"""The admission loop: build a snapshot from the caches, ask the quota engine, carry out
what it decided.

Only the leader runs it. A cycle starts shortly after anything it decides from changes
(Workloads, queues, flavors, nodes), batching bursts of events into one cycle, and at least
every `resync` seconds (for requeue backoffs that expire). Decisions are written to the
Workloads' status with the resourceVersion the snapshot saw: if a Workload changed in the
meantime the write is refused and the next cycle decides again, so nothing is admitted from
a stale view, and nothing is admitted twice.

Order within a cycle: evictions first (they release the room later cycles use), then
admissions (in parallel; they are independent), then pending reasons and queue status
through coalescing writers.

History: admissions, evictions (with the preemptor), slice replacements and preemption
decisions go to the history store through `record_later`, built on the recorder's thread from
the objects as written; the loop never waits on the database. With time-based fair share on,
the snapshot carries the usage figures the history store last computed, read from memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from controllers.admission import queuestatus
from controllers.admission.queuestatus import QueueStatus, QueueStatusPublisher
from controllers.history import transitions as history
from controllers.jobs.batchjob import job_key_of_workload
from controllers.runtime import apply
from controllers.runtime.coalesce import CoalescingWriter
from controllers.runtime.gcpause import paused_collection
from controllers.runtime.resources import WORKLOAD, Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.admission.cycle import admission_cycle
from quota.api.clusterqueue import ClusterQueue
from quota.api.conditions import ClusterQueueConditions
from quota.api.conditions import WorkloadConditions as WC
from quota.api.localqueue import LocalQueue
from quota.api.quantity import format_quantity
from quota.api.queuetree import QueueState, QueueTree, check_queue_tree
from quota.api.resourceflavor import ResourceFlavor
from quota.api.workload import Workload as WorkloadModel
from quota.fairness.fairshare import FairShare, fair_share
from quota.model import convert
from quota.model.decisions import Admit, CycleResult, Victim
from quota.model.resources import FlavorResource
from quota.model.snapshot import (
    QueueSpec,
    Snapshot,
    Workload,
    pod_set_usage,
    queue_tree,
    superseded_slices,
)

if TYPE_CHECKING:
    from controllers.history.usage import UsageFigures

log = logging.getLogger(__name__)

INADMISSIBLE = WC.INADMISSIBLE
PENDING = WC.PENDING


def _epoch(text: str | None, default: float = 0.0) -> float:
    moment = wls.parse_time(text)
    return moment.timestamp() if moment is not None else default


def engine_workload(wl: WorkloadModel, queue: str, raw: Mapping[str, Any]) -> Workload:
    """A Workload as the engine sees it (through `quota.model.convert`), with the times and the
    eviction state only the cluster object knows."""
    admitted_at = None
    if wls.has_quota(raw):
        reserved = wls.condition(raw, wls.QUOTA_RESERVED) or {}
        admitted_at = _epoch(reserved.get("lastTransitionTime"))
    return convert.workload(
        wl,
        queue,
        arrival=_epoch((raw.get("metadata") or {}).get("creationTimestamp")),
        admitted_at=admitted_at,
        evicting=wls.is_evicted(raw),
    )


@dataclass
class View:
    """One cycle's snapshot plus what the shell needs to act on the decisions."""

    snapshot: Snapshot
    tree: QueueTree
    raw: dict[str, Obj]  # workload key -> the object the snapshot was built from
    engine: dict[str, Workload]  # workload key -> as the engine saw it
    cluster_queues: dict[str, ClusterQueue]
    lq_of: dict[str, str]  # workload key -> "namespace/localqueue"
    blocked: list[tuple[str, str, str]] = field(default_factory=list)  # key, reason, message


class AdmissionLoop:
    """Leader-only loop: snapshot, decide, write."""

    def __init__(
        self,
        ctx: Context,
        *,
        min_interval: float = 0.05,
        resync: float = 2.0,
        write_workers: int = 4,
        status_interval: float = 1.0,
        use_node_capacity: bool = True,
        usage: UsageFigures | None = None,
        busy: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.min_interval = min_interval
        self.resync = resync
        self.use_node_capacity = use_node_capacity
        self._dirty = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=write_workers, thread_name_prefix="admit")
        self.queue_status = QueueStatusPublisher(ctx, interval=status_interval)
        self.pending_writer: CoalescingWriter[str] = CoalescingWriter(
            "workload-pending", self._write_pending, interval=status_interval
        )
        self._parsed: dict[str, tuple[Any, Any]] = {}  # key -> (version, parsed)
        self._is_leader: Callable[[], bool] = lambda: True
        self.cycles = 0
        self.admitted = 0
        self._last_cycle_seconds = 0.0
        # Time-based fair share: figures a history job refreshes; None turns it off.
        self.usage = usage
        self._historical: tuple[Any, dict[str, float]] = (None, {})
        # The history recorder holds its writes back while a cycle runs.
        self._busy = busy or nullcontext
        # The last cycle's fair share (usage and demand included), for the history store's
        # usage samples: replaced whole each cycle, never mutated, so any thread may read it.
        self.last_fair_share: FairShare | None = None

    # ------------------------------------------------------------------ driving
    def poke(self) -> None:
        """Something a decision depends on changed: run a cycle soon."""
        self._dirty.set()

    def start_writers(self, is_leader: Callable[[], bool]) -> None:
        self._is_leader = is_leader
        self.queue_status.writer.start(enabled=is_leader)
        self.pending_writer.start(enabled=is_leader)

    def run(self, stop: threading.Event, is_leader: Callable[[], bool]) -> None:
        self._is_leader = is_leader
        while not stop.is_set():
            self._dirty.wait(self.resync)
            if stop.is_set():
                break
            if not is_leader():
                self._dirty.clear()
                stop.wait(0.2)
                continue
            # Let a burst of events land before deciding, so one cycle covers them all; and
            # after a long cycle wait as long again, so the loop never takes more than half of
            # the process (the webhooks and reconcilers share it).
            stop.wait(max(self.min_interval, self._last_cycle_seconds))
            self._dirty.clear()
            started = time.monotonic()
            try:
                self.cycle()
            except Exception:
                log.exception("admission cycle failed")
                stop.wait(1.0)
                self._dirty.set()
            self._last_cycle_seconds = min(2.0, time.monotonic() - started)

    def stop(self) -> None:
        self.queue_status.writer.stop()
        self.pending_writer.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # --------------------------------------------------------------- one cycle
    def cycle(self) -> CycleResult:
        """One admission cycle; returns the engine's decisions."""
        started = time.monotonic()
        with self._busy():
            view = self.build()
            with paused_collection():
                fair = fair_share(view.snapshot)
                result = admission_cycle(view.snapshot, fair)
            self.carry_out(view, result)
            self.publish(view, fair, result)
        self.last_fair_share = fair
        self.cycles += 1
        if result.admit or result.preempt or result.drain:
            log.info(
                "admission cycle",
                extra={
                    "admitted": len(result.admit),
                    "preempting": len(result.preempt),
                    "drained": len(result.drain),
                    "pending": len(result.pending) + len(view.blocked),
                    "seconds": round(time.monotonic() - started, 3),
                },
            )
        return result

    def _engine_workload(self, key: str, raw: Obj, model: WorkloadModel, queue: str) -> Workload:
        rv = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        cache_key = f"engine:{key}"
        cached = self._parsed.get(cache_key)
        if cached is not None and cached[0] == (rv, queue):
            converted: Workload = cached[1]
            return converted
        converted = engine_workload(model, queue, raw)
        self._parsed[cache_key] = ((rv, queue), converted)
        return converted

    def _model(self, key: str, raw: Obj, model: type[Any]) -> Any:
        rv = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._parsed.get(key)
        if cached is not None and cached[0] == rv:
            return cached[1]
        parsed = model.model_validate(raw)
        self._parsed[key] = (rv, parsed)
        return parsed

    def build(self) -> View:
        """The snapshot, from the caches."""
        caches = self.ctx.caches
        now = self.ctx.now()
        flavor_models: list[ResourceFlavor] = []
        for raw in caches.flavors.objects():
            try:
                flavor_models.append(self._model(f"rf:{object_key(raw)}", raw, ResourceFlavor))
            except ValidationError as error:
                log.warning("invalid ResourceFlavor", extra={"error": str(error)[:300]})
        cq_models: dict[str, ClusterQueue] = {}
        for raw in caches.cluster_queues.objects():
            try:
                cq = self._model(f"cq:{object_key(raw)}", raw, ClusterQueue)
            except ValidationError as error:
                log.warning("invalid ClusterQueue", extra={"error": str(error)[:300]})
                continue
            cq_models[cq.name] = cq
        lq_models: list[LocalQueue] = []
        for raw in caches.local_queues.objects():
            try:
                lq_models.append(self._model(f"lq:{object_key(raw)}", raw, LocalQueue))
            except ValidationError as error:
                log.warning("invalid LocalQueue", extra={"error": str(error)[:300]})
        tree = check_queue_tree(cq_models.values(), flavor_models, lq_models)
        tree = self._with_deletions(tree, cq_models)

        flavors = {rf.name: convert.flavor(rf) for rf in flavor_models}
        queues: dict[str, QueueSpec] = {}
        for name, cq in cq_models.items():
            state = tree.cluster_queues[name]
            spec = convert.queue_spec(cq, state.active, state.message)
            if state.reason in (
                ClusterQueueConditions.PARENT_NOT_FOUND,
                ClusterQueueConditions.CYCLE,
            ):
                # Inactive anyway; detached so that the rest of the tree stays a tree.
                spec = replace(spec, parent=None)
            queues[name] = spec
        lqs = {f"{lq.metadata.namespace}/{lq.name}": lq for lq in lq_models}

        admitted: list[Workload] = []
        pending: list[Workload] = []
        raw_by_key: dict[str, Obj] = {}
        engine: dict[str, Workload] = {}
        lq_of: dict[str, str] = {}
        blocked: list[tuple[str, str, str]] = []
        for raw in caches.workloads.objects():
            if wls.is_finished(raw):
                continue
            key = object_key(raw)
            try:
                model: WorkloadModel = self._model(f"wl:{key}", raw, WorkloadModel)
            except ValidationError as error:
                blocked.append((key, INADMISSIBLE, f"invalid Workload: {str(error)[:500]}"))
                continue
            namespace = model.metadata.namespace or ""
            lq_key = f"{namespace}/{model.spec.queue_name}"
            lq_of[key] = lq_key
            raw_by_key[key] = raw
            if wls.has_quota(raw):
                queue = ((raw.get("status") or {}).get("admission") or {}).get("clusterQueue")
                w = self._engine_workload(key, raw, model, str(queue))
                admitted.append(w)
                engine[key] = w
                continue
            lq = lqs.get(lq_key)
            if lq is None:
                blocked.append(
                    (
                        key,
                        INADMISSIBLE,
                        f"LocalQueue {model.spec.queue_name} does not exist in namespace "
                        f"{namespace}; create it, or fix the Job's label muster.dev/queue-name",
                    )
                )
                continue
            lq_state = tree.local_queues.get((namespace, lq.name))
            if lq_state is not None and not lq_state.active:
                blocked.append(
                    (key, INADMISSIBLE, f"LocalQueue {lq.name} is inactive: {lq_state.message}")
                )
                continue
            when = wls.requeue_at(raw)
            if when is not None and when > now:
                blocked.append(
                    (
                        key,
                        PENDING,
                        f"evicted earlier; back-off until {wls.rfc3339(when)} before it "
                        "competes for quota again",
                    )
                )
                continue
            w = self._engine_workload(key, raw, model, lq.spec.cluster_queue)
            pending.append(w)
            engine[key] = w
        # Drop parsed models of objects that are gone.
        live = (
            {f"wl:{k}" for k in raw_by_key}
            | {f"engine:{k}" for k in raw_by_key}
            | {k for k in self._parsed if not k.startswith(("wl:", "engine:"))}
        )
        for stale in [k for k in self._parsed if k not in live]:
            del self._parsed[stale]

        capacity = None
        if self.use_node_capacity:
            # No node of any flavor known: quota-only mode.
            capacity = convert.node_capacity(caches.nodes.objects(), flavors) or None
        snapshot = Snapshot(
            now=now.timestamp(),
            queues=queues,
            flavors=flavors,
            capacity=capacity,
            admitted=tuple(admitted),
            pending=tuple(pending),
            historical_usage=self._historical_usage(queues),
            usage_fairness_k=self.usage.k if self.usage is not None else 0.0,
        )
        return View(snapshot, tree, raw_by_key, engine, cq_models, lq_of, blocked)

    def _historical_usage(self, queues: Mapping[str, QueueSpec]) -> dict[str, float]:
        """Each queue's recent usage among its siblings, from the figures in memory.

        Recomputed only when the figures were refreshed or the tree changed shape."""
        if self.usage is None:
            return {}
        parents = {name: spec.parent for name, spec in queues.items()}
        stamp = (self.usage.computed_at, tuple(sorted(parents.items(), key=lambda p: p[0])))
        if self._historical[0] != stamp:
            self._historical = (stamp, self.usage.historical_usage(parents))
        return self._historical[1]

    @staticmethod
    def _with_deletions(tree: QueueTree, cqs: Mapping[str, ClusterQueue]) -> QueueTree:
        """A ClusterQueue being deleted admits nothing more (its admitted work keeps running
        until it finishes or is drained; the finalizer holds the deletion until then)."""
        states = dict(tree.cluster_queues)
        changed = False
        for name, cq in cqs.items():
            if cq.metadata.deletion_timestamp is not None and states[name].active:
                states[name] = QueueState(
                    False,
                    "Terminating",
                    "the ClusterQueue is being deleted; it admits nothing new and is removed "
                    "once no admitted workload holds quota in it",
                )
                changed = True
        if not changed:
            return tree
        return QueueTree(states, tree.local_queues, tree.children)

    # ---------------------------------------------------------- carrying out
    def carry_out(self, view: View, result: CycleResult) -> None:
        if not self._is_leader():
            log.warning("lost leadership before writing decisions; dropping them")
            return
        for preempt in result.preempt:
            evicted = []
            for victim in preempt.victims:
                written = self._evict(view, victim, preemptor=preempt.preemptor)
                if written is not None:
                    evicted.append((written, victim.queue, victim.reason))
            if evicted:
                self._record_preemption(view, preempt.preemptor, evicted, preempt.victims[0].kind)
        for victim in result.drain:
            self._evict(view, victim, preemptor=None)
        if result.admit:
            list(self._pool.map(lambda a: self._admit(view, a), result.admit))
        for p in result.pending:
            self._submit_pending(view, p.workload, PENDING, p.reason)
        for key, reason, message in view.blocked:
            self._submit_pending(view, key, reason, message)

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
        per_pod = {ps.name: ps.per_pod for ps in engine.pod_sets}
        admission = wls.admission_status(
            decision.queue,
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
                for a in decision.assignments
            ],
        )
        generation = (raw.get("metadata") or {}).get("generation")
        now = self.ctx.now()
        done: list[bool] = []

        def mutate(w: Obj) -> bool:
            # Decided on this generation of the spec; a resized Workload is decided again.
            if (w.get("metadata") or {}).get("generation") != generation:
                return False
            if wls.mark_admitted(w, admission, decision.reason, now):
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
        message = (
            f"replaced by slice {new_key.split('/', 1)[1]} after scale-up; its pods continue "
            "under the new slice"
        )
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
        else:
            reason = WC.EVICTED_BY_PREEMPTION
        message = victim.reason
        now = self.ctx.now()
        try:
            written = apply.update(
                self.ctx.kube,
                WORKLOAD,
                victim.workload,
                lambda w: wls.mark_evicted(w, reason, message, now),
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

    def _submit_pending(self, view: View, key: str, reason: str, message: str) -> None:
        raw = view.raw.get(key) or self.ctx.caches.workloads.get(key)
        if raw is None:
            return
        current = wls.condition(raw, wls.QUOTA_RESERVED) or {}
        if current.get("reason") == reason and current.get("message") == message:
            self.pending_writer.discard(key)
            return
        self.pending_writer.submit(key, (reason, message))

    def _write_pending(self, key: str, desired: tuple[str, str]) -> None:
        reason, message = desired
        now = self.ctx.now()
        apply.update(
            self.ctx.kube,
            WORKLOAD,
            key,
            lambda w: wls.mark_pending(w, reason, message, now),
            cache=self.ctx.caches.workloads,
            status=True,
        )

    def _record(self, make: Callable[[], Iterable[Any]]) -> None:
        """Hand records to the history store, built on its thread from frozen objects (the
        Workloads as written, which nothing changes afterwards)."""
        if self.ctx.recorder is None:
            return

        def built() -> list[Any]:
            return [r for r in make() if r is not None]

        self.ctx.record_later(built)

    def _record_preemption(
        self, view: View, preemptor: str, evicted: list[tuple[Obj, str, str]], kind: str
    ) -> None:
        raw = view.raw.get(preemptor)
        engine = view.engine.get(preemptor)
        if raw is None or engine is None:
            return
        now = self.ctx.now()
        strategy = "reclaim" if kind == "Reclaimed" else "preempt"
        self._record(
            lambda: [
                history.preemption(
                    raw, evicted, at=now, cluster_queue=engine.queue, strategy=strategy
                )
            ]
        )

    # ------------------------------------------------------------ queue status
    def publish(self, view: View, fair: FairShare, result: CycleResult) -> None:
        """Submit every queue's status (coalesced) and keep the deletion finalizers right.

        The figures are the cycle's snapshot: this cycle's own admissions show in the next
        cycle's, which their writes start at once."""
        snapshot = view.snapshot
        gone = superseded_slices(snapshot.admitted)
        admitted_by_cq: dict[str, int] = {}
        admitted_by_lq: dict[str, int] = {}
        usage_by_lq: dict[str, dict[FlavorResource, int]] = {}
        for w in snapshot.admitted:
            if w.key in gone:
                continue
            admitted_by_cq[w.queue] = admitted_by_cq.get(w.queue, 0) + 1
            lq = view.lq_of.get(w.key, "")
            admitted_by_lq[lq] = admitted_by_lq.get(lq, 0) + 1
            bucket = usage_by_lq.setdefault(lq, {})
            for k, v in pod_set_usage(w).items():
                bucket[k] = bucket.get(k, 0) + v
        pending_by_cq: dict[str, int] = {}
        pending_by_lq: dict[str, int] = {}
        for w in snapshot.pending:
            pending_by_cq[w.queue] = pending_by_cq.get(w.queue, 0) + 1
            lq = view.lq_of.get(w.key, "")
            pending_by_lq[lq] = pending_by_lq.get(lq, 0) + 1
        for key, _, _ in view.blocked:
            lq = view.lq_of.get(key, "")
            pending_by_lq[lq] = pending_by_lq.get(lq, 0) + 1

        # Parents report their subtree.
        tree_paths = queue_tree(snapshot.queues).paths
        subtree_admitted: dict[str, int] = {}
        subtree_pending: dict[str, int] = {}
        for name, path in tree_paths.items():
            for ancestor in path:
                subtree_admitted[ancestor] = subtree_admitted.get(ancestor, 0) + admitted_by_cq.get(
                    name, 0
                )
                subtree_pending[ancestor] = subtree_pending.get(ancestor, 0) + pending_by_cq.get(
                    name, 0
                )

        for name, cq in view.cluster_queues.items():
            state = view.tree.cluster_queues[name]
            spec = snapshot.queues[name]
            self.queue_status.submit_cluster_queue(
                name,
                QueueStatus(
                    pending=subtree_pending.get(name, 0),
                    admitted=subtree_admitted.get(name, 0),
                    usage=dict(fair.usage.get(name, {})),
                    active=state.active,
                    reason=state.reason,
                    message=state.message,
                    fair_share=dict(fair.shares.get(name, {})),
                    quota=dict(spec.quotas),
                    spec=cq.spec,
                ),
            )
        for (namespace, name), state in view.tree.local_queues.items():
            key = f"{namespace}/{name}"
            self.queue_status.submit_local_queue(
                key,
                QueueStatus(
                    pending=pending_by_lq.get(key, 0),
                    admitted=admitted_by_lq.get(key, 0),
                    usage=usage_by_lq.get(key, {}),
                    active=state.active,
                    reason=state.reason,
                    message=state.message,
                ),
            )
        queuestatus.reconcile_finalizers(self.ctx, queuestatus.holding(self.ctx))
