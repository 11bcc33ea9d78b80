"""`LocalCluster.down` stops what the state file says now, not only what it loaded: a
component restarted by another process (the chaos run restarts the apiserver) must not be
left running."""

from __future__ import annotations

import subprocess
from pathlib import Path

from controllers.localcluster.cluster import ClusterState, Component, LocalCluster, pid_alive


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"], start_new_session=True)


def test_down_stops_a_component_another_process_restarted(tmp_path: Path) -> None:
    first, kept = _sleeper(), _sleeper()
    state = ClusterState(
        directory=str(tmp_path),
        api_port=1,
        components=[
            Component("etcd", kept.pid, "etcd.log"),
            Component("kube-apiserver", first.pid, "a.log"),
        ],
    )
    state.save()
    cluster = LocalCluster(tmp_path)  # loads the state as it is now
    # Another process restarts the apiserver and records its new pid.
    first.terminate()
    first.wait()
    restarted = _sleeper()
    state.components[1].pid = restarted.pid
    state.save()
    stopped = cluster.down(grace=5)
    for proc in (kept, restarted):
        proc.wait(timeout=10)
    assert not pid_alive(kept.pid) and not pid_alive(restarted.pid)
    assert sorted(stopped) == ["etcd", "kube-apiserver"]


def test_a_component_started_later_keeps_a_restart_another_process_recorded(
    tmp_path: Path,
) -> None:
    first = _sleeper()
    ClusterState(
        directory=str(tmp_path),
        api_port=1,
        components=[Component("kube-apiserver", first.pid, "a.log")],
    ).save()
    cluster = LocalCluster(tmp_path)
    first.terminate()
    first.wait()
    restarted = _sleeper()
    ClusterState(
        directory=str(tmp_path),
        api_port=1,
        components=[Component("kube-apiserver", restarted.pid, "a.log")],
    ).save()
    # This object saves its state when it starts a peer: the restart must survive that.
    (tmp_path / "logs").mkdir()  # made by `up`
    cluster.start_component("peer", ["sleep", "300"], None, {})
    on_disk = ClusterState.load(tmp_path)
    assert on_disk is not None
    assert {c.name: c.pid for c in on_disk.components}["kube-apiserver"] == restarted.pid
    assert sorted(cluster.down(grace=5)) == ["kube-apiserver", "peer"]
    restarted.wait(timeout=10)
    assert not pid_alive(restarted.pid)
