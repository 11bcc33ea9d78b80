"""The chaos run, short and with a fixed seed, as a user runs it (`python bench/chaos.py`):
two controller replicas on the session's local cluster and PostgreSQL, leaders killed with
SIGKILL or paused until deposed, PostgreSQL stopped for 30 s, the apiserver restarted once.
The run's own checker decides; this test asserts what it printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, ClusterHandle


def test_a_short_chaos_run_finds_no_violation_and_loses_no_record(
    cluster: ClusterHandle, tmp_path: Path
) -> None:
    out = tmp_path / "chaos.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "chaos.py"),
            "--seed",
            "7",
            "--duration",
            "90",
            "--kill-every",
            "12",
            "18",
            "--pg-outage",
            "30",
            "--drain-timeout",
            "60",
            "--cluster-dir",
            str(cluster.local.directory),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert out.exists(), (
        f"the chaos run did not finish:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    )
    report = json.loads(out.read_text())
    printed = run.stdout[-4000:]
    print(printed)
    assert report["kills"] >= 2 and report["kills_survived"] == report["kills"], printed
    assert report["pauses"] >= 1 and report["pauses_survived"] == report["pauses"], printed
    assert report["apiserver_restarted"] and report["pg_outage_s"] == 30, printed
    assert report["jobs_run"] >= 10, printed
    assert report["transitions_seen"] > 0, printed
    assert report["records_lost"] == 0 and report["records_twice"] == 0, printed
    assert report["violations"] == {}, printed
    assert run.returncode == 0, printed
