"""The admission cycle: order, fitting, flavors, borrowing, partial admission, stop policies."""

from __future__ import annotations

from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult
from quota.model.snapshot import (
    Flavor,
    FlavorQuota,
    PodSet,
    QueueSpec,
    Snapshot,
    Taint,
    Toleration,
    Workload,
)
from tests.unit.strategies import CPU, GPU, queue, queues_of, workload


def cycle(
    specs: list[QueueSpec], pending=(), admitted=(), capacity=None, flavors=None
) -> CycleResult:  # type: ignore[no-untyped-def]
    return admission_cycle(
        Snapshot(
            now=1_000.0,
            queues=queues_of(*specs),
            flavors=flavors or {},
            capacity=capacity,
            admitted=tuple(admitted),
            pending=tuple(pending),
        )
    )


def admitted_keys(result: CycleResult) -> list[str]:
    return [a.workload for a in result.admit]


def reasons(result: CycleResult) -> dict[str, str]:
    return {p.workload: p.reason for p in result.pending}


H100 = {("h100", GPU): 4}
H = ("h100", GPU)


def test_queue_below_its_fair_share_goes_first() -> None:
    # Both queues are guaranteed 2 of 4 GPUs; a already uses its 2, so b's workload is served
    # before a's even though a's arrived earlier and sorts first.
    result = cycle(
        [queue("a", quota=2), queue("b", quota=2)],
        pending=[
            workload("ns/a1", "a", gpus=2, arrival=0),
            workload("ns/b1", "b", gpus=2, arrival=5),
        ],
        admitted=[workload("ns/a0", "a", gpus=2, flavor="h100")],
        capacity=H100,
    )
    assert admitted_keys(result) == ["ns/b1"]
    assert "ns/a1" in reasons(result)


def test_departments_are_ordered_before_their_teams() -> None:
    # 8 GPUs, departments x and y guaranteed 4 each. Inside x, x2 borrowed x1's idle quota,
    # so x holds its whole share while y holds half of its own. x1 (using nothing) is the
    # least saturated leaf, but its department is the more saturated subtree: the 2 free GPUs
    # go to y1 first, as a hierarchical fair scheduler picks the subtree before the team.
    def run(x1: QueueSpec) -> CycleResult:
        specs = [
            queue("x", quota=4),
            x1,
            queue("x2", "x", quota=2),
            queue("y", quota=4),
            queue("y1", "y", quota=4),
        ]
        admitted = [
            workload("ns/x2-old", "x2", gpus=2, flavor="h100", admitted_at=1.0),
            workload("ns/x2-new", "x2", gpus=2, flavor="h100", admitted_at=2.0),
            workload("ns/y1-run", "y1", gpus=2, flavor="h100"),
        ]
        pending = [
            workload("ns/x1-new", "x1", gpus=2, arrival=0),
            workload("ns/y1-new", "y1", gpus=2, arrival=5),
        ]
        return cycle(specs, pending, admitted, capacity={("h100", GPU): 8})

    result = run(queue("x1", "x", quota=2))
    assert admitted_keys(result) == ["ns/y1-new"]
    assert "ns/x1-new" in reasons(result)
    assert result.preempt == ()
    # Allowed to reclaim, x1 takes back from its sibling what x2 holds beyond its share.
    result = run(queue("x1", "x", quota=2, reclaim="Any"))
    assert admitted_keys(result) == ["ns/y1-new"]
    assert [(p.preemptor, [v.workload for v in p.victims]) for p in result.preempt] == [
        ("ns/x1-new", ["ns/x2-new"])
    ]


