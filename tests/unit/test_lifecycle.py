"""The rules of a workload's life (quota.lifecycle), and the controller and the simulator
following them alike through the same eviction story."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from controllers.state import workloads as wls
from quota.api.conditions import WorkloadConditions as WC
from quota.lifecycle.backoff import DEFAULT_BACKOFF, REQUEUE_BASE_S, REQUEUE_MAX_S, Backoff
from quota.lifecycle.eviction import eviction_reason, recorded_as, requeue_after_eviction
from quota.lifecycle.slices import (
    pods_after_scale_down,
    slice_replaced_message,
    superseded_slice,
)
from quota.simulation.scenario import parse_scenario
from quota.simulation.simulator import simulate

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"

# ----------------------------------------------------------------------------- backoff


def test_the_controller_defaults_are_one_second_doubling_up_to_ten_minutes() -> None:
    defaults = (DEFAULT_BACKOFF.base_s, DEFAULT_BACKOFF.max_s)
    assert defaults == (REQUEUE_BASE_S, REQUEUE_MAX_S) == (1.0, 600.0)
    assert [DEFAULT_BACKOFF.delay(n) for n in range(1, 12)] == [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 600.0,
    ]  # fmt: skip


def test_a_workload_never_requeued_waits_for_nothing() -> None:
    assert Backoff().delay(0) == 0.0
    assert Backoff(5.0, 60.0).delay(0) == 0.0


def test_the_first_eviction_waits_the_base() -> None:
    assert Backoff().delay(1) == 1.0
    assert Backoff(5.0, 60.0).delay(1) == 5.0


def test_the_backoff_stops_at_its_cap_however_often_a_workload_is_evicted() -> None:
    backoff = Backoff(5.0, 60.0)
    assert [backoff.delay(n) for n in (3, 4, 5, 6)] == [20.0, 40.0, 60.0, 60.0]
    # A count far past where 2^(n-1) would overflow a float still gives the cap.
    assert backoff.delay(5000) == 60.0
    assert Backoff().delay(10**6) == 600.0


def test_a_cap_below_the_base_wins() -> None:
    assert Backoff(10.0, 4.0).delay(1) == 4.0


def test_a_negative_requeue_count_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Backoff().delay(-1)


# ---------------------------------------------------------------------------- eviction


def test_the_first_eviction_requeues_once_after_the_base_backoff() -> None:
    requeue = requeue_after_eviction(0, reason=WC.EVICTED_BY_PREEMPTION)
    assert (requeue.count, requeue.delay_s) == (1, 1.0)
    assert requeue.pending_reason == "Pending"
    assert requeue.requeued_reason == "Preempted"
    assert requeue.requeued_message == (
        "queued again; competes for quota after 1s backoff (requeue #1)"
    )


def test_an_eviction_without_words_still_says_what_happened() -> None:
    requeue = requeue_after_eviction(0)
    assert requeue.requeued_reason == "Evicted"


def test_each_eviction_counts_one_more_requeue_and_waits_longer_up_to_the_cap() -> None:
    backoff = Backoff(5.0, 60.0)
    seen = [requeue_after_eviction(n, backoff=backoff) for n in (1, 4, 11)]
    assert [(r.count, r.delay_s) for r in seen] == [(2, 10.0), (5, 60.0), (12, 60.0)]
    assert seen[-1].requeued_message.endswith("after 60s backoff (requeue #12)")


def test_each_eviction_gives_its_reason_and_is_recorded_as_what_it_was() -> None:
    reasons = {kind: eviction_reason(kind) for kind in ("Preempted", "Reclaimed", "Moved", None)}
    assert reasons == {
        "Preempted": "Preempted",
        "Reclaimed": "Reclaimed",
        "Moved": "Moved",
        None: "ClusterQueueStopped",  # drained by the queue's stopPolicy
    }
    recorded = [recorded_as(reason) for reason in reasons.values()]
    assert recorded == ["preempted", "reclaimed", "evicted", "evicted"]
    # A move is not paced: the room it goes to is held for it now.
    assert requeue_after_eviction(2, reason=reasons["Moved"]).delay_s == 0
    assert requeue_after_eviction(2, reason=reasons["Preempted"]).delay_s > 0


def test_a_requeued_workload_competes_after_its_backoff_on_either_clock() -> None:
    requeue = requeue_after_eviction(2)  # the third: 4s
    assert requeue.competes_at(100.0) == 104.0
    assert requeue.competes_at(NOW) == NOW + timedelta(seconds=4)


# ------------------------------------------------------------------------------ slices


def test_a_scale_up_slice_supersedes_the_admitted_slice_it_names() -> None:
    admitted = {"ns/train", "ns/train-slice-2"}
    assert superseded_slice("ns/train-slice-2", "ns/train", admitted) == "ns/train"
    assert superseded_slice("ns/train", None, admitted) is None
    # Gone already (retired, or never admitted), or naming itself: nothing to retire.
    assert superseded_slice("ns/train-slice-3", "ns/train-slice-9", admitted) is None
    assert superseded_slice("ns/train", "ns/train", admitted) is None


def test_a_replaced_slice_names_its_successor() -> None:
    assert slice_replaced_message("train-slice-2") == (
        "replaced by slice train-slice-2 after scale-up; its pods continue under the new slice"
    )


def test_a_scale_down_shrinks_in_place_and_never_grows_an_admission() -> None:
    assert pods_after_scale_down(8, 3) == 3
    assert pods_after_scale_down(3, 8) == 3
    assert pods_after_scale_down(4, 4) == 4
    assert pods_after_scale_down(4, 0) == 0


# --------------------------------------------- one eviction story, controller and simulator

EVICTIONS = 12  # enough to reach the ten-minute cap
GAP_S = 1000  # between evictions: longer than any backoff, so the victim runs again first


def controller_story(evictions: int) -> list[tuple[int, float, str]]:
    """A Workload evicted `evictions` times through the controller's status writes: per
    eviction, (requeue count, backoff in seconds, the Requeued condition's message)."""
    wl: dict[str, Any] = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "batch", "namespace": "a", "generation": 1},
        "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 1}]},
    }
    admission = wls.admission_status("a", [("main", 1, {GPU: "gpu"}, {GPU: "8"})])
    out: list[tuple[int, float, str]] = []
    for k in range(1, evictions + 1):
        now = NOW + timedelta(seconds=k * GAP_S)
        assert wls.mark_admitted(
            wl, dict(admission), "fits in quota of a", now - timedelta(seconds=1)
        )
        assert wls.mark_evicted(wl, WC.EVICTED_BY_PREEMPTION, "to make room for a/urgent", now)
        assert wls.release_quota(wl, now)
        state = wl["status"]["requeueState"]
        at = wls.parse_time(state["requeueAt"])
        assert at is not None
        message = (wls.condition(wl, wls.REQUEUED) or {}).get("message", "")
        out.append((state["count"], (at - now).total_seconds(), message))
    return out


