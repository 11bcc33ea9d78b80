"""The scheduler loop: binds the pods of admitted Workloads to nodes, whole groups at a time.

Only the leader runs it. A pass starts shortly after anything it decides from changes (pods
appearing, ungated, bound or gone; Workloads admitted or resized; nodes), batching bursts
into one pass, and at least every `resync` seconds.

One pass:

1. Read the groups (`groups.collect`): every admitted Workload whose Job's pods carry the
   scheduler name, with its bound pods and the pods waiting for a node. A group is ready
   once all its admitted pods exist and are ungated (after its first placement, replacement
   pods are placed as they come).
2. Build a fresh node view from the caches: every node, every pod bound to one (Muster's or
   not), the pods this loop bound that the watch has not shown yet, and the room planned
   for admitted groups not bound yet (their `podSetAssignments[].nodes` less their pods
   already bound, by `quota.placement.reservations`, as the admission cycle reserves it).
3. Place the ready groups one by one, most important first, each whole or not at all
   (`decide.decide`), taking the room of each placement in the view so that two groups
   never take the same room. A group that cannot be placed waits with the placement core's
   reason; the others go on.
4. Bind the placed pods (`binder.BindPool`): bounded concurrency, leadership checked before
   every batch. A pod already bound counts as done. Pods whose binding failed are placed
   again on the next pass, on a new view; nothing correctly bound is ever unbound. No pod
   of a group is bound before the whole group has a placement.
5. Tell: PodGroup condition, Events, history records (`status.Publisher`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from controllers.metrics import definitions as metrics
from controllers.runtime.gcpause import paused_collection
from controllers.runtime.pacer import Pacer
from controllers.scheduler import pods as p
from controllers.scheduler.binder import ApiBinder, Binder, BindPool, Outcome
from controllers.scheduler.decide import Decision, decide, nodes_text
from controllers.scheduler.groups import Group, collect
from controllers.scheduler.nodeview import Assumed, Parsed, build_view
from controllers.scheduler.status import Publisher
from controllers.scheduler.topology import Topologies
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.names import SCHEDULER_NAME
from quota.api.quantity import QuantityError
from quota.model.nodeconvert import pod_requests
from quota.placement import STRATEGIES, Strategy

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def _queue_strategy(cq: Obj | None) -> Strategy:
    """The ClusterQueue's `spec.placementStrategy` (BinPack when unset or unknown), so the
    loop places exactly as the admission cycle planned."""
    value = ((cq or {}).get("spec") or {}).get("placementStrategy")
    return next((s for s in STRATEGIES if s == value), "BinPack")


class SchedulerLoop:
    """Leader-only loop: read the groups, place them on a fresh view, bind, tell."""

    def __init__(
        self,
        ctx: Context,
        *,
        scheduler_name: str = SCHEDULER_NAME,
        binder: Binder | None = None,
        bind_workers: int = 16,
        bind_qps: float = 0.0,
        min_interval: float = 0.05,
        resync: float = 2.0,
        status_interval: float = 1.0,
        status_max_interval: float | None = None,
        hold_timeout_s: float = 300.0,
    ) -> None:
        if not scheduler_name:
            raise ValueError("the scheduler loop needs a scheduler name (--scheduler-name)")
        self.ctx = ctx
        self.scheduler_name = scheduler_name
        self.hold_timeout_s = hold_timeout_s
        self.pacer = Pacer(
            "scheduler pass", self.schedule_once, min_interval=min_interval, resync=resync, log=log
        )
        self.binds = BindPool(
            binder if binder is not None else ApiBinder(ctx.kube),
            workers=bind_workers,
            qps=bind_qps,
        )
        self.publisher = Publisher(ctx, interval=status_interval, max_interval=status_max_interval)
        self._parsed = Parsed()
        self.topologies = Topologies()
        # Pods this loop bound that the watch has not shown bound yet.
        self.assumed: dict[str, Assumed] = {}
        # (Workload uid, QuotaReserved time) of admissions placed whole, until the PodGroup
        # condition saying so is in the cache.
        self._scheduled: set[tuple[str, str]] = set()
        self._is_leader: Callable[[], bool] = lambda: True
        self.passes = 0
        self.bound = 0

    # ------------------------------------------------------------------ driving
    def _strategy(self, group: Group) -> Strategy:
        return _queue_strategy(self.ctx.caches.cluster_queues.get(group.cluster_queue))

    def poke(self) -> None:
        """Something placement depends on changed: run a pass soon."""
        self.pacer.poke()

    def start_writers(self, is_leader: Callable[[], bool]) -> None:
        """Start the PodGroup status writer; it writes only while `is_leader()`."""
        self._is_leader = is_leader
        self.publisher.start(is_leader)

    def stop(self) -> None:
        """Stop writing; bindings under way finish first."""
        self.publisher.stop()
        self.binds.close()

    def run(self, stop: threading.Event, is_leader: Callable[[], bool]) -> None:
        """Run passes while leading, until `stop` is set."""
        self._is_leader = is_leader
        self.pacer.run(stop, is_leader)

    # ----------------------------------------------------------------- one pass
    def schedule_once(self) -> list[Decision]:
        """One pass; returns the decisions taken (placed or waiting) for the ready groups."""
        started = time.monotonic()
        self.topologies.refresh(self.ctx.caches)
        groups = collect(
            self.ctx.caches,
            self.scheduler_name,
            bound_by_us={k: a.node for k, a in self.assumed.items()},
            remembered=self._scheduled,
            on_error=lambda key, message: log.warning(
                "group not placed", extra={"workload": key, "reason": message}
            ),
            topologies=self.topologies,
        )
        self._settle(groups)
        ready = sorted((g for g in groups if g.ready), key=Group.order)
        if not ready:
            return []
        with paused_collection():
            view, holds = build_view(
                self.ctx.caches, self._parsed, self.assumed, groups, self.hold_timeout_s
            )
            decisions = []
            for g in ready:
                own = holds.pop(g.key, [])
                for placeholder in own:
                    view.remove_pod(placeholder.key)  # its own plan is its to use
                planned = Counter(placeholder.node for placeholder in own)
                try:
                    decision = decide(view, g, self._strategy(g), planned=planned)
                except ValueError as error:  # a request the core refuses: this group only
                    decision = Decision(g, reason=str(error), error=True)
                if decision.placement is not None:
                    view.assume(decision.placement)
                    metrics.topology_placements(g.cluster_queue, decision.domains, view.node)
                else:
                    for placeholder in own:
                        view.add_pod(placeholder)  # still planned there: nobody else takes it
                decisions.append(decision)
        placed_seconds = time.monotonic() - started
        binds = [pair for d in decisions for pair in d.binds]
        outcome = self.binds.bind(binds, self._is_leader, on_batch=self._after_batch)
        self._tell(decisions, outcome)
        self.passes += 1
        metrics.scheduler_pass(
            sum(1 for d in decisions if d.placed),
            sum(1 for d in decisions if not d.placed),
            time.monotonic() - started,
        )
        # A group that keeps waiting is retried every pass; only passes that bound
        # something (or failed to) are worth a line at info.
        log.log(
            logging.INFO if binds else logging.DEBUG,
            "scheduler pass",
            extra={
                "groups": len(ready),
                "placed": sum(1 for d in decisions if d.placed),
                "bound": len(outcome.bound),
                "already_bound": len(outcome.already),
                "failed": len(outcome.failed),
                "place_seconds": round(placed_seconds, 3),
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return decisions

    def _settle(self, groups: list[Group]) -> None:
        """Say where groups stand that this pass does not place: fully bound ones are
        Scheduled (a restart may have cut the status write short), and gangs whose pods do
        not all exist yet wait for them."""
        live = {(g.uid, _reserved(g)) for g in groups}
        self._scheduled &= live
        self.publisher.forget({g.key for g in groups})
        for g in groups:
            if g.scheduled:
                # An elastic Job shrunk in place: its PodGroup's minCount follows.
                pg = self.ctx.caches.pod_groups.get(g.key)
                gang = (((pg or {}).get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
                if pg is not None and (gang or {}).get("minCount") != max(1, g.min_count):
                    self.publisher.scheduled(g, len(g.bound))
                continue
            if g.admitted <= 0:
                continue
            if len(g.bound) >= g.min_count:
                self._mark_scheduled(g, len(g.bound))
            elif not g.ready:
                self.publisher.waiting_for_pods(g)

    def _mark_scheduled(self, group: Group, bound: int) -> None:
        self._scheduled.add((group.uid, _reserved(group)))
        group.scheduled = True
        self.publisher.scheduled(group, bound)

    def _after_batch(self, outcome: Outcome, batch: list[tuple[Obj, str]]) -> None:
        """Take the room of what was just bound until the watch shows it, and log it."""
        now = time.monotonic()
        done = []
        for pod, node in batch:
            key = p.key_of(pod)
            if key not in outcome.bound:
                continue
            done.append(f"{key}@{node}")
            try:
                requests = pod_requests(p.spec_of(pod))
            except QuantityError:
                requests = {}  # placed, so it parsed; only a changed spec could get here
            self.assumed[key] = Assumed(p.uid_of(pod), node, requests, now)
        self.bound += len(done)
        if done:
            log.info("bound pods", extra={"pods": done, "identity": self.ctx.identity})

    def _tell(self, decisions: list[Decision], outcome: Outcome) -> None:
        for d in decisions:
            g = d.group
            if d.placement is None:
                self.publisher.unplaceable(g, d.reason, error=d.error)
                continue
            keys = [p.key_of(pod) for pod, _ in d.binds]
            counts: dict[str, int] = {}
            for key in keys:
                node = outcome.bound.get(key)
                if node is not None:
                    counts[node] = counts.get(node, 0) + 1
            if counts:
                self.publisher.placed(g, counts, d.reason, nodes_text(counts))
            failed = [k for k in keys if k in outcome.failed]
            if failed:
                first = outcome.failed[failed[0]]
                self.publisher.unplaceable(
                    g,
                    f"binding failed for {len(failed)} of {len(keys)} pods (first: {failed[0]}: "
                    f"{first}); they are placed again",
                    error=True,
                )
                continue
            done = len(g.bound) + sum(1 for k in keys if k in outcome.bound or k in outcome.already)
            if not g.scheduled and done >= g.min_count:
                self._mark_scheduled(g, done)


def _reserved(group: Group) -> str:
    return str(
        (wls.condition(group.workload, wls.QUOTA_RESERVED) or {}).get("lastTransitionTime") or ""
    )