def test_work_within_fair_share_goes_before_borrowing() -> None:
    # 8 GPUs, a and b guaranteed 2 each; fair shares a=4, b=4. a's urgent 5-GPU job would
    # borrow beyond a's share, b's 2-GPU job stays within b's: b's goes first, and a's
    # low-priority 2-GPU job, within a's share, may pass the urgent one as it may pass a job
    # that does not fit. The urgent job borrows what is left, if enough is.
    pending = [
        workload("ns/a-urgent", "a", gpus=5, priority=5, arrival=0),
        workload("ns/a-low", "a", gpus=2, priority=0, arrival=1),
        workload("ns/b-small", "b", gpus=2, arrival=2),
        workload("ns/b-big", "b", gpus=6, arrival=3),
    ]
    result = cycle([queue("a", quota=2), queue("b", quota=2)], pending, capacity={H: 8})
    assert admitted_keys(result) == ["ns/a-low", "ns/b-small"]
    assert set(reasons(result)) == {"ns/a-urgent", "ns/b-big"}
    # If a may preempt within itself, the low-priority job would only be evicted for the
    # urgent one a cycle later: it waits behind it, and the urgent one borrows.
    preempting = queue("a", quota=2, within_queue="LowerPriority")
    result = cycle([preempting, queue("b", quota=2)], pending, capacity={H: 8})
    assert admitted_keys(result) == ["ns/b-small", "ns/a-urgent"]
    assert set(reasons(result)) == {"ns/a-low", "ns/b-big"}


def test_inside_a_queue_priority_then_arrival() -> None:
    result = cycle(
        [queue("a", quota=2)],
        pending=[
            workload("ns/old-low", "a", gpus=1, priority=0, arrival=0),
            workload("ns/new-high", "a", gpus=1, priority=5, arrival=9),
            workload("ns/mid-high", "a", gpus=1, priority=5, arrival=3),
        ],
    )
    assert admitted_keys(result) == ["ns/mid-high", "ns/new-high"]
    assert set(reasons(result)) == {"ns/old-low"}


def test_many_admissions_per_queue_in_one_cycle() -> None:
    result = cycle(
        [queue("a", quota=10)],
        pending=[workload(f"ns/w{i}", "a", gpus=2, arrival=i) for i in range(6)],
    )
    assert admitted_keys(result) == [f"ns/w{i}" for i in range(5)]
    assert reasons(result) == {
        "ns/w5": "insufficient quota for nvidia.com/gpu in flavor h100: requested 2, "
        "available 0, fair share 10"
    }


def test_reason_names_resource_flavor_request_availability_and_fair_share() -> None:
    result = cycle(
        [queue("a", quota=4), queue("b", quota=2)],
        pending=[workload("ns/big", "a", gpus=8)],
        admitted=[workload("ns/b1", "b", gpus=4, flavor="h100")],
        capacity={("h100", GPU): 6},
    )
    assert reasons(result)["ns/big"] == (
        "insufficient quota for nvidia.com/gpu in flavor h100: requested 8, available 2, "
        "fair share 4"
    )


def test_strict_fifo_head_blocks_best_effort_lets_others_pass() -> None:
    pending = [
        workload("ns/big", "a", gpus=8, arrival=0),
        workload("ns/small", "a", gpus=1, arrival=1),
    ]
    strict = cycle([queue("a", quota=4, queueing_strategy="StrictFIFO")], pending=pending)
    assert admitted_keys(strict) == []
    assert reasons(strict)["ns/small"] == "waiting behind ns/big, the head of StrictFIFO queue a"
    best = cycle([queue("a", quota=4, queueing_strategy="BestEffortFIFO")], pending=pending)
    assert admitted_keys(best) == ["ns/small"]


def test_identical_shapes_fail_alike_and_other_shapes_still_fit() -> None:
    pending = [workload(f"ns/big{i}", "a", gpus=8, arrival=i) for i in range(3)]
    pending.append(workload("ns/small", "a", gpus=3, arrival=10))
    result = cycle([queue("a", quota=4)], pending=pending)
    assert admitted_keys(result) == ["ns/small"]
    r = reasons(result)
    assert r["ns/big0"] == r["ns/big1"] == r["ns/big2"]


