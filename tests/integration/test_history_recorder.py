"""The recorder: off the hot path, nothing lost in a database outage, every record stored once."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge
from sqlalchemy import Engine, select

from controllers.history.models import WorkloadTransitionRow
from controllers.history.recorder import HistoryRecorder, SpoolLockedError
from controllers.history.records import TransitionKind, WorkloadTransition
from tests.integration.conftest import Store, TcpProxy

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
KINDS = [TransitionKind.CREATED, TransitionKind.QUOTA_RESERVED, TransitionKind.ADMITTED]


def transitions(count: int, *, offset: int = 0) -> list[WorkloadTransition]:
    """`count` distinct transitions: three per workload, as the controller reports them."""
    out = []
    for i in range(offset, offset + count):
        wl = i // len(KINDS)
        out.append(
            WorkloadTransition(
                namespace="team-a",
                name=f"job-{wl}",
                uid=f"uid-{wl}",
                kind=KINDS[i % len(KINDS)],
                at=T0 + timedelta(milliseconds=i),
                local_queue="lq",
                cluster_queue="cq-a",
                flavors={"nvidia.com/gpu": "h100"},
                resources={"nvidia.com/gpu": 8, "cpu": 16_000},
                reason=f"step {i}",
            )
        )
    return out


def stored_keys(engine: Engine) -> list[tuple[str, str, int]]:
    t = WorkloadTransitionRow
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(t.uid, t.kind, t.sequence))]  # type: ignore[misc]


class Outage:
    """Takes the recorder's database away and brings it back, per engine."""

    def __init__(self, store: Store, proxy: TcpProxy | None) -> None:
        self.store = store
        self.proxy = proxy
        self._locker: sqlite3.Connection | None = None
        self.down = False
        if proxy is not None:
            self.engine = store.engine_at("127.0.0.1", proxy.port, connect_timeout_s=1.0)
        else:
            self.engine = store.engine

    def begin(self) -> None:
        self.down = True
        if self.proxy is not None:
            self.proxy.stop()
        else:
            # Another process holding the write lock: every write times out "database is locked".
            assert self.store.url.database is not None
            self._locker = sqlite3.connect(self.store.url.database, isolation_level=None)
            self._locker.execute("BEGIN EXCLUSIVE")

    def end(self) -> None:
        if not self.down:
            return
        self.down = False
        if self.proxy is not None:
            self.proxy.start()
        elif self._locker is not None:
            self._locker.execute("ROLLBACK")
            self._locker.close()
            self._locker = None


@pytest.fixture
def outage(migrated: Store, request: pytest.FixtureRequest) -> Iterator[Outage]:
    proxy = request.getfixturevalue("pg_proxy") if migrated.dialect == "postgresql" else None
    o = Outage(migrated, proxy)
    yield o
    o.end()
    if o.engine is not migrated.engine:
        o.engine.dispose()


