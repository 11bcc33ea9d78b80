"""Delayed eviction and one decision with quota: the room freed for a preemptor is held for it
across cycles (whoever comes first), lapses after a bounded time when a victim will not go,
and victims chosen for quota must also let the gang be placed, or no one is evicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult, Pending
from quota.model.nodes import BoundPod, Node
from quota.model.snapshot import Assignment, Hold, PodSet, QueueSpec, Snapshot, Workload
from quota.simulation.report import to_json
from quota.simulation.scenario import parse_scenario
from quota.simulation.simulator import simulate
from tests.unit.strategies import GPU, queue, queues_of, workload
from tests.unit.test_preemption_nodes import H100, NOW, gangs, gpu_nodes, running, victims_of

A = queue("a", quota=64, reclaim="Any")
B = queue("b", quota=80)
BIG = workload("ns/big", "a", gpus=8, count=4, priority=100)
FPGA = "example.com/fpga"


def cycle(
    specs: Sequence[QueueSpec],
    pending: Sequence[Workload],
    nodes: tuple[Node, ...],
    admitted: Sequence[Workload],
    pods: Sequence[BoundPod],
    now: float = NOW,
) -> CycleResult:
    return admission_cycle(
        Snapshot(
            now=now,
            queues=queues_of(*specs),
            flavors={"h100": H100},
            admitted=tuple(admitted),
            pending=tuple(pending),
            nodes=nodes,
            pods=tuple(pods),
            hold_timeout_s=300.0,
        )
    )


def pending_of(result: CycleResult, key: str) -> Pending:
    (found,) = [p for p in result.pending if p.workload == key]
    return found


def held_nodes(hold: Hold | None) -> list[str]:
    assert hold is not None
    return sorted(node for a in hold.assignments for node, _ in a.nodes)


def evict(
    ws: Sequence[Workload], pods: Sequence[BoundPod], gone: set[str]
) -> tuple[list[Workload], list[BoundPod]]:
    """The victims' eviction complete: their workloads and pods are gone."""
    return [w for w in ws if w.key not in gone], [p for p in pods if p.workload not in gone]


def test_the_preemptor_gets_a_hold_on_the_nodes_its_victims_free() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    result = cycle([A, B], [BIG], nodes, ws, pods)
    waiting = pending_of(result, "ns/big")
    assert waiting.hold is not None and waiting.hold.since == NOW
    assert sorted(waiting.hold.victims) == victims_of(result)
    freed = {p.node for p in pods if p.workload in waiting.hold.victims}
    assert set(held_nodes(waiting.hold)) == freed


def test_held_room_is_not_taken_by_a_workload_of_a_queue_that_comes_first() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    first = cycle([A, B], [BIG], nodes, ws, pods)
    hold = pending_of(first, "ns/big").hold
    left_ws, left_pods = evict(ws, pods, set(victims_of(first)))
    # A queue of higher priority goes first in the next cycle; its medium-priority gang
    # would fit exactly in the freed room (it may not preempt anyone itself).
    c = queue("c", quota=32, priority=10)
    mid = workload("other/mid", "c", gpus=8, count=2, priority=50)
    held = replace(BIG, hold=hold)
    result = cycle([A, B, c], [mid, held], nodes, left_ws, left_pods, now=NOW + 30)
    assert [a.workload for a in result.admit] == ["ns/big"]
    assert "cannot be placed" in pending_of(result, "other/mid").reason
    # Without the hold, the queue that goes first takes the room.
    result = cycle([A, B, c], [mid, BIG], nodes, left_ws, left_pods, now=NOW + 30)
    assert "other/mid" in [a.workload for a in result.admit]


def test_a_hold_keeps_its_start_while_no_one_more_is_evicted() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    first = cycle([A, B], [BIG], nodes, ws, pods)
    hold = pending_of(first, "ns/big").hold
    victims = set(victims_of(first))
    leaving = [replace(w, evicting=True) if w.key in victims else w for w in ws]
    later = cycle([A, B], [replace(BIG, hold=hold)], nodes, leaving, pods, now=NOW + 60)
    assert not later.preempt
    again = pending_of(later, "ns/big").hold
    assert again is not None and again.since == NOW
    assert held_nodes(again) == held_nodes(hold)


