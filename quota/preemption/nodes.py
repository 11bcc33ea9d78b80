"""Preemption on nodes (KEP-5710): whom to evict so that a gang that fits quota fits nodes.

The whole cluster is one domain. Candidates are admitted, running workloads of strictly
lower priority than the preemptor that its queue's policies allow it to evict; each goes
whole, every pod of it (disruptionMode all), with the room planned for its unbound pods,
but for the pods it offers (`pods_of`: a disruptionMode Single one offers only its
unprotected pods, partial.py), and a plan says which of them stand in the gang's way.
If removing every candidate would not make the gang placeable, nothing is evicted.
Otherwise a binary search over the candidates' distinct priorities finds the lowest
priority ceiling that still makes room (fewer, less important victims mean fewer
cascading preemptions), the gang is placed and assumed there, and then victims are
reprieved, most important first, whenever all their pods fit back where they run.

Workloads already leaving (evicted in an earlier cycle, drained) count as gone before any
candidate is looked at: a preemptor reconsidered cycle after cycle while its victims
terminate finds its room in them and evicts no one more.

Every what-if on the view goes through a `Transaction`, so a failed search leaves the view
exactly as it found it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial

from quota.model.nodes import BoundPod
from quota.model.nodewords import named_nodes
from quota.model.snapshot import QueueSpec, Workload
from quota.model.transaction import Transaction
from quota.placement.gang import Placement, Unplaceable
from quota.placement.nodes import NodeView
from quota.preemption.victims import Candidate, started_at

Place = Callable[[], Placement | Unplaceable]


@dataclass(frozen=True, slots=True)
class Protected:
    """A candidate spared because it has not yet run for its queue's minimum runtime."""

    candidate: Candidate
    until: float


@dataclass(frozen=True, slots=True)
class NodeCandidates:
    """Workloads a preemptor may evict for nodes (least important first), those minRuntime
    spares, and those of lower priority its queue's policies spare (`Never`)."""

    allowed: tuple[Candidate, ...]
    protected: tuple[Protected, ...]
    forbidden: tuple[Candidate, ...] = ()


@dataclass(frozen=True, slots=True)
class NodePlan:
    """The gang's placement once `victims` (least important first) and the leaving are gone.

    `freed` maps each victim to the nodes of the placement it must leave, `lost` to its
    pods in the gang's way (the ones a Single victim loses; a whole one loses every pod).
    With no victims the room is found in workloads already leaving.
    """

    placement: Placement
    victims: tuple[Candidate, ...]
    freed: Mapping[str, tuple[str, ...]]
    lost: Mapping[str, tuple[BoundPod, ...]] = field(default_factory=dict)


def node_candidates(
    preemptor: Workload,
    spec: QueueSpec,
    queues: Mapping[str, QueueSpec],
    ordered: Iterable[Candidate],
    excluded: set[str] | frozenset[str],
    now: float,
) -> NodeCandidates:
    """Running workloads `preemptor` (of queue `spec`) may evict for room on nodes.

    `ordered` is in victim order. Only strictly lower priorities qualify. In its own queue
    `withinQueue` must not be Never and the queue's preemption minRuntime protects; in other
    queues `reclaim` must not be Never and the victim queue's reclaim minRuntime protects.
    """
    allowed: list[Candidate] = []
    protected: list[Protected] = []
    forbidden: list[Candidate] = []
    for c in ordered:
        w = c.workload
        if w.priority >= preemptor.priority:
            break  # victim order is by priority: nothing further is allowed
        if w.key in excluded:
            continue
        if c.queue == spec.name:
            if spec.within_queue == "Never":
                forbidden.append(c)
                continue
            min_runtime = spec.min_runtime_preempt_s
        else:
            if spec.reclaim == "Never":
                forbidden.append(c)
                continue
            victim_queue = queues.get(c.queue)
            min_runtime = victim_queue.min_runtime_reclaim_s if victim_queue else 0.0
        until = started_at(w) + min_runtime
        if min_runtime and now < until:
            protected.append(Protected(c, until))
            continue
        allowed.append(c)
    return NodeCandidates(tuple(allowed), tuple(protected), tuple(forbidden))


def reclaimable(
    preemptor: Workload,
    spec: QueueSpec,
    queues: Mapping[str, QueueSpec],
    ordered: Iterable[Candidate],
    excluded: set[str] | frozenset[str],
    now: float,
) -> tuple[Candidate, ...]:
    """Running workloads of other queues that `spec`'s reclaim policy lets `preemptor` evict
    (`Any`: whatever their priority; `LowerPriority`: lower ones), in victim order: the
    candidates of `node_candidates` (its policies and minRuntime) without its priority
    ceiling under `Any`. Whether taking them keeps their queues at their floors is the
    reclaim search's to say (reclaim.py)."""
    if spec.reclaim == "Never":
        return ()
    ceiling = preemptor if spec.reclaim == "LowerPriority" else replace(preemptor, priority=_TOP)
    found = node_candidates(ceiling, spec, queues, ordered, excluded, now)
    return tuple(c for c in found.allowed if c.queue != spec.name)


