"""A real local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and kwok, started as processes on free loopback ports, with state kept in one directory.

The processes outlive the command that starts them (`muster local-cluster up`), so the state
directory records their pids; `down` stops every one of them, and the pytest fixture does the
same when the test session ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from controllers.localcluster import hoststate, pki, realnode
from controllers.localcluster.binaries import Binaries, ensure_binaries, find_binaries
from controllers.localcluster.images import ImageError, ensure_images
from controllers.localcluster.names import clusters_dir, context_name, default_dir, select_args
from controllers.localcluster.nodes import wait_nodes_ready

STAGES_FILE = Path(__file__).with_name("stages.yaml")
# TopologyAwareWorkloadScheduling: without it the apiserver drops a native PodGroup's
# spec.schedulingConstraints on create, and kube-scheduler ignores them.
FEATURE_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
STATE_FILE = "state.json"


class ClusterError(RuntimeError):
    """A component failed; the message carries what failed and the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Component:
    name: str
    pid: int
    log: str
    health_url: str | None = None


@dataclass
class ClusterState:
    directory: str
    api_port: int
    components: list[Component] = field(default_factory=list)
    # The machine's address the apiserver advertises when a real node runs (pods reach it
    # there), else None.
    node_address: str | None = None

    @property
    def kubeconfig(self) -> Path:
        return Path(self.directory) / "kubeconfig"

    def save(self) -> None:
        data = {
            "directory": self.directory,
            "api_port": self.api_port,
            "components": [c.__dict__ for c in self.components],
            "node_address": self.node_address,
        }
        (Path(self.directory) / STATE_FILE).write_text(json.dumps(data, indent=2))

    @classmethod
    def load(cls, directory: Path) -> ClusterState | None:
        path = directory / STATE_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(
            directory=data["directory"],
            api_port=data["api_port"],
            components=[Component(**c) for c in data["components"]],
            node_address=data.get("node_address"),
        )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_detached(
    argv: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` writing to `log`, in a session of its own: stopping it signals its whole
    process group (`stop_groups`), and Ctrl-C on the command that started it does not reach it."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
            env=env,
        )


def stop_groups(pids: list[int], grace: float) -> None:
    """SIGTERM the process groups led by `pids` (in that order), give them `grace` seconds
    together to exit, SIGKILL what is left, and wait a few seconds more for that."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for pid in pids:
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    for pid in pids:
        while pid_alive(pid) and time.monotonic() < deadline + 5:
            time.sleep(0.05)


def _owner_running(owner: dict[str, object]) -> bool:
    """Whether the cluster named in the real node's claim still runs its kubelet."""
    state = ClusterState.load(Path(str(owner.get("directory", ""))))
    return state is not None and any(
        c.name == "kubelet" and pid_alive(c.pid) for c in state.components
    )


def _listen_flags(address: str | None) -> list[str]:
    """Where the apiserver listens and what it tells clients. Without a real node:
    loopback only, and no endpoint for the `kubernetes` Service (it may not be loopback;
    every client runs on this machine). With one, pods reach it through that Service: every
    address, the machine's own advertised, and the endpoint kept by the lease reconciler."""
    if address is None:
        return [
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            "--endpoint-reconciler-type",
            "none",
        ]
    return [
        "--bind-address",
        "0.0.0.0",
        "--advertise-address",
        address,
        "--endpoint-reconciler-type",
        "lease",
    ]


def _control_plane_flags(kubeconfig: Path, port: int, cert_dir: Path) -> list[str]:
    """What kube-controller-manager and kube-scheduler are both told: their kubeconfig for
    everything, a loopback health port, no leader election (one of each), the cluster's
    feature gates, and room to talk to the apiserver."""
    return [
        "--kubeconfig",
        str(kubeconfig),
        "--authentication-kubeconfig",
        str(kubeconfig),
        "--authorization-kubeconfig",
        str(kubeconfig),
        "--leader-elect=false",
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(port),
        "--cert-dir",
        str(cert_dir),
        "--feature-gates",
        FEATURE_GATES,
        "--kube-api-qps",
        "200",
        "--kube-api-burst",
        "400",
        "--v",
        "1",
    ]


@dataclass(frozen=True)
class KnownCluster:
    """One cluster `muster local-cluster list` shows."""

    name: str
    directory: Path
    # running (every component), stopped (none), or partly running (naming what stopped)
    state: str
    real_node: bool  # it holds this machine's real node now


def known_clusters(parent: Path | None = None) -> list[KnownCluster]:
    """Every cluster ever started under `parent` (default: where `--name` puts them), by
    name: a directory holding a state file."""
    parent = parent or clusters_dir()
    found: list[KnownCluster] = []
    for directory in sorted(parent.iterdir()) if parent.is_dir() else []:
        if not (directory / STATE_FILE).is_file():
            continue
        try:
            state = ClusterState.load(directory)
        except (ValueError, KeyError, TypeError, OSError) as exc:
            found.append(KnownCluster(directory.name, directory, f"unknown ({exc})", False))
            continue
        assert state is not None
        alive = {c.name for c in state.components if pid_alive(c.pid)}
        stopped = [c.name for c in state.components if c.name not in alive]
        if not alive:
            words = "stopped"
        elif not stopped:
            words = "running"
        else:
            words = f"partly running ({', '.join(stopped)} stopped)"
        node = "kubelet" in alive and realnode.owns(directory.resolve())
        found.append(KnownCluster(directory.name, directory, words, node))
    return found


class LocalCluster:
    """Start, inspect and stop one local control plane rooted at `directory`."""

    def __init__(self, directory: Path | None = None, binaries: Binaries | None = None) -> None:
        self.directory = (directory or default_dir()).resolve()
        self._binaries = binaries
        self.state = ClusterState.load(self.directory)

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = ensure_binaries()
        return self._binaries

    def _refresh(self) -> None:
        """Take in what another process recorded since this object loaded the state (the chaos
        run restarts the apiserver under a new pid), so that saving does not forget it."""
        on_disk = ClusterState.load(self.directory)
        if self.state is None or on_disk is None:
            self.state = self.state or on_disk
            return
        mine = {c.name: c for c in self.state.components}
        for theirs in on_disk.components:
            ours = mine.get(theirs.name)
            if ours is None:
                self.state.components.append(theirs)
            elif ours.pid != theirs.pid and pid_alive(theirs.pid) and not pid_alive(ours.pid):
                ours.pid = theirs.pid

    # ----------------------------------------------------------------- lifecycle
    def running(self) -> list[Component]:
        if not self.state:
            return []
        return [c for c in self.state.components if pid_alive(c.pid)]

    def up(
        self,
        timeout: float = 120.0,
        progress: Callable[[str], None] = lambda _m: None,
        *,
        real_node: bool = False,
    ) -> ClusterState:
        """Start every component and wait until each answers its health check; with
        `real_node`, also this machine's kubelet node (realnode.py), the apiserver then
        listening where pods reach it."""
        if self.state and self.running():
            raise ClusterError(
                f"a local cluster already runs from {self.directory} "
                f"({', '.join(c.name for c in self.running())}); "
                f"run `muster local-cluster down {select_args(self.directory)}` first"
            )
        binaries = self.binaries
        address = None
        if real_node:
            try:
                realnode.check_prerequisites(
                    binaries.paths.get("kubelet"), binaries.paths.get("kube-proxy")
                )
                address = realnode.host_address()
                realnode.claim(self.directory, _owner_running)
            except realnode.RealNodeError as exc:
                raise ClusterError(str(exc)) from None
        if self.directory.exists():
            shutil.rmtree(self.directory)
        (self.directory / "logs").mkdir(parents=True)
        pki_dir = self.directory / "pki"
        ca = pki.CertificateAuthority(pki_dir)
        serving = ca.issue(
            "apiserver", "kube-apiserver", server=True, addresses=(address,) if address else ()
        )
        # The apiserver's identity towards kubelets (logs, exec): no kwok node asks for it.
        kubelet_client = ca.issue("apiserver-kubelet", "kube-apiserver-kubelet", "system:masters")
        sa_key, sa_pub = pki.service_account_keys(pki_dir)

        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        kcm_port, sched_port, kwok_port = free_port(), free_port(), free_port()
        server = f"https://127.0.0.1:{api_port}"
        admin = ca.issue("admin", "muster-admin", "system:masters")
        # Named after the cluster, user included, so that two clusters' kubeconfigs merge
        # into one file without one's entries hiding the other's.
        context = context_name(self.directory)
        user = "admin" if context == "muster-local" else f"{context}-admin"
        kubeconfig = pki.write_kubeconfig(
            self.kubeconfig, server, ca.cert_path, admin, user, context=context
        )
        kcm_kc = pki.write_kubeconfig(
            self.directory / "kcm.kubeconfig",
            server,
            ca.cert_path,
            ca.issue("kcm", "system:kube-controller-manager"),
            "kcm",
        )
        sched_kc = pki.write_kubeconfig(
            self.directory / "scheduler.kubeconfig",
            server,
            ca.cert_path,
            ca.issue("scheduler", "system:kube-scheduler"),
            "scheduler",
        )
        self.state = ClusterState(
            directory=str(self.directory), api_port=api_port, node_address=address
        )
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        try:
            progress("starting etcd")
            self._start(
                "etcd",
                [
                    binaries["etcd"],
                    "--data-dir",
                    str(self.directory / "etcd"),
                    "--listen-client-urls",
                    etcd_url,
                    "--advertise-client-urls",
                    etcd_url,
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{etcd_peer}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{etcd_peer}",
                    "--initial-cluster",
                    f"default=http://127.0.0.1:{etcd_peer}",
                    "--unsafe-no-fsync=true",
                    "--log-level",
                    "warn",
                ],
                health_url=f"{etcd_url}/health",
            )
            self._wait("etcd", timeout)
            progress("starting kube-apiserver")
            self._start(
                "kube-apiserver",
                [
                    binaries["kube-apiserver"],
                    "--etcd-servers",
                    etcd_url,
                    "--cert-dir",
                    str(pki_dir),
                    "--tls-cert-file",
                    str(serving.cert),
                    "--tls-private-key-file",
                    str(serving.key),
                    "--secure-port",
                    str(api_port),
                    *_listen_flags(address),
                    "--kubelet-client-certificate",
                    str(kubelet_client.cert),
                    "--kubelet-client-key",
                    str(kubelet_client.key),
                    "--authorization-mode",
                    "Node,RBAC",
                    "--service-cluster-ip-range",
                    "10.0.0.0/24",
                    "--allow-privileged=true",
                    "--client-ca-file",
                    str(ca.cert_path),
                    "--service-account-issuer",
                    f"{server}/",
                    "--service-account-key-file",
                    str(sa_pub),
                    "--service-account-signing-key-file",
                    str(sa_key),
                    "--feature-gates",
                    FEATURE_GATES,
                    "--runtime-config",
                    "scheduling.k8s.io/v1beta1=true",
                    "--enable-priority-and-fairness=false",
                    "--v",
                    "1",
                ],
                health_url=f"{server}/readyz",
            )
            self._wait("kube-apiserver", timeout)
            progress("starting kube-controller-manager")
            self._start(
                "kube-controller-manager",
                [
                    binaries["kube-controller-manager"],
                    *_control_plane_flags(kcm_kc, kcm_port, self.directory / "kcm-certs"),
                    "--root-ca-file",
                    str(ca.cert_path),
                    "--service-account-private-key-file",
                    str(sa_key),
                    # Each controller acts as its own service account, bound by bootstrap RBAC.
                    "--use-service-account-credentials=true",
                    "--controllers",
                    "*",
                    # kwok nodes keep their status fresh; don't evict pods for a slow heartbeat.
                    "--node-monitor-grace-period",
                    "120s",
                    "--concurrent-job-syncs",
                    "20",
                ],
                health_url=f"https://127.0.0.1:{kcm_port}/healthz",
            )
            progress("starting kube-scheduler")
            self._start(
                "kube-scheduler",
                [
                    binaries["kube-scheduler"],
                    *_control_plane_flags(sched_kc, sched_port, self.directory / "scheduler-certs"),
                ],
                health_url=f"https://127.0.0.1:{sched_port}/healthz",
            )
            progress("starting kwok")
            self._start(
                "kwok",
                [
                    binaries["kwok"],
                    "--kubeconfig",
                    str(kubeconfig),
                    "--config",
                    str(STAGES_FILE),
                    "--manage-all-nodes=false",
                    "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                    "--server-address",
                    f"127.0.0.1:{kwok_port}",
                    "--node-ip",
                    "10.0.0.1",
                    "--node-lease-duration-seconds",
                    "40",
                ],
                health_url=f"http://127.0.0.1:{kwok_port}/healthz",
            )
            for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
                self._wait(name, timeout)
            if address:
                self._start_node(ca, server.replace("127.0.0.1", address), address, progress)
        except (realnode.RealNodeError, ImageError, OSError) as exc:
            self.down()
            raise ClusterError(f"the real node did not start: {exc}") from None
        except Exception:
            self.down()
            raise
        return self.state

    def down(self, grace: float = 10.0) -> list[str]:
        """Stop every process this cluster started; return the names that were running.

        The state file is read again first: another process may have restarted a component
        (the chaos run restarts the apiserver) or added one (a peer controller) since this
        object loaded it, and those must stop too."""
        self._refresh()
        with_node = self.state and self.state.node_address and realnode.owns(self.directory)
        stopped = self._stop_node(grace) if with_node else []
        # The last started first: a peer controller before the apiserver it talks to.
        running = [
            c for c in reversed(self.state.components if self.state else []) if pid_alive(c.pid)
        ]
        stop_groups([c.pid for c in running], grace)
        return stopped + [c.name for c in running]

    def status(self) -> dict[str, str]:
        """Per component: 'healthy', 'running (unhealthy)' or 'stopped'."""
        if not self.state:
            return {}
        result: dict[str, str] = {}
        for component in self.state.components:
            if not pid_alive(component.pid):
                result[component.name] = "stopped"
            elif component.health_url and not self._healthy(component.health_url):
                result[component.name] = "running (unhealthy)"
            else:
                result[component.name] = "healthy"
        return result

    def env(self) -> str:
        """Shell lines that point kubectl at this cluster, with the kubectl built for it
        first on PATH (a system kubectl may be older than the cluster); with a real node,
        also this machine's address as pods reach it (for a database URL in a Secret)."""
        lines = [f"export KUBECONFIG={shlex.quote(str(self.kubeconfig))}"]
        if self.state and self.state.node_address:
            lines.append(f"export MUSTER_HOST_ADDRESS={self.state.node_address}")
        found, _ = find_binaries()
        kubectl = found.get("kubectl")
        if kubectl is not None:
            lines.append(f'export PATH={shlex.quote(str(kubectl.parent))}:"$PATH"')
        return "\n".join(lines)

    # ----------------------------------------------------------------- the real node
    def _start_node(
        self,
        ca: pki.CertificateAuthority,
        server: str,
        address: str,
        progress: Callable[[str], None],
    ) -> None:
        node = realnode.RealNode(self.directory)
        progress("building (or finding) the images the real node runs")
        archives = ensure_images(progress)
        node.write_config(ca, server)
        hoststate.record(node.sysctls)
        commands = node.commands(self.binaries["kubelet"], self.binaries["kube-proxy"], address)
        progress("starting containerd")
        self._start("containerd", commands["containerd"], None)
        node.wait_containerd(30.0, self.directory / "logs" / "containerd.log")
        for archive in archives:
            progress(f"loading {archive.ref} into the node's containerd")
            node.import_image(archive.path)
        progress(f"starting the kubelet of node {realnode.node_name()} and kube-proxy")
        self._start("kubelet", commands["kubelet"], "http://127.0.0.1:10248/healthz")
        self._start("kube-proxy", commands["kube-proxy"], "http://127.0.0.1:10256/healthz")
        self._wait("kubelet", 120.0)
        self._wait("kube-proxy", 120.0)
        wait_nodes_ready(self.binaries["kubectl"], self.kubeconfig, [realnode.node_name()], 120.0)
        node.prepare_volume(self.binaries["kubectl"], self.kubeconfig)

    def _stop_node(self, grace: float) -> list[str]:
        """Stop the real node before the control plane, leaving the host as it was: no new
        pods (the controller manager and schedulers stop first), every pod deleted so that
        the kubelet tears it down, then the node's processes and their traces."""
        assert self.state is not None
        node = realnode.RealNode(self.directory)
        by_name = {c.name: c for c in self.state.components if pid_alive(c.pid)}
        first = [n for n in ("kube-controller-manager", "kube-scheduler") if n in by_name]
        node_parts = [n for n in ("kube-proxy", "kubelet", "containerd") if n in by_name]
        stop_groups([by_name[n].pid for n in first], grace)
        if "kube-apiserver" in by_name and "kubelet" in by_name:
            node.drain(self.binaries["kubectl"], self.kubeconfig)
        stop_groups([by_name[n].pid for n in ("kube-proxy", "kubelet") if n in by_name], grace)
        node.kill_leftovers()
        if "containerd" in by_name:
            stop_groups([by_name["containerd"].pid], grace)
        node.undo_host(self.binaries["kube-proxy"] if "kube-proxy" in self.binaries.paths else None)
        return first + node_parts

    # ----------------------------------------------------------------- helpers
    def start_component(
        self, name: str, argv: list[str], health_url: str | None, env: dict[str, str]
    ) -> None:
        """Run one more process as part of this cluster (a peer controller): `down` stops
        it with the rest."""
        self._refresh()
        if self.state is None:
            raise ClusterError("the local cluster is not running; run `muster local-cluster up`")
        self._start(name, argv, health_url, env)

    def wait_component(self, name: str, timeout: float) -> None:
        """Wait until a component answers its health URL; raise with its log if it exits."""
        self._wait(name, timeout)

    def stop_component(self, name: str, grace: float = 10.0) -> bool:
        """Stop one component by its pid and forget it; False if it was not running."""
        self._refresh()
        if self.state is None:
            return False
        running = [c for c in self.state.components if c.name == name and pid_alive(c.pid)]
        stop_groups([c.pid for c in running], grace)
        self.state.components = [c for c in self.state.components if c.name != name]
        self.state.save()
        return bool(running)

    def _start(
        self,
        name: str,
        argv: list[str],
        health_url: str | None,
        env: dict[str, str] | None = None,
    ) -> None:
        assert self.state is not None
        log = self.directory / "logs" / f"{name}.log"
        proc = start_detached(argv, log, self.directory, env)
        self.state.components.append(Component(name, proc.pid, str(log), health_url))
        self.state.save()

    def _ssl_context(self) -> ssl.SSLContext:
        pki_dir = self.directory / "pki"
        context = ssl.create_default_context()
        # Controller-manager and scheduler serve self-signed certificates on loopback.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(pki_dir / "admin.crt", pki_dir / "admin.key")
        return context

    def _healthy(self, url: str) -> bool:
        try:
            context = self._ssl_context() if url.startswith("https") else None
            with urllib.request.urlopen(url, timeout=3, context=context) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _wait(self, name: str, timeout: float) -> None:
        assert self.state is not None
        component = next(c for c in self.state.components if c.name == name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(component.pid):
                raise ClusterError(
                    f"{name} exited during start-up; last lines of {component.log}:\n"
                    f"{log_tail(Path(component.log))}"
                )
            if component.health_url is None or self._healthy(component.health_url):
                return
            time.sleep(0.25)
        raise ClusterError(
            f"{name} did not become healthy within {timeout:.0f}s "
            f"({component.health_url}); last lines of {component.log}:\n"
            f"{log_tail(Path(component.log))}"
        )
