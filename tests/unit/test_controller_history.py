"""The controller's history: what it records about Workloads and queues, keyed so that a replay
stores nothing twice, against a real SQLite history store (the admission loop runs against the
in-memory apiserver of `controller_fakes`)."""

from __future__ import annotations

import copy
import logging
import socket
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controllers.admission.loop import AdmissionLoop
from controllers.cli.controller import controller
from controllers.history import queries
from controllers.history import transitions as history
from controllers.history.engine import parse_database_url
from controllers.history.feed import HistoryFeed
from controllers.history.recorder import SpoolLockedError
from controllers.history.records import QueueSample, TransitionKind
from controllers.history.store import (
    HistorySettings,
    HistoryStore,
    default_spool_dir,
    open_recorder,
    queue_readings,
)
from controllers.history.usage import FairnessSettings
from controllers.runtime.events import EventRecorder
from controllers.runtime.resources import CLUSTER_QUEUE, LOCAL_QUEUE, RESOURCE_FLAVOR, WORKLOAD
from controllers.state import workloads as wls
from controllers.state.caches import Caches, Context
from quota.api.conditions import WorkloadConditions as WC
from quota.model.decisions import CycleResult
from tests.unit.controller_fakes import FakeKube

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def open_store(tmp_path: Path, **settings: Any) -> HistoryStore:
    store = HistoryStore(
        HistorySettings(
            url=parse_database_url(str(tmp_path / "history.db")),
            spool_dir=tmp_path / "spool",
            **settings,
        )
    )
    store.start()
    assert store.migrated.wait(30), "the SQLite schema was not created"
    return store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    s = open_store(tmp_path)
    yield s
    s.close()


def flush(store: HistoryStore) -> None:
    assert store.recorder is not None
    assert store.recorder.flush(10), "the recorder did not write its backlog"


def timeline(store: HistoryStore, name: str) -> list[tuple[str, int]]:
    return [
        (e.event, e.detail.get("sequence", -1))
        for e in queries.workload_timeline(store.engine, "ns", name)
    ]


def workload(name: str, cpu: int = 1, *, priority: int = 0, queue: str = "team") -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": wls.rfc3339(NOW),
            "generation": 1,
        },
        "spec": {
            "queueName": queue,
            "priority": priority,
            "podSets": [{"name": "main", "count": cpu, "requests": {"cpu": "1"}}],
        },
    }


def admission(cq: str = "cq", cpu: int = 2) -> dict[str, Any]:
    return wls.admission_status(cq, [("main", cpu, {"cpu": "pool"}, {"cpu": str(cpu)})])


# ------------------------------------------------------------------ records and their keys


def test_a_life_replayed_after_every_step_is_stored_once_per_attempt(
    store: HistoryStore,
) -> None:
    """A controller that restarts at any point reports what the status shows again; the store
    keeps one row per transition, and the second admission after a requeue is a row of its own."""
    assert store.recorder is not None
    wl = workload("w", 2)
    steps: list[Callable[[dict[str, Any], datetime], bool]] = [
        lambda w, t: wls.mark_admitted(w, admission(), "fits in quota of cq", t),
        lambda w, t: wls.mark_evicted(w, WC.EVICTED_BY_PREEMPTION, "to make room for ns/hi", t),
        wls.release_quota,
        lambda w, t: wls.mark_admitted(w, admission(), "fits again", t),
        lambda w, t: wls.mark_finished(w, WC.SUCCEEDED, "the Job completed", t),
    ]
    seen = [copy.deepcopy(wl)]
    for minute, step in enumerate(steps, start=1):
        assert step(wl, NOW + timedelta(minutes=minute))
        seen.append(copy.deepcopy(wl))
        for record in history.visible(wl):
            store.recorder.record(record)
    for snapshot in seen:  # a second controller replaying every state it might have found
        for record in history.visible(snapshot):
            store.recorder.record(record)
    flush(store)

    assert timeline(store, "w") == [
        ("created", 0),
        ("admitted", 0),
        ("preempted", 0),
        ("requeued", 1),
        ("admitted", 1),
        ("finished", 1),
    ]
    entries = queries.workload_timeline(store.engine, "ns", "w")
    first_admission = entries[1]
    assert first_admission.cluster_queue == "cq" and first_admission.local_queue == "team"
    assert first_admission.flavors == {"cpu": "pool"}
    assert first_admission.resources == {"cpu": 2000}  # millicores
    assert entries[2].reason == "Preempted: to make room for ns/hi"
    assert entries[-1].reason == "Succeeded: the Job completed"


