"""Muster as a cluster runs it: the chart's pods on the local cluster's real node, nothing out of
cluster. `helm install` → two replicas Ready, one leads; a labelled Job is admitted and its
pods bound by Muster's scheduler and really run on the real node; `kubectl muster queues` and
`/metrics` through the metrics Service answer; the leader pod is deleted with no grace and the
other replica leads within the lease time while a checker finds no double admission and no
lost history record; `helm upgrade` to a chart with a new Alembic revision and a changed CRD
keeps every admitted workload and every history record; `helm uninstall` leaves only what
docs/deploy.md says is kept.

The tests of this module run in order, on one cluster with one release (one real node per
machine); each says what it leaves for the next.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import create_engine, text

from controllers.localcluster.binaries import ensure_binaries
from controllers.localcluster.cluster import LocalCluster
from controllers.localcluster.images import build_muster_image
from controllers.localcluster.realnode import NODE_LABEL, RealNode, node_name
from tests.conftest import REPO, ClusterHandle
from tests.e2e.controller_harness import (
    admitted,
    apply,
    cluster_queue,
    condition,
    flavor,
    job,
    local_queue,
    unique,
)

pytestmark = pytest.mark.e2e

NS = "muster-system"
HELM = REPO / ".venv" / "bin" / "helm"
PLUGIN = REPO / ".venv" / "bin" / "kubectl-muster"
LEASE_DURATION = 15  # the chart's leaderElection.leaseDuration
RETRY_PERIOD = 2
STATE: dict[str, Any] = {}
# Muster's pods on the node that runs them, never on a kwok node that only fakes it.
ON_THE_REAL_NODE = ("--set-string", "nodeSelector." + NODE_LABEL.replace(".", "\\.") + "=true")


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    """A local cluster of its own with this machine's real node (one per machine)."""
    binaries = ensure_binaries(build=True)
    local = LocalCluster(tmp_path_factory.mktemp("real-cluster"), binaries)
    local.up(real_node=True)
    try:
        yield ClusterHandle(local, str(local.kubeconfig), binaries["kubectl"])
    finally:
        local.down()


@pytest.fixture(scope="module")
def database(real: ClusterHandle) -> Iterator[str]:
    """A fresh database in this machine's PostgreSQL, as pods reach it."""
    name = f"muster_e2e_{uuid.uuid4().hex[:8]}"
    _psql(f"CREATE DATABASE {name} OWNER muster")
    address = real.local.state.node_address if real.local.state else None
    assert address
    try:
        yield f"postgresql+psycopg://muster:muster@{address}:5432/{name}"
    finally:
        _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _psql(sql: str) -> None:
    subprocess.run(
        ["runuser", "-u", "postgres", "--", "psql", "-v", "ON_ERROR_STOP=1", "-c", sql],
        check=True,
        capture_output=True,
        cwd="/",
    )


def helm(real: ClusterHandle, *args: str, timeout: float = 300) -> str:
    env = dict(os.environ, KUBECONFIG=real.kubeconfig, HELM_CACHE_HOME="/tmp/helm-cache")
    result = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stderr}"
    return result.stdout


def install(real: ClusterHandle, *values: str) -> None:
    """`helm install` of this repository's chart, waiting for its pods to be Ready."""
    helm(
        real,
        "install",
        "muster",
        str(REPO / "charts" / "muster"),
        "-n",
        NS,
        *values,
        "--wait",
        "--timeout",
        "240s",
    )


def muster_pods(real: ClusterHandle) -> list[dict[str, Any]]:
    pods = real.get_json("pods", "-n", NS, "-l", "app.kubernetes.io/name=muster")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def leader(real: ClusterHandle) -> str:
    lease = real.get_json("lease", "-n", NS, "muster-controller")
    return str(lease["spec"].get("holderIdentity") or "")


