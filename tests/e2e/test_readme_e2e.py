"""The README's local-cluster walkthrough, run literally, line for line, in one bash shell.

A new user's first minutes: if a command in that block stops working, or Muster stops
admitting, placing and binding the example Job as the README says, this test fails. It runs
the block in a cluster of its own (MUSTER_LOCAL_CLUSTER_DIR), with the controller's log kept,
and checks what the README promises: both pods bound by muster-scheduler to one h100 node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e

SECTION = "## A real local cluster, with Muster on it"
CHART_SECTION = "## Install into a cluster with the chart"


def walkthrough(title: str = SECTION) -> list[str]:
    """The shell lines of one README section, as a user would type them."""
    text = (REPO / "README.md").read_text()
    section = text.split(title, 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [line for line in block.splitlines() if line.strip()]


def test_the_readme_walkthrough_works_when_followed_literally(tmp_path: Path) -> None:
    lines = walkthrough()
    assert lines[0].startswith(".venv/bin/muster local-cluster up")
    assert lines[-1].startswith(".venv/bin/muster local-cluster down")
    # Everything up to the final `down`, then our checks, then `down` — and `down` also when
    # a line fails, so a broken walkthrough never leaves a cluster behind.
    body, down = lines[:-1], lines[-1]
    check = f"kubectl get pods -n team-b -l job-name=train -o json > {tmp_path}/pods.json"
    script = "\n".join(
        ["set -euo pipefail", f"trap '{down.split('#')[0].strip()}' EXIT"]
        + [line for line in body if not line.startswith("kill %1")]
        + [check, "kill %1 || true"]
    )
    env = dict(os.environ, MUSTER_LOCAL_CLUSTER_DIR=str(tmp_path / "cluster"))
    env.pop("KUBECONFIG", None)
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    log = Path("/tmp/muster-controller.log")
    assert result.returncode == 0, (
        result.stdout[-3000:]
        + result.stderr[-3000:]
        + (log.read_text()[-3000:] if log.exists() else "")
    )
    pods = json.loads((tmp_path / "pods.json").read_text())["items"]
    assert len(pods) == 2
    assert {p["spec"]["schedulerName"] for p in pods} == {"muster-scheduler"}
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 1 and next(iter(nodes)).startswith("h100"), nodes
    assert "NAME" in result.stdout and "team-b" in result.stdout  # the `kubectl get` lines ran


def test_the_readme_chart_walkthrough_works_when_followed_literally(tmp_path: Path) -> None:
    """On the real node, nothing out of cluster: helm install, both replicas Ready, a Job that
    waits and `kubectl muster explain` saying why, nodes arriving, `kubectl muster queues`,
    /metrics through the metrics Service, a Job whose containers really run, uninstall."""
    lines = walkthrough(CHART_SECTION)
    assert lines[0].startswith(".venv/bin/muster local-cluster up --real-node")
    assert lines[-1].startswith(".venv/bin/muster local-cluster down")
    body, down = lines[:-1], lines[-1]
    script = "\n".join(["set -euo pipefail", f"trap '{down.split('#')[0].strip()}' EXIT", *body])
    env = dict(os.environ, MUSTER_LOCAL_CLUSTER_DIR=str(tmp_path / "cluster"))
    env.pop("KUBECONFIG", None)
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # Two replicas Running and Ready on the real node (kubectl get pods -o wide).
    rows = [line.split() for line in out.splitlines() if line.startswith("muster-")]
    assert len(rows) >= 2 and all(r[1] == "1/1" and r[2] == "Running" for r in rows[:2]), out
    # The Lease names one of them.
    assert any(line.strip() in {r[0] for r in rows[:2]} for line in out.splitlines()), out
    # explain, before any GPU node: waiting, with the engine's reason.
    assert "Job team-b/train" in out and "waiting for quota" in out
    # queues, after: team-b holds the Job's 4 GPUs.
    assert "team-b" in out and "h100 nvidia.com/gpu: 4 / 8 used" in out
    # /metrics through the Service: a replica saying whether it leads.
    assert re.search(r"^muster_leader [01]\.0$", out, re.M), out
    # The real Job's containers ran on the real node and printed their answer.
    assert out.count("2298025") == 2, out[-2000:]
