"""Consolidation against a brute-force oracle on small clusters (2-4 nodes of 8 GPUs).

The oracle tries every single move by hand: one movable running workload, its pods put on
any nodes with room (not all where they run), after which the pending gang's identical pods
fit. Whenever such a plan exists the cycle must find one of one move, consistent (no node
promised twice), and evict no one for it even when the gang's queue may reclaim."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import product

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult
from quota.model.nodes import BoundPod
from quota.model.snapshot import QueueSpec, Snapshot, Workload
from tests.unit.strategies import GPU, queue, queues_of, workload
from tests.unit.test_preemption_nodes import H100, NOW, gpu_nodes, running

SVC = queue("svc", quota=64, movable=True)
FIX = queue("fix", quota=64)
TRAIN = queue("train", quota=64)
# The API's default for a queue: it may reclaim lower priorities of other queues on nodes.
RECLAIMING = replace(TRAIN, reclaim="Any", within_queue="LowerPriority")
CAPACITY = 8

fast = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Cluster:
    n: int
    running: tuple[Workload, ...]
    pods: tuple[BoundPod, ...]

    def __repr__(self) -> str:
        nodes: dict[str, list[str]] = {f"h100-{i}": [] for i in range(self.n)}
        for p in self.pods:
            nodes[p.node].append(f"{p.workload}({p.requests[GPU]}, prio {_prio(self, p)})")
        return f"Cluster(free={self.free()}, {nodes})"

    def free(self) -> list[int]:
        free = [CAPACITY] * self.n
        for p in self.pods:
            free[int(p.node.rsplit("-", 1)[1])] -= p.requests[GPU]
        return free


def _prio(c: Cluster, p: BoundPod) -> int:
    return next(w.priority for w in c.running if w.key == p.workload)


@st.composite
def clusters(draw: st.DrawFn, max_nodes: int = 4) -> Cluster:
    """1-`max_nodes` nodes, each with about 0-3 running workloads: movable ones (queue svc)
    of one pod, fixed ones (queue fix) of one or two; some nodes left without any room.

    Movable workloads have one pod: the search places a mover where the queue's profile
    puts it, so a plan that needs a several-pod mover packed otherwise may be missed."""
    n = draw(st.integers(1, max_nodes))
    free = [CAPACITY] * n
    ws: list[Workload] = []
    pods: list[BoundPod] = []
    for i in range(draw(st.integers(0, 3 * n))):
        q = draw(st.sampled_from(["svc", "svc", "fix"]))
        gpus = draw(st.integers(1, 4) | st.integers(1, 8))
        most = 1 if q == "svc" else 2
        nodes = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=most))
        need = Counter(nodes)
        if any(free[j] < gpus * k for j, k in need.items()):
            continue
        for j, k in need.items():
            free[j] -= gpus * k
        priority = draw(st.sampled_from([0, 5]))
        w, bound = running(f"{q}/w{i}", q, [f"h100-{j}" for j in nodes], priority, gpus)
        ws.append(w)
        pods.extend(bound)
    return Cluster(n, tuple(ws), tuple(pods))


def gang_fits(free: Sequence[int], count: int, gpus: int) -> bool:
    return sum(f // gpus for f in free) >= count


def one_move(c: Cluster, gang: Workload) -> str | None:
    """A movable workload whose pods, put elsewhere, let the gang fit; None when none."""
    ((count, gpus),) = [(ps.count, ps.per_pod[GPU]) for ps in gang.pod_sets]
    free = c.free()
    for w in c.running:
        if w.queue != "svc" or w.priority > gang.priority:
            continue
        mine = [p for p in c.pods if p.workload == w.key]
        at = [int(p.node.rsplit("-", 1)[1]) for p in mine]
        off = list(free)
        for j in at:
            off[j] += mine[0].requests[GPU]
        for to in product(range(c.n), repeat=len(mine)):
            if Counter(to) == Counter(at):
                continue  # not a move
            after = list(off)
            for j in to:
                after[j] -= mine[0].requests[GPU]
            if min(after) >= 0 and gang_fits(after, count, gpus):
                return w.key
    return None


def run(c: Cluster, pending: Sequence[Workload], *trains: QueueSpec) -> CycleResult:
    return admission_cycle(
        Snapshot(
            now=NOW,
            queues=queues_of(SVC, FIX, *trains),
            flavors={"h100": H100},
            admitted=c.running,
            pending=tuple(pending),
            nodes=gpu_nodes(c.n),
            pods=c.pods,
        )
    )


def assert_consistent(c: Cluster, pending: Sequence[Workload], result: CycleResult) -> None:
    """Replayed, the plan over-commits no node: the pods that stay, the moved workloads on
    their held room and every waiting gang on its own."""
    moved = {v.workload: v for p in result.preempt for v in p.victims}
    used = Counter[str]()
    for p in c.pods:
        if p.workload not in moved:
            used[p.node] += p.requests[GPU]
    holds = [(v.workload, v.hold) for v in moved.values() if v.kind == "Moved"]
    holds += [(p.workload, p.hold) for p in result.pending if p.hold is not None]
    per_pod = {w.key: w.pod_sets[0].per_pod[GPU] for w in c.running}
    per_pod |= {w.key: w.pod_sets[0].per_pod[GPU] for w in pending}
    for key, hold in holds:
        assert hold is not None, f"{key} moved without room held"
        for a in hold.assignments:
            for node, n in a.nodes:
                used[node] += n * per_pod[key]
    assert all(v <= CAPACITY for v in used.values()), f"over-committed: {used}"


def pending_gang(data: st.DataObject, key: str, c: Cluster) -> Workload:
    """A gang of 1-3 identical pods that does not fit as things are (rejected when every
    size fits): only such a gang asks for consolidation."""
    count = data.draw(st.integers(1, 3), label=f"{key} pods")
    sizes = [g for g in range(1, CAPACITY + 1) if not gang_fits(c.free(), count, g)]
    assume(sizes)
    gpus = data.draw(st.sampled_from(sizes), label=f"{key} gpus")
    priority = data.draw(st.sampled_from([0, 5]), label=f"{key} priority")
    return workload(key, "train", gpus=gpus, count=count, priority=priority)


def moves_for(result: CycleResult, key: str) -> list[str]:
    plans = [p for p in result.preempt if p.preemptor == key]
    assert all(v.kind == "Moved" for p in plans for v in p.victims), "an eviction was chosen"
    return [v.workload for p in plans for v in p.victims]


@fast
@given(clusters(), st.data(), st.booleans())
def test_a_one_move_plan_is_found_whenever_one_exists(
    c: Cluster, data: st.DataObject, reclaims: bool
) -> None:
    gang = pending_gang(data, "ml/p", c)
    result = run(c, [gang], RECLAIMING if reclaims else TRAIN)
    assert_consistent(c, [gang], result)
    if one_move(c, gang) is None:
        if not reclaims:
            # No single move helps; a plan of several moves is fine, an eviction is not.
            moves_for(result, "ml/p")
        return
    event("one-move plan")
    assert len(moves_for(result, "ml/p")) == 1, f"{c!r}: {result.preempt}"
    (waiting,) = [p for p in result.pending if p.workload == "ml/p"]
    assert waiting.hold is not None


@fast
@given(clusters(), st.data(), st.booleans(), st.booleans())
def test_the_second_pending_workload_gets_its_move_when_the_first_cannot_be_helped(
    c: Cluster, data: st.DataObject, reclaims: bool, two_queues: bool
) -> None:
    train = RECLAIMING if reclaims else TRAIN
    first = pending_gang(data, "ml/first", c)
    second = pending_gang(data, "ml/second", c)
    second = replace(second, arrival=1.0)
    if two_queues:
        second = replace(second, queue="train2")
    trains = (train, replace(train, name="train2"))
    alone = run(c, [first], *trains)
    if alone.admit or alone.preempt:
        return  # the first can be helped
    if one_move(c, second) is None:
        return
    event("differential")
    both = run(c, [first, second], *trains)
    assert_consistent(c, [first, second], both)
    assert len(moves_for(both, "ml/second")) == 1
    assert not moves_for(both, "ml/first")