def test_only_what_is_new_in_a_change_is_recorded_as_seen() -> None:
    at = NOW + timedelta(seconds=90, microseconds=250_000)
    wl = workload("w")
    [created] = history.new_transitions(None, wl, at=at, cluster_queue="cq")
    # Creation is timed by the object itself, whenever it is first seen.
    assert (created.kind, created.at, created.cluster_queue) == (TransitionKind.CREATED, NOW, "cq")

    waiting = copy.deepcopy(wl)
    wls.mark_pending(waiting, "Pending", "insufficient quota for cpu", NOW)
    assert history.milestones(wl) == history.milestones(waiting)
    assert history.new_transitions(wl, waiting, at=at) == []

    # The admission loop records admissions itself (with the decision's words): not here.
    running = copy.deepcopy(waiting)
    wls.mark_admitted(running, admission(), "fits", NOW)
    assert history.new_transitions(waiting, running, at=at) == []

    done = copy.deepcopy(running)
    wls.mark_finished(done, WC.SUCCEEDED, "the Job completed", NOW)
    [finished] = history.new_transitions(running, done, at=at)
    assert (finished.kind, finished.at) == (TransitionKind.FINISHED, at)
    assert finished.cluster_queue == "cq"

    replaced = copy.deepcopy(running)
    wls.mark_finished(replaced, WC.SLICE_REPLACED, "replaced by slice w-2", NOW)
    assert [t.kind for t in history.visible(replaced)][-1] == TransitionKind.SLICE_REPLACED


def test_a_preemption_is_keyed_by_the_admissions_it_ends() -> None:
    victim = workload("v")
    wls.mark_admitted(victim, admission(), "fits", NOW)
    first = history.preemption_sequence([victim])
    assert history.preemption_sequence([copy.deepcopy(victim)]) == first
    # Evicted, requeued and admitted again: preempting it again is another decision.
    wls.mark_evicted(victim, WC.EVICTED_BY_PREEMPTION, "x", NOW)
    wls.release_quota(victim, NOW)
    wls.mark_admitted(victim, admission(), "fits", NOW)
    assert history.preemption_sequence([victim]) != first


# --------------------------------------------------------------- the admission loop records


QueueManifests = list[tuple[str, dict[str, Any]]]


class Cluster:
    """The admission loop on an in-memory apiserver, recording into `store`."""

    def __init__(self, store: HistoryStore | None, queues: QueueManifests) -> None:
        self.kube = FakeKube()
        self.caches = Caches.create(self.kube)
        self.now = NOW
        self.ctx = Context(
            kube=self.kube,
            caches=self.caches,
            events=EventRecorder(None, "test"),
            identity="test",
            now=lambda: self.now,
            recorder=store,
        )
        self.loop = AdmissionLoop(
            self.ctx,
            use_node_capacity=False,
            usage=store.usage if store is not None else None,
            busy=store.busy if store is not None else None,
        )
        self.put(
            RESOURCE_FLAVOR,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "ResourceFlavor",
                "metadata": {"name": "pool"},
                "spec": {"nodeLabels": {"pool": "a"}},
            },
        )
        for name, spec in queues:
            self.put(
                CLUSTER_QUEUE,
                {
                    "apiVersion": "muster.dev/v1alpha1",
                    "kind": "ClusterQueue",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )

    def cycle(self) -> CycleResult:
        """One admission cycle, and the writes it queued (they run in the background)."""
        result = self.loop.cycle()
        assert self.loop.writer.wait_written(), "the cycle's writes did not finish"
        return result

    def put(self, kind: Any, obj: dict[str, Any]) -> dict[str, Any]:
        stored = self.kube.put(kind, obj)
        cache = {
            "Workload": self.caches.workloads,
            "ClusterQueue": self.caches.cluster_queues,
            "LocalQueue": self.caches.local_queues,
            "ResourceFlavor": self.caches.flavors,
        }[kind.name]
        cache.write_through(stored)
        return stored

    def local_queue(self, name: str, cq: str) -> None:
        self.put(
            LOCAL_QUEUE,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"clusterQueue": cq},
            },
        )

    def workload(self, name: str, cpu: int, *, priority: int = 0, queue: str = "team") -> None:
        self.put(WORKLOAD, workload(name, cpu, priority=priority, queue=queue))


