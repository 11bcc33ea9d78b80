"""The local cluster's real node: pods really run on it, one per machine, and `down` leaves the
host as it was — kernel settings, iptables, the bridge, mounts, cgroups, processes.

Driven as a user drives it, through `muster local-cluster up --real-node` and `down`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controllers.localcluster import hoststate
from controllers.localcluster.binaries import ensure_binaries
from controllers.localcluster.images import PAUSE_IMAGE
from controllers.localcluster.realnode import CLAIM, NODE_LABEL, node_name
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

MUSTER = [sys.executable, "-m", "controllers.main"]


def host_state(roots: list[Path]) -> dict[str, object]:
    """What a real node may change on this machine, read off the host."""
    sysctls = {}
    for name in hoststate.SYSCTLS:
        path = Path("/proc/sys") / name.replace(".", "/")
        if path.exists():
            sysctls[name] = path.read_text().strip()
    saved = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if any(line.split()[4].startswith(str(r)) for r in roots)
        or line.split()[4].startswith("/run/netns/")
    ]
    cgroups = sorted(
        str(p) for name in hoststate.CGROUPS for p in Path("/sys/fs/cgroup").glob(f"*/{name}")
    )
    processes = sorted(
        Path(f"/proc/{pid}/comm").read_text().strip()
        for pid in os.listdir("/proc")
        if pid.isdigit()
        and Path(f"/proc/{pid}/comm").exists()
        and Path(f"/proc/{pid}/comm").read_text().strip()
        in ("containerd", "kubelet", "kube-proxy", "containerd-shim", "pause")
    )
    return {
        "sysctls": sysctls,
        "chains": sorted(
            line for line in saved.splitlines() if line.startswith((":KUBE-", ":CNI-"))
        ),
        "bridge": Path(f"/sys/class/net/{hoststate.BRIDGE}").exists(),
        "mounts": mounts,
        "cgroups": cgroups,
        "processes": processes,
        "claim": CLAIM.exists(),
    }


def muster(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MUSTER, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def test_pods_run_on_the_real_node_and_down_leaves_the_host_as_it_was(tmp_path: Path) -> None:
    directory, other = tmp_path / "cluster", tmp_path / "other"
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    before = host_state([directory])
    up = muster("local-cluster", "up", "--real-node", "--dir", str(directory), env=env)
    try:
        assert up.returncode == 0, up.stderr
        kubeconfig = str(directory / "kubeconfig")
        kctl = [ensure_binaries(build=False)["kubectl"], "--kubeconfig", kubeconfig]
        node = subprocess.run(
            [*kctl, "get", "node", node_name(), "-o", "jsonpath={.metadata.labels}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert NODE_LABEL in node
        subprocess.run(
            [
                *kctl,
                "run",
                "sleeper",
                f"--image={PAUSE_IMAGE}",
                "--image-pull-policy=Never",
                "--restart=Never",
                "--overrides",
                json.dumps({"spec": {"nodeSelector": {NODE_LABEL: "true"}}}),
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*kctl, "wait", "pod/sleeper", "--for=condition=Ready", "--timeout=60s"],
            check=True,
            capture_output=True,
        )
        during = host_state([directory])
        assert during["bridge"] and during["claim"] and "pause" in during["processes"]
        # One real node per machine: a second cluster asking for one is refused, and says why.
        second = muster("local-cluster", "up", "--real-node", "--dir", str(other), env=env)
        assert second.returncode != 0
        assert f"belongs to the local cluster in {directory}" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
    finally:
        down = muster("local-cluster", "down", "--dir", str(directory), env=env)
    assert down.returncode == 0, down.stderr
    assert "kubelet" in down.stdout and "containerd" in down.stdout
    assert host_state([directory]) == before