def rows(url: str) -> set[tuple[str, str, int]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            result = connection.execute(
                text("SELECT uid, kind, sequence FROM workload_transitions")
            )
            return {(r[0], r[1], int(r[2])) for r in result}
    finally:
        engine.dispose()


def alembic_revision(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return str(connection.execute(text("SELECT version_num FROM alembic_version")).scalar())
    finally:
        engine.dispose()


def workloads(real: ClusterHandle, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = real.get_json("workloads.muster.dev", "-n", namespace)["items"]
    return items


def admission_stamp(wl: dict[str, Any]) -> str:
    """What one admission of a Workload looks like: its attempt and when quota was reserved."""
    reserved = next(c for c in wl["status"]["conditions"] if c["type"] == "QuotaReserved")
    count = (wl["status"].get("requeueState") or {}).get("count", 0)
    return f"{count}@{reserved['lastTransitionTime']}"


def release_values(url_secret: str) -> list[str]:
    return [
        "--set",
        "history.database.type=postgresql",
        "--set",
        f"history.database.postgresql.existingSecret={url_secret}",
        *ON_THE_REAL_NODE,
    ]


def test_helm_install_runs_two_replicas_on_the_real_node_one_leading(
    real: ClusterHandle, database: str
) -> None:
    real.kubectl("create", "namespace", NS)
    real.kubectl(
        "-n", NS, "create", "secret", "generic", "muster-db", f"--from-literal=url={database}"
    )
    install(real, *release_values("muster-db"))
    pods = muster_pods(real)
    assert len(pods) == 2 and all(ready(p) for p in pods), [p["status"] for p in pods]
    assert {p["spec"]["nodeName"] for p in pods} == {node_name()}
    for pod in pods:  # really running here, as the chart says: non-root, read-only root
        (container,) = pod["status"]["containerStatuses"]
        assert container["ready"] and "running" in container["state"]
        security = pod["spec"]["containers"][0]["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert pod["spec"]["securityContext"]["runAsUser"] == 65532
    real.wait_for("a leader", lambda: leader(real) in {p["metadata"]["name"] for p in pods}, 60)
    pdb = real.get_json("pdb", "-n", NS, "muster")
    assert pdb["spec"]["minAvailable"] == 1
    # The same database as this machine reaches it (pods come from the pod network).
    address = real.local.state.node_address if real.local.state else ""
    STATE["database"] = database.replace(f"@{address}:", "@127.0.0.1:")


def test_a_labelled_job_is_admitted_and_its_pods_run_on_the_real_node(real: ClusterHandle) -> None:
    real.kubectl("apply", "-f", str(REPO / "examples" / "real-job" / "queues.yaml"))
    manifest = yaml.safe_load((REPO / "examples" / "real-job" / "job.yaml").read_text())
    namespace = manifest["metadata"]["namespace"]
    name = manifest["metadata"]["name"]
    real.kubectl("create", "-f", str(REPO / "examples" / "real-job" / "job.yaml"))
    real.wait_for(
        "the real Job to complete",
        lambda: (
            real.get_json("job", "-n", namespace, name).get("status", {}).get("succeeded", 0)
            == manifest["spec"].get("completions", manifest["spec"].get("parallelism", 1))
        ),
        timeout=180,
        interval=1,
    )
    (wl,) = workloads(real, namespace)
    assert condition(wl, "Finished").get("status") == "True", wl["status"]
    pods = real.get_json("pods", "-n", namespace, "-l", f"batch.kubernetes.io/job-name={name}")[
        "items"
    ]
    assert pods and {p["spec"]["nodeName"] for p in pods} == {node_name()}
    assert {p["spec"]["schedulerName"] for p in pods} == {"muster-scheduler"}
    assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
    # Its container really ran: its output is in the kubelet's log of it.
    logs = real.kubectl("logs", "-n", namespace, pods[0]["metadata"]["name"]).stdout
    assert logs.strip(), "the real Job's container printed nothing"
    STATE["real_job"] = (namespace, name)


def test_the_plugin_and_metrics_through_the_service_answer(real: ClusterHandle) -> None:
    env = dict(os.environ, KUBECONFIG=real.kubeconfig)
    env["PATH"] = f"{Path(real.kubectl_bin).parent}:{REPO / '.venv' / 'bin'}:{env['PATH']}"
    queues = subprocess.run(
        [str(PLUGIN), "queues"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert queues.returncode == 0, queues.stderr
    namespace, _ = STATE["real_job"]
    assert namespace in queues.stdout or "real-node" in queues.stdout, queues.stdout
    # Through the Service, either replica answers: each says whether it leads.
    metrics = real.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{NS}/services/muster-metrics:metrics/proxy/metrics"
    ).stdout
    assert re.search(r"^muster_leader [01]\.0$", metrics, re.M), metrics[-2000:]
    # The leader counted the real Job's admission.
    at_leader = real.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{NS}/pods/{leader(real)}:8080/proxy/metrics"
    ).stdout
    assert 'muster_admitted_workloads_total{cluster_queue="real-node"} 1.0' in at_leader


def test_the_leader_pod_deleted_with_no_grace_hands_over_without_double_admission_or_lost_records(
    real: ClusterHandle,
) -> None:
    namespace = unique("failover")
    real.kubectl("create", "namespace", namespace)
    real.nodes(2, prefix="fo", cpu="8", labels={"muster-e2e/pool": "failover"})
    cq = unique("failover")
    apply(
        real,
        flavor(f"{cq}-cpu", "failover"),
        cluster_queue(cq, [{"name": f"{cq}-cpu", "quota": {"cpu": "8"}, "limit": {"cpu": "8"}}]),
        local_queue("q", namespace, cq),
    )
    real.wait_for(
        "serviceaccount default",
        lambda: real.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0,
    )
    for i in range(12):  # 2 cpu each: four fit in the queue's 8
        apply(real, job(f"j{i}", namespace, "q", cpu="2"))
    real.wait_for(
        "four admitted", lambda: sum(admitted(w) for w in workloads(real, namespace)) == 4, 90
    )
    url = STATE["database"]
    before = rows(url)
    old = leader(real)
    violations: list[str] = []
    stamps: dict[str, str] = {}
    stop = threading.Event()

    def check() -> None:
        """Every half second: never more admitted than the quota holds, and no Workload
        admitted a second time within one attempt."""
        while not stop.is_set():
            current = [w for w in workloads(real, namespace) if admitted(w)]
            if len(current) > 4:
                violations.append(f"{len(current)} admitted at once")
            for wl in current:
                uid, stamp = wl["metadata"]["uid"], admission_stamp(wl)
                if stamps.setdefault(uid, stamp) != stamp:
                    violations.append(f"{wl['metadata']['name']} admitted again: {stamp}")
            time.sleep(0.5)

    checker = threading.Thread(target=check, daemon=True)
    checker.start()
    killed = time.monotonic()
    real.kubectl("delete", "pod", "-n", NS, old, "--grace-period=0", "--force")
    # Room for two more, which only the next leader can admit.
    done = [
        w["metadata"]["labels"]["muster.dev/job-name"]
        for w in workloads(real, namespace)
        if admitted(w)
    ][:2]
    for name in done:
        real.kubectl("delete", "job", "-n", namespace, name, "--cascade=foreground", "--wait=false")
    real.wait_for("a new leader", lambda: leader(real) not in ("", old), LEASE_DURATION * 3, 0.25)
    handover = time.monotonic() - killed
    real.wait_for(
        "two more admitted by the new leader",
        lambda: sum(admitted(w) for w in workloads(real, namespace)) == 4 and len(stamps) >= 6,
        120,
    )
    stop.set()
    checker.join(timeout=5)
    assert violations == []
    assert handover <= LEASE_DURATION + 2 * RETRY_PERIOD + 2, f"handover took {handover:.1f}s"
    # Nothing recorded before the kill is lost, and every admission is in the store (the new
    # leader reports what the cluster shows; the old pod's spool went with it).
    admitted_uids = set(stamps)

    def recorded() -> bool:
        now = rows(url)
        return before <= now and admitted_uids <= {u for u, k, _ in now if k == "admitted"}

    real.wait_for("every admission in the history store", recorded, 60, 1)
    real.wait_for("two replicas again", lambda: sum(ready(p) for p in muster_pods(real)) == 2, 120)
    STATE["failover"] = {"namespace": namespace, "handover": handover}


def test_helm_upgrade_with_a_new_revision_and_a_changed_crd_keeps_workloads_and_history(
    real: ClusterHandle, tmp_path: Path
) -> None:
    namespace = STATE["failover"]["namespace"]
    url = STATE["database"]
    admitted_before = {
        w["metadata"]["uid"]: admission_stamp(w) for w in workloads(real, namespace) if admitted(w)
    }
    history_before = rows(url)
    head_before = alembic_revision(url)
    # The next version: a copy of this tree with one more Alembic revision and a new
    # printer column on ClusterQueue, built into an image of its own.
    source = tmp_path / "next"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(REPO / name):  # the chart's link to crds/ stays a link
            shutil.copy2(REPO / name, target, follow_symlinks=False)
    revision = f"e2e{uuid.uuid4().hex[:8]}"
    (source / "migrations" / "versions" / f"9999_{revision}.py").write_text(
        f'''"""An index the next version adds (the in-cluster upgrade test)."""

from alembic import op

revision = "{revision}"
down_revision = "{head_before}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_e2e_upgrade", "workload_transitions", ["reason"])


def downgrade() -> None:
    op.drop_index("ix_e2e_upgrade", table_name="workload_transitions")
'''
    )
    crd_path = source / "crds" / "muster.dev_clusterqueues.yaml"
    crd = yaml.safe_load(crd_path.read_text())
    crd["spec"]["versions"][0].setdefault("additionalPrinterColumns", []).append(
        {"name": "Upgraded", "type": "string", "jsonPath": ".metadata.name"}
    )
    crd_path.write_text(yaml.safe_dump(crd, sort_keys=False))
    tag = f"0.1.0-{revision}"
    archive = build_muster_image(source, tag)
    RealNode(real.local.directory).import_image(archive.path)
    helm(
        real,
        "upgrade",
        "muster",
        str(source / "charts" / "muster"),
        "-n",
        NS,
        "--reuse-values",
        "--set",
        f"image.tag={tag}",
        "--wait",
        "--timeout",
        "240s",
    )
    pods = muster_pods(real)
    real.wait_for(
        "two upgraded replicas",
        lambda: (
            [
                p
                for p in muster_pods(real)
                if ready(p) and p["spec"]["containers"][0]["image"].endswith(tag)
            ].__len__()
            == 2
        ),
        180,
    )
    real.wait_for("the new revision", lambda: alembic_revision(url) == revision, 60, 1)
    columns = real.get_json("crd", "clusterqueues.muster.dev")["spec"]["versions"][0][
        "additionalPrinterColumns"
    ]
    assert "Upgraded" in {c["name"] for c in columns}
    admitted_after = {
        w["metadata"]["uid"]: admission_stamp(w) for w in workloads(real, namespace) if admitted(w)
    }
    assert admitted_after == admitted_before
    assert history_before <= rows(url)
    assert pods


def test_helm_uninstall_leaves_only_what_the_docs_say_is_kept(real: ClusterHandle) -> None:
    helm(real, "uninstall", "muster", "-n", NS, "--wait", "--timeout", "120s")
    real.wait_for("Muster's pods gone", lambda: not real.get_json("pods", "-n", NS)["items"], 90)
    kinds = (
        "deployment,replicaset,pod,service,serviceaccount,configmap,secret,role,rolebinding,"
        "poddisruptionbudget,lease,persistentvolumeclaim"
    )
    left = real.get_json(kinds, "-n", NS)["items"]
    left = [
        o
        for o in left
        if not (o["kind"] == "Secret" and o["metadata"]["name"] == "muster-db")  # the user's
        and not (o["kind"] == "ConfigMap" and o["metadata"]["name"] == "kube-root-ca.crt")
        and not (o["kind"] == "ServiceAccount" and o["metadata"]["name"] == "default")
    ]
    assert [f"{o['kind']}/{o['metadata']['name']}" for o in left] == []
    cluster_wide = real.get_json(
        "clusterrole,clusterrolebinding,validatingwebhookconfiguration,"
        "mutatingwebhookconfiguration,validatingadmissionpolicy,validatingadmissionpolicybinding,"
        "mutatingadmissionpolicy,mutatingadmissionpolicybinding",
        "-l",
        "app.kubernetes.io/instance=muster",
    )["items"]
    assert cluster_wide == []
    for name in ("muster-webhooks",):
        assert (
            real.kubectl("get", "validatingwebhookconfiguration", name, check=False).returncode != 0
        )
    # Kept, as docs/deploy.md says: the CRDs, and with them every queue and Workload.
    assert real.kubectl("get", "crd", "workloads.muster.dev", check=False).returncode == 0
    assert workloads(real, STATE["failover"]["namespace"])


def test_sqlite_history_on_a_claim_bound_to_the_real_nodes_volume(real: ClusterHandle) -> None:
    """The chart's defaults on a single-node cluster: SQLite on a PersistentVolumeClaim, which
    binds to the volume the local cluster prepares on its real node; one replica writes the
    history there; uninstall keeps the claim (and so the history)."""
    install(real, "--take-ownership", *ON_THE_REAL_NODE)
    (pod,) = muster_pods(real)
    assert ready(pod)
    claim = real.get_json("pvc", "-n", NS, "muster-history")
    assert claim["status"]["phase"] == "Bound"
    assert claim["spec"]["volumeName"] == "muster-local-volume"
    namespace, name = STATE["real_job"]
    real.kubectl("delete", "job", "-n", namespace, name, "--wait=true")
    real.kubectl("create", "-f", str(REPO / "examples" / "real-job" / "job.yaml"))
    real.wait_for(
        "the real Job to complete again",
        lambda: (
            real.get_json("job", "-n", namespace, name).get("status", {}).get("succeeded", 0) == 2
        ),
        timeout=180,
        interval=1,
    )
    database = RealNode(real.local.directory).volume_dir / "history.db"
    engine = create_engine(f"sqlite:///{database}")

    def admitted_there() -> bool:
        with engine.connect() as connection:
            return bool(
                connection.execute(
                    text(
                        "SELECT count(*) FROM workload_transitions "
                        "WHERE kind = 'admitted' AND namespace = :ns AND name LIKE :name"
                    ),
                    {"ns": namespace, "name": f"job-{name}-%"},
                ).scalar()
            )

    try:
        real.wait_for("the admission in the SQLite history", admitted_there, 60, 1)
    finally:
        engine.dispose()
    helm(real, "uninstall", "muster", "-n", NS, "--wait", "--timeout", "120s")
    kept = real.get_json("pvc", "-n", NS, "muster-history")
    assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
