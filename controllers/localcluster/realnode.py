"""One real node in the local cluster: containerd, a kubelet and kube-proxy on this machine.

kwok's nodes have no container runtime, so nothing ever runs on them. With `--real-node`, the
local cluster also runs a kubelet (built from the same Kubernetes release as the control
plane) over Debian's containerd and runc, with the CNI bridge plugin and kube-proxy, so that
pods really run here: Muster's own chart, a Job whose container computes something. It joins
with a client certificate from the cluster's CA (no bootstrap tokens), under the machine's
hostname (the apiserver must resolve the node's name to reach the kubelet for logs and exec).

One kubelet per machine (its port 10250, one `cni0` bridge): a claim file in /run names the
cluster that owns the node, and a second `--real-node` cluster is refused while it runs.
Everything the node changes on the host is undone at `down` (hoststate.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from controllers.localcluster import hoststate, names, pki
from controllers.localcluster.images import PAUSE_IMAGE
from controllers.localcluster.kubectl import kubectl

POD_SUBNET = "10.244.0.0/24"  # host-local hands pod IPs out of it, on the bridge cni0
CLUSTER_CIDR = "10.244.0.0/16"  # kube-proxy's idea of "inside the cluster"
NODE_LABEL = "muster.dev/real-node"
# A directory on the node the local cluster offers as a PersistentVolume, so that a claim of a
# single-node cluster binds (the chart's SQLite history): what a user of such a cluster does
# without a storage provisioner.
VOLUME_NAME = "muster-local-volume"
VOLUME_SIZE = "2Gi"
CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
CLAIM = Path("/run/muster-real-node.json")
# containerd's state (its sockets, the shims' sockets, containers' root filesystems): a short
# path, since a unix socket's path may not exceed 107 bytes and a test's directory is long.
RUN_DIR = Path("/run/muster-node")
COMPONENTS = ("containerd", "kubelet", "kube-proxy")
PACKAGES = "runc containerd containernetworking-plugins iptables conntrack"
Progress = Callable[[str], None]


class RealNodeError(RuntimeError):
    """The real node cannot start (or stop) here; the message says why and what to do."""


def host_address() -> str:
    """The machine's primary IPv4 address (the default route's): where pods reach the
    apiserver and the host's PostgreSQL. No packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 9))
        except OSError as exc:
            raise RealNodeError(
                f"no route to a non-loopback address ({exc}): pods would have no way to "
                "reach the apiserver"
            ) from exc
        address = str(sock.getsockname()[0])
    if address.startswith("127."):
        raise RealNodeError("this machine's only address is a loopback one")
    return address


def node_name() -> str:
    return socket.gethostname().lower()


def _cni_bin_dir() -> Path | None:
    return next((d for d in CNI_BIN_DIRS if (d / "bridge").is_file()), None)


def check_prerequisites(kubelet: Path | None, kube_proxy: Path | None) -> None:
    """Refuse early, naming everything missing, rather than fail halfway through."""
    problems = []
    if os.geteuid() != 0:
        problems.append("it must run as root (the kubelet manages cgroups, mounts and iptables)")
    tools = ("containerd", "ctr", "runc", "iptables", "iptables-save", "conntrack", "ip")
    missing = [t for t in tools if shutil.which(t) is None]
    if _cni_bin_dir() is None:
        missing.append("the CNI bridge plugin")
    if missing:
        problems.append(
            f"missing {', '.join(missing)} (`make setup` installs the Debian packages: {PACKAGES})"
        )
    if kubelet is None or kube_proxy is None:
        problems.append("kubelet and kube-proxy are not built (`muster local-cluster build`)")
    if problems:
        raise RealNodeError("a real node cannot run here: " + "; ".join(problems))


