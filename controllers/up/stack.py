"""Everything `muster up` starts, and how `muster down` stops it again.

The local control plane (controllers/localcluster) with this machine's real node, Muster
installed the way an operator installs it — its Helm chart, its image, two replicas as pods
on the real node, the history store in the machine's PostgreSQL through the chart's Secret —
and a scenario's organisation and kwok nodes. Out of cluster (`--out-of-cluster`, for a
machine where a kubelet cannot run), the controller runs on this machine instead: as the
chart's ServiceAccount when helm is there, else as the cluster admin with the CRDs applied.
What was started is kept in `up.json` in the cluster's directory, so that `muster down` stops
exactly that (a controller process by its id; the pods with the cluster).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from controllers.localcluster.cluster import (
    LocalCluster,
    free_port,
    pid_alive,
    start_detached,
    stop_groups,
)
from controllers.localcluster.kubectl import KubectlError, kubectl
from controllers.localcluster.nodes import wait_nodes_ready
from controllers.localcluster.realnode import NODE_LABEL as REAL_NODE_LABEL
from controllers.up.plan import Plan

STATE_FILE = "up.json"
NAMESPACE = "muster-system"
REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "muster"
CRDS = REPO / "crds"
HISTORY_SECRET = "muster-history"
# The database hack/install-postgres.sh prepares for Muster in the local cluster.
DATABASE_URL = "postgresql+psycopg://muster:muster@{address}:5432/muster"
Progress = Callable[[str], None]


class UpError(RuntimeError):
    """Something `muster up` could not do; the message says what and where to look."""


@dataclass
class Stack:
    """What `muster up` started, as recorded in up.json."""

    directory: str
    controller_pid: int | None  # None: Muster runs as the chart's pods
    controller_log: str
    kubeconfig: str  # the cluster admin's: the player and the live view use it
    database_url: str
    webhook_port: int
    metrics_port: int
    chart: bool
    scenario: str
    started_at: float

    def save(self) -> None:
        path = Path(self.directory) / STATE_FILE
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: Path) -> Stack | None:
        path = directory / STATE_FILE
        if not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            return None  # a file from another version: treated as nothing started

    def controller_alive(self) -> bool:
        """Out of cluster, whether its process lives; in cluster, its pods live as long as
        the cluster does (the caller checks that)."""
        return self.controller_pid is None or pid_alive(self.controller_pid)


def _helm() -> str | None:
    beside = Path(sys.executable).parent / "helm"  # `make setup` links it into .venv/bin
    return str(beside) if beside.is_file() else shutil.which("helm")


def _apply(cluster: LocalCluster, docs: list[object] | tuple[object, ...]) -> None:
    kubectl(
        cluster.binaries["kubectl"],
        cluster.kubeconfig,
        "apply",
        "--server-side",
        "--field-manager=muster-up",
        "--force-conflicts",
        "-f",
        "-",
        input=yaml.safe_dump_all(list(docs), sort_keys=False),
    )


def _service_account_kubeconfig(cluster: LocalCluster, path: Path) -> Path:
    """The cluster's kubeconfig with the chart's ServiceAccount as its user."""
    token = kubectl(
        cluster.binaries["kubectl"],
        cluster.kubeconfig,
        "-n",
        NAMESPACE,
        "create",
        "token",
        "muster",
        "--duration=24h",
    ).stdout.strip()
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    config["users"] = [{"name": "muster", "user": {"token": token}}]
    for context in config.get("contexts") or []:
        context["context"]["user"] = "muster"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _install_chart(cluster: LocalCluster, helm: str, *values: str) -> None:
    subprocess.run(
        [
            helm,
            "upgrade",
            "--install",
            "muster",
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            # The CRDs may be there already, applied by hand or by another release.
            "--take-ownership",
            "--kubeconfig",
            str(cluster.kubeconfig),
            *values,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _webhook_field(cluster: LocalCluster, field: str) -> str:
    """A field of the validating webhook configuration's first webhook's clientConfig ("" while
    it is not there)."""
    result = kubectl(
        cluster.binaries["kubectl"],
        cluster.kubeconfig,
        "get",
        "validatingwebhookconfiguration",
        "muster-webhooks",
        "-o",
        f"jsonpath={{.webhooks[0].clientConfig.{field}}}",
        check=False,
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def _wait_for_controller(
    cluster: LocalCluster, pid: int, log: Path, webhook_port: int, timeout: float
) -> None:
    """Until the controller has registered its webhooks at its own port (it is then the
    leader, its caches synced); fails early, with its log, if it exits."""
    want = f"https://127.0.0.1:{webhook_port}/"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise UpError(f"the controller exited; the end of its log ({log}):\n{tail}")
        if _webhook_field(cluster, "url").startswith(want):
            return
        time.sleep(1.0)
    raise UpError(f"the controller did not register its webhooks within {timeout:.0f}s; see {log}")


def start(
    cluster: LocalCluster,
    plan: Plan,
    *,
    scenario: str,
    database_url: str | None,
    use_chart: bool | None,
    in_cluster: bool,
    progress: Progress,
    timeout: float = 180.0,
) -> Stack:
    """Start the cluster (if it is not running), Muster, the organisation and the nodes."""
    if in_cluster:
        stack = _start_in_cluster(
            cluster,
            scenario=scenario,
            database_url=database_url,
            progress=progress,
            timeout=timeout,
        )
    else:
        stack = _start_out_of_cluster(
            cluster,
            scenario=scenario,
            database_url=database_url,
            use_chart=use_chart,
            progress=progress,
            timeout=timeout,
        )
    progress(f"creating {len(plan.nodes)} kwok nodes and the organisation of {plan.name}")
    try:
        _apply(cluster, plan.nodes)
        wait_nodes_ready(
            cluster.binaries["kubectl"],
            cluster.kubeconfig,
            [str(n["metadata"]["name"]) for n in plan.nodes],
            60.0,
        )
        _apply(cluster, plan.organisation)
    except (KubectlError, TimeoutError) as error:
        raise UpError(str(error)) from None
    return stack


def _start_in_cluster(
    cluster: LocalCluster,
    *,
    scenario: str,
    database_url: str | None,
    progress: Progress,
    timeout: float,
) -> Stack:
    """The chart with its image on the real node: two replicas (one leads), the history in
    PostgreSQL through the chart's Secret."""
    if cluster.running():
        if not (cluster.state and cluster.state.node_address):
            raise UpError(
                f"the local cluster in {cluster.directory} runs without a real node; stop it "
                "with `muster down` first, or run Muster on this machine with --out-of-cluster"
            )
    else:
        cluster.up(timeout=120.0, progress=progress, real_node=True)
    helm = _helm()
    if helm is None or not CHART.is_dir():
        raise UpError("Muster in the cluster needs helm and the chart (run `make setup`)")
    assert cluster.state is not None and cluster.state.node_address is not None
    # Pods reach the host's PostgreSQL at the machine's address, the live view on loopback.
    url = database_url or DATABASE_URL.format(address=cluster.state.node_address)
    view_url = database_url or DATABASE_URL.format(address="127.0.0.1")
    _check_database(view_url)
    directory = cluster.directory
    _apply(cluster, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    _apply(
        cluster,
        [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": HISTORY_SECRET, "namespace": NAMESPACE},
                "stringData": {"url": url},
            }
        ],
    )
    progress("installing Muster with its Helm chart: two replicas on the real node")
    try:
        _install_chart(
            cluster,
            helm,
            "--set",
            "history.database.type=postgresql",
            "--set",
            f"history.database.postgresql.existingSecret={HISTORY_SECRET}",
            # Its pods on the node that runs them, never on a kwok node that only fakes it.
            "--set-string",
            "nodeSelector." + REAL_NODE_LABEL.replace(".", "\\.") + "=true",
            "--wait",
            "--timeout",
            f"{timeout:.0f}s",
        )
    except subprocess.CalledProcessError as error:
        raise UpError(
            f"helm install failed: {error.stderr.strip()}\n"
            f"`kubectl -n {NAMESPACE} describe pods` says why"
        ) from None
    _wait_for_leader(cluster, timeout)
    stack = Stack(
        directory=str(directory),
        controller_pid=None,
        controller_log=f"`kubectl -n {NAMESPACE} logs deployment/muster`",
        kubeconfig=str(cluster.kubeconfig),
        database_url=view_url,
        webhook_port=9443,
        metrics_port=8080,
        chart=True,
        scenario=scenario,
        started_at=time.time(),
    )
    stack.save()
    return stack