# Above every priority a workload can have (int32): no candidate reaches it.
_TOP = 2**31


def preempt_on_nodes(
    view: NodeView,
    candidates: Sequence[Candidate],
    pods_of: Mapping[str, Sequence[str]],
    leaving: Iterable[str],
    place: Place,
    keep: bool = True,
    short: bool = False,
) -> NodePlan | Unplaceable:
    """Choose victims among `candidates` (victim order) so that `place()` succeeds.

    `pods_of` gives each workload's pod keys in the view; `leaving` names workloads already
    being evicted, whose pods count as gone for free. On success the gang's placement is
    assumed in the view and only the victims' and leaving pods in its way stay removed:
    nothing else planned in this cycle can take the held room. On failure the view is left
    exactly as it was and the Unplaceable says why even removing every candidate would not
    do (or, without candidates, why the leaving ones do not suffice). Without `keep` the
    view is left as it was on success too, and the plan is an estimate: the victims
    KEP-5710's reprieve leaves (see `WhatIf.hold`), what domains are compared on. `short`
    says the caller knows the leaving alone do not make room (and `candidates` are some).
    """
    what_if = WhatIf(view)
    gone = [key for w in leaving for key in pods_of.get(w, ())]
    what_if.remove(gone)
    placed = None if short else place()
    if isinstance(placed, Placement):
        return what_if.hold(placed, (), gone, pods_of, place, keep)
    if not candidates:
        assert placed is not None
        what_if.undo()
        return placed
    # Candidates are in victim order, priority first: "every candidate up to a priority
    # ceiling", and then "the least important few at that ceiling", are both prefixes of
    # the list. So the lowest ceiling that makes room and the shortest run within it are
    # together the shortest prefix that makes room. It is found by galloping (1, 2, 4, ...
    # candidates, each step removing only the pods of the candidates it adds) and then
    # bisecting between the last two steps from a checkpoint: the cost grows with the
    # victims needed, not with the candidates there are, and a search that fails has
    # removed every candidate once, as KEP-5710's first check does.
    tx = what_if.tx
    marks = {0: tx.checkpoint()}
    done = 0

    def fits_with(n: int) -> Placement | Unplaceable:
        nonlocal done
        if n < done:
            start = max(k for k in marks if k <= n)
            tx.rollback(marks[start])
            for k in [k for k in marks if k > start]:
                del marks[k]
            done = start
        what_if.remove(key for c in candidates[done:n] for key in pods_of.get(c.workload.key, ()))
        done = n
        marks[n] = tx.checkpoint()
        return place()

    total = len(candidates)
    lo, hi = 0, 1
    while isinstance(last := fits_with(hi), Unplaceable):
        if hi == total:  # not even with every candidate gone: evict no one
            what_if.undo()
            return last
        lo, hi = hi, min(2 * hi, total)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if isinstance(fits_with(mid), Placement):
            hi = mid
        else:
            lo = mid
    chosen = list(candidates[:hi])
    placed = fits_with(hi)
    if not isinstance(placed, Placement):  # placement is deterministic on the same view
        raise AssertionError("the gang stopped fitting without victims it fitted without")
    return what_if.hold(placed, chosen, gone, pods_of, place, keep)


