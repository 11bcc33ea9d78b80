"""Admission with nodes: quota is the policy, placement the physics.

A workload whose flavors fit is admitted only when its pods can be placed on nodes of those
flavors, counting every bound pod (Muster's or not), room planned for admitted workloads not
yet bound, and this cycle's own admissions; the plan goes out with the admission.
"""

from __future__ import annotations

from collections import Counter

from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult
from quota.model.nodes import BoundPod, Node
from quota.model.snapshot import (
    Assignment,
    Flavor,
    FlavorQuota,
    PodSet,
    QueueSpec,
    Snapshot,
    Workload,
)
from tests.unit.strategies import GPU, queue, queues_of, workload

H100 = Flavor("h100", {"pool": "h100"})


def gpu_nodes(n: int, gpus: int = 8, pool: str = "h100") -> tuple[Node, ...]:
    return tuple(
        Node(f"{pool}-{i}", {GPU: gpus, "cpu": 64_000, "pods": 110}, {"pool": pool})
        for i in range(n)
    )


def cycle(
    specs: list[QueueSpec],
    pending: list[Workload],
    nodes: tuple[Node, ...],
    pods: tuple[BoundPod, ...] = (),
    admitted: tuple[Workload, ...] = (),
) -> CycleResult:
    capacity = {("h100", GPU): sum(n.allocatable.get(GPU, 0) for n in nodes)}
    return admission_cycle(
        Snapshot(
            now=1_000.0,
            queues=queues_of(*specs),
            flavors={"h100": H100},
            capacity=capacity,
            admitted=admitted,
            pending=tuple(pending),
            nodes=nodes,
            pods=pods,
        )
    )


def other_pods(nodes: tuple[Node, ...], gpus: int) -> tuple[BoundPod, ...]:
    """Pods Muster does not manage, `gpus` GPUs on every node."""
    return tuple(BoundPod(f"other/p{i}", n.name, {GPU: gpus}) for i, n in enumerate(nodes))


def planned(result: CycleResult, key: str) -> Counter[str]:
    (admit,) = [a for a in result.admit if a.workload == key]
    out: Counter[str] = Counter()
    for assignment in admit.assignments:
        for node, n in assignment.nodes:
            out[node] += n
    return out


def test_fragmented_gpus_do_not_admit_a_gang_and_the_reason_names_the_free_amounts() -> None:
    nodes = gpu_nodes(8)
    gang = workload("ns/gang", "a", gpus=8, count=4)
    result = cycle([queue("a", quota=64)], [gang], nodes, other_pods(nodes, 4))
    assert not result.admit
    (pending,) = result.pending
    assert "cannot be placed on flavor h100" in pending.reason
    assert "4" in pending.reason and "8" in pending.reason  # what is free and what is needed


def test_the_gang_lands_on_four_whole_nodes_once_the_small_pods_are_gone() -> None:
    nodes = gpu_nodes(8)
    result = cycle([queue("a", quota=64)], [workload("ns/gang", "a", gpus=8, count=4)], nodes)
    plan = planned(result, "ns/gang")
    assert sum(plan.values()) == 4 and set(plan.values()) == {1}
    assert "4 pods planned on" in result.admit[0].reason


def test_bin_packing_fills_nodes_and_spread_uses_them_all() -> None:
    nodes = gpu_nodes(4)
    job = workload("ns/small", "a", gpus=1, count=16)
    packed = planned(cycle([queue("a", quota=32)], [job], nodes), "ns/small")
    assert sorted(packed.values()) == [8, 8]
    spread = planned(cycle([queue("a", quota=32, placement="Spread")], [job], nodes), "ns/small")
    assert sorted(spread.values()) == [4, 4, 4, 4]


def test_pods_muster_does_not_manage_are_counted() -> None:
    nodes = gpu_nodes(2)
    full = (BoundPod("other/big", "h100-0", {GPU: 8}),)
    result = cycle([queue("a", quota=16)], [workload("ns/w", "a", gpus=8)], nodes, full)
    assert planned(result, "ns/w") == Counter({"h100-1": 1})


def test_one_cycle_never_plans_two_workloads_onto_the_same_room() -> None:
    nodes = gpu_nodes(2)
    pending = [workload(f"ns/w{i}", "a", gpus=8, arrival=i) for i in range(3)]
    result = cycle([queue("a", quota=24)], pending, nodes)
    assert sorted(a.workload for a in result.admit) == ["ns/w0", "ns/w1"]
    used = Counter[str]()
    for a in result.admit:
        used.update(planned(result, a.workload))
    assert used == Counter({"h100-0": 1, "h100-1": 1})
    assert [p.workload for p in result.pending] == ["ns/w2"]


def test_room_planned_for_an_admitted_workload_not_yet_bound_stays_reserved() -> None:
    nodes = gpu_nodes(3)
    earlier = Workload(
        "ns/earlier",
        "a",
        0,
        0.0,
        (PodSet("main", 2, {GPU: 8}),),
        admission=(Assignment("main", 2, {GPU: "h100"}, (("h100-0", 1), ("h100-1", 1))),),
        admitted_at=0.0,
    )
    # One of its two pods is bound already; the other's room is still promised to it.
    # The third node is full of pods Muster does not manage: quota has room for one more
    # 8-GPU pod, the nodes do not.
    bound = (
        BoundPod("ns/earlier-0", "h100-0", {GPU: 8}, "ns/earlier"),
        BoundPod("other/big", "h100-2", {GPU: 8}),
    )
    result = cycle(
        [queue("a", quota=32)], [workload("ns/next", "a", gpus=8)], nodes, bound, (earlier,)
    )
    assert not result.admit
    assert "cannot be placed" in result.pending[0].reason
    # Once the planned pod is bound, the reservation is the pod itself: still no room.
    bound += (BoundPod("ns/earlier-1", "h100-1", {GPU: 8}, "ns/earlier"),)
    again = cycle(
        [queue("a", quota=32)], [workload("ns/next", "a", gpus=8)], nodes, bound, (earlier,)
    )
    assert not again.admit


