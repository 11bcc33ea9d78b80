"""Property: room held for a preemptor or a moved workload stays its own until it is admitted
again or the hold lapses, whatever else is pending.

Cycle 1 on a random small cluster decides for one pending gang: it may evict lower
priorities for room on nodes, or have movable workloads moved for it (consolidation); every
eviction is then carried out (the victims gone, the moved pending again with their holds, as
the simulator requeues them: arrival at the requeue). Cycle 2 adds random newcomers of any
queue, priority and size. Every holder is admitted (its pods where it fits: its room or other
free room), or, once its hold lapsed, waits with a reason that says so; and no node is
given to more than it has, the room still held for a holder counted as taken.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from quota.model.nodes import BoundPod
from quota.model.snapshot import Assignment, PodSet, QueueSpec, Workload
from tests.unit.strategies import GPU, queue, workload
from tests.unit.test_preemption_hold import cycle
from tests.unit.test_preemption_nodes import NOW, gpu_nodes

TIMEOUT = 300.0  # test_preemption_hold.cycle's hold timeout
GPUS = 8  # per node


@st.composite
def clusters(
    draw: st.DrawFn,
) -> tuple[list[QueueSpec], int, list[Workload], list[BoundPod], Workload]:
    """Queues svc (movable) and train, 2-4 nodes filled with one-pod workloads of both, and
    a pending gang of train."""
    nodes = draw(st.integers(2, 4))
    policy = st.sampled_from(["Never", "LowerPriority", "LowerOrNewerEqualPriority"])
    svc_quota = draw(st.sampled_from([8, 16, 32]))
    svc = queue(
        "svc",
        quota=svc_quota,
        limit=draw(st.sampled_from([svc_quota, None])),
        movable=True,
        within_queue=draw(policy),
        reclaim=draw(st.sampled_from(["Never", "Any"])),
    )
    # Half the time train may evict no one: then only consolidation makes room.
    evicts = draw(st.booleans())
    train_quota = draw(st.sampled_from([16, 32, 64]))
    train = queue(
        "train",
        quota=train_quota,
        within_queue=draw(policy) if evicts else "Never",
        reclaim=draw(st.sampled_from(["Never", "Any"])) if evicts else "Never",
    )
    admitted: list[Workload] = []
    pods: list[BoundPod] = []
    # What each queue may still be admitted: the running were admitted within it.
    room = {"svc": svc_quota, "train": train_quota}
    for n in range(nodes):
        # Full nodes but for a little free room each: room scattered, gangs that fit only
        # by moving or evicting someone.
        left = GPUS - draw(st.integers(0, 3))
        i = 0
        while left:
            gpus = min(left, draw(st.integers(1, 5)))
            left -= gpus
            i += 1
            name = draw(st.sampled_from(["svc", "train"]))
            if room[name] < gpus:
                continue
            room[name] -= gpus
            key = f"{name}/r{n}-{i}"
            node = f"h100-{n}"
            admitted.append(
                Workload(
                    key,
                    name,
                    draw(st.integers(0, 10)),
                    0.0,
                    (PodSet("main", 1, {GPU: gpus}),),
                    admission=(Assignment("main", 1, {GPU: "h100"}, ((node, 1),)),),
                    admitted_at=0.0,
                )
            )
            pods.append(BoundPod(f"{key}-0", node, {GPU: gpus}, key))
    gang = workload(
        "ml/gang",
        "train",
        gpus=draw(st.integers(4, 8)),
        count=draw(st.integers(1, 2)),
        priority=draw(st.integers(5, 20)),
        arrival=1.0,
    )
    return [svc, train], nodes, admitted, pods, gang


newcomers = st.lists(
    st.builds(
        lambda i, q, gpus, count, priority, arrival: workload(
            f"{q}/new{i}", q, gpus=gpus, count=count, priority=priority, arrival=arrival
        ),
        st.integers(0, 1000),
        st.sampled_from(["svc", "train"]),
        st.integers(1, 8),
        st.integers(1, 2),
        st.integers(0, 20),
        st.floats(0.0, 20.0),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda w: w.key,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), newcomers, st.sampled_from([10.0, TIMEOUT + 10.0]))
def test_a_holder_is_admitted_on_its_room_or_told_its_hold_lapsed(
    cluster: tuple[list[QueueSpec], int, list[Workload], list[BoundPod], Workload],
    extra: list[Workload],
    later: float,
) -> None:
    specs, nodes, admitted, pods, gang = cluster
    first = cycle(specs, [gang], gpu_nodes(nodes, GPUS), admitted, pods)
    holds = {p.workload: p.hold for p in first.pending if p.hold is not None}
    victims = [v for p in first.preempt for v in p.victims]
    holds.update({v.workload: v.hold for v in victims if v.hold is not None})
    event(f"holds={len(holds)} moved={sum(v.kind == 'Moved' for v in victims)}")
    if not holds:
        return
    # Every eviction carried out: the victims' pods gone, the moved pending with their holds.
    gone = {v.workload for v in victims}
    by_key = {w.key: w for w in admitted}
    holders = [replace(gang, hold=holds[gang.key])] if gang.key in holds else []
    holders += [
        replace(by_key[key], admission=None, admitted_at=None, arrival=5.0, hold=hold)
        for key, hold in holds.items()
        if key != gang.key
    ]
    running = [w for w in admitted if w.key not in gone]
    still = [p for p in pods if p.workload not in gone]
    second = cycle(specs, [*holders, *extra], gpu_nodes(nodes, GPUS), running, still, NOW + later)

    admits = {a.workload: a for a in second.admit}
    reasons = {p.workload: p.reason for p in second.pending}
    lapsed = later >= TIMEOUT
    for w in holders:
        if lapsed:
            assert w.key in admits or "lapsed" in reasons[w.key], reasons.get(w.key)
        else:
            assert w.key in admits, reasons[w.key]

    # No node given beyond its GPUs: pods that stay (not evicted in this cycle: room they
    # free is planned, as the cycle plans it), this cycle's admissions, and the room still
    # held for holders not admitted.
    used = {f"h100-{n}": 0 for n in range(nodes)}
    leaving = {v.workload for p in second.preempt for v in p.victims}
    for pod in still:
        if pod.workload not in leaving:
            used[pod.node] += pod.requests[GPU]
    for a in second.admit:
        per_pod = {
            ps.name: ps.per_pod[GPU]
            for w in [*holders, *extra]
            for ps in w.pod_sets
            if w.key == a.workload
        }
        for assignment in a.assignments:
            for node, n in assignment.nodes:
                used[node] += per_pod[assignment.pod_set] * n
    if not lapsed:
        for w in holders:
            if w.key not in admits:
                assert w.hold is not None
                for assignment in w.hold.assignments:
                    for node, n in assignment.nodes:
                        used[node] += w.pod_sets[0].per_pod[GPU] * n
    assert all(v <= GPUS for v in used.values()), used
