"""What the parts of one admission cycle share: the ledgers, the node view, the decisions.

The cycle keeps two ledgers. `held` is what nodes actually hold: admitted workloads,
including those already told to leave, plus this cycle's admissions. `planned` is the state
once every eviction in flight has completed: victims and drained workloads released,
preemptors that wait for them, and workloads being moved, charged (the quota of their
holds, from the start of the cycle until their own turn). A workload is admitted only when
it fits both, so it neither overcommits nodes nor takes room promised to a preemptor;
preemption plans against
`planned`, so no quota is promised twice and no victim is chosen twice.

`CycleState` is built once per cycle from the snapshot and handed to every part (the driver
in cycle.py, the victim lists, quota and node preemption, consolidation); each part keeps
its own caches and reads or records here only what the others must see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial

from quota.fairness.fairshare import Counted, FairShare, root_amount
from quota.fairness.ordering import QueueKey, QueueOrder, dominant_ratio, queue_order
from quota.model.decisions import Admit, Pending, Preempt, Victim
from quota.model.ledger import Ledger
from quota.model.resources import FlavorResource, add_into
from quota.model.snapshot import (
    QueueSpec,
    Snapshot,
    Workload,
    draining,
    pod_set_usage,
    queue_tree,
    superseded_slices,
)
from quota.placement.nodes import NodeView
from quota.placement.reservations import LEAVING, held_pods, leaving_of, planned_pods

Vector = dict[FlavorResource, int]
NO_SHARE: Mapping[FlavorResource, int] = {}


class CycleState:
    """The shared, changing state of one cycle (see the module docstring)."""

    def __init__(self, snapshot: Snapshot, fair: FairShare) -> None:
        self.snapshot = snapshot
        self.fair = fair
        self.queues = snapshot.queues
        self.tree = queue_tree(snapshot.queues)
        self.quotas = {name: spec.quotas for name, spec in self.queues.items()}
        limits = {name: spec.limits for name, spec in self.queues.items()}
        amount = dict(fair.amount) if fair.amount else root_amount(snapshot, self.tree)
        self.held = Ledger(self.tree.paths, limits, amount)
        # The decisions, in the order they are made.
        self.admit: list[Admit] = []
        self.preempt: list[Preempt] = []
        self.pending: list[Pending] = []
        self.drain: list[Victim] = []
        # Admitted workloads that hold quota (an old slice whose successor is admitted does
        # not), per queue, each with its usage (never changed).
        gone = superseded_slices(snapshot.admitted)
        holding: Mapping[str, Sequence[Counted]]
        if fair.snapshot is snapshot:
            # Fair share counted these very workloads (the same ones: not superseded, in a
            # known queue) and rolled their usage up the tree: taken as they are.
            holding = fair.queue_workloads
            self.held.load(fair.usage, self.tree.roots)
        else:
            holding, per_leaf = self._count_admitted(gone, fair)
            # Summed per leaf first: one charge per leaf instead of one per workload up the
            # tree.
            for queue in sorted(per_leaf):
                self.held.charge(queue, per_leaf[queue])
        self.holding = holding
        self._holders: dict[str, Counted] | None = None  # by key, see running()
        self.planned = self.held.copy()
        # Workloads already leaving, or chosen as victims this cycle: never chosen again.
        self.taken: set[str] = set()
        # Per queue, its admitted workloads that may still be chosen as victims.
        self.admitted_by_queue: Mapping[str, Sequence[Counted]] = holding
        self._release_leaving(holding)
        # Quota held with a hold's room, per holder (see `_reserve_holds`).
        self.reserved: dict[str, Mapping[FlavorResource, int]] = {}
        # Placement: free room on every node, less bound pods and planned, unbound room.
        self.nodes: NodeView | None = None
        if snapshot.nodes is not None:
            kept = [w for w in snapshot.admitted if w.key not in gone]
            pods = list(snapshot.pods) + planned_pods(kept, snapshot.pods)
            # Room held for preemptors whose victims are leaving and for moved workloads:
            # taken for everyone else, whichever queue comes first, until the holder's own
            # turn (node_room.py).
            holders = [*snapshot.pending, *(w for w in snapshot.admitted if w.hold is not None)]
            pods += held_pods(holders, snapshot.now, snapshot.hold_timeout_s)
            self._reserve_holds(holders)
            self.nodes = NodeView(snapshot.nodes, pods)
        # Whether `planned` may differ from `held` (then a fit is checked in both).
        self.diverged = bool(self.taken or self.reserved)
        # Pod keys in the view per workload (bound and planned), for preemption on nodes.
        self.pods_of: dict[str, list[str]] = {}
        # Owners (`leaving_of`) of pods single-pod preemption took, in this cycle or before:
        # gone for any preemptor, as a leaving workload's are.
        self.shed: set[str] = set()
        # Workloads single-pod preemption took pods from in this cycle: never chosen again
        # (they are `taken`), but what they keep still runs.
        self.shrunk: set[str] = set()
        if self.nodes is not None:
            for pod in self.nodes.pods.values():
                if pod.workload is not None:
                    self.pods_of.setdefault(pod.workload, []).append(pod.key)
                    if pod.workload.endswith(LEAVING):
                        self.shed.add(pod.workload)
        self.replaced: set[str] = set()  # slices taken over by this cycle's scale-ups
        # The order queues are visited in, lowest usage/fair-share ratio first. Its key
        # reads only the planned ledger and the shares, not this object: the order must not
        # hold the state alive, so that a cycle is freed by reference counting as it returns
        # (see test_the_cycle_leaves_no_cyclic_garbage).
        self.order = self.new_order()

    def shed_pods(self, key: str, pods: Sequence[str]) -> None:
        """Single-pod preemption took `pods` from workload `key` in this cycle: they leave
        (counted as gone for later preemptors), the rest of it stays."""
        if not pods:
            return
        gone = set(pods)
        owner = leaving_of(key)
        self.pods_of[owner] = [*self.pods_of.get(owner, ()), *pods]
        self.pods_of[key] = [k for k in self.pods_of.get(key, ()) if k not in gone]
        self.shed.add(owner)
        self.shrunk.add(key)
        self.taken.add(key)

    def new_order(self) -> QueueOrder:
        """An empty queue order over this cycle's planned ledger (one per pass)."""
        key = partial(_queue_key, {}, self.planned.used, self.fair.shares, self.queues)
        return QueueOrder(self.tree, key)

    def _count_admitted(
        self, gone: frozenset[str], fair: FairShare
    ) -> tuple[dict[str, list[Counted]], dict[str, Vector]]:
        """The admitted workloads that hold quota with their usage, per queue, and their usage
        summed per queue (for a fair share computed from another snapshot)."""
        # Fair share may have worked a workload's usage out, if computed with that workload.
        known = {id(w): usage for counted in fair.queue_workloads.values() for w, usage in counted}
        holding: dict[str, list[Counted]] = {}
        per_leaf: dict[str, Vector] = {}
        for w in self.snapshot.admitted:
            if w.key in gone or w.queue not in self.tree.paths:
                continue
            usage = known.get(id(w))
            if usage is None:
                usage = pod_set_usage(w)
            holding.setdefault(w.queue, []).append((w, usage))
            add_into(per_leaf.setdefault(w.queue, {}), usage)
        return holding, per_leaf

    def _reserve_holds(self, holders: Iterable[Workload]) -> None:
        """Charge in `planned` the quota of every hold that has not lapsed, as its room is
        taken in the view: a moved workload keeps its quota across the move, a preemptor the
        quota its victims free, until its own turn (node_room.py releases it then), so that
        no one else is admitted on it, of its queue or another, whichever comes first."""
        snapshot = self.snapshot
        for w in holders:
            hold = snapshot.active_hold(w)
            if hold is None or w.queue not in self.tree.paths:
                continue
            if w.admission is not None and not w.evicting:
                continue  # admitted where it is: its admission holds its quota
            # The quota of its held plan: what it takes once admitted there.
            usage = pod_set_usage(replace(w, admission=hold.assignments))
            self.planned.charge(w.queue, usage)
            self.reserved[w.key] = usage

    def _release_leaving(self, holding: Mapping[str, Sequence[Counted]]) -> None:
        """Release from `planned` the workloads already leaving (evicted, or in a draining
        queue) and record the drains."""
        fair, snapshot = self.fair, self.snapshot
        # Per queue, the draining queue on its path.
        drains = {name: draining(self.queues, self.tree, name) for name in holding}
        evicting = (
            fair.evicting
            if fair.snapshot is snapshot
            else {w.queue for counted in holding.values() for w, _ in counted if w.evicting}
        )
        if not evicting and all(d is None for d in drains.values()):
            return  # most cycles: the lists stay as fair share made them
        # Walked in the snapshot's order (that of the drain decisions).
        by_queue: dict[str, list[Counted]] = {}
        for w, usage in self.running().values():
            drained_by = drains[w.queue]
            if w.evicting or drained_by is not None:
                self.taken.add(w.key)
                self.planned.release(w.queue, usage)
                if drained_by is not None and not w.evicting:
                    self.drain.append(
                        Victim(
                            w.key,
                            w.queue,
                            "Preempted",
                            f"queue {drained_by} is draining (stopPolicy HoldAndDrain); "
                            "set stopPolicy to None to keep workloads running",
                        )
                    )
            else:
                by_queue.setdefault(w.queue, []).append((w, usage))
        self.admitted_by_queue = by_queue

    def running(self) -> dict[str, Counted]:
        """The admitted workloads that hold quota by key, in the snapshot's order, with their
        usage: made on first use (a scale-up slice, a drain), most cycles need none."""
        if self._holders is None:
            usage_of = {id(w): usage for counted in self.holding.values() for w, usage in counted}
            self._holders = {}
            for w in self.snapshot.admitted:
                usage = usage_of.get(id(w))
                if usage is not None:
                    self._holders[w.key] = (w, usage)
        return self._holders

    def ledgers(self) -> tuple[Ledger, ...]:
        """The ledgers a workload must fit: both once they may differ."""
        return (self.held, self.planned) if self.diverged else (self.held,)


def _queue_key(
    inputs: dict[str, tuple[Mapping[FlavorResource, int], Mapping[FlavorResource, int], int]],
    used_of: Mapping[str, Mapping[FlavorResource, int]],
    shares: Mapping[str, Mapping[FlavorResource, int]],
    queues: Mapping[str, QueueSpec],
    name: str,
) -> QueueKey:
    found = inputs.get(name)
    if found is None:
        # What a queue's key reads, looked up once: keys are worked out ~10,000 times.
        found = inputs[name] = (used_of[name], shares.get(name, NO_SHARE), queues[name].priority)
    used, share, priority = found
    return queue_order(dominant_ratio(used, share), priority, name)
