"""Which running pods go when single-pod preemption shrank an admission
(`controllers.jobs.preempted.excess`): the named ones first, then unbound, then newest."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controllers.jobs.preempted import excess


def pod(name: str, made: int, node: str = "n1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": f"2026-11-28T09:00:{made:02d}Z"},
        "spec": {"nodeName": node} if node else {},
    }


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def test_the_pods_preemption_named_go_first_whatever_their_age() -> None:
    running = [pod("a", 1), pod("b", 2), pod("c", 3), pod("d", 4)]
    assert sorted(names(excess(running, 2, {"a", "b"}))) == ["a", "b"]


def test_unnamed_excess_takes_unbound_pods_then_the_newest() -> None:
    running = [pod("old", 1), pod("unbound", 2, node=""), pod("new", 3), pod("mid", 2)]
    assert names(excess(running, 2, set())) == ["unbound", "new"]


def test_nothing_goes_within_the_admission() -> None:
    running = [pod("a", 1), pod("b", 2)]
    assert excess(running, 2, {"a"}) == []
    assert excess([], 0, set()) == []


@given(ages=st.lists(st.integers(0, 59), max_size=8), allowed=st.integers(0, 8))
def test_exactly_the_pods_past_the_admission_go(ages: list[int], allowed: int) -> None:
    running = [pod(f"p{i}", age) for i, age in enumerate(ages)]
    gone = excess(running, allowed, set())
    assert len(gone) == max(0, len(running) - allowed)
    kept = [p for p in running if p not in gone]
    # Never an older pod before a newer one.
    assert all(
        p["metadata"]["creationTimestamp"] >= q["metadata"]["creationTimestamp"]
        for p in gone
        for q in kept
    )