def wait_until(what: str, predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting until {what}")


def backlog_gauge() -> tuple[Gauge, CollectorRegistry]:
    registry = CollectorRegistry()
    return Gauge("muster_history_backlog_records", "backlog", registry=registry), registry


# Small segments: the outage meets several of them, some drained, some not.
@pytest.mark.parametrize("segment_records", [10_000, 100], ids=["one-segment", "many-segments"])
def test_an_outage_in_the_middle_of_a_burst_loses_no_transition(
    outage: Outage, migrated: Store, tmp_path: Path, segment_records: int
) -> None:
    gauge, registry = backlog_gauge()
    burst = transitions(3000)
    spool = tmp_path / "spool"
    with HistoryRecorder(
        outage.engine,
        spool,
        segment_records=segment_records,
        batch_size=100,
        backlog_gauge=gauge,
        retry_initial_s=0.2,
        retry_max_s=0.5,
    ) as recorder:
        for record in burst[:1000]:
            recorder.record(record)
        outage.begin()
        for record in burst[1000:2000]:
            recorder.record(record)
        # The controller keeps going: records pile up on disk, and the metric shows them.
        wait_until("the recorder notices the outage", lambda: not recorder.database_up)
        for record in burst[2000:]:
            recorder.record(record)
        assert recorder.spooled >= 1000
        assert (registry.get_sample_value("muster_history_backlog_records") or 0) >= 1000
        assert list(spool.glob("segment-*.jsonl"))
        outage.end()

        assert recorder.flush(timeout_s=60), f"backlog stuck at {recorder.backlog}"
        assert recorder.database_up
        assert registry.get_sample_value("muster_history_backlog_records") == 0
    keys = stored_keys(migrated.engine)
    assert len(keys) == len(set(keys)) == 3000
    assert set(keys) == {(r.uid, r.kind.value, r.sequence) for r in burst}
    assert not list(spool.glob("segment-*.jsonl")), "replayed segments are removed"


def test_a_replayed_transition_is_stored_once(migrated: Store, tmp_path: Path) -> None:
    first = transitions(30)
    # The restarted controller reports the same steps again, with a newer timestamp and wording.
    again = [dataclasses.replace(r, at=r.at + timedelta(hours=1), reason="again") for r in first]
    with HistoryRecorder(migrated.engine, tmp_path / "spool") as recorder:
        for record in first:
            recorder.record(record)
        assert recorder.flush(30)
        for record in again + first:
            recorder.record(record)
        assert recorder.flush(30)
    assert migrated.count("workload_transitions") == 30
    t = WorkloadTransitionRow
    with migrated.engine.connect() as conn:
        reasons = set(conn.execute(select(t.reason)).scalars())
    assert "again" not in reasons, "the first report of a transition is the one kept"


def test_spooled_records_survive_a_recorder_restart_and_are_stored_once(
    outage: Outage, migrated: Store, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    records = transitions(600)
    outage.begin()
    first = HistoryRecorder(outage.engine, spool, retry_initial_s=0.2).start()
    for record in records:
        first.record(record)
    first.close(drain_timeout_s=0.5)  # the controller stops while the database is still down
    on_disk = sum(len(p.read_text().splitlines()) for p in spool.glob("segment-*.jsonl"))
    assert on_disk == 600
    assert migrated.count("workload_transitions") == 0
    outage.end()

    # The next run replays the spool, and its controller reports some of the same steps again.
    with HistoryRecorder(outage.engine, spool) as second:
        # Counted on start; the writer may have stored a batch already, so not the backlog.
        assert second.replayed == 600
        for record in records[:300]:
            second.record(record)
        assert second.flush(60)
    keys = stored_keys(migrated.engine)
    assert len(keys) == len(set(keys)) == 600
    assert not list(spool.glob("segment-*.jsonl"))


def test_a_malformed_record_is_set_aside_and_the_rest_are_written(
    migrated: Store, tmp_path: Path
) -> None:
    good = transitions(9)
    bad = transitions(1, offset=100)[0]
    # A value validation let through but the database cannot hold: past a BIGINT.
    object.__setattr__(bad, "sequence", 2**63)
    with HistoryRecorder(migrated.engine, tmp_path / "spool") as recorder:
        for record in [*good[:4], bad, *good[4:]]:
            recorder.record(record)
        assert recorder.flush(30)
        assert recorder.database_up
    assert migrated.count("workload_transitions") == 9
    rejected = (tmp_path / "spool" / "rejected.jsonl").read_text().splitlines()
    assert len(rejected) == 1
    assert json.loads(rejected[0])["uid"] == bad.uid


def test_one_spool_directory_serves_one_recorder(migrated: Store, tmp_path: Path) -> None:
    with (
        HistoryRecorder(migrated.engine, tmp_path / "spool"),
        pytest.raises(SpoolLockedError, match="in use by another recorder"),
    ):
        HistoryRecorder(migrated.engine, tmp_path / "spool").start()


def test_a_closed_recorder_refuses_records(migrated: Store, tmp_path: Path) -> None:
    recorder = HistoryRecorder(migrated.engine, tmp_path / "spool").start()
    recorder.close()
    with pytest.raises(RuntimeError, match="closed"):
        recorder.record(transitions(1)[0])


def test_busy_sections_hold_writes_back_until_they_end(migrated: Store, tmp_path: Path) -> None:
    records = transitions(300)
    with HistoryRecorder(migrated.engine, tmp_path / "spool", max_defer_s=30) as recorder:
        with recorder.busy():
            for record in records:
                recorder.record(record)
            time.sleep(0.5)
            # The admission loop is running: nothing competes with it for the interpreter.
            assert migrated.count("workload_transitions") == 0
            assert recorder.backlog == 300
        assert recorder.flush(30)
    assert migrated.count("workload_transitions") == 300


def test_a_loop_that_is_always_busy_still_gets_its_history_written(
    migrated: Store, tmp_path: Path
) -> None:
    with (
        HistoryRecorder(migrated.engine, tmp_path / "spool", max_defer_s=0.2) as recorder,
        recorder.busy(),
    ):
        for record in transitions(50):
            recorder.record(record)
        wait_until("the deferred records are written", lambda: recorder.backlog == 0)
    assert migrated.count("workload_transitions") == 50


def test_record_later_builds_records_before_it_returns(migrated: Store, tmp_path: Path) -> None:
    # Built on the caller's thread and on disk when record_later returns: a record that
    # waited in memory for the writer thread would be lost by a kill -9.
    built_on: list[str] = []

    def build() -> list[WorkloadTransition]:
        built_on.append(threading.current_thread().name)
        return transitions(20)

    def broken() -> list[WorkloadTransition]:
        raise KeyError("a bug in the caller's record builder")

    spool = tmp_path / "spool"
    with HistoryRecorder(migrated.engine, spool) as recorder, recorder.busy():
        recorder.record_later(build)
        assert built_on == [threading.current_thread().name]
        recorder.record_later(broken)
        recorder.record_later(lambda: transitions(10, offset=20))
        on_disk = sum(len(p.read_text().splitlines()) for p in spool.glob("segment-*.jsonl"))
        assert on_disk == recorder.backlog == 30
    # The broken builder is logged and counted; the records queued after it still arrive.
    assert migrated.count("workload_transitions") == 30