def test_partial_admission_takes_the_largest_count_that_fits() -> None:
    w = Workload("ns/elastic", "a", 0, 0.0, (PodSet("workers", 8, {GPU: 1}, min_count=2),))
    result = cycle([queue("a", quota=5)], pending=[w])
    (admit,) = result.admit
    assert admit.assignments[0].count == 5
    assert "partial admission: pod set workers gets 5 of 8 pods (minCount 2)" in admit.reason


def test_partial_admission_below_min_count_stays_pending() -> None:
    w = Workload("ns/elastic", "a", 0, 0.0, (PodSet("workers", 8, {GPU: 1}, min_count=6),))
    result = cycle([queue("a", quota=5)], pending=[w])
    assert result.admit == ()
    assert "not even minCount pods fit" in reasons(result)["ns/elastic"]


def test_workload_is_admitted_whole_or_not_at_all() -> None:
    w = Workload(
        "ns/job",
        "a",
        0,
        0.0,
        (PodSet("launcher", 1, {GPU: 1}), PodSet("workers", 4, {GPU: 1})),
    )
    result = cycle([queue("a", quota=4)], pending=[w])
    assert result.admit == ()
    assert reasons(result)["ns/job"].startswith("pod set workers: insufficient quota")


def two_flavor_queue(**fields: object) -> QueueSpec:
    return QueueSpec(
        "a",
        flavors=(
            FlavorQuota("h100", {GPU: 4}),
            FlavorQuota("a100", {GPU: 8}),
        ),
        **fields,  # type: ignore[arg-type]
    )


def test_flavors_are_tried_in_preference_order() -> None:
    result = cycle(
        [two_flavor_queue()],
        pending=[
            workload("ns/w1", "a", gpus=3, arrival=0),
            workload("ns/w2", "a", gpus=3, arrival=1),
        ],
    )
    assert [a.assignments[0].flavors[GPU] for a in result.admit] == ["h100", "a100"]


def test_node_selector_and_taints_rule_flavors_out() -> None:
    flavors = {
        "h100": Flavor("h100", {"gpu": "h100"}, taints=(Taint("dedicated", "llm"),)),
        "a100": Flavor("a100", {"gpu": "a100"}),
    }
    wants_h100 = Workload(
        "ns/sel", "a", 0, 0.0, (PodSet("main", 1, {GPU: 1}, node_selector={"gpu": "h100"}),)
    )
    result = cycle([two_flavor_queue()], pending=[wants_h100], flavors=flavors)
    assert result.admit == ()
    assert "taint dedicated=llm:NoSchedule is not tolerated" in reasons(result)["ns/sel"]

    tolerant = Workload(
        "ns/tol",
        "a",
        0,
        0.0,
        (
            PodSet(
                "main",
                1,
                {GPU: 1},
                node_selector={"gpu": "h100"},
                tolerations=(Toleration("dedicated", "Equal", "llm", "NoSchedule"),),
            ),
        ),
    )
    plain = workload("ns/plain", "a", gpus=1, arrival=1)
    result = cycle([two_flavor_queue()], pending=[tolerant, plain], flavors=flavors)
    flavors_used = {a.workload: a.assignments[0].flavors[GPU] for a in result.admit}
    # The untolerating pod set skips the tainted preferred flavor and lands on a100.
    assert flavors_used == {"ns/tol": "h100", "ns/plain": "a100"}


def test_resources_of_different_flavor_groups_come_from_their_own_flavors() -> None:
    spec = QueueSpec(
        "a",
        flavors=(FlavorQuota("default", {CPU: 8_000}), FlavorQuota("h100", {GPU: 4})),
    )
    w = Workload("ns/w", "a", 0, 0.0, (PodSet("main", 2, {CPU: 1_500, GPU: 1}),))
    (admit,) = cycle([spec], pending=[w]).admit
    assert admit.assignments[0].flavors == {CPU: "default", GPU: "h100"}


