"""The admission cycle never waits on the apiserver: decisions are assumed and written in the
background. A write in flight counts at once (nothing is admitted into room it takes, nothing
is decided twice); a write that failed for certain is rolled back and decided again; one
whose outcome is unknown keeps its room until the watch shows the Workload."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from urllib3.exceptions import ReadTimeoutError

from controllers.runtime.resources import WORKLOAD, Kind
from controllers.state import workloads as wls
from tests.unit.controller_fakes import _error
from tests.unit.test_controller_admission import Harness


def held_writes(h: Harness) -> tuple[threading.Event, threading.Event]:
    """Make Workload status writes wait until released; (started, release)."""
    started, release = threading.Event(), threading.Event()
    original = h.kube.patch

    def patch(kind: Kind, *args: Any, **kwargs: Any) -> Any:
        if kind.name == "Workload":
            started.set()
            assert release.wait(10)
        return original(kind, *args, **kwargs)

    h.kube.patch = patch  # type: ignore[method-assign]
    return started, release


def test_a_cycle_returns_before_its_admission_is_written_and_the_next_counts_it() -> None:
    h = Harness(cpu_quota="4", limit="4")
    h.workload("first", 3, created=1)
    started, release = held_writes(h)
    assert [a.workload for a in h.loop.cycle().admit] == ["ns/first"]
    assert started.wait(5), "the write runs in the background"
    assert not wls.has_quota(h.get("first")), "not written yet: the cycle did not wait"

    # Meanwhile another 3-cpu workload arrives: the assumed admission holds the room.
    h.workload("second", 3, created=2)
    result = h.loop.cycle()
    assert result.admit == ()
    assert "ns/first" not in {p.workload for p in result.pending}, "not decided twice"
    release.set()
    assert h.loop.writer.wait_written()
    assert wls.has_quota(h.get("first")) and not wls.has_quota(h.get("second"))
    assert h.cycle().admit == (), "4 cpu: the second still does not fit"


def test_a_refused_write_rolls_the_assumption_back_and_the_next_cycle_decides_again() -> None:
    h = Harness(cpu_quota="4", limit="4")
    h.workload("first", 3, created=1)
    refusals = [1]

    def refuse_once(verb: str, kind: Kind, name: str) -> None:
        if kind.name == "Workload" and verb == "patch" and refusals:
            refusals.pop()
            raise _error(422, "Invalid")

    h.kube.before_write = refuse_once
    assert [a.workload for a in h.cycle().admit] == ["ns/first"]
    assert not wls.has_quota(h.get("first"))
    assert len(h.loop.writer.assumed) == 0, "rolled back"
    assert [a.workload for a in h.cycle().admit] == ["ns/first"], "decided again"
    assert wls.has_quota(h.get("first"))


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "lost"])
def test_a_write_of_unknown_outcome_keeps_its_room_until_the_cache_tells(applied: bool) -> None:
    h = Harness(cpu_quota="4", limit="4")
    h.workload("first", 3, created=1)
    original = h.kube.patch
    timeouts = [1]

    def patch(*args: Any, **kwargs: Any) -> Any:
        if timeouts:
            timeouts.pop()
            if applied:
                original(*args, **kwargs)  # applied, but the answer never came back
            raise ReadTimeoutError(None, "/", "read timed out")  # type: ignore[arg-type]
        return original(*args, **kwargs)

    h.kube.patch = patch  # type: ignore[method-assign]
    h.cycle()
    assert len(h.loop.writer.assumed) == 1, "kept: the write may have been applied"
    h.workload("second", 3, created=2)
    assert h.cycle().admit == (), "the room stays taken while the outcome is unknown"

    # The watch brings the Workload as it is now.
    current = h.get("first")
    if applied:
        h.caches.workloads.write_through(current)
        assert h.cycle().admit == ()
        assert wls.has_quota(h.get("first")) and not wls.has_quota(h.get("second"))
    else:
        h.loop.writer.assumed.max_age_s = 0.0  # nothing came: the write did not happen
        admitted = {a.workload for a in h.cycle().admit}
        assert len(admitted) == 1, "decided again, once"
    h.cycle()  # a view of the cache as it is now ends what was assumed
    assert len(h.loop.writer.assumed) == 0
    assert sum(wls.has_quota(h.get(name)) for name in ("first", "second")) == 1


def test_a_cycle_that_fails_while_carrying_out_its_decisions_leaves_them_to_the_next() -> None:
    h = Harness(cpu_quota="4", limit="4")
    h.workload("first", 1, created=1)
    h.workload("second", 1, created=2)
    discard = h.loop.writer.pending_writer.discard
    failures = [RuntimeError("dictionary changed size during iteration")]

    def fail_once(key: str) -> None:
        # Called while the second admission is being planned: its Workload is claimed and
        # its change computed, but its write is not queued yet.
        if key == "ns/second" and failures:
            raise failures.pop()
        discard(key)

    h.loop.writer.pending_writer.discard = fail_once  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        h.loop.cycle()
    assert h.loop.writer.wait_written()
    assert wls.has_quota(h.get("first")), "what was queued before the failure is written"
    assert not wls.has_quota(h.get("second"))

    assert [a.workload for a in h.cycle().admit] == ["ns/second"], "the next cycle decides it"
    assert wls.has_quota(h.get("second"))


def test_an_admission_being_written_keeps_its_room_when_someone_else_moves_the_workload_on() -> (
    None
):
    """Someone else's write (a pending status, a label) lands between the cycle that admitted
    a Workload and the write of that admission: the write retries on the newer version and
    lands all the same, so its room must keep counting meanwhile (the chaos run's queue over
    its limit)."""
    h = Harness(cpu_quota="4", limit="4")
    h.workload("first", 3, created=1)
    original = h.kube.patch
    started, release = held_writes(h)
    assert [a.workload for a in h.loop.cycle().admit] == ["ns/first"]
    assert started.wait(5)
    moved = original(WORKLOAD, "ns", "first", {"metadata": {"labels": {"seen-by": "someone"}}})
    h.cache(WORKLOAD).write_through(moved)

    h.workload("second", 3, created=2)
    assert h.loop.cycle().admit == (), "the admission under way still holds its 3 cpu"
    release.set()
    assert h.loop.writer.wait_written()
    assert wls.has_quota(h.get("first")) and not wls.has_quota(h.get("second"))
    h.cycle()  # the written version in the cache ends the assumption
    assert len(h.loop.writer.assumed) == 0


def test_an_admission_landing_as_assumed_needs_no_cycle_and_any_other_change_does() -> None:
    h = Harness(cpu_quota="4", limit="4")
    h.workload("first", 3, created=1)
    assert not h.loop.lands_as_assumed("ns/first", h.get("first")), "nothing assumed yet"
    assert [a.workload for a in h.cycle().admit] == ["ns/first"]
    landed = h.get("first")
    assert wls.has_quota(landed)
    assert h.loop.lands_as_assumed("ns/first", landed), "the write landed as the cycle assumed"

    # Anything a decision reads that the assumption did not say brings a cycle.
    evicted = copy.deepcopy(landed)
    evicted["status"]["conditions"].append(
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by hand"}
    )
    assert not h.loop.lands_as_assumed("ns/first", evicted)
    respecified = copy.deepcopy(landed)
    respecified["metadata"]["generation"] = 7
    assert not h.loop.lands_as_assumed("ns/first", respecified)
    # The next cycle ends the assumption: later changes are nobody's write landing.
    h.cycle()
    assert not h.loop.lands_as_assumed("ns/first", landed)


def test_room_on_nodes_matters_only_while_a_workload_waits_for_it() -> None:
    h = Harness(cpu_quota="4", limit="4")
    assert h.loop.room_matters(), "before the first cycle nothing is known"
    h.workload("first", 3, created=1)
    h.workload("second", 3, created=2)
    h.cycle()
    assert h.loop.room_matters(), "the second waits: a pod that frees room may admit it"
    h.kube.delete(WORKLOAD, "ns", "first")
    h.caches.workloads.forget("ns/first")
    assert [a.workload for a in h.cycle().admit] == ["ns/second"]
    assert not h.loop.room_matters(), "everything admitted: a pod moving decides nothing"
    h.workload("third", 3, created=3)
    h.cycle()
    assert h.loop.room_matters()