def test_a_lapsed_hold_is_released_with_a_reason_and_the_stuck_victims_are_not_counted() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    first = cycle([A, B], [BIG], nodes, ws, pods)
    hold = pending_of(first, "ns/big").hold
    stuck = set(victims_of(first))
    leaving = [replace(w, evicting=True) if w.key in stuck else w for w in ws]
    # Five minutes on, both victims still have their pods bound (a finalizer, say).
    late = cycle([A, B], [replace(BIG, hold=hold)], nodes, leaving, pods, now=NOW + 301)
    waiting = pending_of(late, "ns/big")
    assert waiting.reason.startswith("the room held since 02:46:40 UTC lapsed after 300s (")
    assert "did not leave" in waiting.reason
    # A new plan around them: two other gangs, never the stuck ones again.
    new = set(victims_of(late))
    assert len(new) == 2 and not new & stuck
    assert waiting.hold is not None and waiting.hold.since == NOW + 301
    assert not set(held_nodes(waiting.hold)) & {p.node for p in pods if p.workload in stuck}


def test_a_lapsed_hold_whose_victims_left_needs_no_new_victims() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    first = cycle([A, B], [BIG], nodes, ws, pods)
    hold = pending_of(first, "ns/big").hold
    left_ws, left_pods = evict(ws, pods, set(victims_of(first)))
    late = cycle([A, B], [replace(BIG, hold=hold)], nodes, left_ws, left_pods, now=NOW + 900)
    assert [a.workload for a in late.admit] == ["ns/big"] and not late.preempt


# -- one decision with quota ----------------------------------------------------------------


def mixed_cluster() -> tuple[tuple[Node, ...], list[Workload], list[BoundPod]]:
    """Four 4-GPU nodes held by queue a's small jobs (16 GPUs), four 8-GPU nodes held by two
    gangs of queue b (32 GPUs, its whole quota)."""
    small_nodes = tuple(
        Node(f"small-{i}", {GPU: 4, "cpu": 64_000, "pods": 110}, {"pool": "h100"}) for i in range(4)
    )
    ws: list[Workload] = []
    pods: list[BoundPod] = []
    for i in range(4):
        w, bound = running(f"ns/s{i}", "a", [f"small-{i}"], 0, gpus=4, admitted_at=float(i))
        ws.append(w)
        pods.extend(bound)
    for i in range(2):
        on = [f"h100-{2 * i}", f"h100-{2 * i + 1}"]
        w, bound = running(f"other/g{i}", "b", on, 0, admitted_at=float(i))
        ws.append(w)
        pods.extend(bound)
    return small_nodes + gpu_nodes(4), ws, pods


def test_victims_for_quota_must_also_make_room_on_nodes_and_are_spared_when_those_do() -> None:
    # The gang (four 8-GPU pods) is over queue a's quota by 16: evicting a's four small jobs
    # would free that quota, but they sit on 4-GPU nodes it cannot use. Its pods need the
    # 8-GPU nodes, held by queue b's lower-priority gangs; evicting those frees quota too
    # (a may then borrow b's idle quota), so the small jobs are spared: no one is evicted
    # for quota who does not help the gang run.
    nodes, ws, pods = mixed_cluster()
    a = queue("a", quota=32, within_queue="LowerPriority", reclaim="Any")
    b = queue("b", quota=32)
    result = cycle([a, b], [BIG], nodes, ws, pods)
    assert not result.admit
    assert victims_of(result) == ["other/g0", "other/g1"]
    waiting = pending_of(result, "ns/big")
    assert waiting.hold is not None
    assert held_nodes(waiting.hold) == ["h100-0", "h100-1", "h100-2", "h100-3"]
    assert sorted(waiting.hold.victims) == ["other/g0", "other/g1"]
    # Once they are gone, the gang is admitted where it was held.
    left_ws, left_pods = evict(ws, pods, {"other/g0", "other/g1"})
    done = cycle([a, b], [replace(BIG, hold=waiting.hold)], nodes, left_ws, left_pods, NOW + 5)
    assert [x.workload for x in done.admit] == ["ns/big"]


def test_quota_victims_that_are_still_needed_are_evicted_with_those_in_the_way() -> None:
    # With a limit on queue a at 32 GPUs it may not borrow: the small jobs must go for
    # quota as well as b's gangs for the nodes.
    nodes, ws, pods = mixed_cluster()
    a = queue("a", quota=32, limit=32, within_queue="LowerPriority", reclaim="Any")
    b = queue("b", quota=32)
    result = cycle([a, b], [BIG], nodes, ws, pods)
    victims = victims_of(result)
    assert victims == ["ns/s0", "ns/s1", "ns/s2", "ns/s3", "other/g0", "other/g1"]
    reason = pending_of(result, "ns/big").reason
    assert reason.startswith("waiting for 6 preempted workloads to release quota and leave nodes")


