"""`muster local-cluster ... --name NAME`: which directory a name picks, what is refused
(a name that is not a DNS label, --name with --dir) and how, `list`, and the names that keep
two clusters apart (their kubeconfigs' contexts, the real node's owner)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from controllers.cli.localcluster import local_cluster
from controllers.localcluster import pki, realnode
from controllers.localcluster.cluster import ClusterState, Component, known_clusters
from controllers.localcluster.names import check_name, clusters_dir, context_name, named_dir
from controllers.main import main


@pytest.fixture
def parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Clusters live beside the default one, here under tmp_path."""
    monkeypatch.setenv("MUSTER_LOCAL_CLUSTER_DIR", str(tmp_path / "default"))
    return tmp_path


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(main, list(args))


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _started(directory: Path, alive: dict[str, bool]) -> None:
    """A state file as `up` leaves it, its components alive (this process) or not."""
    directory.mkdir(parents=True)
    (directory / "kubeconfig").write_text("apiVersion: v1\n")
    ClusterState(
        directory=str(directory),
        api_port=1,
        components=[
            Component(name, os.getpid() if up else _dead_pid(), f"{name}.log")
            for name, up in alive.items()
        ],
    ).save()


def test_a_name_is_the_directory_beside_the_default_cluster(parent: Path) -> None:
    assert clusters_dir() == parent.resolve()
    assert named_dir("gpu-west") == parent.resolve() / "gpu-west"
    assert named_dir("default") == (parent / "default").resolve()
    _started(parent / "gpu-west", {"etcd": True})
    result = run("local-cluster", "env", "--name", "gpu-west")
    assert result.exit_code == 0, result.output
    kubeconfig = parent.resolve() / "gpu-west" / "kubeconfig"
    assert result.output.splitlines()[0] == f"export KUBECONFIG={kubeconfig}"


@pytest.mark.parametrize("name", ["Gpu", "gpu_west", "-gpu", "gpu-", "a.b", "", "x" * 64, "../x"])
def test_a_name_that_is_not_a_dns_label_is_a_usage_error_without_traceback(
    parent: Path, name: str
) -> None:
    with pytest.raises(ValueError, match="not a valid cluster name: a DNS label"):
        check_name(name)
    for command in ("up", "down", "status", "env", "nodes"):
        result = run("local-cluster", command, "--name", name)
        assert result.exit_code == 2, (command, result.output)
        assert "Invalid value for '--name'" in result.output
        assert "DNS label" in result.output
        assert not isinstance(result.exception, ValueError)  # click's, not a traceback
    assert not any(parent.iterdir())  # nothing was created


def test_name_and_dir_together_is_a_usage_error_naming_both(parent: Path) -> None:
    for command in ("up", "down", "status", "env", "nodes"):
        result = run("local-cluster", command, "--name", "a", "--dir", str(parent / "b"))
        assert result.exit_code == 2, (command, result.output)
        assert "--name and --dir" in result.output
    assert run("down", "--name", "a", "--dir", str(parent / "b")).exit_code == 2


def test_every_command_that_takes_dir_takes_name() -> None:
    import controllers.up.command as up_command

    commands = [c for c in local_cluster.commands.values()] + [up_command.up, up_command.down]
    with_dir = [c for c in commands if any(p.name == "directory" for p in c.params)]
    assert {c.name for c in with_dir} >= {"up", "down", "status", "env", "nodes"}
    for command in with_dir:
        options = {o for p in command.params for o in p.opts}
        assert {"--dir", "--name"} <= options, command.name


def test_a_named_cluster_not_started_says_so_and_how_to_start_it(parent: Path) -> None:
    status = run("local-cluster", "status", "--name", "idle")
    assert status.exit_code == 1
    assert f"no local cluster has been started in {parent.resolve() / 'idle'}" in status.output
    env = run("local-cluster", "env", "--name", "idle")
    assert env.exit_code == 1 and "muster local-cluster up --name idle" in env.output
    nodes = run("local-cluster", "nodes", "--name", "idle")
    assert nodes.exit_code == 1 and "muster local-cluster up --name idle" in nodes.output
    assert run("local-cluster", "down", "--name", "idle").output == "nothing was running\n"


def test_list_shows_each_cluster_with_its_state_and_directory(parent: Path) -> None:
    assert run("local-cluster", "list").output == (
        f"no local clusters in {parent.resolve()} (`muster local-cluster up --name NAME`)\n"
    )
    _started(parent / "default", {"etcd": False, "kube-apiserver": False})
    _started(parent / "west", {"etcd": True, "kube-apiserver": True})
    _started(parent / "east", {"etcd": True, "kube-apiserver": False})
    (parent / "not-a-cluster").mkdir()  # no state file: never started, not listed
    result = run("local-cluster", "list")
    assert result.exit_code == 0, result.output
    lines = [line.split(None, 1) for line in result.output.splitlines()]
    assert [line[0] for line in lines] == ["NAME", "default", "east", "west"]
    assert lines[1][1].startswith("stopped")
    assert lines[2][1].startswith("partly running (kube-apiserver stopped)")
    assert lines[3][1].startswith("running")
    assert lines[3][1].endswith(str(parent / "west"))
    assert [c.name for c in known_clusters()] == ["default", "east", "west"]


def test_each_cluster_has_its_own_kubeconfig_context(tmp_path: Path) -> None:
    assert context_name(tmp_path / "default") == "muster-local"
    assert context_name(tmp_path / "gpu-west") == "muster-local-gpu-west"
    ca = pki.CertificateAuthority(tmp_path / "pki")
    admin = ca.issue("admin", "muster-admin", "system:masters")
    path = pki.write_kubeconfig(
        tmp_path / "kc", "https://127.0.0.1:1", ca.cert_path, admin, "a", context="muster-local-x"
    )
    config = yaml.safe_load(path.read_text())
    assert config["current-context"] == "muster-local-x"
    assert config["contexts"][0] == {
        "name": "muster-local-x",
        "context": {"cluster": "muster-local-x", "user": "a"},
    }
    assert config["clusters"][0]["name"] == "muster-local-x"


def test_a_second_real_node_is_refused_naming_the_cluster_that_has_it(
    parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = parent / "claim.json"
    monkeypatch.setattr(realnode, "CLAIM", claim)
    owner = named_dir("gpu-west")
    realnode.claim(owner, lambda _owner: True)
    assert json.loads(claim.read_text())["directory"] == str(owner)
    with pytest.raises(realnode.RealNodeError) as refused:
        realnode.claim(named_dir("other"), lambda _owner: True)
    message = str(refused.value)
    assert f"belongs to the local cluster in {owner} (named gpu-west)" in message
    assert "muster local-cluster down --name gpu-west" in message
    # Its owner gone, the node may be taken.
    realnode.claim(named_dir("other"), lambda _owner: False)
    assert realnode.owns(named_dir("other"))
    # A cluster elsewhere is named by its directory.
    elsewhere = parent / "x" / "y"
    realnode.claim(elsewhere, lambda _owner: False)
    with pytest.raises(realnode.RealNodeError, match=f"down --dir {elsewhere}`"):
        realnode.claim(named_dir("other"), lambda _owner: True)