def test_a_pod_no_node_can_ever_hold_waits_and_does_not_block_a_strict_fifo_queue() -> None:
    nodes = gpu_nodes(2)
    huge = workload("ns/huge", "a", gpus=9, arrival=0)
    small = workload("ns/small", "a", gpus=1, arrival=1)
    result = cycle([queue("a", quota=16, queueing_strategy="StrictFIFO")], [huge, small], nodes)
    assert [a.workload for a in result.admit] == ["ns/small"]
    (pending,) = result.pending
    assert pending.workload == "ns/huge"
    assert "9" in pending.reason and "8" in pending.reason


def test_a_flavor_no_node_carries_waits_with_a_reason_naming_the_flavor() -> None:
    nodes = gpu_nodes(2, pool="a100")
    # As the controller counts it, a flavor no Ready node carries has no capacity at all.
    for capacity in ({("h100", GPU): 0}, {("h100", GPU): 16}):
        result = admission_cycle(
            Snapshot(
                now=0.0,
                queues=queues_of(queue("a", quota=16)),
                flavors={"h100": H100},
                capacity=capacity,
                pending=(workload("ns/w", "a", gpus=1),),
                nodes=nodes,
            )
        )
        assert not result.admit
        reason = result.pending[0].reason
        assert "flavor h100" in reason and "pool=h100" in reason, reason


def test_partial_admission_places_at_least_min_count() -> None:
    nodes = gpu_nodes(3)
    pods = (BoundPod("other/x", "h100-2", {GPU: 8}),)  # quota says 24 GPUs, nodes hold 16
    job = Workload("ns/elastic", "a", 0, 0.0, (PodSet("main", 3, {GPU: 8}, min_count=2),))
    result = cycle([queue("a", quota=24)], [job], nodes, pods)
    (admit,) = result.admit
    assert admit.assignments[0].count == 2
    assert sum(planned(result, "ns/elastic").values()) == 2


def test_without_nodes_admission_trusts_quota_alone() -> None:
    result = admission_cycle(
        Snapshot(
            now=0.0,
            queues=queues_of(queue("a", quota=8)),
            flavors={"h100": H100},
            pending=(workload("ns/w", "a", gpus=8),),
        )
    )
    assert [a.workload for a in result.admit] == ["ns/w"]
    assert result.admit[0].assignments[0].nodes == ()


def test_when_the_first_flavors_nodes_are_full_the_next_flavor_is_tried() -> None:
    h100, a100 = gpu_nodes(1), gpu_nodes(1, pool="a100")
    spec = QueueSpec(
        "a",
        flavors=(FlavorQuota("h100", {GPU: 8}), FlavorQuota("a100", {GPU: 8})),
    )
    full = (BoundPod("other/big", "h100-0", {GPU: 8}),)
    result = admission_cycle(
        Snapshot(
            now=0.0,
            queues=queues_of(spec),
            flavors={"h100": H100, "a100": Flavor("a100", {"pool": "a100"})},
            capacity={("h100", GPU): 8, ("a100", GPU): 8},
            pending=(workload("ns/w", "a", gpus=8),),
            nodes=h100 + a100,
            pods=full,
        )
    )
    (admit,) = result.admit
    assert admit.assignments[0].flavors == {GPU: "a100"}
    assert admit.assignments[0].nodes == (("a100-0", 1),)


def test_a_queue_that_dispatches_is_admitted_by_quota_alone_and_plans_no_local_node() -> None:
    """Its workloads run in worker clusters: this cluster's nodes neither admit nor refuse
    them, and hold no room for them; a local queue beside it still places on them. The
    capacity counts the workers' nodes too (the controller adds them)."""
    nodes = gpu_nodes(1)
    remote = workload("ns/remote", "fleet", gpus=8, count=3)  # 24 GPUs: no local room
    here = workload("ns/here", "local", gpus=8, count=1, arrival=1.0)
    snapshot = Snapshot(
        now=1_000.0,
        queues=queues_of(queue("fleet", quota=24, remote=True), queue("local", quota=8)),
        flavors={"h100": H100},
        capacity={("h100", GPU): 8 + 24},
        pending=(remote, here),
        nodes=nodes,
    )
    result = admission_cycle(snapshot)
    assert {a.workload for a in result.admit} == {"ns/remote", "ns/here"}
    assert planned(result, "ns/remote") == Counter()
    assert planned(result, "ns/here") == Counter({"h100-0": 1})


def test_a_dispatching_queue_still_keeps_to_its_quota() -> None:
    result = cycle(
        [queue("fleet", quota=16, limit=16, remote=True)],
        [workload("ns/big", "fleet", gpus=8, count=3)],
        gpu_nodes(8),
    )
    assert not result.admit
    (pending,) = result.pending
    assert "exceeds limit of queue fleet" in pending.reason