def test_quota_victims_are_not_evicted_when_the_gang_could_not_be_placed_anyway() -> None:
    # Queue a's own low-priority gangs free the quota, but the other six nodes hold
    # higher-priority work: four nodes cannot be found for a five-node gang.
    nodes = gpu_nodes(8)
    a = queue("a", quota=40, within_queue="LowerPriority")
    b = queue("b", quota=48)
    mine, my_pods = gangs([0], queue_name="a")  # h100-0 and h100-1
    theirs: list[Workload] = []
    their_pods: list[BoundPod] = []
    for i in range(3):  # h100-2..7: priority 200, out of reach
        on = [f"h100-{2 + 2 * i}", f"h100-{3 + 2 * i}"]
        w, bound = running(f"other/g{i}", "b", on, 200)
        theirs.append(w)
        their_pods.extend(bound)
    five = workload("ns/five", "a", gpus=8, count=5, priority=100)
    result = cycle([a, b], [five], nodes, [*mine, *theirs], [*my_pods, *their_pods])
    assert not result.preempt and not result.admit
    reason = pending_of(result, "ns/five").reason
    assert "would free the quota, but no one is evicted" in reason


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(0, 200), min_size=1, max_size=6),
    st.integers(1, 8),
    st.integers(8, 12),
    st.sampled_from([16, 48, 80]),
)
def test_when_victims_are_chosen_the_preemptor_is_admitted_once_they_are_gone(
    priorities: list[int], size: int, n_nodes: int, a_quota: int
) -> None:
    """Evict only when the whole gang is known to fit afterwards: removing the victims
    (and nothing else) lets the next cycle admit it."""
    nodes = gpu_nodes(n_nodes)
    a = queue("a", quota=a_quota, within_queue="LowerPriority", reclaim="Any")
    b = queue("b", quota=8 * n_nodes - a_quota)
    half = len(priorities) // 2
    mine, my_pods = gangs(priorities[:half], queue_name="a")
    theirs, their_pods = gangs(priorities[half:], queue_name="b")
    # Gang i sits on nodes 2i, 2i+1: shift b's gangs past a's.
    shift = 2 * half
    theirs = [
        replace(
            w,
            key=f"other/{w.key}",
            admission=tuple(
                replace(x, nodes=tuple((_shifted(n, shift), c) for n, c in x.nodes))
                for x in w.admission or ()
            ),
        )
        for w in theirs
    ]
    their_pods = [
        replace(
            p, key=f"other/{p.key}", node=_shifted(p.node, shift), workload=f"other/{p.workload}"
        )
        for p in their_pods
    ]
    running_ws = [*mine, *theirs]
    running_pods = [p for p in [*my_pods, *their_pods] if int(p.node.split("-")[1]) < n_nodes]
    running_ws = [
        w for w in running_ws if any(p.workload == w.key for p in running_pods)
    ]  # gangs beyond the last node were never placed
    preemptor = workload("ns/p", "a", gpus=8, count=size, priority=100)
    result = cycle([a, b], [preemptor], nodes, running_ws, running_pods)
    event(f"preempted={bool(result.preempt)}")
    if not result.preempt:
        return
    waiting = pending_of(result, "ns/p")
    assert waiting.hold is not None
    gone = set(victims_of(result))
    left_ws, left_pods = evict(running_ws, running_pods, gone)
    after = cycle(
        [a, b], [replace(preemptor, hold=waiting.hold)], nodes, left_ws, left_pods, NOW + 1
    )
    assert [x.workload for x in after.admit] == ["ns/p"], after.pending


def _shifted(node: str, by: int) -> str:
    return f"h100-{int(node.split('-')[1]) + by}"


# -- the simulator runs the same decisions ---------------------------------------------------


