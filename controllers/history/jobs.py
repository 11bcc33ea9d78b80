"""Periodic history jobs (APScheduler): sampling, retention and downsampling, fairness refresh.

- Sampling asks the controller for each queue's current usage, fair share and demand (a callable
  it passes in, reading its own cache) and hands the samples to the recorder, so a database
  outage delays them but loses none.
- Retention deletes raw events (transitions, placements, preemptions) older than N days, folds
  raw queue samples older than M days into hourly averages, and deletes samples past their own
  retention. Downsampling keeps the usage integral exact, so fairness reads the same figures
  before and after.
- Fairness refresh recomputes the decayed usage that time-based fair share feeds the quota engine.

Each step is also a plain method, so tests and `muster` commands can run it on demand.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler  # type: ignore[import-untyped]
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]
from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from controllers.history.models import (
    PlacementDecisionRow,
    PreemptionDecisionRow,
    QueueSampleRow,
    WorkloadTransitionRow,
)
from controllers.history.recorder import HistoryRecorder
from controllers.history.records import QueueSample
from controllers.history.usage import UsageFigures

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueReading:
    """What the controller reports for one queue, flavor and resource at sampling time."""

    cluster_queue: str
    flavor: str
    resource: str
    usage: float
    fair_share: float
    demand: float


Sampler = Callable[[], Iterable[QueueReading]]


@dataclass(frozen=True)
class RetentionSettings:
    """How long history is kept; all durations configurable."""

    events: timedelta = timedelta(days=30)
    downsample_after: timedelta = timedelta(days=2)
    downsample_resolution: timedelta = timedelta(hours=1)
    samples: timedelta = timedelta(days=365)

    def __post_init__(self) -> None:
        for name in ("events", "downsample_after", "downsample_resolution", "samples"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"retention settings: field {name!r} must be a positive duration")
        if self.downsample_after >= self.samples:
            raise ValueError(
                "retention settings: field 'downsample_after' must be shorter than 'samples', "
                "or raw samples would be deleted before they are downsampled"
            )
        if self.downsample_resolution.total_seconds() % 1:
            raise ValueError(
                "retention settings: field 'downsample_resolution' must be whole seconds"
            )


@dataclass(frozen=True)
class RetentionReport:
    """What one retention pass did."""

    events_deleted: int
    samples_folded: int
    downsampled_written: int
    samples_deleted: int


def prune_events(engine: Engine, *, now: datetime, keep: timedelta) -> int:
    """Delete transitions, placement and preemption decisions older than `keep`."""
    cutoff = now - keep
    deleted = 0
    with engine.begin() as conn:
        for row in (WorkloadTransitionRow, PlacementDecisionRow, PreemptionDecisionRow):
            deleted += conn.execute(delete(row).where(row.at < cutoff)).rowcount
    return deleted


def prune_samples(engine: Engine, *, now: datetime, keep: timedelta) -> int:
    """Delete queue samples (raw or downsampled) older than `keep`."""
    with engine.begin() as conn:
        result = conn.execute(delete(QueueSampleRow).where(QueueSampleRow.at < now - keep))
        return result.rowcount


def _bucket(at: datetime, resolution_s: int) -> datetime:
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % resolution_s, UTC)


def downsample_samples(
    engine: Engine, *, now: datetime, after: timedelta, resolution: timedelta
) -> tuple[int, int]:
    """Fold raw samples older than `after` into one sample per `resolution` bucket.

    Returns (raw samples folded, downsampled rows written or updated). Per bucket, usage becomes
    the integral divided by the resolution (so `usage * resolution_s` is unchanged); fair share
    and demand become time-weighted averages over the seconds observed. Raw samples that arrive
    late (replayed after an outage) are merged into an existing bucket on a later pass. One
    transaction per day of raw data, so a crash mid-way leaves no sample counted twice.
    """
    res_s = int(resolution.total_seconds())
    # Only whole buckets: the one containing the cutoff may still be receiving samples.
    cutoff = _bucket(now - after, res_s)
    folded = written = 0
    raw = QueueSampleRow.downsampled.is_(False)
    while True:
        with engine.begin() as conn:
            first = conn.execute(
                select(func.min(QueueSampleRow.at)).where(
                    raw, QueueSampleRow.resolution_s < res_s, QueueSampleRow.at < cutoff
                )
            ).scalar_one_or_none()
            if first is None:
                return folded, written
            if first.tzinfo is None:  # SQLite aggregates bypass the column type
                first = datetime.fromisoformat(str(first)).replace(tzinfo=UTC)
            end = min(cutoff, _bucket(first, res_s) + timedelta(days=1))
            in_chunk = (
                raw,
                QueueSampleRow.resolution_s < res_s,
                QueueSampleRow.at >= _bucket(first, res_s),
                QueueSampleRow.at < end,
            )
            rows = conn.execute(select(QueueSampleRow.__table__).where(*in_chunk)).all()
            sums: dict[tuple[str, str, str, datetime], list[float]] = defaultdict(
                lambda: [0.0, 0.0, 0.0, 0.0]
            )
            for r in rows:
                acc = sums[(r.cluster_queue, r.flavor, r.resource, _bucket(r.at, res_s))]
                acc[0] += r.usage * r.resolution_s
                acc[1] += r.covered_s
                acc[2] += r.fair_share * r.covered_s
                acc[3] += r.demand * r.covered_s
            existing = {
                (d.cluster_queue, d.flavor, d.resource, d.at): d
                for d in conn.execute(
                    select(QueueSampleRow.__table__).where(
                        QueueSampleRow.downsampled.is_(True),
                        QueueSampleRow.resolution_s == res_s,
                        QueueSampleRow.at >= _bucket(first, res_s),
                        QueueSampleRow.at < end,
                    )
                )
            }
            new_rows: list[dict[str, Any]] = []
            for key, (integral, covered, fs_int, demand_int) in sums.items():
                old = existing.get(key)
                if old is not None:
                    integral += old.usage * res_s
                    fs_int += old.fair_share * old.covered_s
                    demand_int += old.demand * old.covered_s
                    covered += old.covered_s
                values = {
                    "usage": integral / res_s,
                    "fair_share": fs_int / covered if covered else 0.0,
                    "demand": demand_int / covered if covered else 0.0,
                    "covered_s": int(min(covered, res_s)),
                }
                if old is not None:
                    conn.execute(
                        update(QueueSampleRow).where(QueueSampleRow.id == old.id).values(**values)
                    )
                else:
                    queue, flavor, resource, at = key
                    new_rows.append(
                        values
                        | {
                            "at": at,
                            "cluster_queue": queue,
                            "flavor": flavor,
                            "resource": resource,
                            "resolution_s": res_s,
                            "downsampled": True,
                        }
                    )
            if new_rows:
                conn.execute(insert(QueueSampleRow), new_rows)
            conn.execute(delete(QueueSampleRow).where(*in_chunk))
            folded += len(rows)
            written += len(sums)


def apply_retention(engine: Engine, settings: RetentionSettings, now: datetime) -> RetentionReport:
    """One retention pass: prune events, downsample old samples, prune expired samples."""
    events = prune_events(engine, now=now, keep=settings.events)
    folded, written = downsample_samples(
        engine, now=now, after=settings.downsample_after, resolution=settings.downsample_resolution
    )
    samples = prune_samples(engine, now=now, keep=settings.samples)
    return RetentionReport(events, folded, written, samples)


class HistoryJobs:
    """The history store's background jobs on an APScheduler BackgroundScheduler.

    `sampler` is called from the scheduler's thread every `sample_interval`; it must be quick
    and read only the controller's in-memory state. Pass `sampler=None` or `usage=None` to leave
    that job out (a standby replica, or time-based fair share turned off).
    """

    def __init__(
        self,
        engine: Engine,
        recorder: HistoryRecorder,
        *,
        sampler: Sampler | None = None,
        usage: UsageFigures | None = None,
        retention: RetentionSettings | None = None,
        sample_interval: timedelta = timedelta(minutes=1),
        retention_interval: timedelta = timedelta(hours=1),
        fairness_interval: timedelta = timedelta(minutes=5),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        ready: threading.Event | None = None,
    ) -> None:
        for name, value in (
            ("sample_interval", sample_interval),
            ("retention_interval", retention_interval),
            ("fairness_interval", fairness_interval),
        ):
            if value < timedelta(seconds=1):
                raise ValueError(f"history jobs: {name} must be at least one second")
        self._engine = engine
        self._recorder = recorder
        self._sampler = sampler
        self._usage = usage
        self.retention = retention or RetentionSettings()
        self._intervals = (sample_interval, retention_interval, fairness_interval)
        self._clock = clock
        # Retention and fairness touch the database only once it is known to be this Muster's.
        self._ready = ready
        self._scheduler: BackgroundScheduler | None = None

    def start(self) -> None:
        """Schedule the jobs; fairness figures are computed once right away."""
        sample, retention, fairness = self._intervals
        scheduler = BackgroundScheduler(
            timezone=UTC,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 60},
        )
        if self._sampler is not None:
            scheduler.add_job(
                self.sample_now,
                IntervalTrigger(seconds=sample.total_seconds()),
                id="history-sample",
                name="sample queue usage, fair share and demand",
            )
        scheduler.add_job(
            self._guarded(self.retention_now),
            IntervalTrigger(seconds=retention.total_seconds()),
            id="history-retention",
            name="prune and downsample history",
        )
        if self._usage is not None:
            scheduler.add_job(
                self._guarded(self.refresh_fairness_now),
                IntervalTrigger(seconds=fairness.total_seconds()),
                id="history-fairness",
                name="refresh time-based fair share usage",
                next_run_time=datetime.now(UTC),
            )
        scheduler.start()
        self._scheduler = scheduler

    def shutdown(self, wait: bool = True) -> None:
        """Stop the scheduler (waiting for a running job by default)."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=wait)
            self._scheduler = None

    def sample_now(self) -> int:
        """Take one sample of every queue through the recorder; returns how many."""
        if self._sampler is None:
            return 0
        at = self._clock().replace(microsecond=0)
        resolution_s = int(self._intervals[0].total_seconds())
        count = 0
        for reading in self._sampler():
            self._recorder.record(
                QueueSample(
                    cluster_queue=reading.cluster_queue,
                    flavor=reading.flavor,
                    resource=reading.resource,
                    at=at,
                    usage=reading.usage,
                    fair_share=reading.fair_share,
                    demand=reading.demand,
                    resolution_s=resolution_s,
                )
            )
            count += 1
        return count

    def retention_now(self) -> RetentionReport:
        """Run one retention pass now."""
        report = apply_retention(self._engine, self.retention, self._clock())
        log.info("history retention: %s", report)
        return report

    def refresh_fairness_now(self) -> None:
        """Recompute the time-based fair share usage figures now."""
        if self._usage is not None:
            self._usage.refresh(self._engine, self._clock())

    def _guarded(self, job: Callable[[], object]) -> Callable[[], None]:
        # A database outage skips one run; the previous fairness figures stay in use.
        def run() -> None:
            if self._ready is not None and not self._ready.is_set():
                return
            try:
                job()
            except SQLAlchemyError as err:
                log.warning("history job %s skipped, database unavailable: %s", job.__name__, err)
            except (ValueError, TypeError) as err:
                # A row it could not read (a store edited by hand): the next run tries again.
                log.warning(
                    "history job %s skipped, a row it read is malformed: %s", job.__name__, err
                )

        run.__name__ = job.__name__
        return run
