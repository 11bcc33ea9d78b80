"""The local control plane behaves like a real cluster: Jobs run to completion on kwok nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from controllers.localcluster.cluster import LocalCluster, pid_alive
from tests.conftest import ClusterHandle

pytestmark = pytest.mark.e2e


def test_job_with_three_pods_runs_to_completion_on_two_kwok_nodes(
    cluster: ClusterHandle, namespace: str
) -> None:
    nodes = cluster.nodes(2, cpu="4", memory="8Gi", labels={"pool": "e2e-basic"})
    job = textwrap.dedent(
        f"""
        apiVersion: batch/v1
        kind: Job
        metadata:
          name: hello
          namespace: {namespace}
        spec:
          parallelism: 3
          completions: 3
          template:
            metadata:
              annotations:
                pod-complete.stage.kwok.x-k8s.io/delay: "2s"
            spec:
              restartPolicy: Never
              nodeSelector:
                pool: e2e-basic
              containers:
              - name: main
                image: busybox
                resources:
                  requests:
                    cpu: "1"
                    memory: 1Gi
        """
    )
    cluster.kubectl("apply", "-f", "-", input=job)

    def pods() -> list[dict[str, object]]:
        data = cluster.get_json("pods", "-n", namespace, "-l", "job-name=hello")
        return data["items"]  # type: ignore[return-value]

    # The Job controller (kube-controller-manager) creates the pods ...
    cluster.wait_for("3 pods created by the Job controller", lambda: len(pods()) == 3)
    # ... the scheduler binds them to our two nodes, and kwok runs and completes them.
    cluster.kubectl(
        "wait",
        "--for=condition=Complete",
        "job/hello",
        "-n",
        namespace,
        "--timeout=90s",
        timeout=100,
    )
    placed = {p["spec"]["nodeName"] for p in pods()}  # type: ignore[index]
    assert placed <= set(nodes) and placed
    phases = [p["status"]["phase"] for p in pods()]  # type: ignore[index]
    assert phases == ["Succeeded"] * 3
    status = cluster.get_json("job", "hello", "-n", namespace)["status"]
    assert status["succeeded"] == 3  # type: ignore[index]


def test_native_gang_api_is_served(cluster: ClusterHandle) -> None:
    resources = cluster.kubectl("api-resources", "--api-group=scheduling.k8s.io", "-o", "name")
    assert "podgroups.scheduling.k8s.io" in resources.stdout.split()
    assert "workloads.scheduling.k8s.io" in resources.stdout.split()


def test_cli_up_status_env_nodes_down_leaves_no_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The commands a user types: up, env, kubectl get nodes, status, down."""
    directory = tmp_path / "cli-cluster"
    muster = [sys.executable, "-m", "controllers.main"]
    env = dict(os.environ)
    up = subprocess.run(
        [*muster, "local-cluster", "up", "--dir", str(directory)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    try:
        assert up.returncode == 0, up.stderr
        # `up` ends with what `env` prints: the kubeconfig, then the cluster's kubectl on PATH.
        lines = up.stdout.strip().splitlines()
        export, path = lines[-2], lines[-1]
        assert export.startswith("export KUBECONFIG=")
        assert path.startswith("export PATH=") and '"$PATH"' in path
        kubeconfig = export.split("=", 1)[1]
        printed = subprocess.run(
            [*muster, "local-cluster", "env", "--dir", str(directory)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert printed.stdout.strip() == f"{export}\n{path}"
        # eval'ed, it puts the kubectl built for this cluster first on PATH.
        shell = subprocess.run(
            ["bash", "-c", f"{printed.stdout}\ncommand -v kubectl"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert shell.stdout.strip().startswith(str(Path.home() / ".cache" / "muster")) or (
            os.environ.get("MUSTER_K8S_BIN") or os.environ.get("KUBEBUILDER_ASSETS")
        ), shell.stdout
        made = subprocess.run(
            [
                *muster,
                "local-cluster",
                "nodes",
                "--dir",
                str(directory),
                "--count",
                "2",
                "--cpu",
                "8",
                "--memory",
                "64Gi",
                "--gpu",
                "8",
                "--label",
                "pool=h100",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert made.returncode == 0, made.stderr
        local = LocalCluster(directory)
        got = subprocess.run(
            [local.binaries["kubectl"], "get", "nodes", "-l", "pool=h100", "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
            env={**env, "KUBECONFIG": kubeconfig},
        )
        items = json.loads(got.stdout)["items"]
        assert len(items) == 2
        assert all(i["status"]["allocatable"]["nvidia.com/gpu"] == "8" for i in items)
        status = subprocess.run(
            [*muster, "local-cluster", "status", "--dir", str(directory)],
            capture_output=True,
            text=True,
        )
        assert status.returncode == 0, status.stdout
        assert status.stdout.count("healthy") == 5
        pids = [c.pid for c in local.state.components]  # type: ignore[union-attr]
    finally:
        down = subprocess.run(
            [*muster, "local-cluster", "down", "--dir", str(directory)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in pids if pid_alive(pid)]