def one_queue(**spec: Any) -> QueueManifests:
    return [("cq", {"flavors": [{"name": "pool", "quota": {"cpu": "4"}}], **spec})]


def test_a_preemption_is_recorded_with_preemptor_victims_and_reasons(
    store: HistoryStore,
) -> None:
    c = Cluster(store, one_queue(preemption={"withinQueue": "LowerPriority"}))
    c.local_queue("team", "cq")
    c.workload("low", 4, priority=1)
    c.cycle()
    c.now = NOW + timedelta(minutes=1)
    c.workload("high", 4, priority=100)
    c.cycle()
    flush(store)

    low = queries.workload_timeline(store.engine, "ns", "low")
    assert [(e.event, e.cluster_queue, e.actor) for e in low] == [
        ("admitted", "cq", ""),
        ("preempted", "cq", "ns/high"),
    ]
    assert low[1].reason.startswith("Preempted: preempted in queue cq to make room for ns/high")
    [decision] = queries.preemptions(store.engine, NOW - timedelta(hours=1))
    assert (decision.name, decision.cluster_queue, decision.strategy) == ("high", "cq", "preempt")
    assert [v["name"] for v in decision.victims] == ["low"]
    assert decision.victims[0]["priority"] == 1

    # A new leader replays what the cluster shows: nothing doubles, the preemptor stays named.
    assert store.recorder is not None
    for obj in c.caches.workloads.objects():
        for record in history.visible(obj, cluster_queue="cq"):
            store.recorder.record(record)
    c.cycle()  # the victim is still leaving: no second decision about it
    flush(store)
    low = queries.workload_timeline(store.engine, "ns", "low")
    assert [(e.event, e.actor) for e in low] == [
        ("created", ""),
        ("admitted", ""),
        ("preempted", "ns/high"),
    ]
    assert len(queries.preemptions(store.engine, NOW - timedelta(hours=1))) == 1


def test_queue_samples_carry_the_last_cycles_usage_and_fair_share(store: HistoryStore) -> None:
    c = Cluster(store, one_queue())
    c.local_queue("team", "cq")
    c.workload("a", 3)
    c.workload("b", 3)  # does not fit beside a: demand, not usage
    assert store.jobs is not None
    assert store.jobs.sample_now() == 0, "nothing to sample before the first cycle"
    c.cycle()
    # The controller's sampler: the leader's last cycle, as `muster controller` wires it.
    readings = queue_readings(c.loop.last_fair_share)
    assert [(r.cluster_queue, r.flavor, r.resource) for r in readings] == [("cq", "pool", "cpu")]
    assert (readings[0].usage, readings[0].demand) == (0.0, 6000.0)  # decided from the snapshot
    c.cycle()
    reading = queue_readings(c.loop.last_fair_share)[0]
    assert (reading.usage, reading.fair_share, reading.demand) == (3000.0, 4000.0, 6000.0)


