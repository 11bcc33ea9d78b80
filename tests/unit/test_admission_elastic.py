"""Elastic workload slices: scale-up charged for its extra pods only, on sticky flavors."""

from __future__ import annotations

from quota.admission.cycle import admission_cycle
from quota.fairness.fairshare import fair_share
from quota.model.snapshot import (
    Assignment,
    FlavorQuota,
    PodSet,
    QueueSpec,
    Snapshot,
    Workload,
)
from tests.unit.strategies import GPU, workload

QUEUE = QueueSpec("a", flavors=(FlavorQuota("h100", {GPU: 8}), FlavorQuota("a100", {GPU: 8})))


def running(count: int, flavor: str = "a100") -> Workload:
    return Workload(
        "ns/job-s1",
        "a",
        0,
        0.0,
        (PodSet("workers", count, {GPU: 1}),),
        admission=(Assignment("workers", count, {GPU: flavor}),),
        admitted_at=0.0,
    )


def slice_of(count: int, key: str = "ns/job-s2") -> Workload:
    return Workload(key, "a", 0, 1.0, (PodSet("workers", count, {GPU: 1}),), replaces="ns/job-s1")


def snapshot(admitted: list[Workload], pending: list[Workload]) -> Snapshot:
    return Snapshot(
        now=100.0,
        queues={"a": QUEUE},
        flavors={},
        capacity={("h100", GPU): 8, ("a100", GPU): 8},
        admitted=tuple(admitted),
        pending=tuple(pending),
    )


def test_scale_up_is_charged_only_its_extra_pods_on_the_running_flavor() -> None:
    # 4 pods run on a100; the slice grows to 6. Only 2 more a100 GPUs are needed, and another
    # workload can still take the last 2: the old slice is not counted twice.
    other = workload("ns/other", "a", gpus=1, count=2, arrival=5)
    result = admission_cycle(
        snapshot(
            [running(4), workload("ns/fill", "a", gpus=8, flavor="h100")], [slice_of(6), other]
        )
    )
    admits = {a.workload: a for a in result.admit}
    assert admits["ns/job-s2"].assignments == (Assignment("workers", 6, {GPU: "a100"}),)
    assert "2 more pods charged" in admits["ns/job-s2"].reason
    assert admits["ns/other"].assignments[0].flavors == {GPU: "a100"}


def test_scale_up_waits_when_the_running_flavor_is_full_even_if_another_has_room() -> None:
    full = workload("ns/fill", "a", gpus=3, flavor="a100")
    result = admission_cycle(snapshot([running(4), full], [slice_of(6)]))
    assert result.admit == ()
    (pending,) = result.pending
    assert pending.reason == (
        "insufficient quota for nvidia.com/gpu in flavor a100: requested 2, available 1, "
        "fair share 8"
    )


def test_scale_down_frees_quota_at_once() -> None:
    waiting = workload("ns/waiting", "a", gpus=1, count=3, arrival=5)
    fill = workload("ns/fill", "a", gpus=8, flavor="h100")
    result = admission_cycle(snapshot([running(8), fill], [slice_of(5), waiting]))
    admits = {a.workload: a for a in result.admit}
    assert admits["ns/job-s2"].assignments == (Assignment("workers", 5, {GPU: "a100"}),)
    assert admits["ns/waiting"].assignments[0].flavors == {GPU: "a100"}


def test_admitted_successor_and_old_slice_count_once() -> None:
    successor = Workload(
        "ns/job-s2",
        "a",
        0,
        1.0,
        (PodSet("workers", 6, {GPU: 1}),),
        admission=(Assignment("workers", 6, {GPU: "a100"}),),
        admitted_at=50.0,
        replaces="ns/job-s1",
    )
    snap = snapshot([running(4), successor], [workload("ns/two", "a", gpus=2, flavor=None)])
    assert fair_share(snap).usage["a"] == {("a100", GPU): 6}
    result = admission_cycle(snap)
    assert [a.workload for a in result.admit] == ["ns/two"]


def test_scale_up_demand_is_the_delta_on_sticky_flavors() -> None:
    fair = fair_share(snapshot([running(4)], [slice_of(6)]))
    assert fair.demand["a"] == {("a100", GPU): 6}
