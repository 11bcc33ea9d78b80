"""`kubectl muster ...` driven through kubectl's plugin mechanism (kubectl finds
kubectl-muster on PATH), against the real local cluster and a running controller: the queue
tree, why a Job waits, stopping and resuming a queue, the history, a what-if simulation of
the live cluster, and shell completion."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    flavor,
    get,
    job,
    local_queue,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

VENV_BIN = REPO / ".venv" / "bin"


def kubectl_muster(
    cluster: ClusterHandle, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`kubectl muster ARGS` as a user runs it: kubectl finds the plugin on PATH."""
    path = os.pathsep.join(
        [str(VENV_BIN), os.path.dirname(cluster.kubectl_bin), os.environ["PATH"]]
    )
    env = dict(os.environ, PATH=path, KUBECONFIG=cluster.kubeconfig)
    result = subprocess.run(
        [cluster.kubectl_bin, "muster", *args], capture_output=True, text=True, env=env, timeout=180
    )
    if check:
        assert result.returncode == 0, f"kubectl muster {' '.join(args)}:\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def story(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """A parent queue over a queue limited to 4 cpu, on one 8-cpu node: one Job runs (2
    cpu), one waits (4 cpu more than the limit lets in)."""
    namespace = unique("plugin")
    cluster.kubectl("create", "namespace", namespace)
    pool = unique("plugin")
    nodes = cluster.nodes(1, cpu="8", memory="16Gi", labels={"muster-e2e/pool": pool})
    org, cq = unique("org"), unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(org, [{"name": pool, "quota": {"cpu": "4"}}]),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}], parent=org),
        local_queue("team", namespace, cq),
    )
    cluster.wait_for(
        "the service account default",
        lambda: (
            cluster.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0
        ),
    )
    apply(cluster, job("runs", namespace, "team", parallelism=2, cpu="1"))
    cluster.wait_for(
        "the first Job admitted",
        lambda: any(admitted(w) for w in workloads_of(cluster, namespace, "runs")),
        timeout=60,
    )
    apply(cluster, job("waits", namespace, "team", parallelism=4, cpu="1"))
    cluster.wait_for(
        "the second Job to wait with a reason",
        lambda: bool(
            workloads_of(cluster, namespace, "waits")
            and condition(workloads_of(cluster, namespace, "waits")[0], "QuotaReserved").get(
                "message"
            )
        ),
        timeout=60,
    )
    cluster.wait_for(
        "the queue status to count both",
        lambda: (
            (get(cluster, "clusterqueues.muster.dev", cq).get("status") or {}).get(
                "pendingWorkloads"
            )
            == 1
        ),
        timeout=30,
    )
    try:
        yield {"namespace": namespace, "org": org, "cq": cq, "controller": controller}
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)


def test_queues_shows_the_tree_with_usage_quota_and_counts(
    cluster: ClusterHandle, story: dict[str, Any]
) -> None:
    out = kubectl_muster(cluster, "queues", "--color", "never").stdout
    org, cq, ns = story["org"], story["cq"], story["namespace"]
    assert org in out and cq in out
    # The child is drawn under its parent.
    assert out.index(org) < out.index(cq)
    child = next(line for line in out.splitlines() if cq in line)
    assert "admitted 1" in child and "pending 1" in child
    assert "cpu: 2 / 4 used" in out
    assert f"{ns}/team (pending 1)" in out
    # Piped output carries no colour codes; --color always does.
    assert "\x1b[" not in out
    assert "\x1b[" in kubectl_muster(cluster, "queues", "--color", "always").stdout


def test_explain_says_why_a_job_waits_with_its_timeline(
    cluster: ClusterHandle, story: dict[str, Any]
) -> None:
    ns = story["namespace"]
    wl = workloads_of(cluster, ns, "waits")[0]
    reason = condition(wl, "QuotaReserved")["message"]
    out = kubectl_muster(cluster, "explain", "waits", "-n", ns, "--color", "never").stdout
    assert f"Job {ns}/waits" in out and "suspended" in out
    assert "waiting for quota" in out
    assert reason.split(";")[0][:40] in " ".join(out.split())
    assert "timeline" in out
    running = kubectl_muster(cluster, "explain", "runs", "-n", ns, "--color", "never").stdout
    assert "admitted" in running and "placement:" in running
    missing = kubectl_muster(cluster, "explain", "nosuch", "-n", ns, check=False)
    assert missing.returncode == 1
    assert f"no Job or Workload named 'nosuch' in namespace {ns}" in missing.stderr


def test_explain_reads_the_history_store_timeline(
    cluster: ClusterHandle, story: dict[str, Any]
) -> None:
    ctl: Controller = story["controller"]
    url = ctl.extra[ctl.extra.index("--database-url") + 1]
    ns = story["namespace"]
    name = workloads_of(cluster, ns, "runs")[0]["metadata"]["name"]
    cluster.wait_for(
        "the admission in the history store",
        lambda: (
            "admitted"
            in kubectl_muster(
                cluster, "history", "workload", f"{ns}/{name}", "--database-url", url, check=False
            ).stdout
        ),
        timeout=60,
    )
    out = kubectl_muster(
        cluster, "explain", "runs", "-n", ns, "--database-url", url, "--color", "never"
    ).stdout
    assert f"history of {name}" in out and "admitted" in out


def test_stop_and_resume_a_queue(cluster: ClusterHandle, story: dict[str, Any]) -> None:
    cq = story["cq"]
    out = kubectl_muster(cluster, "stop", cq, "--drain").stdout
    assert f"clusterqueue/{cq} stopped (HoldAndDrain; was None)" in out
    assert get(cluster, "clusterqueues.muster.dev", cq)["spec"]["stopPolicy"] == "HoldAndDrain"
    kubectl_muster(cluster, "stop", cq)
    assert "stopped (Hold)" in kubectl_muster(cluster, "queues", "--color", "never").stdout
    assert "was Hold" in kubectl_muster(cluster, "resume", cq).stdout
    assert get(cluster, "clusterqueues.muster.dev", cq)["spec"]["stopPolicy"] == "None"
    missing = kubectl_muster(cluster, "stop", "no-such-queue", check=False)
    assert missing.returncode == 1 and "ClusterQueue 'no-such-queue' not found" in missing.stderr


def test_what_if_simulates_the_live_cluster_with_more_quota(
    cluster: ClusterHandle, story: dict[str, Any], tmp_path: Path
) -> None:
    ns, cq = story["namespace"], story["cq"]
    # A higher limit for the queue (the node has room): the waiting Job would run at once
    # instead of waiting for the first (1h) to finish.
    out = kubectl_muster(
        cluster,
        "what-if",
        "--set",
        f"{cq}.quota.cpu=8",
        "--set",
        f"{cq}.limit.cpu=8",
        "--out",
        str(tmp_path / "reports"),
        "--color",
        "never",
    ).stdout
    assert cq in out
    # The same views as `muster simulate --output html`, for both runs.
    for name in ("now.html", "with-change.html"):
        page = (tmp_path / "reports" / name).read_text()
        assert "<table" in page and f">{cq}<" in page, name
    changed = [line for line in out.splitlines() if f"{ns}/waits" in line]
    assert changed, out
    before, after = changed[0].split(": waits ", 1)[1].split(" -> ")
    assert after.strip() == "0s" and before.strip() != "0s", changed
    bad = kubectl_muster(cluster, "what-if", "--set", "nosuch.quota.cpu=8", check=False)
    assert bad.returncode == 2 and "no ClusterQueue 'nosuch'" in bad.stderr
    exported = kubectl_muster(cluster, "what-if", "--export").stdout
    assert "kind: Simulation" in exported and f"name: {cq}" in exported


def test_completion(cluster: ClusterHandle) -> None:
    script = kubectl_muster(cluster, "completion", "bash").stdout
    assert "_KUBECTL_MUSTER_COMPLETE" in script
    path = os.pathsep.join([str(VENV_BIN), os.environ["PATH"]])
    env = dict(os.environ, PATH=path, KUBECONFIG=cluster.kubeconfig)
    # kubectl's own completion of plugin arguments runs kubectl_complete-muster.
    result = subprocess.run(
        [cluster.kubectl_bin, "__complete", "muster", "ex"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert "explain" in result.stdout.split()