def simulator_story(evictions: int) -> list[tuple[int, float, str]]:
    """The same: a low-priority Job preempted `evictions` times, each by a short urgent Job,
    with the controller's backoff settings; per eviction, (requeue count, backoff, the
    message of its requeue)."""
    docs = [
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ResourceFlavor",
            "metadata": {"name": "gpu"},
            "spec": {"nodeLabels": {"pool": "gpu"}},
        },
        {
            "apiVersion": "simulate.muster.dev/v1alpha1",
            "kind": "NodePool",
            "metadata": {"name": "gpu"},
            "spec": {"count": 1, "labels": {"pool": "gpu"}, "allocatable": {GPU: 8}},
        },
        *(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
            for name, value in (("high", 1000), ("low", 1))
        ),
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ClusterQueue",
            "metadata": {"name": "a"},
            "spec": {
                "preemption": {"withinQueue": "LowerPriority", "reclaim": "Never"},
                "flavors": [{"name": "gpu", "quota": {GPU: 8}}],
            },
        },
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "LocalQueue",
            "metadata": {"name": "q", "namespace": "a"},
            "spec": {"clusterQueue": "a"},
        },
        {
            "apiVersion": "simulate.muster.dev/v1alpha1",
            "kind": "Simulation",
            "metadata": {"name": "story"},
            "spec": {"requeueBase": "1s", "requeueMax": "10m"},
        },
        _job("batch", "low", at=0, run=10 * GAP_S * evictions),
        *(_job(f"urgent-{k}", "high", at=k * GAP_S, run=1) for k in range(1, evictions + 1)),
    ]
    result = simulate(parse_scenario(list(yaml.safe_load_all(yaml.safe_dump_all(docs)))))
    [batch] = [j for j in result.jobs if j.key == "a/batch"]
    assert batch.evictions == evictions
    mine = [t for t in result.transitions if t.job == "a/batch"]
    evicted = [t.at for t in mine if t.kind == "preempted"]
    requeued = [t for t in mine if t.kind == "requeued"]
    assert len(evicted) == len(requeued) == evictions
    return [(r.sequence + 1, r.at - at, r.reason) for at, r in zip(evicted, requeued, strict=True)]


def _job(name: str, priority: str, *, at: int, run: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "a",
            "labels": {"muster.dev/queue-name": "q"},
            "annotations": {"muster.dev/submit-at": f"{at}s", "muster.dev/run-for": f"{run}s"},
        },
        "spec": {
            "parallelism": 1,
            "template": {
                "spec": {
                    "priorityClassName": priority,
                    "containers": [{"name": "c", "resources": {"requests": {GPU: 8}}}],
                }
            },
        },
    }


def test_the_controller_and_the_simulator_requeue_an_evicted_workload_alike() -> None:
    controller = controller_story(EVICTIONS)
    assert controller == simulator_story(EVICTIONS)
    assert [count for count, _, _ in controller] == list(range(1, EVICTIONS + 1))
    assert [delay for _, delay, _ in controller] == [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600,
    ]  # fmt: skip


def test_both_sides_take_the_backoff_from_the_shared_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A side that computes its own backoff again would not follow this change."""

    def odd_rule(self: Backoff, requeues: int) -> float:
        return 7.0 + 3 * requeues

    monkeypatch.setattr(Backoff, "delay", odd_rule)
    controller = controller_story(4)
    assert [(count, delay) for count, delay, _ in controller] == [
        (1, 10.0), (2, 13.0), (3, 16.0), (4, 19.0),
    ]  # fmt: skip
    assert simulator_story(4) == controller