def _check_database(url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError

    try:
        engine = create_engine(url, connect_args={"connect_timeout": 5})
        with engine.connect() as connection:
            connection.execute(text("select 1"))
        engine.dispose()
    except SQLAlchemyError as error:
        raise UpError(
            f"the history store at {url} does not answer ({error.__class__.__name__}: "
            f"{str(error).splitlines()[0]}); `make setup` installs PostgreSQL "
            "(hack/install-postgres.sh), or pass --database-url"
        ) from None


def _wait_for_leader(cluster: LocalCluster, timeout: float) -> None:
    """Until one replica holds the Lease and has written its CA into the webhook
    configuration: from then on, a labelled Job is suspended and queued."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lease = kubectl(
            cluster.binaries["kubectl"],
            cluster.kubeconfig,
            "-n",
            NAMESPACE,
            "get",
            "lease",
            "muster-controller",
            "-o",
            "jsonpath={.spec.holderIdentity}",
            check=False,
        )
        if lease.stdout.strip() and _webhook_field(cluster, "caBundle"):
            return
        time.sleep(1.0)
    raise UpError(
        f"no Muster replica led within {timeout:.0f}s; see `kubectl -n {NAMESPACE} logs "
        "deployment/muster`"
    )


def _start_out_of_cluster(
    cluster: LocalCluster,
    *,
    scenario: str,
    database_url: str | None,
    use_chart: bool | None,
    progress: Progress,
    timeout: float,
) -> Stack:
    """The controller as a process on this machine (as the chart's ServiceAccount when
    helm is there)."""
    directory = cluster.directory
    if not cluster.running():
        cluster.up(timeout=120.0, progress=progress)
    helm = _helm() if use_chart is not False else None
    if use_chart and helm is None:
        raise UpError("--chart needs helm (run `make setup`, which builds it)")
    if use_chart and not CHART.is_dir():
        raise UpError(f"--chart needs the chart at {CHART} (run from a clone of the repository)")
    chart = helm is not None and CHART.is_dir()
    kubeconfig = Path(cluster.kubeconfig)
    if chart:
        assert helm is not None
        progress("installing Muster with its Helm chart (CRDs, RBAC, webhooks)")
        try:
            _install_chart(cluster, helm)
        except subprocess.CalledProcessError as error:
            raise UpError(f"helm install failed: {error.stderr.strip()}") from None
        kubeconfig = _service_account_kubeconfig(cluster, directory / "muster-sa.kubeconfig")
    else:
        progress("applying Muster's CRDs (helm not found: the controller runs as cluster admin)")
        if not CRDS.is_dir():
            raise UpError(f"Muster's CRDs are not at {CRDS} (run from a clone of the repository)")
        _apply(cluster, [yaml.safe_load(p.read_text()) for p in sorted(CRDS.glob("*.yaml"))])
    url = database_url or f"sqlite:///{directory / 'history.db'}"
    webhook_port, metrics_port = free_port(), free_port()
    log = directory / "muster-controller.log"
    command = [
        sys.executable,
        "-m",
        "controllers.main",
        "controller",
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        NAMESPACE,
        "--webhook-port",
        str(webhook_port),
        "--metrics-port",
        str(metrics_port),
        "--database-url",
        url,
        "--history-spool-dir",
        str(directory / "history-spool"),
    ]
    progress(f"starting the controller (log: {log})")
    # Ctrl-C in the live view does not reach it; `muster down` does.
    proc = start_detached(command, log, directory)
    stack = Stack(
        directory=str(directory),
        controller_pid=proc.pid,
        controller_log=str(log),
        kubeconfig=str(cluster.kubeconfig),
        database_url=url,
        webhook_port=webhook_port,
        metrics_port=metrics_port,
        chart=chart,
        scenario=scenario,
        started_at=time.time(),
    )
    stack.save()
    _wait_for_controller(cluster, proc.pid, log, webhook_port, timeout)
    return stack


def stop(directory: Path, grace: float = 20.0) -> list[str]:
    """Stop the controller `muster up` started (it gives up its Lease on SIGTERM), then the
    cluster; names what was stopped."""
    stopped: list[str] = []
    stack = Stack.load(directory)
    if stack is not None and stack.controller_pid is not None and stack.controller_alive():
        stop_groups([stack.controller_pid], grace)
        stopped.append(f"muster-controller (pid {stack.controller_pid})")
    stopped += LocalCluster(directory).down()
    (directory / STATE_FILE).unlink(missing_ok=True)
    return stopped
