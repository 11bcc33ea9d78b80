"""The README's first section, followed literally: `make run`, watch, Ctrl-C, `muster down`.

A new user's first minutes: the one command must start a real local cluster whose real node
runs Muster as its chart's pods (two replicas, nothing out of cluster), play the demo, and
show in its live view Jobs admitted, placed on nodes and preempted; `muster down` must then
leave no process behind. The test types the section's commands as they are written (in a
cluster directory of its own), presses Ctrl-C (SIGINT to the command's process group) once a
preemption has been shown, and checks every process the run started is gone afterwards.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from controllers.localcluster.binaries import ensure_binaries
from controllers.localcluster.cluster import pid_alive
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

SECTION = "## Muster in one command"


def commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [
        line.split("#")[0].strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip()
    ]


def kubectl_json(state: Path, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [
            ensure_binaries(build=False)["kubectl"],
            "--kubeconfig",
            str(state / "kubeconfig"),
            "get",
            *args,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    result: dict[str, object] = json.loads(out)
    return result


def test_one_command_shows_muster_admitting_placing_and_preempting_then_down_stops_it(
    tmp_path: Path,
) -> None:
    run, down = commands()
    assert run == "make run" and down == ".venv/bin/muster down"
    env = dict(os.environ, MUSTER_LOCAL_CLUSTER_DIR=str(tmp_path / "cluster"))
    env.pop("KUBECONFIG", None)
    proc = subprocess.Popen(
        ["bash", "-c", run],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # A terminal's job takes Ctrl-C; a runner started in the background (`cmd &` in a
        # script) ignores SIGINT, and an ignored signal would be inherited down to `muster up`.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    in_cluster = False
    muster_pods: dict[str, object] = {}
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    started: list[int] = []
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and proc.poll() is None:
            # The gang placed on the room its preemption freed: everything the view should show.
            if any("  placed product/job-finetune-" in line for line in lines):
                break
            time.sleep(2)
        state = tmp_path / "cluster"
        if (state / "up.json").exists():
            up = json.loads((state / "up.json").read_text())
            in_cluster = up["controller_pid"] is None
        if in_cluster:
            muster_pods = kubectl_json(state, "pods", "-n", "muster-system")
        if (state / "state.json").exists():
            started += [
                c["pid"] for c in json.loads((state / "state.json").read_text())["components"]
            ]
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        reader.join(timeout=10)
        result = subprocess.run(
            ["bash", "-c", down], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
        )
    output = "".join(lines)
    tail = output[-4000:]
    # What the live view showed: admissions, placements on named nodes, a reclaim, a resize.
    assert re.search(
        r"^\d\d:\d\d:\d\d  admitted research/job-pretrain-1-\w+ on a100$", output, re.M
    ), tail
    assert re.search(
        r"^\d\d:\d\d:\d\d  placed research/job-pretrain-1-\w+ on a100-\d \(x2\)$", output, re.M
    ), tail
    assert re.search(r"^\d\d:\d\d:\d\d  reclaimed \(preempted\) research/", output, re.M), tail
    assert re.search(
        r"^\d\d:\d\d:\d\d  placed product/job-finetune-\w+ on h100-\d, h100-\d$",
        output,
        re.M,
    ), tail
    assert "resized (new slice) product/job-serve-" in output, tail
    assert "Traceback" not in output, tail
    assert re.search(r"`(\.venv/bin/)?muster down` stops everything", output)  # said at Ctrl-C
    # `muster down` stopped every process the run started, by pid.
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kubelet" in result.stdout and "kube-apiserver" in result.stdout
    # Muster ran in the cluster: two replicas of the chart on the real node, both Ready.
    assert in_cluster, "make run started the controller out of cluster"
    pods = muster_pods["items"]
    assert isinstance(pods, list) and len(pods) == 2
    assert all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
        for p in pods
    )
    assert "installing Muster with its Helm chart: two replicas on the real node" in output
    assert started and len(started) >= 6
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in started if pid_alive(p)] == []