def test_usage_fairness_moves_surplus_away_from_the_queue_that_used_it(tmp_path: Path) -> None:
    tree: QueueManifests = [
        ("org", {"flavors": [{"name": "pool", "quota": {"cpu": "8"}}]}),
        ("a", {"parent": "org", "flavors": [{"name": "pool", "quota": {"cpu": "0"}}]}),
        ("b", {"parent": "org", "flavors": [{"name": "pool", "quota": {"cpu": "0"}}]}),
    ]

    def shares(store: HistoryStore | None) -> tuple[int, int]:
        c = Cluster(store, tree)
        c.local_queue("la", "a")
        c.local_queue("lb", "b")
        c.workload("wa", 8, queue="la")
        c.workload("wb", 8, queue="lb")
        c.cycle()
        fair = c.loop.last_fair_share
        assert fair is not None
        return fair.shares["a"].get(("pool", "cpu"), 0), fair.shares["b"].get(("pool", "cpu"), 0)

    assert shares(None) == (4000, 4000)
    on = FairnessSettings(enabled=True, window=timedelta(days=7), half_life=timedelta(days=1))
    store = open_store(tmp_path, fairness=on)
    try:
        assert store.recorder is not None and store.usage is not None and store.jobs is not None
        # Queue a ran 8 cpu for the past day; b ran nothing.
        for hour in range(1, 25):
            store.recorder.record(
                QueueSample("a", "pool", "cpu", NOW - timedelta(hours=hour), 8000, 4000, 8000, 3600)
            )
        flush(store)
        store.usage.refresh(store.engine, NOW)
        a, b = shares(store)
        assert a < b and a + b == 8000, (a, b)
    finally:
        store.close()


# ------------------------------------------------------------------- the store as it runs


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_database_holds_nothing_up_and_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool"
    down = HistoryStore(
        HistorySettings(
            url=parse_database_url(f"postgresql://muster@127.0.0.1:{closed_port()}/history"),
            spool_dir=spool,
        )
    )
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        down.start()
        assert time.monotonic() - started < 1.0, "start waited on the database"
        wl = workload("w")
        wls.mark_admitted(wl, admission(), "fits", NOW)
        down.record_later(lambda: history.visible(wl))
        deadline = time.monotonic() + 20
        while (down.recorder is None or down.recorder.spooled < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        down.close(drain_timeout_s=0.5)
    assert down.recorder is not None and down.recorder.spooled == 2
    assert any("history store unavailable" in r.getMessage() for r in caplog.records)

    # The next start, with the database there, writes what was spooled.
    up = open_store(tmp_path)
    try:
        flush(up)
        assert timeline(up, "w") == [("created", 0), ("admitted", 0)]
    finally:
        up.close()


def test_replicas_on_one_host_take_separate_default_spools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    url = parse_database_url(str(tmp_path / "history.db"))
    store = HistoryStore(HistorySettings(url=url))
    first = open_recorder(store.engine, url, None)
    second = open_recorder(store.engine, url, None)
    try:
        assert first.spool_dir == default_spool_dir(url)
        assert second.spool_dir != first.spool_dir
        # A directory the operator chose is theirs to keep apart.
        with pytest.raises(SpoolLockedError, match="give each controller replica"):
            open_recorder(store.engine, url, first.spool_dir)
    finally:
        first.close()
        second.close()
        store.engine.dispose()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-history", "--usage-fairness"], "--usage-fairness needs the history store"),
        (["--usage-fairness-window", "a week"], "--usage-fairness-window: 'a week'"),
        (["--database-url", "mysql://db/history"], "scheme 'mysql' is not supported"),
    ],
)
def test_history_flags_are_checked_before_anything_starts(args: list[str], message: str) -> None:
    result = CliRunner().invoke(controller, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_the_feed_records_an_admission_nobody_else_recorded() -> None:
    # An admission write that timed out after the apiserver applied it is logged as failed by
    # the admission loop, which then records nothing; the leader's feed sees the Workload
    # admitted and records it (the store keeps the first record of a key).
    built: list[Any] = []

    class Collect:
        def record_later(self, make: Callable[[], Any]) -> None:
            built.extend(make())

    kube = FakeKube()
    ctx = Context(
        kube=kube,
        caches=Caches.create(kube),
        events=EventRecorder(None, "me"),
        identity="me",
        recorder=Collect(),
    )
    feed = HistoryFeed(ctx, lambda: True)
    feed.recording = True
    waiting = workload("w")
    running = copy.deepcopy(waiting)
    wls.mark_admitted(running, admission(), "fits", NOW)
    feed.on_workload("MODIFIED", waiting, running)
    assert [(t.kind, t.reason) for t in built] == [(TransitionKind.ADMITTED, "fits")]