def test_borrowing_idle_capacity_is_allowed_and_reported() -> None:
    result = cycle(
        [queue("a", quota=2), queue("b", quota=2)],
        pending=[workload("ns/w", "a", gpus=3)],
    )
    (admit,) = result.admit
    assert admit.borrowing
    assert "borrows idle capacity beyond the quota of queue a" in admit.reason
    in_quota = cycle([queue("a", quota=4)], pending=[workload("ns/w", "a", gpus=3)])
    assert not in_quota.admit[0].borrowing


def test_borrowing_stops_at_the_limit_of_the_queue_and_of_every_ancestor() -> None:
    specs = [
        queue("dept", quota=2, limit=3),
        queue("t1", "dept", quota=2, limit=10),
        queue("other", quota=8),
    ]
    result = cycle(specs, pending=[workload("ns/w", "t1", gpus=4)])
    assert result.admit == ()
    assert reasons(result)["ns/w"] == (
        "exceeds limit of queue dept for nvidia.com/gpu in flavor h100: requested 4, "
        "limit 3, in use 0"
    )
    own = cycle(
        [queue("t1", quota=2, limit=3), queue("o", quota=8)],
        pending=[workload("ns/w", "t1", gpus=4)],
    )
    assert "exceeds limit of queue t1" in reasons(own)["ns/w"]


def test_admissions_never_exceed_node_capacity() -> None:
    result = cycle(
        [queue("a", quota=8)],
        pending=[workload(f"ns/w{i}", "a", gpus=2, arrival=i) for i in range(4)],
        capacity={("h100", GPU): 5},
    )
    assert admitted_keys(result) == ["ns/w0", "ns/w1"]


def test_inactive_and_held_queues_admit_nothing() -> None:
    specs = [
        queue("off", quota=4, active=False, inactive_reason="flavor h100 does not exist"),
        queue("held", quota=4, stop_policy="Hold"),
        queue("dept", quota=4, stop_policy="Hold"),
        queue("team", "dept", quota=4),
    ]
    result = cycle(
        specs,
        pending=[
            workload("ns/a", "off"),
            workload("ns/b", "held"),
            workload("ns/c", "team"),
            workload("ns/d", "dept"),
            workload("ns/e", "nowhere"),
        ],
    )
    assert result.admit == ()
    r = reasons(result)
    assert r["ns/a"] == "queue off is inactive: flavor h100 does not exist"
    assert r["ns/b"].startswith("queue held is stopped (stopPolicy Hold)")
    assert r["ns/c"].startswith("queue dept (ancestor of team) is stopped")
    assert r["ns/d"] == "queue dept has child queues; workloads must name a leaf queue"
    assert r["ns/e"] == "queue nowhere does not exist"


def test_hold_and_drain_evicts_admitted_workloads() -> None:
    result = cycle(
        [queue("a", quota=4, stop_policy="HoldAndDrain"), queue("b", quota=4)],
        admitted=[workload("ns/run", "a", flavor="h100"), workload("ns/keep", "b", flavor="h100")],
    )
    assert [(v.workload, v.kind) for v in result.drain] == [("ns/run", "Preempted")]
    assert "draining (stopPolicy HoldAndDrain)" in result.drain[0].reason


def test_every_pending_workload_gets_exactly_one_decision() -> None:
    pending = [workload(f"ns/w{i}", q, gpus=3, arrival=i) for i, q in enumerate("aabbab")]
    result = cycle(
        [queue("a", quota=4, queueing_strategy="StrictFIFO"), queue("b", quota=4)], pending=pending
    )
    decided = admitted_keys(result) + [p.workload for p in result.pending]
    assert sorted(decided) == sorted(w.key for w in pending)


def test_reasons_use_manifest_units() -> None:
    spec = QueueSpec("a", flavors=(FlavorQuota("default", {CPU: 1_500, "memory": 1 << 30}),))
    w = Workload("ns/w", "a", 0, 0.0, (PodSet("main", 1, {CPU: 3_000, "memory": 1 << 29}),))
    result = cycle([spec], pending=[w])
    assert reasons(result)["ns/w"] == (
        "insufficient quota for cpu in flavor default: requested 3, available 1500m, "
        "fair share 1500m"
    )
