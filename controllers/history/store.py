"""The history store as `muster controller` runs it: schema, recorder and periodic jobs.

Starting it never waits on the database. Migrations run on a thread of their own, retried with
a growing backoff until the database answers; meanwhile the recorder keeps records in memory
and spools them to local disk, and the periodic jobs skip the runs the database cannot serve.
Closing it stops the jobs, writes what the database takes within a few seconds and leaves the
rest in the spool, which the next start replays.

Every replica runs it (a standby keeps its usage figures warm for when it takes over); only the
leader has anything to record or sample.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.exc import DatabaseError

from controllers.history import migrate
from controllers.history.engine import display_url, make_engine
from controllers.history.jobs import HistoryJobs, QueueReading, RetentionSettings, Sampler
from controllers.history.recorder import HistoryRecorder, SpoolLockedError, spool_dir_default
from controllers.history.usage import FairnessSettings, UsageFigures
from quota.fairness.fairshare import FairShare

log = logging.getLogger(__name__)

# Replicas on one host each need a spool of their own; with the default directory the second
# takes the next free slot instead of failing (and replays what an earlier run left there).
SPOOL_SLOTS = 8


@dataclass(frozen=True)
class HistorySettings:
    """Where the history store is and what the controller does with it."""

    url: URL
    # None: /var/lib/muster/spool in a pod, else under the user's data directory; one
    # directory per database.
    spool_dir: Path | None = None
    fairness: FairnessSettings = field(default_factory=FairnessSettings)
    sample_interval: timedelta = timedelta(minutes=1)
    fairness_interval: timedelta = timedelta(minutes=5)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    # Migration retries back off from 1 s to this.
    migrate_retry_max_s: float = 60.0


def default_spool_dir(url: URL) -> Path:
    """The default spool: one directory per database, so records spooled for one database are
    never replayed into another."""
    digest = hashlib.sha256(display_url(url).encode()).hexdigest()[:12]
    return spool_dir_default() / digest


def open_recorder(
    engine: Any, url: URL, spool_dir: Path | None, ready: threading.Event | None = None
) -> HistoryRecorder:
    """Start a recorder on `spool_dir`, or on the first free slot of the default spool; it
    writes to the database only once `ready` is set (the schema is known to be this Muster's)."""
    if spool_dir is not None:
        # An operator's choice: sharing it between replicas is a mistake to report, not mend.
        return HistoryRecorder(engine, spool_dir, ready=ready).start()
    base = default_spool_dir(url)
    for slot in range(SPOOL_SLOTS):
        path = base if slot == 0 else base.with_name(f"{base.name}-{slot}")
        try:
            return HistoryRecorder(engine, path, ready=ready).start()
        except SpoolLockedError:
            continue
    raise SpoolLockedError(
        f"history spool: all {SPOOL_SLOTS} default spool directories beside {base} are in use; "
        "pass --history-spool-dir"
    )


def queue_readings(fair: FairShare | None) -> list[QueueReading]:
    """Each queue's usage, fair share and demand per flavor and resource, from one cycle's
    fair share (parents report their subtree)."""
    if fair is None:
        return []
    out: list[QueueReading] = []
    for queue in sorted(set(fair.shares) | set(fair.usage) | set(fair.demand)):
        shares = fair.shares.get(queue, {})
        usage = fair.usage.get(queue, {})
        demand = fair.demand.get(queue, {})
        for flavor, resource in sorted(set(shares) | set(usage) | set(demand)):
            key = (flavor, resource)
            out.append(
                QueueReading(
                    cluster_queue=queue,
                    flavor=flavor,
                    resource=resource,
                    usage=float(max(0, usage.get(key, 0))),
                    fair_share=float(max(0, shares.get(key, 0))),
                    demand=float(max(0, demand.get(key, 0))),
                )
            )
    return out


class HistoryStore:
    """The controller's history store: `start(sampler)`, `record_later`, `busy()`, `close()`."""

    def __init__(self, settings: HistorySettings) -> None:
        self.settings = settings
        self.engine = make_engine(settings.url)
        # Only when time-based fair share is on: the admission loop reads these figures.
        self.usage = UsageFigures(settings.fairness) if settings.fairness.enabled else None
        self.recorder: HistoryRecorder | None = None
        self.jobs: HistoryJobs | None = None
        self.migrated = threading.Event()
        self._stop = threading.Event()
        self._migrator: threading.Thread | None = None

    @property
    def where(self) -> str:
        """The database URL, safe to print."""
        return display_url(self.settings.url)

    def start(self, sampler: Sampler | None = None) -> None:
        """Start recording and the periodic jobs; the schema is migrated in the background."""
        self.recorder = open_recorder(
            self.engine, self.settings.url, self.settings.spool_dir, self.migrated
        )
        self._migrator = threading.Thread(
            target=self._migrate_until_done, name="history-migrate", daemon=True
        )
        self._migrator.start()
        self.jobs = HistoryJobs(
            self.engine,
            self.recorder,
            sampler=sampler,
            usage=self.usage,
            retention=self.settings.retention,
            sample_interval=self.settings.sample_interval,
            fairness_interval=self.settings.fairness_interval,
            ready=self.migrated,
        )
        self.jobs.start()
        log.info(
            "history store started",
            extra={
                "database": self.where,
                "spool_dir": str(self.spool_dir),
                "usage_fairness": self.usage is not None,
            },
        )

    @property
    def spool_dir(self) -> Path | None:
        return self.recorder.spool_dir if self.recorder is not None else None

    def _migrate_until_done(self) -> None:
        delay = 1.0
        warned = False
        refused = ""  # the permanent problem last logged
        while not self._stop.is_set():
            try:
                migrate.upgrade(self.engine)
                revision = migrate.current_revision(self.engine)
            except (migrate.MigrationError, DatabaseError) as error:
                if not migrate.is_permanent(error):
                    self._unavailable(error, delay, warned)
                    warned = True
                elif refused != (problem := migrate.describe(error)):
                    # Another application's database, a newer Muster's, or not a database:
                    # nothing is written into it (the recorder and the jobs wait for the
                    # migration), records stay in the spool, and it is checked again at the
                    # longest backoff in case someone replaces it.
                    log.error(
                        f"history store at {self.where} {problem}",
                        extra={"database": self.where, "spool_dir": str(self.spool_dir)},
                    )
                    refused = problem
                    delay = self.settings.migrate_retry_max_s
                self._stop.wait(delay)
                delay = min(self.settings.migrate_retry_max_s, delay * 2)
                continue
            except Exception as error:
                # Anything else the driver raises: try again (another replica migrating at the
                # same moment is no failure: migrate.upgrade waits for it on a lock).
                self._unavailable(error, delay, warned)
                warned = True
                self._stop.wait(delay)
                delay = min(self.settings.migrate_retry_max_s, delay * 2)
                continue
            log.info("history store ready", extra={"database": self.where, "revision": revision})
            self.migrated.set()
            if self.recorder is not None:
                # Records that met a missing schema were spooled; write them now, not after
                # the recorder's backoff.
                self.recorder.retry_now()
            if self.jobs is not None and self.usage is not None:
                try:
                    self.jobs.refresh_fairness_now()
                except Exception as error:
                    log.warning("usage fairness figures not refreshed", extra={"error": str(error)})
            return

    def _unavailable(self, error: Exception, delay: float, warned: bool) -> None:
        detail = str(getattr(error, "orig", None) or error).strip().splitlines()
        fields = {
            "database": self.where,
            "spool_dir": str(self.spool_dir),
            "error": (detail[0] if detail else type(error).__name__)[:500],
            "retry_in": delay,
        }
        if not warned:
            log.warning(
                "history store unavailable; recording to the spool until it answers", extra=fields
            )
        else:
            log.debug("history store still unavailable", extra=fields)

    def record_later(self, make: Callable[[], Iterable[Any]]) -> None:
        """Build records with `make` and write them ahead to the spool (see the recorder)."""
        if self.recorder is None:
            raise RuntimeError("history store not started")
        self.recorder.record_later(make)

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Hold database writes back while the admission loop decides."""
        if self.recorder is None:
            yield
            return
        with self.recorder.busy():
            yield

    def close(self, drain_timeout_s: float = 5.0) -> None:
        """Stop the jobs, write what the database takes in `drain_timeout_s`, spool the rest."""
        self._stop.set()
        if self.jobs is not None:
            self.jobs.shutdown(wait=True)
            self.jobs = None
        if self.recorder is not None:
            self.recorder.close(drain_timeout_s)
            backlog = self.recorder.spooled
            if backlog:
                log.warning(
                    "history records left in the spool for the next start",
                    extra={"records": backlog, "spool_dir": str(self.spool_dir)},
                )
        if self._migrator is not None:
            self._migrator.join(timeout=10)
        self.engine.dispose()