def claim(directory: Path, running: Callable[[dict[str, object]], bool]) -> None:
    """Take this machine's one real node for the cluster in `directory`."""
    if CLAIM.is_file():
        with contextlib.suppress(ValueError, OSError):
            owner = json.loads(CLAIM.read_text())
            if owner.get("directory") != str(directory) and running(owner):
                theirs = Path(str(owner["directory"]))
                name = names.name_of(theirs)
                raise RealNodeError(
                    f"this machine's real node belongs to the local cluster in {theirs}"
                    f"{f' (named {name})' if name else ''}; run `muster local-cluster down "
                    f"{names.select_args(theirs)}` first, or start this one without "
                    "--real-node (one kubelet per machine)"
                )
    CLAIM.write_text(json.dumps({"directory": str(directory), "pid": os.getpid()}))


def owns(directory: Path) -> bool:
    """Whether the cluster in `directory` holds this machine's real node: only its `down`
    may touch the node's processes and host state (another cluster's stale `down` must not
    tear down a node that now belongs to a running cluster)."""
    try:
        return bool(json.loads(CLAIM.read_text()).get("directory") == str(directory))
    except (ValueError, OSError):
        return False


def release(directory: Path) -> None:
    with contextlib.suppress(ValueError, OSError):
        if json.loads(CLAIM.read_text()).get("directory") == str(directory):
            CLAIM.unlink()


