"""Several local clusters side by side, driven as a user drives them: `muster local-cluster
up --name A`, then `--name B` while A runs, a kwok node in each, and each apiserver sees its
own node only; `list` shows both running, `down --name` stops each.

The clusters live under a temporary parent ($MUSTER_LOCAL_CLUSTER_DIR's parent is where
`--name` puts them), never beside the developer's own, and are downed however the test ends;
the suite's shared cluster is not touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from controllers.localcluster.cluster import LocalCluster, pid_alive

pytestmark = pytest.mark.e2e

MUSTER = [sys.executable, "-m", "controllers.main"]


def muster(
    env: dict[str, str], *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MUSTER, *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[dict[str, str], list[str]]]:
    """The environment that puts named clusters under tmp_path, two fresh names, and both
    clusters downed at the end (by the command, then by pid should it fail)."""
    env = dict(os.environ, MUSTER_LOCAL_CLUSTER_DIR=str(tmp_path / "clusters" / "default"))
    names = [f"t-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    try:
        yield env, names
    finally:
        for name in names:
            down = muster(env, "local-cluster", "down", "--name", name, timeout=120)
            if down.returncode != 0:
                LocalCluster(tmp_path / "clusters" / name).down()


def kubectl(kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = LocalCluster(Path(kubeconfig).parent).binaries["kubectl"]
    return subprocess.run(
        [binary, "--kubeconfig", kubeconfig, *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


def test_two_named_clusters_run_side_by_side_and_stay_apart(
    two: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    env, names = two
    parent = (tmp_path / "clusters").resolve()
    for name in names:  # the second while the first runs
        up = muster(env, "local-cluster", "up", "--name", name)
        assert up.returncode == 0, up.stderr
        assert f"local cluster is up ({parent / name})" in up.stderr
    # A name that runs already is refused, naming how to stop it.
    again = muster(env, "local-cluster", "up", "--name", names[0])
    assert again.returncode == 1
    assert f"muster local-cluster down --name {names[0]}" in again.stderr
    assert "Traceback" not in again.stderr

    kubeconfigs: dict[str, str] = {}
    for name in names:
        printed = muster(env, "local-cluster", "env", "--name", name)
        assert printed.returncode == 0, printed.stderr
        export = printed.stdout.splitlines()[0]
        kubeconfigs[name] = export.removeprefix("export KUBECONFIG=")
        assert kubeconfigs[name] == str(parent / name / "kubeconfig")
        made = muster(
            env, "local-cluster", "nodes", "--name", name, "--label", f"muster-e2e/cluster={name}"
        )
        assert made.returncode == 0, made.stderr
        # The same first name in each: neither apiserver holds the other's node.
        assert made.stdout.split() == ["node-0"]
    for name in names:
        nodes = json.loads(kubectl(kubeconfigs[name], "get", "nodes", "-o", "json").stdout)
        assert [
            (n["metadata"]["name"], n["metadata"]["labels"]["muster-e2e/cluster"])
            for n in nodes["items"]
        ] == [("node-0", name)]

    # Apart in every way two clusters could collide: ports, certificate authorities,
    # kubeconfig contexts (so the two files merge), logs.
    configs = {n: yaml.safe_load(Path(kc).read_text()) for n, kc in kubeconfigs.items()}
    servers = {n: c["clusters"][0]["cluster"]["server"] for n, c in configs.items()}
    assert len(set(servers.values())) == 2
    first, second = names
    foreign = kubectl(kubeconfigs[first], "--server", servers[second], "get", "nodes", check=False)
    assert foreign.returncode != 0 and "certificate" in foreign.stderr, foreign.stderr
    merged = subprocess.run(
        [
            LocalCluster(parent / first).binaries["kubectl"],
            "config",
            "get-contexts",
            "-o",
            "name",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=dict(env, KUBECONFIG=os.pathsep.join(kubeconfigs.values())),
    )
    assert sorted(merged.stdout.split()) == sorted(f"muster-local-{n}" for n in names)
    states = {n: LocalCluster(parent / n).state for n in names}
    logs = {Path(c.log).parent for s in states.values() if s for c in s.components}
    assert logs == {parent / n / "logs" for n in names}
    for name in names:
        status = muster(env, "local-cluster", "status", "--name", name)
        assert status.returncode == 0, status.stdout
        assert status.stdout.count("healthy") == 5

    listed = muster(env, "local-cluster", "list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()}
    for name in names:
        assert rows[name] == [name, "running", str(parent / name)]

    pids = [c.pid for s in states.values() if s for c in s.components]
    for name in names:
        down = muster(env, "local-cluster", "down", "--name", name, timeout=120)
        assert down.returncode == 0, down.stderr
        assert "kube-apiserver" in down.stdout
    assert not [pid for pid in pids if pid_alive(pid)]
    listed = muster(env, "local-cluster", "list")
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()}
    assert [rows[n][1] for n in names] == ["stopped", "stopped"]
