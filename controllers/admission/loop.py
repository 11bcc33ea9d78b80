"""The admission loop: build a snapshot from the caches, ask the quota engine, carry out
what it decided.

Only the leader runs it. A cycle starts shortly after anything it decides from changes
(Workloads, queues, flavors, nodes), batching bursts of events into one cycle, and at least
every `resync` seconds (for requeue backoffs that expire).

A cycle never waits on the apiserver. Its decisions are assumed (`assumed.py`: the next
cycle sees each Workload as its write will make it) and written in the background by at most
`write_workers` threads (`writes.py`), each write naming the resourceVersion the snapshot
saw: if a Workload changed in the meantime the write is refused, the assumption rolled back
and the next cycle decides again, so nothing is admitted from a stale view, and nothing is
admitted twice. Every write goes through the context's API access, which for a leader is
the fence (`FencedKube`): a deposed leader's queued writes are never sent.

Order: a preemptor's hold is written before its victims are evicted, in one background
task; pending reasons and queue status go through coalescing writers.

A failed cycle loses nothing. A cycle changes nothing it shares before it carries out its
decisions, and each decision is carried out whole or not at all (`writes.py`): one that
raises leaves no claim and no assumption behind. The pacer runs the next cycle a second
after a failure (and every `resync` seconds in any case), and it decides every Workload the
failed one was deciding again, from the caches as they are then. The caches themselves are
read, never changed: every object in them is frozen (`controllers/runtime/frozen.py`).

History: admissions, evictions (with the preemptor), slice replacements and preemption
decisions go to the history store through `record_later` from the writing threads, once
the write succeeded; the loop never waits on the database. With time-based fair share on,
the snapshot carries the usage figures the history store last computed, read from memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from controllers.admission import queuestatus
from controllers.admission.assumed import Assumptions
from controllers.admission.queuestatus import QueueStatus, QueueStatusPublisher
from controllers.admission.view import View, ViewBuilder
from controllers.admission.writes import DecisionWriter
from controllers.metrics import definitions as metrics
from controllers.runtime.coalesce import CoalescingWriter
from controllers.runtime.gcpause import paused_collection
from controllers.runtime.pacer import Pacer
from controllers.runtime.resources import Obj
from controllers.state.caches import Context
from quota.admission.cycle import admission_cycle
from quota.fairness.fairshare import FairShare, fair_share
from quota.model.decisions import CycleResult
from quota.model.resources import FlavorResource
from quota.model.snapshot import queue_tree

if TYPE_CHECKING:
    from controllers.history.usage import UsageFigures

log = logging.getLogger(__name__)


class AdmissionLoop:
    """Leader-only loop: snapshot, decide, write."""

    def __init__(
        self,
        ctx: Context,
        *,
        min_interval: float = 0.05,
        resync: float = 2.0,
        write_workers: int = 16,
        status_interval: float = 1.0,
        status_max_interval: float | None = None,
        use_node_capacity: bool = True,
        usage: UsageFigures | None = None,
        hold_timeout_s: float = 300.0,
        busy: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.pacer = Pacer(
            "admission cycle", self.cycle, min_interval=min_interval, resync=resync, log=log
        )
        # Decisions being written: the writer assumes them, the views see them (assumed.py).
        assumed = Assumptions()
        self.views = ViewBuilder(
            ctx,
            use_node_capacity=use_node_capacity,
            usage=usage,
            hold_timeout_s=hold_timeout_s,
            assumed=assumed,
        )
        self.writer = DecisionWriter(
            ctx,
            self.poke,
            write_workers=write_workers,
            status_interval=status_interval,
            status_max_interval=status_max_interval,
            assumed=assumed,
        )
        self.queue_status = QueueStatusPublisher(
            ctx, interval=status_interval, max_interval=status_max_interval
        )
        self.cycles = 0
        # The history recorder holds its writes back while a cycle runs.
        self._busy = busy or nullcontext
        # The last cycle's fair share (usage and demand included), for the history store's
        # usage samples: replaced whole each cycle, never mutated, so any thread may read it.
        self.last_fair_share: FairShare | None = None
        # Whether the last cycle left no workload waiting for room: then a pod taking or
        # freeing room changes no decision, and needs no cycle (`room_matters`). False while
        # a cycle runs, so that an event it may have missed still brings the next one.
        self._settled = False

    @property
    def pending_writer(self) -> CoalescingWriter[str]:
        """The coalescing writer of pending reasons (its backlog shows in tests and benches)."""
        return self.writer.pending_writer

    @property
    def admitted(self) -> int:
        """Workloads this loop has admitted since it started."""
        return self.writer.admitted

    # ------------------------------------------------------------------ driving
    def poke(self) -> None:
        """Something a decision depends on changed: run a cycle soon."""
        self.pacer.poke()

    def room_matters(self) -> bool:
        """Whether room on nodes taken or freed may change a decision: some workload may be
        waiting for room (every way a workload comes to wait, a Workload or queue change,
        brings a cycle of its own)."""
        return not self._settled

    def lands_as_assumed(self, key: str, cached: Obj) -> bool:
        """Whether this change of Workload `key` is a decision's write landing as the cycles
        since it already saw it (`Assumptions.landed`): no cycle needed for it."""
        return self.views.assumed.landed(key, cached)

    def start_writers(self, is_leader: Callable[[], bool]) -> None:
        """Start the status writers; they write only while `is_leader()`."""
        self.queue_status.writer.start(enabled=is_leader)
        self.writer.start(is_leader)

    def run(self, stop: threading.Event, is_leader: Callable[[], bool]) -> None:
        """Run cycles while leading, until `stop` is set."""
        self.pacer.run(stop, is_leader)

    def stop(self) -> None:
        """Stop the writers (admissions under way finish first)."""
        self.queue_status.writer.stop()
        self.writer.stop()

    # --------------------------------------------------------------- one cycle
    def cycle(self) -> CycleResult:
        """One admission cycle; returns the engine's decisions."""
        started = time.monotonic()
        self._settled = False
        with self._busy():
            view = self.views.build()
            with paused_collection():
                fair = fair_share(view.snapshot)
                result = admission_cycle(view.snapshot, fair)
            self.writer.carry_out(view, result)
            self.publish(view, fair, result)
        self.last_fair_share = fair
        # Settled: everything pending admitted, nothing preempting or draining. (Blocked
        # workloads wait for their queue, backoff or priority class, never for room.)
        self._settled = (
            len(result.admit) == len(view.snapshot.pending)
            and not result.preempt
            and not result.drain
        )
        self.cycles += 1
        metrics.admission_cycle(result, time.monotonic() - started)
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

    # ------------------------------------------------------------ queue status
    def publish(self, view: View, fair: FairShare, result: CycleResult) -> None:
        """Submit every queue's status (coalesced) and keep the deletion finalizers right.

        The figures are the cycle's snapshot: this cycle's own admissions show in the next
        cycle's, which their writes start at once."""
        snapshot = view.snapshot
        admitted_by_cq: dict[str, int] = {}
        admitted_by_lq: dict[str, int] = {}
        usage_by_lq: dict[str, dict[FlavorResource, int]] = {}
        # The admitted workloads fair share counted (superseded slices left out), with the
        # usage it worked out for each: not worked out again here.
        for queue, counted in fair.queue_workloads.items():
            admitted_by_cq[queue] = len(counted)
            for w, usage in counted:
                lq = view.lq_of.get(w.key, "")
                admitted_by_lq[lq] = admitted_by_lq.get(lq, 0) + 1
                bucket = usage_by_lq.setdefault(lq, {})
                for k, v in usage.items():
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
        queuestatus.reconcile_finalizers(self.ctx)