def test_the_simulator_evicts_exactly_two_gangs_and_holds_their_nodes_for_the_preemptor() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "preemption-on-nodes.yaml"
    result = to_json(simulate(parse_scenario(list(yaml.safe_load_all(example.read_text())))))
    by_name = {w["name"]: w for w in result["workloads"]}
    evicted = sorted(name for name, w in by_name.items() if w["evictions"])
    assert evicted == ["research/research-sweep-4", "research/research-sweep-5"]
    # Evicted at minute 10 and 30 seconds (waitBeforeEvicting's default: no completion made
    # room meanwhile), gone 3 minutes later: the preemptor runs then, and the higher-priority
    # queue's replicas, which arrived meanwhile, did not take its room.
    assert by_name["prod/prod-launch-1"]["admittedAt"] == 810.0
    assert by_name["serving/serving-replicas-1"]["admittedAt"] > 810.0


def test_a_preemptor_set_aside_for_the_second_pass_keeps_its_room_held_meanwhile() -> None:
    # Capacity 16 GPUs on two nodes, both in queue a's use; la is leaving for `urgent`,
    # which is beyond its fair share and so decided in the second pass, after queue o's
    # medium-priority job (o may not preempt). The room on h100-0 and its quota stay urgent's.
    a = queue("a", quota=64, within_queue="LowerPriority")
    o = queue("o", quota=64)
    la, la_pods = running("ns/la", "a", ["h100-0"], 10, admitted_at=1.0)
    lb, lb_pods = running("ns/lb", "a", ["h100-1"], 10, admitted_at=2.0)
    hold = Hold((Assignment("main", 1, {GPU: "h100"}, (("h100-0", 1),)),), NOW - 1, ("ns/la",))
    urgent = workload("ns/urgent", "a", gpus=8, priority=1000, arrival=3.0, hold=hold)
    medium = workload("ns/medium", "o", gpus=8, priority=500, arrival=4.0)
    result = admission_cycle(
        Snapshot(
            now=NOW,
            queues=queues_of(a, o),
            flavors={"h100": H100},
            capacity={("h100", GPU): 16},
            admitted=(replace(la, evicting=True), lb),
            pending=(urgent, medium),
            nodes=gpu_nodes(2),
            pods=(*la_pods, *lb_pods),
        )
    )
    assert not result.preempt  # lb is not evicted on top
    # Neither urgent's room nor its quota (held with the room) goes to medium.
    assert not result.admit
    assert "insufficient quota" in pending_of(result, "ns/medium").reason
    assert pending_of(result, "ns/medium").hold is None
    assert held_nodes(pending_of(result, "ns/urgent").hold) == ["h100-0"]


# -- a holder's turn: its room and quota stay its own until it is admitted or the hold lapses --

SVC = queue("svc", quota=8, limit=8, movable=True, within_queue="LowerOrNewerEqualPriority")
TRAIN = queue("train", quota=64)


def test_a_moved_workload_is_admitted_on_its_held_room_before_newcomers_of_its_queue() -> None:
    # 3 nodes: h100-0 has 2 free, h100-1 4, h100-2 2. A 6-GPU gang of train moves svc/m off
    # h100-0 onto h100-1. Once the move is done, newcomers arrive in svc: a higher priority
    # one, and one that arrived after svc/m. Neither takes svc/m's quota or room.
    m, m_pods = running("svc/m", "svc", ["h100-0"], gpus=4)
    x, x_pods = running("svc/x", "svc", ["h100-1"], gpus=4)
    f, f_pods = running("train/f", "train", ["h100-0"], gpus=2)
    g, g_pods = running("train/g", "train", ["h100-2"], gpus=6)
    gang = workload("ml/gang", "train", gpus=6)
    others, other_pods = [x, f, g], [*x_pods, *f_pods, *g_pods]
    first = cycle([SVC, TRAIN], [gang], gpu_nodes(3), [m, *others], [*m_pods, *other_pods])
    ((moved,),) = [p.victims for p in first.preempt]
    assert (moved.workload, moved.kind) == ("svc/m", "Moved")
    assert held_nodes(moved.hold) == ["h100-1"]
    gang_hold = pending_of(first, "ml/gang").hold
    hi = workload("svc/hi", "svc", gpus=2, priority=10, arrival=50.0)
    late = workload("svc/late", "svc", gpus=2, arrival=60.0)
    # Requeued as the simulator does it: arrival at the requeue, after the newcomers.
    again = replace(m, admission=None, admitted_at=None, arrival=70.0, hold=moved.hold)
    pending = [again, replace(gang, hold=gang_hold), hi, late]
    second = cycle([SVC, TRAIN], pending, gpu_nodes(3), others, other_pods, NOW + 10)
    admitted = {a.workload: a.assignments[0].nodes for a in second.admit}
    assert admitted["svc/m"] == (("h100-1", 1),)
    assert admitted["ml/gang"] == (("h100-0", 1),)
    for key in ("svc/hi", "svc/late"):
        assert key not in admitted or "h100-1" not in dict(admitted[key])