class RealNode:
    """The files of the node of the cluster in `directory` (everything under `node/`)."""

    def __init__(self, directory: Path) -> None:
        self.cluster_dir = directory
        self.root = directory / "node"
        self.containerd_root = self.root / "containerd"
        self.containerd_state = RUN_DIR / "containerd"
        self.socket = RUN_DIR / "containerd.sock"
        self.kubelet_root = RUN_DIR / "kubelet"  # it holds sockets too
        self.volume_dir = self.root / "volume"
        self.sysctls = self.root / "host-sysctls.json"

    # ------------------------------------------------------------------ configuration
    def write_config(self, ca: pki.CertificateAuthority, server: str) -> None:
        """containerd's, the CNI network's, the kubelet's and kube-proxy's configuration and
        credentials, under node/."""
        for d in (self.root, self.containerd_root, self.containerd_state, self.kubelet_root):
            d.mkdir(parents=True, exist_ok=True)
        cni_bin = _cni_bin_dir()
        cni_conf = self.root / "cni"
        cni_conf.mkdir(exist_ok=True)
        (cni_conf / "10-muster.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "muster",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": hoststate.BRIDGE,
                            "isGateway": True,
                            "ipMasq": True,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_SUBNET}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.root / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=2,
            )
        )
        (self.root / "containerd.toml").write_text(
            f"""version = 2
root = "{self.containerd_root}"
state = "{self.containerd_state}"
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE here: a container's oom_score_adj may not go below this process's.
  restrict_oom_score_adj = true
  # Pods' network namespaces under node/ too, so that `down` finds every one of them.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"""
        )
        name = node_name()
        pki.write_kubeconfig(
            self.root / "kubelet.kubeconfig",
            server,
            ca.cert_path,
            ca.issue("kubelet", f"system:node:{name}", "system:nodes"),
            "kubelet",
        )
        pki.write_kubeconfig(
            self.root / "kube-proxy.kubeconfig",
            server,
            ca.cert_path,
            ca.issue("kube-proxy", "system:kube-proxy"),
            "kube-proxy",
        )
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This machine kind mounts cgroup v1 (with a cgroup2 mount holding only hugetlb).
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "failSwapOn": False,
            # No CAP_SYS_RESOURCE: the kubelet may not lower its own oom_score_adj.
            "oomScoreAdj": 0,
            # Images are imported, never pulled: never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%"},
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca.cert_path)},
            },
            "authorization": {"mode": "Webhook"},
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "maxPods": 110,
        }
        (self.root / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def commands(self, kubelet: str, kube_proxy: str, address: str) -> dict[str, list[str]]:
        name = node_name()
        return {
            "containerd": ["containerd", "--config", str(self.root / "containerd.toml")],
            "kubelet": [
                kubelet,
                "--config",
                str(self.root / "kubelet.yaml"),
                "--kubeconfig",
                str(self.root / "kubelet.kubeconfig"),
                "--root-dir",
                str(self.kubelet_root),
                "--cert-dir",
                str(self.root / "kubelet-pki"),
                "--hostname-override",
                name,
                "--node-ip",
                address,
                "--node-labels",
                f"{NODE_LABEL}=true",
                "--v",
                "1",
            ],
            "kube-proxy": [
                kube_proxy,
                "--kubeconfig",
                str(self.root / "kube-proxy.kubeconfig"),
                "--hostname-override",
                name,
                "--proxy-mode",
                "iptables",
                "--cluster-cidr",
                CLUSTER_CIDR,
                # Leave the host's conntrack settings and route_localnet as they are.
                "--conntrack-max-per-core",
                "0",
                "--conntrack-tcp-timeout-established",
                "0",
                "--conntrack-tcp-timeout-close-wait",
                "0",
                "--iptables-localhost-nodeports=false",
                "--oom-score-adj",
                "0",
                "--metrics-bind-address",
                "127.0.0.1:10249",
                "--healthz-bind-address",
                "127.0.0.1:10256",
                "--v",
                "1",
            ],
        }

    # ------------------------------------------------------------------ images
    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def wait_containerd(self, timeout: float, log: Path) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.socket.exists() and self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.2)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
        raise RealNodeError(
            f"containerd did not answer on {self.socket} within {timeout:.0f}s; the end of "
            f"{log}:\n{tail}"
        )

    def import_image(self, archive: Path) -> None:
        """Load an image archive into the node's containerd (what a pull would do)."""
        self.ctr("images", "import", "--no-unpack", str(archive))

    # ------------------------------------------------------------------ the node object
    def prepare_volume(self, kubectl_bin: str, kubeconfig: Path) -> None:
        """A PersistentVolume on the node (no StorageClass): a claim without a class binds
        to it. Owned by the chart's user, since a hostPath volume ignores fsGroup."""
        self.volume_dir.mkdir(parents=True, exist_ok=True)
        os.chown(self.volume_dir, 65532, 65532)
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": VOLUME_NAME, "labels": {NODE_LABEL: "true"}},
            "spec": {
                "capacity": {"storage": VOLUME_SIZE},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "local": {"path": str(self.volume_dir)},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [node_name()],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        }
        kubectl(kubectl_bin, kubeconfig, "apply", "-f", "-", input=json.dumps(pv))

    def drain(self, kubectl_bin: str, kubeconfig: Path, timeout: float = 60.0) -> None:
        """Delete every pod bound to this node, so that the kubelet stops their containers and
        tears down their sandboxes (network included) itself, and wait until none runs."""
        kubectl(
            kubectl_bin,
            kubeconfig,
            "delete",
            "pods",
            "--all-namespaces",
            "--field-selector",
            f"spec.nodeName={node_name()}",
            "--grace-period=0",
            "--force",
            "--wait=false",
            check=False,
            timeout=30,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tasks = self.ctr("tasks", "ls", "-q", check=False)
            if tasks.returncode != 0 or not tasks.stdout.strip():
                return
            time.sleep(0.5)

    def kill_leftovers(self) -> None:
        """Whatever the kubelet did not stop: containers' tasks, then their shims (they
        outlive containerd)."""
        if self.socket.exists():
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
            time.sleep(0.5)
            for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "delete", "--force", container, check=False)
                self.ctr("containers", "delete", container, check=False)

    def kill_shims(self) -> None:
        marker = str(self.socket)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if argv and b"containerd-shim" in argv[0] and marker.encode() in b" ".join(argv):
                    os.kill(int(proc.name), 9)

    def undo_host(self, kube_proxy: str | None) -> None:
        """Everything the node changed on the host, back as it was (hoststate.py)."""
        self.kill_shims()
        if kube_proxy:
            subprocess.run([kube_proxy, "--cleanup"], capture_output=True, check=False)
        hoststate.remove_chains()
        hoststate.unmount_under([self.root, RUN_DIR])
        hoststate.remove_netns()
        hoststate.remove_bridge()
        hoststate.remove_cgroups()
        hoststate.restore_sysctls(self.sysctls)
        shutil.rmtree(RUN_DIR, ignore_errors=True)
        release(self.cluster_dir)
