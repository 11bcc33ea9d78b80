"""Periodic jobs: retention of raw events, downsampling of queue samples, the APScheduler loop."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from controllers.history.jobs import (
    HistoryJobs,
    QueueReading,
    RetentionSettings,
    apply_retention,
    downsample_samples,
)
from controllers.history.models import QueueSampleRow
from controllers.history.recorder import HistoryRecorder
from controllers.history.records import (
    PlacementDecision,
    PreemptionDecision,
    QueueSample,
    Record,
    TransitionKind,
    Victim,
    WorkloadTransition,
)
from controllers.history.rows import write_records
from controllers.history.usage import FairnessSettings, UsageFigures, decayed_usage_by_queue
from tests.integration.conftest import Store

NOW = datetime(2026, 3, 9, 12, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"


def events_aged(days: float, tag: str) -> list[Record]:
    at = NOW - timedelta(days=days)
    return [
        WorkloadTransition(
            namespace="ns", name=tag, uid=f"uid-{tag}", kind=TransitionKind.ADMITTED, at=at
        ),
        PlacementDecision(
            namespace="ns",
            name=tag,
            uid=f"uid-{tag}",
            pod_group="pg",
            at=at,
            assignments={"node-1": 1},
        ),
        PreemptionDecision(
            namespace="ns", name=tag, uid=f"uid-{tag}", at=at, victims=(Victim("ns", "v", "uv"),)
        ),
    ]


def minute_samples(start: datetime, minutes: int, queue: str = "cq-a") -> list[QueueSample]:
    """One raw sample a minute; usage and fair share vary so averages are not trivial."""
    return [
        QueueSample(
            cluster_queue=queue,
            flavor="h100",
            resource=GPU,
            at=start + timedelta(minutes=i),
            usage=float(i % 7),
            fair_share=float(4 + i % 3),
            demand=float(10 + i % 5),
            resolution_s=60,
        )
        for i in range(minutes)
    ]


def write(store: Store, records: list[Record] | list[QueueSample]) -> None:
    with store.engine.begin() as conn:
        write_records(conn, records)


def integral(store: Store, queue: str = "cq-a") -> float:
    s = QueueSampleRow
    with store.engine.connect() as conn:
        return float(
            conn.execute(
                select(func.sum(s.usage * s.resolution_s)).where(s.cluster_queue == queue)
            ).scalar_one()
        )


def sample_counts(store: Store) -> dict[bool, int]:
    s = QueueSampleRow
    with store.engine.connect() as conn:
        return dict(conn.execute(select(s.downsampled, func.count()).group_by(s.downsampled)).all())


def test_retention_deletes_raw_events_past_their_days_and_keeps_the_rest(migrated: Store) -> None:
    write(migrated, events_aged(31, "old") + events_aged(29, "recent"))
    report = apply_retention(migrated.engine, RetentionSettings(events=timedelta(days=30)), NOW)
    assert report.events_deleted == 3
    for table in ("workload_transitions", "placement_decisions", "preemption_decisions"):
        assert migrated.count(table) == 1


def test_old_samples_become_hourly_averages_with_the_same_usage_integral(migrated: Store) -> None:
    # Three days of minute samples; the last day stays raw.
    start = NOW - timedelta(days=3)
    raw = minute_samples(start, 3 * 24 * 60)
    write(migrated, raw)
    before = integral(migrated)
    fairness_before = decayed_usage_by_queue(
        migrated.engine, now=NOW, window=timedelta(days=7), half_life=timedelta(days=1)
    )

    folded, written = downsample_samples(
        migrated.engine, now=NOW, after=timedelta(days=1), resolution=timedelta(hours=1)
    )
    assert folded == 2 * 24 * 60
    assert written == 2 * 24
    assert sample_counts(migrated) == {True: 48, False: 24 * 60}
    assert integral(migrated) == pytest.approx(before)
    # Fairness reads (almost) the same usage: only the timestamps moved within each hour.
    fairness_after = decayed_usage_by_queue(
        migrated.engine, now=NOW, window=timedelta(days=7), half_life=timedelta(days=1)
    )
    assert fairness_after["cq-a"][GPU] == pytest.approx(fairness_before["cq-a"][GPU], rel=0.01)

    # Fair share and demand become time-weighted averages of the hour they stand for.
    first_hour = raw[:60]
    s = QueueSampleRow
    with migrated.engine.connect() as conn:
        row = conn.execute(
            select(s.__table__).where(s.downsampled.is_(True)).order_by(s.at).limit(1)
        ).one()
    assert row.at == start
    assert (row.resolution_s, row.covered_s) == (3600, 3600)
    assert row.usage == pytest.approx(sum(x.usage for x in first_hour) / 60)
    assert row.fair_share == pytest.approx(sum(x.fair_share for x in first_hour) / 60)
    assert row.demand == pytest.approx(sum(x.demand for x in first_hour) / 60)

    # A second pass finds nothing more to do.
    assert downsample_samples(
        migrated.engine, now=NOW, after=timedelta(days=1), resolution=timedelta(hours=1)
    ) == (0, 0)


def test_samples_replayed_late_merge_into_their_downsampled_hour(migrated: Store) -> None:
    start = NOW - timedelta(days=3)
    hour = minute_samples(start, 60)
    # Half of the hour arrives in time; the other half is replayed after an outage.
    write(migrated, hour[:30])
    downsample_samples(
        migrated.engine, now=NOW, after=timedelta(days=1), resolution=timedelta(hours=1)
    )
    write(migrated, hour[30:])
    downsample_samples(
        migrated.engine, now=NOW, after=timedelta(days=1), resolution=timedelta(hours=1)
    )
    assert sample_counts(migrated) == {True: 1}
    assert integral(migrated) == pytest.approx(sum(x.usage * 60 for x in hour))
    s = QueueSampleRow
    with migrated.engine.connect() as conn:
        row = conn.execute(select(s.__table__)).one()
    assert row.covered_s == 3600
    assert row.fair_share == pytest.approx(sum(x.fair_share for x in hour) / 60)


def test_samples_past_their_retention_are_deleted(migrated: Store) -> None:
    write(migrated, minute_samples(NOW - timedelta(days=400), 60))
    write(migrated, minute_samples(NOW - timedelta(days=3), 60))
    report = apply_retention(
        migrated.engine,
        RetentionSettings(downsample_after=timedelta(days=2), samples=timedelta(days=365)),
        NOW,
    )
    assert report.samples_folded == 120  # both hours were downsampled first...
    assert report.samples_deleted == 1  # ...then the one past a year was dropped
    assert sample_counts(migrated) == {True: 1}


def test_retention_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="'events' must be a positive duration"):
        RetentionSettings(events=timedelta(0))
    with pytest.raises(ValueError, match="'downsample_after' must be shorter than 'samples'"):
        RetentionSettings(downsample_after=timedelta(days=10), samples=timedelta(days=5))


def test_the_scheduler_samples_prunes_and_refreshes_fairness(
    migrated: Store, tmp_path: Path
) -> None:
    readings = [
        QueueReading("cq-a", "h100", GPU, usage=6, fair_share=4, demand=8),
        QueueReading("cq-b", "h100", GPU, usage=2, fair_share=4, demand=2),
    ]
    calls: list[float] = []

    def sampler() -> list[QueueReading]:
        calls.append(time.monotonic())
        return readings

    write(migrated, events_aged(400, "ancient"))
    figures = UsageFigures(FairnessSettings(enabled=True))
    with HistoryRecorder(migrated.engine, tmp_path / "spool") as recorder:
        jobs = HistoryJobs(
            migrated.engine,
            recorder,
            sampler=sampler,
            usage=figures,
            sample_interval=timedelta(seconds=1),
            retention_interval=timedelta(seconds=1),
            fairness_interval=timedelta(seconds=1),
        )
        jobs.start()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (
                len(calls) < 3
                or migrated.count("workload_transitions") > 0
                or "cq-a" not in figures.current()
            ):
                time.sleep(0.1)
                recorder.flush(5)
        finally:
            jobs.shutdown()
    assert len(calls) >= 3
    s = QueueSampleRow
    with migrated.engine.connect() as conn:
        rows = conn.execute(select(s.cluster_queue, s.usage, s.resolution_s)).all()
    assert {(q, u, r) for q, u, r in rows} == {("cq-a", 6.0, 1), ("cq-b", 2.0, 1)}
    assert len(rows) >= 2 * 2
    assert migrated.count("workload_transitions") == 0, "the 400-day-old event was pruned"
    usage = figures.current()
    assert usage["cq-a"][GPU] > usage["cq-b"][GPU] > 0
