"""The history recorder: takes records off the admission and scheduling loops, writes them later.

`HistoryRecorder.record()` is all the hot path pays: a deque append and a condition notify. A
background thread writes the buffer to the database in batches. When the database is down, or
when the buffer holds more than `buffer_size` records, the thread spools records to JSON-lines
segment files on local disk and replays them once the database answers again. Every write is
INSERT ... ON CONFLICT DO NOTHING on the record's natural key, so a replay (after an outage, or
a controller restart that reports the same transition again) stores each record once.

A record the database refuses as malformed is not retried forever: it goes to `rejected.jsonl`
in the spool directory (kept, never dropped silently) and counts in a metric.

Why one module of this size: the buffer, the database writes and the spool are one state
machine driven by one thread under one lock, and their ordering (spool before drop, replay
before new writes, flush on close) is the whole point; split across modules, that invariant
would have no single place to be read and checked.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from prometheus_client import Counter, Gauge
from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError, StatementError

from controllers.history.models import (
    PlacementDecisionRow,
    PreemptionDecisionRow,
    QueueSampleRow,
    WorkloadTransitionRow,
)
from controllers.history.records import (
    PlacementDecision,
    PreemptionDecision,
    QueueSample,
    Record,
    RecordError,
    WorkloadTransition,
    record_from_dict,
    record_to_dict,
)

log = logging.getLogger(__name__)

BACKLOG = Gauge(
    "muster_history_backlog_records",
    "History records accepted but not yet in the database (buffered in memory or spooled).",
)
WRITTEN = Counter("muster_history_records_written", "History records written to the database.")
REJECTED = Counter(
    "muster_history_records_rejected",
    "History records the database refused as malformed (kept in the spool's rejected.jsonl).",
)

_TABLES: dict[type[Record], Table] = {
    WorkloadTransition: WorkloadTransitionRow.__table__,  # type: ignore[dict-item]
    PlacementDecision: PlacementDecisionRow.__table__,  # type: ignore[dict-item]
    PreemptionDecision: PreemptionDecisionRow.__table__,  # type: ignore[dict-item]
    QueueSample: QueueSampleRow.__table__,  # type: ignore[dict-item]
}
# The natural key of each table: the columns of its unique constraint.
_KEYS: dict[type[Record], list[str]] = {
    WorkloadTransition: ["uid", "kind", "sequence"],
    PlacementDecision: ["uid", "pod_group", "sequence"],
    PreemptionDecision: ["uid", "sequence"],
    QueueSample: ["cluster_queue", "flavor", "resource", "resolution_s", "at"],
}


def record_row(record: Record) -> dict[str, Any]:
    """The column values stored for `record`."""
    if isinstance(record, WorkloadTransition):
        return {
            "at": record.at,
            "kind": record.kind.value,
            "namespace": record.namespace,
            "name": record.name,
            "uid": record.uid,
            "sequence": record.sequence,
            "local_queue": record.local_queue,
            "cluster_queue": record.cluster_queue,
            "flavors": dict(record.flavors),
            "resources": dict(record.resources),
            "reason": record.reason,
            "actor": record.actor,
        }
    if isinstance(record, PlacementDecision):
        return {
            "at": record.at,
            "namespace": record.namespace,
            "name": record.name,
            "uid": record.uid,
            "pod_group": record.pod_group,
            "sequence": record.sequence,
            "cluster_queue": record.cluster_queue,
            "assignments": dict(record.assignments),
            "reason": record.reason,
        }
    if isinstance(record, PreemptionDecision):
        return {
            "at": record.at,
            "namespace": record.namespace,
            "name": record.name,
            "uid": record.uid,
            "sequence": record.sequence,
            "cluster_queue": record.cluster_queue,
            "strategy": record.strategy,
            "victims": [v.as_dict() for v in record.victims],
            "reason": record.reason,
        }
    return {
        "at": record.at,
        "cluster_queue": record.cluster_queue,
        "flavor": record.flavor,
        "resource": record.resource,
        "usage": float(record.usage),
        "fair_share": float(record.fair_share),
        "demand": float(record.demand),
        "resolution_s": record.resolution_s,
        "covered_s": record.covered_s,
        "downsampled": record.downsampled,
    }


def write_records(conn: Connection, records: Iterable[Record]) -> None:
    """Insert `records` in `conn`'s transaction; records already stored are left as they are."""
    by_type: dict[type[Record], list[dict[str, Any]]] = {}
    for record in records:
        by_type.setdefault(type(record), []).append(record_row(record))
    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    for cls, rows in by_type.items():
        stmt = insert(_TABLES[cls]).on_conflict_do_nothing(index_elements=_KEYS[cls])
        conn.execute(stmt, rows)