class WhatIf:
    """Pods removed from a view under one transaction, and the room each node may go to.

    A node may already be overcommitted (caches lag each other); putting a pod back is
    fine as long as no resource of its node ends below zero, or below where it was on a
    node the gang does not use.
    """

    __slots__ = ("floors", "removed", "tx", "used", "view")

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self.tx = Transaction()
        self.removed: dict[str, BoundPod] = {}
        self.floors: dict[str, dict[str, int]] = {}
        self.used: frozenset[str] = frozenset()  # nodes of the gang's assumed placement

    def remove(self, keys: Iterable[str]) -> None:
        view, tx, removed, floors = self.view, self.tx, self.removed, self.floors
        for key in keys:
            if key not in view.pods:
                continue  # already removed, or put back only where it is not in the way
            node = view.pods[key].node
            if node not in floors:
                floors[node] = {r: v for r, v in view.free(node).items() if v < 0}
            pod = view.remove_pod(key)
            removed[key] = pod
            tx.record(partial(view.add_pod, pod))

    def add_back(self, keys: Iterable[str]) -> bool:
        """Put removed pods back; False (with the view changed) if a node went short."""
        view, tx, removed = self.view, self.tx, self.removed
        touched: set[str] = set()
        for key in keys:
            pod = removed.get(key)
            if pod is None or key in view.pods:
                continue
            view.add_pod(pod)
            tx.record(partial(_unbind, view, key))
            touched.add(pod.node)
        for node in touched:
            floor = {} if node in self.used else self.floors.get(node, {})
            if any(v < floor.get(r, 0) for r, v in view.free(node).items()):
                return False
        return True

    def undo(self) -> None:
        self.tx.rollback()
        self.view.settle()

    def hold(
        self,
        placed: Placement,
        chosen: Sequence[Candidate],
        gone: Sequence[str],
        pods_of: Mapping[str, Sequence[str]],
        place: Place,
        keep: bool = True,
    ) -> NodePlan:
        """Assume the gang, reprieve victims most important first while it still fits, then
        put back every removed pod not in its way, so the view shows what still runs.

        Reprieve goes in two rounds. First, as in KEP-5710, with the gang's placement fixed:
        every victim whose pods all fit back where they run stays (cheap, and it keeps all
        but the victims in the gang's way). Then each victim still chosen, most important
        first, is put back and the gang placed again: the first placement was found with
        every candidate gone and may sit on a victim's nodes while room free without any
        eviction goes unused. This round places the gang once per victim left, a few.
        Without `keep` the view is put back after the first round, and the plan (its
        victims after that round, no `freed`) is an estimate.
        """
        view, tx = self.view, self.tx
        view.assume(placed)
        tx.record(partial(view.forget, placed))
        self.used = placement_nodes(placed)
        kept: list[Candidate] = []
        for c in reversed(chosen):
            mark = tx.checkpoint()
            if not self.add_back(pods_of.get(c.workload.key, ())):
                tx.rollback(mark)
                kept.append(c)
        if not keep:
            # An estimate (domains compared on it): KEP-5710's reprieve alone.
            self.undo()
            return NodePlan(placed, tuple(reversed(kept)), {})
        needed: list[Candidate] = []
        for c in kept:  # most important first
            mark = tx.checkpoint()
            view.forget(placed)
            tx.record(partial(view.assume, placed))
            back = self.add_back(pods_of.get(c.workload.key, ()))
            again = place() if back else None
            if isinstance(again, Placement):
                view.assume(again)
                tx.record(partial(view.forget, again))
                placed = again
                self.used = placement_nodes(placed)
            else:
                tx.rollback(mark)
                needed.append(c)
        needed.reverse()
        used = self.used
        freed: dict[str, tuple[str, ...]] = {}
        for c in needed:
            keys = pods_of.get(c.workload.key, ())
            nodes = {self.removed[k].node for k in keys if k in self.removed}
            freed[c.workload.key] = tuple(sorted(nodes & used))
        for key in [*gone, *(k for c in needed for k in pods_of.get(c.workload.key, ()))]:
            mark = tx.checkpoint()
            if not self.add_back((key,)):
                tx.rollback(mark)
        lost = {
            c.workload.key: tuple(
                self.removed[k]
                for k in pods_of.get(c.workload.key, ())
                if k in self.removed and k not in view.pods
            )
            for c in needed
        }
        tx.commit()
        return NodePlan(placed, tuple(needed), freed, lost)


def placement_nodes(placed: Placement) -> frozenset[str]:
    """The nodes a placement uses."""
    return frozenset(node for pairs in placed.nodes.values() for node, _ in pairs)


def _unbind(view: NodeView, key: str) -> None:
    view.remove_pod(key)


def protected_words(protected: Sequence[Protected], now: float) -> str:
    """ "2 lower-priority workloads are protected by minRuntime until 14:05:00 UTC (in
    300s): ns/a, ns/b" (naming the one protected longest)."""
    until = max(p.until for p in protected)
    when = datetime.fromtimestamp(until, UTC).strftime("%H:%M:%S UTC")
    names = [p.candidate.workload.key for p in protected[:4]]
    more = f" and {len(protected) - 4} more" if len(protected) > 4 else ""
    n = len(protected)
    verb = "workloads are" if n != 1 else "workload is"
    return (
        f"{n} lower-priority {verb} protected by minRuntime until {when} "
        f"(in {until - now:.0f}s): {', '.join(names)}{more}"
    )


def forbidden_words(forbidden: Sequence[Candidate], spec: QueueSpec) -> str:
    """ "queue a's policies spare 3 of them (withinQueue: Never)": lower-priority workloads
    in the way that the preemptor's queue may not evict."""
    own = sum(1 for c in forbidden if c.queue == spec.name)
    rules = [
        *(["withinQueue: Never"] if own else []),
        *(["reclaim: Never"] if own < len(forbidden) else []),
    ]
    n = len(forbidden)
    return f"queue {spec.name}'s policies spare {n} of them ({', '.join(rules)})"


def node_victim_reason(
    preemptor: Workload, victim: Candidate, nodes: Sequence[str], queue: str, domain: str = ""
) -> str:
    """Why a victim was chosen to free nodes, in `domain` ("rack b0-r1 of Topology
    fabric") when the preemptor keeps to one: it goes whole (every pod of it), or, with
    disruptionMode Single, loses the pods named in `victim.pods`."""
    where = named_nodes(nodes) + (f" in {domain}" if domain else "")
    who = f"{preemptor.key} (priority {preemptor.priority})"
    verb = "preempted" if victim.queue == queue else f"reclaimed by queue {queue}"
    lost = ""
    if victim.pods is not None:
        lost = (
            " (disruptionMode Single: it loses "
            + ", ".join(f"{n} {pod_set} pod{'s' if n != 1 else ''}" for pod_set, n in victim.pods)
            + " and keeps the rest)"
        )
    return (
        f"{verb} to free {where} for {who}: its pods could not be placed otherwise, "
        f"and this workload has lower priority ({victim.workload.priority}){lost}"
    )
