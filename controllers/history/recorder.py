"""The history recorder: a write-ahead log on local disk, drained into the database.

`HistoryRecorder.record()` appends the record to the spool (JSON lines in segment files) with
one `write()` before it returns, so once a caller has handed a record over, a kill -9 of the
process loses nothing: the kernel holds the bytes, and the next recorder started on the same
spool directory replays every segment. (A power loss could lose what the writer thread has
not yet fsync'ed, at most its last `sync_interval_s`.) The database is written only from the
spool, by a background thread that reads the segments in order, writes them in batches and
deletes a segment once all of it is stored; while the database is down the segments simply
grow. Every write is INSERT ... ON CONFLICT DO NOTHING on the record's natural key, so a replay
(after an outage, a crash between a batch and its deletion, or a controller restart that
reports the same transition again) stores each record once.

A record the database refuses as malformed is not retried forever: it goes to `rejected.jsonl`
in the spool directory (kept, never dropped silently) and counts in a metric.

This module is that state machine: the spool's life cycle (lock, replay on start, segments
appended, drained, deleted), the writer thread and its retries. Its ordering (on disk before
acknowledged, stored before deleted, replay on start) is the whole point and is read here in
one place. What a record looks like on disk is `spoollines.py`; as a database row, `rows.py`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from prometheus_client import Counter, Gauge
from sqlalchemy import Engine
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError, StatementError

from controllers.history.records import Record, record_to_dict
from controllers.history.rows import write_records
from controllers.history.spoollines import parse_lines, spool_line

log = logging.getLogger(__name__)

BACKLOG = Gauge(
    "muster_history_backlog_records",
    "History records accepted (on disk in the spool) but not yet in the database.",
)
WRITTEN = Counter("muster_history_records_written", "History records written to the database.")
REJECTED = Counter(
    "muster_history_records_rejected",
    "History records the database refused as malformed (kept in the spool's rejected.jsonl).",
)


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


class SpoolLockedError(RuntimeError):
    """Another recorder already spools into the same directory."""


class HistoryRecorder:
    """Writes every record ahead to the spool, and from there to the database on a thread.

    Use as a context manager, or call `start()` and `close()`. `spool_dir` must belong to this
    recorder alone (a lock file enforces it); whatever an earlier run left there is replayed
    on start.

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
        batch_size: int = 200,
        segment_records: int = 10_000,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
        max_defer_s: float = 1.0,
        sync_interval_s: float = 1.0,
        backlog_gauge: Gauge | None = None,
        ready: threading.Event | None = None,
    ) -> None:
        if batch_size < 1 or segment_records < 1:
            raise ValueError("history recorder: batch_size and segment_records must be >= 1")
        self._engine = engine
        self._spool_dir = Path(spool_dir)
        self._batch_size = batch_size
        self._segment_records = segment_records
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._max_defer_s = max_defer_s
        self._sync_interval_s = sync_interval_s
        # The database is written only once this is set: until the store is known to be this
        # Muster's (migrated), records wait in the spool and nothing is written into it.
        self._ready = ready

        # The appending side, shared by every caller: the open segment and what it holds.
        self._log_lock = threading.Lock()
        self._fd: int | None = None
        self._active: Path | None = None
        self._active_lines = 0
        self._next_segment = 0
        self._accepted = 0  # records on disk since start (with those found there on start)
        self._replayed = 0  # records an earlier run left in the spool, found on start
        self._unsynced = False
        self._closed = False

        self._wake = threading.Condition(threading.Lock())
        self._progress = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._stopping = False
        # True while the writer waits for work: only then does an append need to wake it.
        self._idle = False
        self._busy = 0

        # Owned by the writer thread (read elsewhere only for figures).
        self._done = 0  # records stored in the database or set aside as rejected
        self._reading: Path | None = None  # the segment being drained, and how far
        self._offset = 0
        self._db_up = True
        self._retry_delay_s = retry_initial_s
        self._retry_at = 0.0
        self._synced_at = 0.0
        self._lock_file: IO[str] | None = None

        gauge = backlog_gauge if backlog_gauge is not None else BACKLOG
        gauge.set_function(lambda: float(self.backlog))

    # --- the hot path -----------------------------------------------------------------------

    def record(self, record: Record) -> None:
        """Append `record` to the spool; when this returns, a crash can no longer lose it."""
        self._append([record])

    def record_later(self, make: Callable[[], Iterable[Record]]) -> None:
        """Build records with `make` and append them to the spool before returning.

        Built now, not on the writer thread: a record that waits in memory is lost by a
        kill -9. If `make` raises, the error is logged and counted in
        muster_history_records_rejected (the caller's work goes on)."""
        if self._closed:
            raise RuntimeError("history recorder is closed; records can no longer be accepted")
        try:
            records = list(make())
        except Exception:
            REJECTED.inc()
            log.exception("history: a record builder failed; its records are lost")
            return
        self._append(records)

    def _append(self, records: Sequence[Record]) -> None:
        lines: list[str] = []
        for record in records:
            try:
                lines.append(spool_line(record))
            except (TypeError, ValueError) as err:
                self._reject_line(repr(record), err)
        with self._log_lock:
            if self._closed:
                raise RuntimeError("history recorder is closed; records can no longer be accepted")
            if not lines:
                return
            if self._fd is None or self._active_lines >= self._segment_records:
                self._rotate()
            assert self._fd is not None
            _write_all(self._fd, "".join(lines).encode())
            self._active_lines += len(lines)
            self._accepted += len(lines)
            self._unsynced = True
        # The writer sets _idle under the lock before it checks for work, so either it sees
        # these records or this sees _idle; a busy writer needs no wake-up.
        if self._idle:
            with self._wake:
                self._wake.notify()

    def _rotate(self) -> None:
        """Close the open segment (synced) and open the next one; caller holds _log_lock."""
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
        path = self._spool_dir / f"segment-{self._next_segment:012d}.jsonl"
        self._next_segment += 1
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._active = path
        self._active_lines = 0

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
        """Records accepted (so on disk in the spool) but not yet in the database."""
        return self._accepted - self._done

    @property
    def spooled(self) -> int:
        """Records in spool files not yet in the database: every record waits there, so this
        is the backlog."""
        return self.backlog

    @property
    def replayed(self) -> int:
        """Records an earlier run left in the spool, found when this recorder started (the
        writer may already have stored some of them: `backlog` falls from here)."""
        return self._replayed

    @property
    def spool_dir(self) -> Path:
        """Where records are written ahead, and wait while the database is down."""
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
        self._accepted = self._replayed = sum(_count_lines(p) for p in segments)
        if segments:
            self._next_segment = int(segments[-1].stem.split("-")[1]) + 1
            log.info("history: %d records from an earlier run to replay", self._accepted)
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
        """Stop accepting records; write what the database takes within the timeout.

        Nothing accepted is lost: what is not in the database when this returns is in the
        spool and is replayed by the next recorder started on the same directory.
        """
        with self._log_lock:
            if self._closed:
                return
            self._closed = True
        if self._thread is not None:
            if self._db_up and self._store_ready():
                self.flush(drain_timeout_s)
            with self._wake:
                self._stopping = True
                self._wake.notify()
            self._thread.join()
        with self._log_lock:
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
        if self._thread is not None and self.backlog == 0:
            for path in self._segments():  # all of it is stored
                path.unlink()
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
                if self._stopping:
                    self._signal_progress()
                    return
            try:
                self._step()
            except Exception:
                # A bug here must not kill the thread: the records wait on disk; try later.
                log.exception("history: unexpected error in the recorder; retrying later")
                self._mark_down()
            self._signal_progress()

    def _sync_due(self) -> bool:
        return self._unsynced and time.monotonic() - self._synced_at >= self._sync_interval_s

    def _has_work(self) -> bool:
        if self._sync_due():
            return True
        return (
            self.backlog > 0
            and self._store_ready()
            and (self._db_up or time.monotonic() >= self._retry_at)
        )

    def _store_ready(self) -> bool:
        return self._ready is None or self._ready.is_set()

    def _wait_s(self) -> float:
        wait = min(1.0, self._sync_interval_s)
        if not self._db_up:
            wait = min(wait, self._retry_at - time.monotonic())
        return max(0.01, wait)

    def _sync(self) -> None:
        """fsync the open segment: what a crash of the process cannot lose, a power cut
        cannot lose either once this has run."""
        with self._log_lock:
            if self._fd is not None and self._unsynced:
                os.fsync(self._fd)
            self._unsynced = False
        self._synced_at = time.monotonic()

    def _step(self) -> None:
        if self._sync_due():
            self._sync()
        if not self._store_ready() or (not self._db_up and time.monotonic() < self._retry_at):
            return
        while not self._stopping:
            batch = self._read_batch()
            if batch is None:
                return
            records, unreadable, offset = batch
            self._yield_to_busy()
            if records and not self._write(records):
                return  # the database is down: the same lines are read again on the retry
            if unreadable:
                REJECTED.inc(len(unreadable))
                with open(self._spool_dir / "rejected.jsonl", "a", encoding="utf-8") as f:
                    f.writelines(u + "\n" for u in unreadable)
            self._offset = offset
            self._done += len(records) + len(unreadable)
            self._signal_progress()
            if self._sync_due():
                self._sync()

    def _read_batch(self) -> tuple[list[Record], list[str], int] | None:
        """The next lines of the spool after what is stored: (records, unreadable lines, the
        offset after them) in the segment being drained; None when everything is stored.
        A drained segment that is no longer appended to is deleted here."""
        while True:
            if self._reading is None:
                segments = self._segments()
                if not segments:
                    return None
                self._reading, self._offset = segments[0], 0
            path = self._reading
            lines, offset = _read_lines(path, self._offset, self._batch_size, complete=True)
            if lines:
                records, unreadable = parse_lines(lines)
                return records, unreadable, offset
            with self._log_lock:
                active = path == self._active
            if active:
                return None  # caught up with the appending side
            # No longer appended to: anything after the offset now is final, a cut-off last
            # line included.
            lines, offset = _read_lines(path, self._offset, self._batch_size, complete=False)
            if lines:
                records, unreadable = parse_lines(lines)
                return records, unreadable, offset
            path.unlink()
            self._reading = None

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
            log.info("history: database reachable again; writing the spooled records")
        self._db_up = True
        self._retry_delay_s = self._retry_initial_s
        return True

    def _mark_down(self, err: Exception | None = None) -> None:
        if self._db_up:
            log.warning(
                "history: database unreachable; records wait in the spool %s: %s",
                self._spool_dir,
                _short_error(err) if err is not None else "unexpected error",
            )
        self._db_up = False
        self._retry_at = time.monotonic() + self._retry_delay_s
        self._retry_delay_s = min(self._retry_max_s, self._retry_delay_s * 2)

    def _reject(self, record: Record, err: Exception) -> None:
        reason = _short_error(err)
        log.error("history: database refused %s %s: %s", record.TYPE, record.key(), reason)
        self._reject_line(json.dumps(record_to_dict(record) | {"error": reason}), None)

    def _reject_line(self, line: str, err: Exception | None) -> None:
        REJECTED.inc()
        if err is not None:
            log.error("history: record could not be written to the spool: %s: %s", err, line)
            line = json.dumps({"unserializable_record": line, "error": str(err)})
        with open(self._spool_dir / "rejected.jsonl", "a", encoding="utf-8") as f:
            f.write(line + "\n")

    # --- the spool --------------------------------------------------------------------------

    def _segments(self) -> list[Path]:
        return sorted(self._spool_dir.glob("segment-*.jsonl"))

    def _signal_progress(self) -> None:
        with self._progress:
            self._progress.notify_all()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _read_lines(path: Path, offset: int, limit: int, *, complete: bool) -> tuple[list[str], int]:
    """Up to `limit` non-blank lines of `path` from byte `offset`, and the offset after them.
    With `complete`, a last line without its newline (still being appended) is left alone."""
    lines: list[str] = []
    with open(path, "rb") as f:
        f.seek(offset)
        while len(lines) < limit:
            raw = f.readline()
            if not raw or (complete and not raw.endswith(b"\n")):
                break
            offset += len(raw)
            if raw.strip():
                lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
    return lines, offset


def spool_dir_default() -> Path:
    """Where a controller spools by default. In a pod, /var/lib/muster/spool (the chart mounts
    a volume there; a home directory in a container is gone with the container); elsewhere
    beside the SQLite default, under the user's data directory."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return Path("/var/lib/muster/spool")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "muster" / "history-spool"
