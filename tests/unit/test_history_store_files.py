"""The history store refuses files it cannot use, cleanly, and never changes what is in them
(issue 24, item 6).

Every reader and writer of the store is driven the way a person drives it (the `muster`
command line, in-process; the controller's HistoryStore as `muster controller --history`
starts it) over a generated set of bad files: a file that is not a database, real stores cut
short or with bytes flipped, another application's SQLite database (with and without an
Alembic revision of its own), a store a newer Muster migrated, and a store with rows a reader
cannot parse. Each must end with exit code 0 or a clear message naming the file (never a
traceback), and the file's bytes must be as they were, unless the command is one that
writes and the store is Muster's own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from controllers.history import migrate
from controllers.history.engine import make_engine, parse_database_url
from controllers.history.recorder import HistoryRecorder
from controllers.history.records import TransitionKind, WorkloadTransition
from controllers.history.spoollines import spool_line
from controllers.history.store import HistorySettings, HistoryStore
from controllers.history.usage import decayed_usage_by_queue
from controllers.main import main

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "examples" / "elastic.yaml"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store: the preemption example's run, recorded by `muster simulate`."""
    path = tmp_path_factory.mktemp("recorded") / "history.db"
    result = CliRunner().invoke(
        main, ["simulate", "--history", str(path), str(REPO / "examples" / "three-teams.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert sql(path, "select count(*) from preemption_decisions")[0][0] > 0
    return path


def sql(path: Path, *statements: str | tuple[str, tuple[object, ...]]) -> list[tuple[object, ...]]:
    """Run statements on the SQLite file at `path` and close it (a connection left open would
    checkpoint its journal into the file later, while the test compares its bytes)."""
    conn = sqlite3.connect(path)
    try:
        rows: list[tuple[object, ...]] = []
        for statement in statements:
            text, args = statement if isinstance(statement, tuple) else (statement, ())
            rows = conn.execute(text, args).fetchall()
        conn.commit()
        return rows
    finally:
        conn.close()


def _junk(path: Path, _store: Path) -> None:
    path.write_text("not a database at all\n" * 50)


def _truncated(at: float) -> Callable[[Path, Path], None]:
    def make(path: Path, store: Path) -> None:
        data = store.read_bytes()
        path.write_bytes(data[: max(1, int(len(data) * at))])

    make.__name__ = f"truncated to {at:.0%}"
    return make


def _flipped(seed: int) -> Callable[[Path, Path], None]:
    def make(path: Path, store: Path) -> None:
        data = bytearray(store.read_bytes())
        rng = random.Random(seed)
        # The header on even seeds (the page size, the schema's place), pages after it on odd.
        span = range(0, 100) if seed % 2 == 0 else range(100, len(data))
        for _ in range(8):
            data[rng.choice(span)] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))

    make.__name__ = f"flipped bytes (seed {seed})"
    return make


def _foreign(path: Path, _store: Path) -> None:
    sql(
        path,
        "create table invoices (id integer primary key, amount real)",
        "insert into invoices values (1, 9.5)",
    )


def _foreign_alembic(path: Path, _store: Path) -> None:
    _foreign(path, _store)
    sql(
        path,
        "create table alembic_version (version_num varchar(32) primary key)",
        "insert into alembic_version values ('a1b2c3d4')",
    )


def _newer(path: Path, store: Path) -> None:
    shutil.copy(store, path)
    sql(path, "update alembic_version set version_num = '9000_from_the_future'")


CASES: list[tuple[str, Callable[[Path, Path], None], str | None]] = [
    # (name, how the file is made, what the refusal must say; None: may also be read)
    ("junk", _junk, "not an SQLite database"),
    ("truncated header", _truncated(0.0001), None),
    *((f"truncated {f:.0%}", _truncated(f), None) for f in (0.1, 0.5, 0.9)),
    *((f"flipped {seed}", _flipped(seed), None) for seed in range(6)),
    ("foreign", _foreign, "another application's database"),
    ("foreign alembic", _foreign_alembic, "another application's database"),
    ("newer", _newer, "a newer Muster wrote it"),
]

READERS = [
    ["history", "workload", "vision/sweep-trial-1"],
    ["history", "queue", "vision", "--since", "2020-01-01"],
    ["history", "preemptions", "--since", "2020-01-01"],
    ["db", "current"],
]
WRITERS = [["db", "upgrade"], ["db", "downgrade", "base", "--yes"]]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def invoke(args: list[str]) -> Result:
    result = CliRunner().invoke(main, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: {type(result.exception).__name__}") from result.exception
    assert "Traceback" not in result.output, result.output
    return result


def assert_clear(result: Result, path: Path, needle: str | None) -> None:
    """Refused with a message that names the file (and says `needle`), or succeeded."""
    if needle is not None:
        assert result.exit_code == 1, result.output
    if result.exit_code != 0:
        assert result.exit_code == 1, result.output
        assert "Error: history store at" in result.output, result.output
        assert path.name in result.output, result.output
        if needle is not None:
            assert needle in result.output, result.output


@pytest.mark.parametrize(("name", "make", "needle"), CASES, ids=[c[0] for c in CASES])
def test_every_command_refuses_a_bad_file_by_name_and_leaves_it_as_it_was(
    tmp_path: Path,
    recorded: Path,
    name: str,
    make: Callable[[Path, Path], None],
    needle: str | None,
) -> None:
    path = tmp_path / (name.replace(" ", "-").replace("%", "pc") + ".db")
    make(path, recorded)
    before = digest(path)
    for args in READERS:
        assert_clear(invoke([*args, "--database-url", str(path)]), path, needle)
        assert digest(path) == before, (args, "a reader changed the file")
    for args in WRITERS:
        result = invoke([*args, "--database-url", str(path)])
        assert_clear(result, path, needle)
        if result.exit_code != 0:
            assert digest(path) == before, (args, "a refused write changed the file")
        else:  # a store still usable, which a write may change: made again for the next
            for leftover in tmp_path.glob(f"{path.name}*"):
                leftover.unlink()
            make(path, recorded)
    # The simulator checks the store before it simulates: nothing is printed, nothing written.
    sim = invoke(["simulate", "--history", str(path), str(SCENARIO)])
    assert_clear(sim, path, needle)
    if sim.exit_code != 0:
        assert digest(path) == before
        assert "Job" not in sim.output  # refused before the run, not after its report
    # The same with the store --out gives it.
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(path, out / "history.db")
    assert_clear(invoke(["simulate", "--out", str(out), str(SCENARIO)]), out / "history.db", needle)


def test_rows_a_reader_cannot_parse_are_skipped_by_name_and_the_rest_is_answered(
    tmp_path: Path, recorded: Path
) -> None:
    path = tmp_path / "rows.db"
    shutil.copy(recorded, path)
    ids = [int(str(r[0])) for r in sql(path, "select id from preemption_decisions order by id")]
    total = len(ids)
    first = sql(path, "select id, namespace || '/' || name from workload_transitions limit 1")[0]
    sql(
        path,
        ("update preemption_decisions set victims = '{oops' where id = ?", (ids[0],)),
        ("update preemption_decisions set strategy = 'bogus' where id = ?", (ids[1],)),
        ("update preemption_decisions set victims = '[1, 2]' where id = ?", (ids[2],)),
        ("update workload_transitions set kind = 'exploded' where id = ?", (first[0],)),
        (
            "update workload_transitions set resources = 'garbage' where "
            "namespace || '/' || name = ? and kind = 'finished'",
            (first[1],),
        ),
        "update queue_samples set usage = 'lots' where id = "
        "(select min(id) from queue_samples where cluster_queue = 'vision')",
        # A NULL where the schema requires a value: SQLite keeps one once the schema is edited.
        "pragma writable_schema = on",
        "update sqlite_master set sql = replace(sql, 'reason TEXT NOT NULL', 'reason TEXT') "
        "where name = 'preemption_decisions'",
    )
    sql(path, ("update preemption_decisions set reason = NULL where id = ?", (ids[3],)))
    before = digest(path)

    url = ["--database-url", str(path)]
    out = invoke(["history", "preemptions", "--since", "2020-01-01", "-o", "json", *url])
    assert out.exit_code == 0, out.output
    warnings = [line for line in out.output.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 4, warnings
    for row, why in zip(
        ids[:4],
        ("cannot be read", "'bogus' is not", "must be a JSON list", "is NULL where"),
        strict=True,
    ):
        assert any(f"preemption_decisions row id={row}: " in w and why in w for w in warnings)
    assert all(path.name in w for w in warnings)
    body = "\n".join(line for line in out.output.splitlines() if not line.startswith("Warning:"))
    assert len(json.loads(body)) == total - 4

    timeline = invoke(["history", "workload", str(first[1]), *url])
    assert timeline.exit_code == 0, timeline.output
    assert "'exploded' is not a transition kind" in timeline.output
    assert "column resources cannot be read" in timeline.output
    assert "admitted" in timeline.output  # the rows around them are shown

    queue = invoke(["history", "queue", "vision", "--since", "2020-01-01", *url])
    assert queue.exit_code == 0, queue.output
    assert "queue_samples row id=" in queue.output and "not a number" in queue.output
    assert "nvidia.com/gpu" in queue.output
    assert digest(path) == before


def _transition(i: int) -> WorkloadTransition:
    return WorkloadTransition(
        namespace="team-a",
        name=f"job-{i}",
        uid=f"uid-{i}",
        kind=TransitionKind.CREATED,
        at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i),
    )


@pytest.mark.parametrize("make", [_junk, _foreign, _foreign_alembic, _newer])
def test_the_controller_names_a_store_it_cannot_use_writes_nothing_and_keeps_the_records(
    tmp_path: Path,
    recorded: Path,
    make: Callable[[Path, Path], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "history.db"
    make(path, recorded)
    before = digest(path)
    store = HistoryStore(
        HistorySettings(url=parse_database_url(str(path)), spool_dir=tmp_path / "spool")
    )
    with caplog.at_level(logging.ERROR, logger="controllers.history.store"):
        store.start()
        store.record_later(lambda: [_transition(i) for i in range(5)])
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.05)
        # Time for the recorder to write, if it wrongly would.
        time.sleep(0.5)
        store.close(drain_timeout_s=0.5)
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(f"history store at sqlite:///{path}" in m for m in messages), messages
    assert not store.migrated.is_set()
    assert digest(path) == before
    # The records wait in the spool for a store this Muster can use.
    spooled = sum(len(p.read_text().splitlines()) for p in (tmp_path / "spool").glob("segment-*"))
    assert spooled == 5


def test_a_spool_line_cut_short_is_set_aside_and_the_rest_is_stored(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'h.db'}")
    migrate.upgrade(engine)
    spool = tmp_path / "spool"
    spool.mkdir()
    lines = [spool_line(_transition(i)) for i in range(3)]
    # A crash mid-write: the middle record cut short, and a line that is JSON of no record.
    (spool / "segment-000000000000.jsonl").write_text(
        lines[0] + lines[1][:25] + "\n" + '{"type": "transition", "kind": "bogus"}\n' + lines[2]
    )
    with HistoryRecorder(engine, spool) as recorder:
        assert recorder.flush(10)
    names = sql(tmp_path / "h.db", "select name from workload_transitions order by name")
    assert names == [("job-0",), ("job-2",)]
    rejected = (spool / "rejected.jsonl").read_text().splitlines()
    assert len(rejected) == 2
    assert "unreadable_spool_line" in rejected[0] and "bogus" in rejected[1]
    engine.dispose()


def test_time_based_fair_share_reads_past_a_sample_that_is_not_a_number(
    tmp_path: Path, recorded: Path
) -> None:
    path = tmp_path / "samples.db"
    shutil.copy(recorded, path)
    engine = make_engine(f"sqlite:///{path}")
    now = datetime(2025, 1, 7, tzinfo=UTC)
    window = timedelta(days=7)
    before = decayed_usage_by_queue(engine, now=now, window=window, half_life=timedelta(days=1))
    sql(
        path,
        "update queue_samples set usage = 'lots' where id = (select min(id) from queue_samples)",
    )
    after = decayed_usage_by_queue(engine, now=now, window=window, half_life=timedelta(days=1))
    engine.dispose()
    assert set(after) == set(before) and after != before  # one sample less, the rest read