def test_a_holder_whose_turn_fails_keeps_its_room_for_the_rest_of_the_cycle() -> None:
    # ns/p holds h100-0 (its victim has left), but its queue no longer has quota for one of
    # its resources: its turn ends pending. The next workload of its queue, which fits
    # quota, must still not get h100-0.
    a = queue("a", quota=64)
    busy, busy_pods = running("ns/busy", "a", ["h100-1"], gpus=8)
    hold = Hold((Assignment("main", 1, {GPU: "h100"}, (("h100-0", 1),)),), NOW - 1, ("ns/v",))
    p = Workload("ns/p", "a", 0, 1.0, (PodSet("main", 1, {GPU: 8, FPGA: 1}),), hold=hold)
    other = workload("ns/other", "a", gpus=8, arrival=2.0)
    result = cycle([a], [p, other], gpu_nodes(2), [busy], busy_pods)
    assert not result.admit
    assert "no quota for example.com/fpga" in pending_of(result, "ns/p").reason
    assert "cannot be placed" in pending_of(result, "ns/other").reason
    assert pending_of(result, "ns/other").hold is None


def test_a_holders_quota_is_not_taken_by_a_queue_visited_before_its_turn() -> None:
    # ns/p borrows the cohort's last 8 GPUs, given to it when its victim was evicted; it is
    # beyond its fair share, so its turn comes in the second pass, and queue c's newcomer
    # (within c's share) comes first. Room on nodes is plenty: quota is what is held.
    root = queue("root", quota=16)
    a = queue("a", parent="root", quota=0)
    c = queue("c", parent="root", quota=8)
    busy, busy_pods = running("ns/busy", "c", ["h100-1"], gpus=8)
    hold = Hold((Assignment("main", 1, {GPU: "h100"}, (("h100-0", 1),)),), NOW - 1, ("ns/v",))
    p = workload("ns/p", "a", gpus=8, priority=100, arrival=1.0, hold=hold)
    other = workload("ns/other", "c", gpus=4, arrival=2.0)
    result = cycle([root, a, c], [p, other], gpu_nodes(3), [busy], busy_pods)
    assert [(x.workload, x.assignments[0].nodes) for x in result.admit] == [
        ("ns/p", (("h100-0", 1),))
    ]
    assert "insufficient quota" in pending_of(result, "ns/other").reason


def test_a_lapsed_hold_is_no_longer_kept_and_the_wait_says_so_whatever_ends_the_turn() -> None:
    a = queue("a", quota=64, limit=4)
    hold = Hold((Assignment("main", 1, {GPU: "h100"}, (("h100-0", 1),)),), NOW - 400)
    p = workload("ns/p", "a", gpus=8, arrival=1.0, hold=hold)
    other = workload("ns/other", "b", gpus=8, arrival=2.0)
    result = cycle([a, B], [p, other], gpu_nodes(1), [], [], NOW)
    reason = pending_of(result, "ns/p").reason
    assert reason.startswith("the room held since 02:40:00 UTC lapsed after 300s; ")
    assert "exceeds limit" in reason
    # The room is free again: another queue's workload is admitted on it.
    assert [x.workload for x in result.admit] == ["ns/other"]


def test_a_holder_goes_first_in_a_strict_fifo_queue() -> None:
    # A newcomer of higher priority at the head of a StrictFIFO queue cannot be placed (the
    # only free room is held): the holder behind it is admitted on its room, not kept
    # waiting behind the head.
    fifo = queue("a", quota=64, queueing_strategy="StrictFIFO")
    busy, busy_pods = running("ns/busy", "a", ["h100-1"], gpus=8, priority=100)
    hold = Hold((Assignment("main", 1, {GPU: "h100"}, (("h100-0", 1),)),), NOW - 1)
    held = workload("ns/held", "a", gpus=8, arrival=5.0, hold=hold)
    head = workload("ns/head", "a", gpus=8, priority=10, arrival=1.0)
    result = cycle([fifo], [head, held], gpu_nodes(2), [busy], busy_pods)
    assert [(x.workload, x.assignments[0].nodes) for x in result.admit] == [
        ("ns/held", (("h100-0", 1),))
    ]
    assert "cannot be placed" in pending_of(result, "ns/head").reason
