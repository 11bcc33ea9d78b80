"""The controller runtime: work queue, optimistic writes, the list+watch cache, leader
election and coalesced writes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from controllers.runtime import apply
from controllers.runtime.coalesce import CoalescingWriter
from controllers.runtime.informer import Informer, is_newer
from controllers.runtime.leader import LeaderElector
from controllers.runtime.resources import JOB, LEASE, WORKLOAD, Kind
from controllers.runtime.workqueue import WorkQueue
from tests.unit.controller_fakes import FakeKube, apply_json_patch, apply_merge_patch


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# ------------------------------------------------------------------ work queue


def test_workqueue_deduplicates_and_never_hands_one_key_to_two_workers() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    first = q.get(timeout=0)
    assert first == "a"
    q.add("a")  # changed while being processed
    assert q.get(timeout=0) == "b"
    assert q.get(timeout=0) is None, "a must not be handed out while it is processed"
    q.done("b")
    q.done("a")
    assert q.get(timeout=0) == "a", "a was added while processing, so it comes back once"
    q.done("a")
    assert q.get(timeout=0) is None


def test_workqueue_backs_off_per_key_and_forget_resets() -> None:
    clock = Clock()
    q: WorkQueue[str] = WorkQueue("t", base_delay=1.0, max_delay=5.0, clock=clock)
    assert [q.add_rate_limited("k") for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert q.add_rate_limited("other") == 1.0, "backoff is per key"
    q.forget("k")
    assert q.add_rate_limited("k") == 1.0


def test_workqueue_add_after_waits_and_the_earliest_request_wins() -> None:
    clock = Clock()
    q: WorkQueue[str] = WorkQueue("t", clock=clock)
    q.add_after("k", 10)
    q.add_after("k", 3)
    q.add_after("k", 7)
    assert q.get(timeout=0) is None
    clock.t += 3
    assert q.get(timeout=0) == "k"
    q.done("k")
    clock.t += 10
    assert q.get(timeout=0) is None, "superseded delayed requests do not fire again"


def test_workqueue_shutdown_releases_blocked_workers() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(q.get()))
    worker.start()
    time.sleep(0.05)
    q.shutdown()
    worker.join(2)
    assert got == [None]


# ------------------------------------------------------------- optimistic writes


def test_merge_patch_nulls_removed_keys_and_replaces_lists() -> None:
    old = {"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]}
    new = {"a": 1, "b": {"c": 5}, "l": [2], "e": "x"}
    patch = apply.merge_patch(old, new)
    assert patch == {"b": {"c": 5, "d": None}, "l": [2], "e": "x"}
    assert apply_merge_patch(old, patch) == new


def _job(name: str = "j") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"suspend": True}}


def test_update_rereads_on_conflict_and_reapplies_the_change_to_the_new_version() -> None:
    kube = FakeKube()
    stale = kube.put(JOB, _job())
    # Someone else writes a label after we read.
    kube.patch(JOB, "ns", "j", {"metadata": {"labels": {"team": "a"}}})
    written = apply.update(
        kube, JOB, "ns/j", lambda j: j["spec"].update(suspend=False) or True, current=stale
    )
    assert written is not None
    assert written["spec"]["suspend"] is False
    assert written["metadata"]["labels"] == {"team": "a"}, "the other writer's change survives"
    assert [w[0] for w in kube.writes] == ["patch", "patch"]


def _unsuspend(j: dict[str, Any]) -> bool:
    j["spec"]["suspend"] = False
    j["metadata"].setdefault("annotations", {})["muster.dev/original"] = "{}"
    return True


def test_a_spec_guarded_update_is_not_refused_for_another_writers_status() -> None:
    kube = FakeKube()
    stale = kube.put(JOB, _job())
    # The Job controller records the Suspended condition after we read.
    kube.patch(JOB, "ns", "j", {"status": {"conditions": [{"type": "Suspended"}]}}, status=True)
    written = apply.update(kube, JOB, "ns/j", _unsuspend, current=stale, spec_guarded=True)
    assert written is not None and written["spec"]["suspend"] is False
    assert written["status"]["conditions"] == [{"type": "Suspended"}]
    assert [w[0] for w in kube.writes] == ["patch/status", "patch"], "one write, no retry"
    # Without the guard the same stale read costs a refused write and a second one.
    kube.writes.clear()
    stale = kube.patch(JOB, "ns", "j", {"spec": {"suspend": True}})
    kube.patch(JOB, "ns", "j", {"status": {"active": 0}}, status=True)
    apply.update(kube, JOB, "ns/j", _unsuspend, current=stale)
    assert [w[0] for w in kube.writes] == ["patch", "patch/status", "patch"]
    assert kube.get(JOB, "ns", "j")["spec"]["suspend"] is False  # type: ignore[index]


def test_a_spec_guarded_update_recomputes_over_a_spec_changed_meanwhile() -> None:
    kube = FakeKube()
    stale = kube.put(JOB, _job())
    kube.patch(JOB, "ns", "j", {"spec": {"parallelism": 3}})
    seen: list[Any] = []

    def unsuspend(j: dict[str, Any]) -> bool:
        seen.append(j["spec"].get("parallelism"))
        return _unsuspend(j)

    written = apply.update(kube, JOB, "ns/j", unsuspend, current=stale, spec_guarded=True)
    assert written is not None
    assert seen == [None, 3], "the change was worked out again over the new spec"
    assert written["spec"] == {"suspend": False, "parallelism": 3}


def test_a_spec_guarded_update_keeps_annotations_another_writer_added() -> None:
    kube = FakeKube()
    stale = kube.put(JOB, _job())
    kube.patch(JOB, "ns", "j", {"metadata": {"annotations": {"team": "a"}}})
    written = apply.update(kube, JOB, "ns/j", _unsuspend, current=stale, spec_guarded=True)
    assert written is not None
    assert written["metadata"]["annotations"] == {"team": "a", "muster.dev/original": "{}"}
    # The map exists now: keys are written one by one, a key added meanwhile survives.
    stale = kube.patch(JOB, "ns", "j", {"spec": {"suspend": True}})
    kube.patch(JOB, "ns", "j", {"metadata": {"annotations": {"owner": "b"}}})
    kube.writes.clear()

    def relabel(j: dict[str, Any]) -> bool:
        del j["metadata"]["annotations"]["team"]
        j["metadata"]["annotations"]["x/y~z"] = "1"
        return True

    written = apply.update(kube, JOB, "ns/j", relabel, current=stale, spec_guarded=True)
    assert written is not None
    assert written["metadata"]["annotations"] == {
        "muster.dev/original": "{}",
        "owner": "b",
        "x/y~z": "1",
    }
    assert [w[0] for w in kube.writes] == ["patch"]


def test_spec_ops_fall_back_when_the_change_reaches_beyond_the_spec() -> None:
    old = {"metadata": {"uid": "u", "generation": 2, "finalizers": []}, "spec": {"a": 1}}
    assert apply.spec_ops(old, old) == []
    finalized = {**old, "metadata": {**old["metadata"], "finalizers": ["f"]}}
    assert apply.spec_ops(old, finalized) is None
    assert apply.spec_ops(old, {**old, "other": 1}) is None
    assert apply.spec_ops({"spec": {}}, {"spec": {"a": 1}}) is None, "no generation read"
    ops = apply.spec_ops(old, {**old, "spec": {"a": 2}})
    assert ops is not None and ops[:2] == [
        {"op": "test", "path": "/metadata/uid", "value": "u"},
        {"op": "test", "path": "/metadata/generation", "value": 2},
    ]


_keys = st.text(alphabet="ab/~", min_size=1, max_size=3)
_trees = st.recursive(
    st.none() | st.integers(-2, 2) | st.lists(st.integers(0, 2), max_size=2),
    lambda inner: st.dictionaries(_keys, inner, max_size=3),
    max_leaves=8,
)


@given(
    st.dictionaries(_keys, _trees, max_size=4),
    st.dictionaries(_keys, _trees, max_size=4),
    st.none() | st.dictionaries(_keys, st.text(max_size=2), max_size=3),
    st.none() | st.dictionaries(_keys, st.text(max_size=2), max_size=3),
)
def test_spec_ops_turn_the_old_object_into_the_new_one(
    old_spec: dict[str, Any],
    new_spec: dict[str, Any],
    old_notes: dict[str, str] | None,
    new_notes: dict[str, str] | None,
) -> None:
    def obj(spec: dict[str, Any], notes: dict[str, str] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"uid": "u", "generation": 1}
        if notes is not None:
            meta["annotations"] = notes
        return {"metadata": meta, "spec": spec}

    old, new = obj(old_spec, old_notes), obj(new_spec, new_notes)
    ops = apply.spec_ops(old, new)
    assert ops is not None
    result = apply_json_patch(old, ops)
    # An emptied map may stay as {}: the apiserver treats it as absent.
    for o in (result, new):
        if not o["metadata"].get("annotations"):
            o["metadata"].pop("annotations", None)
    assert result == new


def test_update_writes_nothing_when_the_mutation_says_so() -> None:
    kube = FakeKube()
    kube.put(JOB, _job())
    assert apply.update(kube, JOB, "ns/j", lambda j: False) is not None
    assert apply.update(kube, JOB, "ns/missing", lambda j: True) is None
    assert kube.writes == []


def test_update_gives_up_when_the_object_keeps_changing() -> None:
    kube = FakeKube()
    kube.put(JOB, _job())

    def meddle(verb: str, kind: Kind, name: str) -> None:
        kube.before_write = None
        kube.patch(JOB, "ns", "j", {"metadata": {"labels": {"n": str(time.monotonic())}}})
        kube.before_write = meddle

    kube.before_write = meddle
    with pytest.raises(apply.ConflictRetriesExhausted):
        apply.update(kube, JOB, "ns/j", lambda j: j["spec"].update(suspend=False) or True)


def test_create_is_idempotent_and_delete_respects_preconditions() -> None:
    kube = FakeKube()
    first, created = apply.create(kube, WORKLOAD, {"metadata": {"name": "w", "namespace": "ns"}})
    again, created_again = apply.create(
        kube, WORKLOAD, {"metadata": {"name": "w", "namespace": "ns"}}
    )
    assert created and not created_again
    assert again["metadata"]["uid"] == first["metadata"]["uid"]
    kube.patch(WORKLOAD, "ns", "w", {"spec": {"x": 1}})
    assert apply.delete(kube, WORKLOAD, first, unchanged=True) is False, "changed since read"
    assert kube.get(WORKLOAD, "ns", "w") is not None
    assert apply.delete(kube, WORKLOAD, first) is True


# ---------------------------------------------------------------- the cache


class ScriptedKube(FakeKube):
    """Lists from the store; watches replay scripted event batches, then raise."""

    def __init__(self) -> None:
        super().__init__()
        self.watches: list[list[dict[str, Any]] | ApiException] = []
        self.watched_from: list[str] = []
        self.done = threading.Event()

    def watch(self, kind: Kind, resource_version: str, **_: Any) -> tuple[Any, Iterator[Any]]:
        self.watched_from.append(resource_version)
        if not self.watches:
            self.done.set()
            time.sleep(0.05)
            raise ApiException(status=500, reason="script over")
        step = self.watches.pop(0)
        if isinstance(step, ApiException):
            raise step
        return None, iter(step)


def _obj(name: str, rv: int, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv), "labels": labels}
    }


def test_informer_lists_watches_and_relists_on_410_reporting_what_changed() -> None:
    kube = ScriptedKube()
    kube.put(JOB, _obj("a", 0))
    kube.put(JOB, _obj("gone", 0))
    seen: list[tuple[str, str]] = []
    informer = Informer(
        kube,
        JOB,
        indexes={"team": lambda o: [o["metadata"]["labels"].get("team", "")]},
    )
    informer.add_handler(
        lambda t, old, new: seen.append((t, (new or old or {})["metadata"]["name"]))
    )
    kube.watches = [
        [
            {"type": "ADDED", "object": _obj("b", 100, team="x")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}},
            {"type": "ERROR", "object": {"code": 410, "message": "too old"}},
        ],
    ]

    def relisted_state() -> None:
        # While the watch was down "gone" was deleted and "c" created.
        del kube.objects[("Job", "ns", "gone")]
        kube.put(JOB, _obj("c", 0))

    informer.relists = 0
    original_relist = informer._relist

    def relist() -> str:
        if informer.relists == 1:
            relisted_state()
        return original_relist()

    informer._relist = relist  # type: ignore[method-assign]
    informer.start()
    assert informer.wait_synced(2)
    assert kube.done.wait(3)
    informer.stop()
    assert ("ADDED", "b") in seen
    assert ("DELETED", "gone") in seen and ("ADDED", "c") in seen
    assert informer.relists == 2
    assert kube.watched_from[1] != "150", "after 410 the watch restarts from a fresh list"
    assert sorted(informer.list_keys()) == ["ns/a", "ns/c"], "b was only in the old watch"


def test_informer_keeps_the_newer_of_its_own_write_and_a_late_watch_event() -> None:
    informer = Informer(FakeKube(), JOB)
    informer._apply("ADDED", _obj("a", 5))
    informer.write_through(_obj("a", 9, state="written"))
    informer._apply("MODIFIED", _obj("a", 7, state="stale"))
    cached = informer.get("ns/a")
    assert cached is not None and cached["metadata"]["labels"] == {"state": "written"}
    assert is_newer("10", "9") and not is_newer("9", "10")


def test_a_late_answer_to_our_own_write_does_not_bring_a_deleted_object_back() -> None:
    informer = Informer(FakeKube(), JOB)
    live = _obj("a", 5)
    live["metadata"]["uid"] = "u1"
    informer._apply("ADDED", live)
    deleted = _obj("a", 8)
    deleted["metadata"]["uid"] = "u1"
    informer._apply("DELETED", deleted)
    # The response to a patch sent before the deletion, read after its DELETED event.
    late = _obj("a", 7, state="written")
    late["metadata"]["uid"] = "u1"
    informer.write_through(late)
    assert informer.get("ns/a") is None
    # A new object of the same name (another uid) is a new life, written through at once.
    reborn = _obj("a", 9, state="new")
    reborn["metadata"]["uid"] = "u2"
    informer.write_through(reborn)
    cached = informer.get("ns/a")
    assert cached is not None and cached["metadata"]["labels"] == {"state": "new"}
    # Without uids, versions decide: nothing at or before the deletion comes back.
    informer._apply("DELETED", _obj("b", 4))
    informer.write_through(_obj("b", 3))
    assert informer.get("ns/b") is None
    informer.write_through(_obj("b", 6))
    assert informer.get("ns/b") is not None


def test_a_create_refused_in_a_terminating_namespace_is_not_retried() -> None:
    from kubernetes.client.exceptions import ApiException

    from controllers.runtime.workers import namespace_terminating

    refused = ApiException(status=403, reason="Forbidden")
    refused.body = (
        '{"kind":"Status","reason":"Forbidden","details":{"causes":[{"type":'
        '"NamespaceTerminating","message":"namespace ns is being terminated"}]}}'
    )
    assert namespace_terminating(refused)
    other = ApiException(status=403, reason="Forbidden")
    other.body = '{"kind":"Status","reason":"Forbidden","message":"no RBAC"}'
    assert not namespace_terminating(other) and not namespace_terminating(ValueError())


# ----------------------------------------------------------- leader election


class WallClock:
    def __init__(self, mono: Clock) -> None:
        self.mono = mono

    def __call__(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=self.mono.t)


def _elector(kube: FakeKube, clock: Clock, identity: str) -> LeaderElector:
    return LeaderElector(
        kube,
        "ns",
        "lease",
        identity,
        lease_duration=15,
        renew_deadline=10,
        retry_period=2,
        clock=clock,
        wall_clock=WallClock(clock),
    )


def test_only_one_candidate_leads_and_a_standby_takes_over_after_expiry() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = _elector(kube, clock, "a"), _elector(kube, clock, "b")
    assert a.try_acquire_or_renew() is True
    a._set_leading(True)
    assert b.try_acquire_or_renew() is False
    # a stops renewing (crashed); b must wait a full lease duration from when it saw it.
    clock.t += 14
    assert b.try_acquire_or_renew() is False
    clock.t += 2
    assert b.try_acquire_or_renew() is True
    b._set_leading(True)
    lease = kube.get(LEASE, "ns", "lease")
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    # The old leader's own view has expired too: it no longer acts.
    assert a.is_leader() is False


def test_leader_stops_acting_when_renewals_fail_before_anyone_else_may_start() -> None:
    kube, clock = FakeKube(), Clock()
    a = _elector(kube, clock, "a")
    assert a.try_acquire_or_renew()
    a._set_leading(True)
    assert a.is_leader()
    clock.t += 9.9
    assert a.is_leader(), "still within the renew deadline"
    clock.t += 0.2
    assert not a.is_leader(), "past the renew deadline, well before the lease expires"


def test_a_slow_renewal_counts_from_when_it_was_sent() -> None:
    # The standby counts the lease from when it saw the renewal, which is no later than the
    # answer; counting the lead from the answer would let a slow renewal outlast the lease.
    kube, clock = FakeKube(), Clock()
    a = _elector(kube, clock, "a")
    assert a.try_acquire_or_renew()
    a._set_leading(True)
    assert a.leadership_left() == pytest.approx(10)
    kube.before_write = lambda *_: setattr(clock, "t", clock.t + 6)  # the answer takes 6 s
    assert a.try_acquire_or_renew()
    assert a.leadership_left() == pytest.approx(4)
    clock.t += 4
    assert a.leadership_left() == 0 and not a.is_leader()


def test_release_hands_over_at_once() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = _elector(kube, clock, "a"), _elector(kube, clock, "b")
    assert a.try_acquire_or_renew()
    a._set_leading(True)
    assert not b.try_acquire_or_renew()
    a.release()
    assert b.try_acquire_or_renew() is True


# ------------------------------------------------------------ coalesced writes


def test_coalescing_writer_writes_the_latest_state_at_most_once_per_interval() -> None:
    clock = Clock()
    written: list[tuple[str, int]] = []
    writer: CoalescingWriter[str] = CoalescingWriter(
        "t", lambda k, v: written.append((k, v)), interval=1.0, clock=clock
    )
    for value in range(100):
        writer.submit("q", value)
    assert writer.flush_due() == 1
    assert written == [("q", 99)]
    writer.submit("q", 100)
    assert writer.flush_due() == 0, "within the interval"
    clock.t += 1
    assert writer.flush_due() == 1
    assert written[-1] == ("q", 100)


def test_coalescing_writer_backs_off_while_a_key_stays_busy_and_not_once_it_is_quiet() -> None:
    clock = Clock()
    times: list[float] = []
    writer: CoalescingWriter[str] = CoalescingWriter(
        "t", lambda k, v: times.append(clock.t), interval=1.0, max_interval=8.0, clock=clock
    )
    # A burst: a new state every 0.5 s for 40 s.
    for step in range(81):
        clock.t = step * 0.5
        writer.submit("q", step)
        writer.flush_due()
    assert times == [0, 1, 3, 7, 15, 23, 31, 39]
    # The burst's last state is written at most max_interval after the last write.
    clock.t = 47
    assert writer.flush_due() == 1
    # Quiet for longer than twice the gap: the next change goes out at once, and the one
    # after it a second later, as for a key never written.
    clock.t = 100
    writer.submit("q", 1)
    assert writer.flush_due() == 1
    writer.submit("q", 2)
    clock.t = 100.5
    assert writer.flush_due() == 0
    clock.t = 101
    assert writer.flush_due() == 1
    # Other keys are not held back by a busy one.
    writer.submit("other", 1)
    assert writer.flush_due() == 1


def test_coalescing_writer_without_max_interval_keeps_the_base_interval() -> None:
    clock = Clock()
    times: list[float] = []
    writer: CoalescingWriter[str] = CoalescingWriter(
        "t", lambda k, v: times.append(clock.t), interval=1.0, clock=clock
    )
    for step in range(21):
        clock.t = step * 0.5
        writer.submit("q", step)
        writer.flush_due()
    assert times == [float(t) for t in range(11)]


def test_coalescing_writer_retries_a_failed_write() -> None:
    clock = Clock()
    attempts: list[int] = []

    def write(key: str, value: int) -> None:
        attempts.append(value)
        if len(attempts) == 1:
            raise RuntimeError("apiserver down")

    writer: CoalescingWriter[str] = CoalescingWriter("t", write, interval=1.0, clock=clock)
    writer.submit("q", 1)
    writer.flush_due()
    clock.t += 1
    writer.flush_due()
    assert attempts == [1, 1]
    assert writer.pending() == 0
