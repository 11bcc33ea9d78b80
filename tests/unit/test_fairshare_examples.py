"""The worked examples of docs/fairness.md, one row each."""

from __future__ import annotations

import pytest

from quota.fairness.fairshare import fair_share
from quota.model.snapshot import QueueSpec, Snapshot
from tests.unit.strategies import GPU, queue, queues_of, workload

H100 = ("h100", GPU)


def shares(
    specs: list[QueueSpec],
    demands: dict[str, int],
    capacity: int | None,
    **fields: object,
) -> dict[str, int]:
    pending = tuple(workload(f"ns/{q}", q, gpus=d) for q, d in demands.items())
    snapshot = Snapshot(
        now=0.0,
        queues=queues_of(*specs),
        flavors={},
        capacity=None if capacity is None else {H100: capacity},
        pending=pending,
        **fields,  # type: ignore[arg-type]
    )
    fair = fair_share(snapshot)
    return {name: fair[name].get(H100, 0) for name in fair}


EXAMPLES = [
    pytest.param(
        [
            queue("a", priority=2, over_quota_weight=1),
            queue("b", priority=1, over_quota_weight=100),
        ],
        {"a": 10, "b": 10},
        10,
        {},
        {"a": 10, "b": 0},
        id="1-priority-before-weight",
    ),
    pytest.param(
        [queue("a", priority=2), queue("b", quota=4)],
        {"a": 10, "b": 10},
        10,
        {},
        {"a": 6, "b": 4},
        id="2-quota-before-priority",
    ),
    pytest.param(
        [queue("a", over_quota_weight=1), queue("b", over_quota_weight=2)],
        {"a": 20, "b": 20},
        12,
        {},
        {"a": 4, "b": 8},
        id="3-weights",
    ),
    pytest.param(
        [queue("a"), queue("b", limit=4), queue("c")],
        {"a": 2, "b": 20, "c": 20},
        12,
        {},
        {"a": 2, "b": 4, "c": 6},
        id="4-water-filling",
    ),
    pytest.param(
        [queue("a"), queue("b"), queue("c")],
        {"a": 10, "b": 10, "c": 10},
        10,
        {},
        {"a": 4, "b": 3, "c": 3},
        id="5-tie-by-name",
    ),
    pytest.param(
        [queue("a"), queue("b", over_quota_weight=2)],
        {"a": 10, "b": 10},
        10,
        {},
        {"a": 3, "b": 7},
        id="6-largest-remainder",
    ),
    pytest.param(
        [queue("a", quota=4), queue("b", quota=4)],
        {"a": 8, "b": 8},
        5,
        {},
        {"a": 3, "b": 2},
        id="7-overcommitted-quota",
    ),
    pytest.param(
        [queue("a", quota=3), queue("b", quota=5)],
        {"a": 10, "b": 10},
        None,
        {},
        {"a": 3, "b": 5},
        id="8-quota-only-mode",
    ),
    pytest.param(
        [
            queue("dept-x", quota=10),
            queue("x1", "dept-x", quota=4),
            queue("x2", "dept-x", quota=2, over_quota_weight=3),
            queue("dept-y", quota=6),
            queue("y1", "dept-y"),
        ],
        {"x1": 8, "x2": 10, "y1": 20},
        20,
        {},
        {"dept-x": 12, "dept-y": 8, "x1": 6, "x2": 6, "y1": 8},
        id="9-hierarchy",
    ),
    pytest.param(
        [queue("a"), queue("b")],
        {"a": 10, "b": 10},
        8,
        {"historical_usage": {"a": 3.0, "b": 1.0}, "usage_fairness_k": 1.0},
        {"a": 2, "b": 6},
        id="10-time-based",
    ),
    pytest.param(
        [queue("a", quota=3, over_quota_weight=0)],
        {"a": 5},
        7,
        {},
        {"a": 3},
        id="11-weight-zero",
    ),
]


@pytest.mark.parametrize(("specs", "demands", "capacity", "fields", "expected"), EXAMPLES)
def test_documented_example(
    specs: list[QueueSpec],
    demands: dict[str, int],
    capacity: int | None,
    fields: dict[str, object],
    expected: dict[str, int],
) -> None:
    assert shares(specs, demands, capacity, **fields) == expected


def test_every_example_is_in_the_document() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "fairness.md").read_text()
    for param in EXAMPLES:
        number = param.id.split("-")[0] if param.id else ""
        expected = ", ".join(f"{q}={v}" for q, v in param.values[4].items())  # type: ignore[union-attr]
        assert f"| {number} |" in text
        assert expected in text, f"example {number}: docs should show {expected}"


def test_history_without_k_changes_nothing() -> None:
    specs = [queue("a"), queue("b")]
    plain = shares(specs, {"a": 10, "b": 10}, 8)
    assert (
        shares(specs, {"a": 10, "b": 10}, 8, historical_usage={"a": 5.0})
        == plain
        == {
            "a": 4,
            "b": 4,
        }
    )


def test_usage_and_demand_roll_up_to_parents() -> None:
    specs = [queue("dept", quota=4), queue("t1", "dept", quota=2), queue("t2", "dept", quota=2)]
    snapshot = Snapshot(
        now=0.0,
        queues=queues_of(*specs),
        flavors={},
        admitted=(workload("ns/r", "t1", gpus=3, flavor="h100"),),
        pending=(workload("ns/p", "t2", gpus=2),),
    )
    fair = fair_share(snapshot)
    assert fair.usage["dept"] == {H100: 3}
    assert fair.demand["dept"] == {H100: 5}
    assert fair.demand["t2"] == {H100: 2}
    assert fair.amount == {H100: 4}


def test_pending_in_held_queue_adds_no_demand() -> None:
    specs = [queue("a", quota=4, stop_policy="Hold"), queue("b", quota=4)]
    snapshot = Snapshot(
        now=0.0,
        queues=queues_of(*specs),
        flavors={},
        pending=(workload("ns/a", "a", gpus=8), workload("ns/b", "b", gpus=8)),
    )
    fair = fair_share(snapshot)
    assert fair["a"].get(H100, 0) == 0
    assert fair["b"][H100] == 8


@pytest.mark.parametrize("capacity", [4, 5, 6, 7, 100])
def test_weight_zero_never_exceeds_quota_whatever_the_capacity(capacity: int) -> None:
    # Everything fits from capacity 5 on; a weight-0 queue still stops at its quota.
    specs = [queue("a", quota=3, over_quota_weight=0), queue("b", quota=1)]
    got = shares(specs, {"a": 5, "b": 2}, capacity)
    assert got["a"] == 3
    assert got["b"] == min(2, capacity - 3)
