"""Nothing recorded is lost by a kill -9 (issue 16, hole 7), on SQLite and real PostgreSQL.

A separate process records history, is told nothing, and is killed with SIGKILL: once before
any record reached the database (its writer held back by a busy section, as during an
admission cycle), once in the middle of writing them. A recorder started on the same spool
directory then stores every record, each once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from controllers.history.recorder import HistoryRecorder
from tests.integration.conftest import Store
from tests.integration.test_history_recorder import stored_keys, transitions

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import sys, time
    from sqlalchemy.engine import make_url
    from controllers.history.engine import make_engine
    from controllers.history.recorder import HistoryRecorder
    from tests.integration.test_history_recorder import transitions

    url, spool, count, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "hold"
    recorder = HistoryRecorder(make_engine(make_url(url)), spool, batch_size=50).start()
    if hold:
        # The admission loop is busy: the writer waits, so nothing reaches the database.
        section = recorder.busy()
        section.__enter__()
    for i, record in enumerate(transitions(count)):
        recorder.record(record) if i % 2 else recorder.record_later(lambda r=record: [r])
    print("recorded", flush=True)
    time.sleep(600)
    """
)


def run_and_kill(store: Store, spool: Path, count: int, *, hold: bool) -> None:
    """Record `count` transitions in a child process, then SIGKILL it."""
    url = store.url.render_as_string(hide_password=False)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(spool), str(count), "hold" if hold else "go"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == b"recorded", f"the child did not record: {line!r}"
        if not hold:
            # Kill it while it is writing: some records stored, some not yet.
            deadline = time.monotonic() + 30
            while store.count("workload_transitions") == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("hold", [True, False], ids=["before-any-write", "mid-write"])
def test_records_survive_a_kill_9_and_are_replayed_once(
    migrated: Store, tmp_path: Path, hold: bool
) -> None:
    spool = tmp_path / "spool"
    count = 3000
    run_and_kill(migrated, spool, count, hold=hold)
    before = migrated.count("workload_transitions")
    if hold:
        assert before == 0, "the killed process wrote nothing to the database"
    else:
        assert before < count, "killed before it had written everything"

    with HistoryRecorder(migrated.engine, spool) as restarted:
        # Counted on start; the writer may have stored a batch already, so not the backlog.
        assert restarted.replayed >= count - before
        assert restarted.flush(120), f"backlog stuck at {restarted.backlog}"
    keys = stored_keys(migrated.engine)
    assert len(keys) == len(set(keys)) == count
    assert set(keys) == {(r.uid, r.kind.value, r.sequence) for r in transitions(count)}
    assert not list(spool.glob("segment-*.jsonl")), "a drained spool is removed"