def _short_error(err: BaseException) -> str:
    """The driver's own message, without the SQL and the parameters of a whole batch."""
    orig = getattr(err, "orig", None) or err
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__


def _is_bad_record(err: Exception) -> bool:
    """True when the database refused the data itself, not when it could not be reached.

    Missing tables and denied permissions count as outages: an operator fixes them (runs
    `muster db upgrade`, grants access) and the spooled records then go in.
    """
    if isinstance(err, DataError | IntegrityError):
        return True
    # A StatementError that is not a DBAPIError failed while binding parameters in Python.
    return isinstance(err, StatementError) and not isinstance(err, DBAPIError)


# A record, or a function the writer thread calls to build records (see `record_later`).
Pending = Record | Callable[[], Iterable[Record]]


class SpoolLockedError(RuntimeError):
    """Another recorder already spools into the same directory."""


class HistoryRecorder:
    """Buffers history records in memory and writes them from a background thread.

    Use as a context manager, or call `start()` and `close()`. `spool_dir` must belong to this
    recorder alone (a lock file enforces it); records spooled there by an earlier run are
    replayed on start.

    The writer competes with the admission loop for the interpreter. Code that must not be
    slowed down runs inside `with recorder.busy():`; the writer finishes the batch it is on and
    then waits for the section to end (at most `max_defer_s`, so a loop that is always busy
    still gets its history written).
    """

    def __init__(
        self,
        engine: Engine,
        spool_dir: Path | str,
        *,
        buffer_size: int = 10_000,
        batch_size: int = 200,
        segment_records: int = 10_000,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
        max_defer_s: float = 1.0,
        backlog_gauge: Gauge | None = None,
    ) -> None:
        if buffer_size < 1 or batch_size < 1 or segment_records < 1:
            raise ValueError(
                "history recorder: buffer_size, batch_size and segment_records must be >= 1"
            )
        self._engine = engine
        self._spool_dir = Path(spool_dir)
        self._buffer_size = buffer_size
        self._batch_size = batch_size
        self._segment_records = segment_records
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._max_defer_s = max_defer_s

        self._buffer: deque[Pending] = deque()
        self._wake = threading.Condition(threading.Lock())
        self._progress = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stopping = False
        # True while the writer waits for work: only then does record() need to wake it.
        self._idle = False
        self._busy = 0

        # Owned by the writer thread (read elsewhere only for figures).
        self._in_flight = 0
        self._spooled = 0
        self._db_up = True
        self._retry_delay_s = retry_initial_s
        self._retry_at = 0.0
        self._segment: IO[str] | None = None
        self._segment_lines = 0
        self._next_segment = 0
        # How much of the oldest segment is already in the database (after a partial replay).
        self._head: tuple[Path, int] | None = None
        self._lock_file: IO[str] | None = None

        gauge = backlog_gauge if backlog_gauge is not None else BACKLOG
        gauge.set_function(lambda: float(self.backlog))

    # --- the hot path -----------------------------------------------------------------------

    def record(self, record: Record) -> None:
        """Queue `record` for writing; never waits on the database or the disk."""
        if self._closed:
            raise RuntimeError("history recorder is closed; records can no longer be accepted")
        self._buffer.append(record)
        # The writer sets _idle under the lock before it checks the buffer, so either it sees
        # this record or this sees _idle; a busy writer needs no wake-up.
        if self._idle:
            with self._wake:
                self._wake.notify()

    def record_later(self, make: Callable[[], Iterable[Record]]) -> None:
        """Queue a function that builds records; the writer thread calls it, off the hot path.

        `make` must read only data that no longer changes (a frozen cycle result, say). If it
        raises, the error is logged and counted in muster_history_records_rejected.
        """
        if self._closed:
            raise RuntimeError("history recorder is closed; records can no longer be accepted")
        self._buffer.append(make)
        if self._idle:
            with self._wake:
                self._wake.notify()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Hold database writes back while the caller does latency-critical work."""
        with self._wake:
            self._busy += 1
        try:
            yield
        finally:
            with self._wake:
                self._busy -= 1
                if not self._busy:
                    self._wake.notify()

    # --- figures ----------------------------------------------------------------------------

    @property
    def backlog(self) -> int:
        """Records accepted but not yet in the database: in memory, being written, or spooled.

        A function queued with `record_later` counts as one until the writer has called it.
        """
        return len(self._buffer) + self._in_flight + self._spooled

    @property
    def spooled(self) -> int:
        """Records waiting in spool files on local disk."""
        return self._spooled

    @property
    def spool_dir(self) -> Path:
        """Where records wait on local disk while the database is down."""
        return self._spool_dir

    @property
    def database_up(self) -> bool:
        """Whether the last write attempt reached the database."""
        return self._db_up

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> HistoryRecorder:
        """Lock the spool directory, count what an earlier run left there, start the writer."""
        if self._thread is not None:
            raise RuntimeError("history recorder already started")
        self._spool_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self._spool_dir / "lock", "w")  # noqa: SIM115 - held until close
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise SpoolLockedError(
                f"history spool {self._spool_dir} is in use by another recorder; "
                "give each controller replica its own spool directory"
            ) from None
        segments = self._segments()
        self._spooled = sum(_count_lines(p) for p in segments)
        if segments:
            self._next_segment = int(segments[-1].stem.split("-")[1]) + 1
            log.info("history: %d spooled records from an earlier run to replay", self._spooled)
        self._thread = threading.Thread(target=self._run, name="history-recorder", daemon=True)
        self._thread.start()
        return self

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything recorded so far is in the database; False on timeout.

        Retries a database that was down right away instead of waiting for the backoff.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.retry_now()
        with self._progress:
            while self.backlog > 0:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._progress.wait(0.05 if remaining is None else min(0.05, remaining))
        return True

    def retry_now(self) -> None:
        """Try the database again at once instead of after the backoff (it is known to be back:
        its schema was just created, say)."""
        with self._wake:
            self._retry_at = 0.0
            self._wake.notify()

    def close(self, drain_timeout_s: float = 5.0) -> None:
        """Stop accepting records; write what the database takes within the timeout, spool the rest.

        Nothing accepted is lost: what is not in the database when this returns is on disk and
        is replayed by the next recorder started on the same spool directory.
        """
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            if self._db_up:
                self.flush(drain_timeout_s)
            with self._wake:
                self._stopping = True
                self._wake.notify()
            self._thread.join()
            # A record() that raced with close() may have landed after the writer's last spill.
            self._spill(len(self._buffer))
            self._close_segment()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def __enter__(self) -> HistoryRecorder:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                self._idle = True
                while not self._stopping and not self._has_work():
                    self._wake.wait(self._wait_s())
                self._idle = False
                stopping = self._stopping
            if stopping:
                self._spill(len(self._buffer))
                self._close_segment()
                self._signal_progress()
                return
            try:
                self._step()
            except Exception:
                # A bug here must not kill the thread and strand the buffer: spool and go on.
                log.exception("history: unexpected error in the recorder; spooling records")
                self._mark_down()
                self._spill(len(self._buffer))
            self._signal_progress()

    def _has_work(self) -> bool:
        # While the database is down, buffered records go straight to disk (the writer is slower
        # than an fsync, so they batch up by themselves); spooled ones wait for the next retry.
        if self._buffer:
            return True
        return self._spooled > 0 and time.monotonic() >= self._retry_at

    def _wait_s(self) -> float:
        if self._db_up and not self._spooled:
            return 1.0
        return max(0.01, min(1.0, self._retry_at - time.monotonic()))

    def _step(self) -> None:
        if not self._db_up and time.monotonic() < self._retry_at:
            self._spill(len(self._buffer))
            return
        excess = len(self._buffer) - self._buffer_size
        if excess > 0:
            self._spill(excess)
        if not self._replay_spool():
            self._spill(len(self._buffer))
            return
        while self._buffer and not self._stopping:
            self._yield_to_busy()
            batch = self._take(self._batch_size)
            ok = self._write(batch)
            if not ok:
                self._spool(batch)
            self._in_flight = 0
            if not ok:
                self._spill(len(self._buffer))
                return
            self._signal_progress()

    def _yield_to_busy(self) -> None:
        if not self._busy:
            return
        deadline = time.monotonic() + self._max_defer_s
        with self._wake:
            while self._busy and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._wake.wait(remaining)

    def _take(self, count: int) -> list[Record]:
        """Pop about `count` records (functions queued by record_later are called here).

        Everything popped counts in `_in_flight` until the caller has written or spooled it, so
        `backlog` never reads zero while records are on their way.
        """
        out: list[Record] = []
        while self._buffer and len(out) < count:
            self._in_flight += 1
            item = self._buffer.popleft()
            if isinstance(item, _RECORD_TYPES):
                out.append(item)
                continue
            try:
                out.extend(item())
            except Exception:
                REJECTED.inc()
                log.exception("history: a record_later function failed; its records are lost")
            self._in_flight = len(out)
        self._in_flight = len(out)
        return out

    def _write(self, records: Sequence[Record]) -> bool:
        """Write one batch; False if the database could not be reached (nothing was stored)."""
        try:
            with self._engine.begin() as conn:
                write_records(conn, records)
        except (SQLAlchemyError, OverflowError, ValueError, TypeError) as err:
            # The non-SQLAlchemy ones are raised by the driver while converting a value
            # (an integer too large for SQLite, say): the record is at fault, not the database.
            if isinstance(err, SQLAlchemyError) and not _is_bad_record(err):
                self._mark_down(err)
                return False
            if len(records) == 1:
                self._reject(records[0], err)
                return True
            # Find the malformed records; the rest of the batch still goes in.
            half = len(records) // 2
            return self._write(records[:half]) and self._write(records[half:])
        WRITTEN.inc(len(records))
        if not self._db_up:
            log.info("history: database reachable again; replaying spooled records")
        self._db_up = True
        self._retry_delay_s = self._retry_initial_s
        return True

    def _mark_down(self, err: Exception | None = None) -> None:
        if self._db_up:
            log.warning(
                "history: database unreachable, spooling records to %s: %s",
                self._spool_dir,
                _short_error(err) if err is not None else "unexpected error",
            )
        self._db_up = False
        self._retry_at = time.monotonic() + self._retry_delay_s
        self._retry_delay_s = min(self._retry_max_s, self._retry_delay_s * 2)

    def _reject(self, record: Record, err: Exception) -> None:
        REJECTED.inc()
        reason = _short_error(err)
        log.error("history: database refused %s %s: %s", record.TYPE, record.key(), reason)
        with open(self._spool_dir / "rejected.jsonl", "a", encoding="utf-8") as f:
            line = record_to_dict(record) | {"error": reason}
            f.write(json.dumps(line, separators=(",", ":")) + "\n")

    # --- the spool --------------------------------------------------------------------------

    def _segments(self) -> list[Path]:
        return sorted(self._spool_dir.glob("segment-*.jsonl"))

    def _spill(self, count: int) -> None:
        """Move the `count` oldest buffered records to the spool."""
        if count <= 0:
            return
        self._spool(self._take(count))
        self._in_flight = 0

    def _spool(self, records: Sequence[Record]) -> None:
        written = 0
        while written < len(records):
            if self._segment is None or self._segment_lines >= self._segment_records:
                self._open_segment()
            assert self._segment is not None
            room = self._segment_records - self._segment_lines
            chunk = records[written : written + room]
            self._segment.write(
                "".join(json.dumps(record_to_dict(r), separators=(",", ":")) + "\n" for r in chunk)
            )
            self._segment.flush()
            os.fsync(self._segment.fileno())
            self._segment_lines += len(chunk)
            self._spooled += len(chunk)
            written += len(chunk)

    def _open_segment(self) -> None:
        self._close_segment()
        path = self._spool_dir / f"segment-{self._next_segment:012d}.jsonl"
        self._next_segment += 1
        self._segment = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed on rotation
        self._segment_lines = 0

    def _close_segment(self) -> None:
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def _replay_spool(self) -> bool:
        """Write spooled records to the database, oldest segment first; False on an outage."""
        if not self._spooled:
            return True
        # Close the segment being appended so that every segment replayed is complete.
        self._close_segment()
        for path in self._segments():
            records, unreadable = _read_segment(path)
            done = self._head[1] if self._head is not None and self._head[0] == path else 0
            for start in range(done, len(records), self._batch_size):
                if self._stopping:
                    self._head = (path, start)
                    return True
                chunk = records[start : start + self._batch_size]
                if not self._write(chunk):
                    self._head = (path, start)
                    return False
                self._spooled -= len(chunk)
                self._signal_progress()
                self._yield_to_busy()
            if unreadable:
                # Lines cut short by a crash mid-write: kept for a person to look at.
                REJECTED.inc(len(unreadable))
                with open(self._spool_dir / "rejected.jsonl", "a", encoding="utf-8") as f:
                    f.writelines(
                        json.dumps({"unreadable_spool_line": u}) + "\n" for u in unreadable
                    )
                self._spooled -= len(unreadable)
            path.unlink()
            self._head = None
        return True

    def _signal_progress(self) -> None:
        with self._progress:
            self._progress.notify_all()


_RECORD_TYPES = (WorkloadTransition, PlacementDecision, PreemptionDecision, QueueSample)


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _read_segment(path: Path) -> tuple[list[Record], list[str]]:
    records: list[Record] = []
    unreadable: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                records.append(record_from_dict(json.loads(line)))
            except (json.JSONDecodeError, RecordError, TypeError):
                unreadable.append(line.rstrip("\n"))
    return records, unreadable


def spool_dir_default() -> Path:
    """Where a controller spools by default: beside the SQLite default, under the data dir."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "muster" / "history-spool"
