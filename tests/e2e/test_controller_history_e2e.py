"""The controller's history, end to end: a labelled Job runs to completion under a controller
with an SQLite history store, `muster history workload` (run as a user runs it) tells its
story in order, and a restarted controller, which replays what the cluster shows, stores none
of it twice."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    MUSTER,
    Controller,
    apply,
    crds,  # noqa: F401 - fixture
    create,
    finished,
    flavor,
    job,
    local_queue,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e


def history_of(url: str, namespace: str, name: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [MUSTER, "history", "workload", f"{namespace}/{name}", "--database-url", url, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode != 0:
        # Before the controller's first write the schema may not exist yet.
        assert "has no schema" in out.stderr, out.stderr
        return []
    entries: list[dict[str, Any]] = json.loads(out.stdout)
    return entries


def test_history_tells_a_jobs_story_once_across_a_restart(
    cluster: ClusterHandle,
    namespace: str,
    crds: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    store_args = ("--database-url", url, "--history-spool-dir", str(tmp_path / "spool"))
    ctl = Controller(cluster, tmp_path, unique("hist"), *store_args).start()
    try:
        ctl.wait_leading()
        pool = unique("hist")
        cluster.nodes(1, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
        cq = unique("cq")
        apply(
            cluster,
            flavor(pool, pool),
            cq_manifest(cq, [{"name": pool, "quota": {"cpu": "2"}}]),
            local_queue("team", namespace, cq),
        )
        create(cluster, job("train", namespace, "team", cpu="2", runs_for="2s"))
        cluster.wait_for(
            "the Job's Workload to be Finished",
            lambda: any(finished(w) for w in workloads_of(cluster, namespace, "train")),
            timeout=40,
        )
        [wl] = workloads_of(cluster, namespace, "train")
        name = wl["metadata"]["name"]
        cluster.wait_for(
            "the finish to reach the history store",
            lambda: "finished" in [e["event"] for e in history_of(url, namespace, name)],
            timeout=20,
            interval=1.0,
        )
    finally:
        ctl.stop()

    story = history_of(url, namespace, name)
    assert [e["event"] for e in story] == ["created", "admitted", "placed", "finished"], story
    created, admitted, placed, done = story
    assert created["local_queue"] == "team" and created["cluster_queue"] == cq
    assert admitted["cluster_queue"] == cq and admitted["local_queue"] == "team"
    assert admitted["flavors"] == {"cpu": pool} and admitted["resources"] == {"cpu": 2000}
    assert admitted["reason"], "an admission says why"
    assert done["reason"] == "Succeeded: the Job completed"
    assert placed["detail"]["nodes"] and placed["reason"].startswith("placed 1 pod on ")
    assert created["at"] <= admitted["at"] <= placed["at"] <= done["at"]

    # A new controller replays every Workload's transitions from what the cluster shows; the
    # store keeps the first recording of each.
    again = Controller(cluster, tmp_path, unique("hist-again"), *store_args).start()
    try:
        again.wait_leading()
        cluster.wait_for(
            "the new leader to replay the history",
            lambda: any(
                r.get("workloads", 0) >= 1
                for r in again.logged("history: replaying what the cluster shows")
            ),
            timeout=20,
        )
    finally:
        # A graceful stop writes everything recorded before it exits.
        assert again.stop() == 0
    replayed = history_of(url, namespace, name)
    assert Counter(e["event"] for e in replayed) == {
        "created": 1,
        "admitted": 1,
        "placed": 1,
        "finished": 1,
    }
    assert replayed == story
