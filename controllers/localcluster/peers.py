"""Peer controllers (JobSet, Kubeflow Trainer, LeaderWorkerSet, KubeRay, Kueue) built from
exact versions on the Go module proxy and run out of cluster against the local control plane.

Each peer is built once by `build_peer.sh` into `~/.cache/muster/<peer>-<version>/`: the
manager binary in `bin/` and the module's own manifests (CRDs, webhooks, runtimes) in
`manifests/`, so the CRDs always come from the same download as the binary.

Started with `muster local-cluster up --with jobset,trainer,lws,kuberay`: its CRDs are
applied, it runs as a process of the cluster (recorded in the cluster's state, so `down`
stops it by pid), with leader election and its own certificate management off. Its webhooks
serve on a loopback port with a certificate from a CA of our own (`pki.py`, as the
apiserver's), and the module's webhook configurations are registered with
`clientConfig.url` pointing there, as the harness registers Muster's own webhooks; the
apiserver runs on the same host, so the peers' webhooks run as they do in a cluster, none
disabled (KubeRay's are off in its own default install, and here too).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controllers.localcluster import pki
from controllers.localcluster.binaries import cache_root
from controllers.localcluster.cluster import ClusterError, LocalCluster, free_port
from quota.api.names import QUEUE_LABEL

BUILD_SCRIPT = Path(__file__).with_name("build_peer.sh")
HOST = "127.0.0.1"


class PeerError(RuntimeError):
    """A peer could not be built or started; the message says what failed."""


@dataclass(frozen=True)
class Ports:
    """Where one running peer listens (all on loopback)."""

    webhook: int
    health: int


@dataclass(frozen=True)
class Peer:
    """One peer controller: where it comes from and how it runs out of cluster."""

    name: str
    module: str
    version: str
    package: str  # the manager's main package
    binary: str
    manifests: str  # the directory of the module copied into the cache
    crds: tuple[str, ...]  # under `manifests`: CRD files or directories
    webhooks: str | None  # under `manifests`: the webhook configurations
    # Under `manifests`: objects applied once the manager serves its webhooks (runtimes).
    extras: tuple[str, ...] = ()
    # Dependencies the checksum database answers 404 for, exempted by name (GONOSUMDB).
    nosumdb: str = ""
    requires: tuple[str, ...] = ()  # peers whose CRDs and manager it needs
    config: Callable[[Ports, Path], dict[str, Any]] | None = None  # None: build only
    # Extra environment, given the certificate directory (the Trainer has no certDir
    # setting; controller-runtime then reads $TMPDIR/k8s-webhook-server/serving-certs).
    env: Callable[[Path], dict[str, str]] = field(default=lambda certs: {})

    @property
    def directory(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}"

    @property
    def binary_path(self) -> Path:
        return self.directory / "bin" / self.binary

    @property
    def manifest_dir(self) -> Path:
        return self.directory / "manifests"

    def built(self) -> bool:
        return os.access(self.binary_path, os.X_OK) and self.manifest_dir.is_dir()


def _manager_config(api_version: str) -> Callable[[Ports, Path], dict[str, Any]]:
    """The Configuration of a manager with JobSet's layout (JobSet's and LWS's alike)."""

    def config(ports: Ports, certs: Path) -> dict[str, Any]:
        return {
            "apiVersion": api_version,
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": ports.webhook, "host": HOST, "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"{HOST}:{ports.health}"},
        }

    return config


def _trainer_config(ports: Ports, certs: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
        "webhook": {"port": ports.webhook, "host": HOST},
        "metrics": {"bindAddress": "0", "secureServing": False},
        "health": {"healthProbeBindAddress": f"{HOST}:{ports.health}"},
        # Its status server (feature gate TrainJobStatus) stays off, as by default: it needs
        # the service-account token of a pod to find the cluster's OIDC issuer.
    }


def _trainer_env(certs: Path) -> dict[str, str]:
    return {"TMPDIR": str(certs.parent.parent)}


def _kuberay_config(ports: Ports, certs: Path) -> dict[str, Any]:
    # KubeRay serves webhooks only with ENABLE_WEBHOOKS=true (they are off in its default
    # install too) and then for RayClusters alone, on a fixed port: run without them.
    return {
        "apiVersion": "config.ray.io/v1alpha1",
        "kind": "Configuration",
        "enableLeaderElection": False,
        "metricsAddr": "0",
        "probeAddr": f"{HOST}:{ports.health}",
    }


PEERS: dict[str, Peer] = {
    p.name: p
    for p in (
        Peer(
            name="jobset",
            module="sigs.k8s.io/jobset",
            version="v0.12.0",
            package="sigs.k8s.io/jobset",
            binary="jobset-controller",
            manifests="config/components",
            crds=("crd/bases",),
            webhooks="webhook/manifests.yaml",
            config=_manager_config("config.jobset.x-k8s.io/v1alpha1"),
        ),
        Peer(
            name="trainer",
            module="github.com/kubeflow/trainer/v2",
            version="v2.2.0",
            package="github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
            binary="trainer-controller-manager",
            manifests="manifests",
            crds=("base/crds",),
            webhooks="base/webhook/manifests.yaml",
            extras=("base/runtimes",),
            requires=("jobset",),
            config=_trainer_config,
            env=_trainer_env,
        ),
        Peer(
            name="lws",
            module="sigs.k8s.io/lws",
            # v0.10.0 is listed by the proxy but its source is not served ("This module
            # version is not available"): v0.9.0 is the newest that downloads.
            version="v0.9.0",
            package="sigs.k8s.io/lws/cmd",
            binary="lws-controller-manager",
            manifests="config",
            crds=("crd",),
            webhooks="webhook/manifests.yaml",
            config=_manager_config("config.lws.x-k8s.io/v1alpha1"),
        ),
        Peer(
            name="kuberay",
            module="github.com/ray-project/kuberay/ray-operator",
            version="v1.5.0",
            package="github.com/ray-project/kuberay/ray-operator",
            binary="kuberay-operator",
            manifests="config",
            crds=("crd",),
            webhooks=None,
            config=_kuberay_config,
        ),
        # Built for the side-by-side benchmark, which starts it itself; not started here.
        Peer(
            name="kueue",
            module="sigs.k8s.io/kueue",
            version="v0.19.2",
            package="sigs.k8s.io/kueue/cmd/kueue",
            binary="kueue",
            manifests="config/components",
            crds=("crd/bases",),
            webhooks="webhook/manifests.yaml",
            # The checksum database has no entry for this one dependency of Kueue (it
            # answers 404); it alone is exempted, by name.
            nosumdb="sigs.k8s.io/scheduler-library",
        ),
    )
}


def parse_names(text: str) -> list[Peer]:
    """Peers named in a comma-separated list, each after the peers it requires."""
    ordered: list[Peer] = []

    def add(name: str) -> None:
        peer = PEERS.get(name)
        if peer is None:
            known = ", ".join(PEERS)
            raise PeerError(f"unknown peer {name!r} (known: {known})")
        for required in peer.requires:
            add(required)
        if peer not in ordered:
            ordered.append(peer)

    for name in (n.strip() for n in text.split(",")):
        if name:
            add(name)
    return ordered


# ------------------------------------------------------------------------- building


def build(peer: Peer, log: Path | None = None) -> Path:
    """Build the peer into its cache directory unless it is there already; return it."""
    if peer.built():
        return peer.directory
    argv = [
        "bash",
        str(BUILD_SCRIPT),
        peer.module,
        peer.version,
        peer.package,
        peer.binary,
        str(peer.directory),
        peer.manifests,
        peer.nosumdb,
    ]
    out = open(log, "ab") if log else None  # noqa: SIM115 - closed below
    try:
        result = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT if out else None, check=False
        )
    finally:
        if out:
            out.close()
    if result.returncode != 0 or not peer.built():
        where = f"; see {log}" if log else ""
        raise PeerError(
            f"building {peer.name} {peer.version} ({peer.package}) failed "
            f"(exit {result.returncode}){where}"
        )
    return peer.directory


# ------------------------------------------------------------------------- manifests


def _yaml_files(root: Path, relative: Iterable[str]) -> list[Path]:
    """The YAML files under each path (a file, or a directory: the resources its
    kustomization lists, else every YAML file in it)."""
    files: list[Path] = []
    for rel in relative:
        path = root / rel
        kustomization = path / "kustomization.yaml"
        if path.is_file():
            files.append(path)
        elif kustomization.is_file():
            config = yaml.safe_load(kustomization.read_text()) or {}
            files.extend(_yaml_files(path, [str(r) for r in config.get("resources") or []]))
        elif path.is_dir():
            files.extend(sorted(path.rglob("*.yaml")))
        else:
            raise PeerError(f"{path} is missing from the peer's manifests")
    return files


def _documents(files: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind"):
                docs.append(doc)
    return docs


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def json_patch(doc: dict[str, Any], ops: Iterable[Mapping[str, Any]]) -> None:
    """Apply JSON-patch (RFC 6902) add / replace / remove operations in place: the shape of
    the patches a module's kustomization applies to its webhook configurations."""
    for op in ops:
        *parents, last = _pointer(str(op["path"]))
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        kind = op.get("op")
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if kind == "add":
                target.insert(index, op["value"])
            elif kind == "replace":
                target[index] = op["value"]
            elif kind == "remove":
                del target[index]
            else:
                raise PeerError(f"unsupported JSON patch operation {kind!r} at {op['path']}")
        elif kind in ("add", "replace"):
            target[last] = op["value"]
        elif kind == "remove":
            del target[last]
        else:
            raise PeerError(f"unsupported JSON patch operation {kind!r} at {op['path']}")


def _kustomize_patches(manifest: Path, doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patches the kustomization beside `manifest` applies to `doc` (matched by the
    target's kind, and name if it gives one)."""
    kustomization = manifest.parent / "kustomization.yaml"
    if not kustomization.is_file():
        return []
    config = yaml.safe_load(kustomization.read_text()) or {}
    ops: list[dict[str, Any]] = []
    for entry in config.get("patches") or []:
        target = entry.get("target") or {}
        if target.get("kind") != doc.get("kind"):
            continue
        if target.get("name") and target["name"] != (doc.get("metadata") or {}).get("name"):
            continue
        if entry.get("path"):
            ops.extend(yaml.safe_load((manifest.parent / entry["path"]).read_text()) or [])
    return ops


def webhook_configurations(peer: Peer, url: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The peer's own webhook configurations as its kustomization renders them (its object
    selectors included), named after the peer, each webhook's clientConfig pointing at
    `url` + its path instead of the in-cluster Service."""
    if peer.webhooks is None:
        return []
    bundle = base64.b64encode(ca_bundle).decode()
    manifest = peer.manifest_dir / peer.webhooks
    out = []
    for doc in _documents(_yaml_files(peer.manifest_dir, [peer.webhooks])):
        doc = json.loads(json.dumps(doc))
        json_patch(doc, _kustomize_patches(manifest, doc))
        doc["metadata"] = {"name": f"muster-peer-{peer.name}-{doc['metadata']['name']}"}
        for hook in doc.get("webhooks") or []:
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path") or "/"
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": bundle}
        out.append(doc)
    return out


def _kubectl(cluster: LocalCluster, args: Sequence[str], stdin: str | None = None) -> str:
    result = subprocess.run(
        [cluster.binaries["kubectl"], "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise PeerError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()[:2000]}")
    return result.stdout


def _apply(cluster: LocalCluster, docs: list[dict[str, Any]], manager: str) -> None:
    if docs:
        # Server-side: the CRDs are too large for the last-applied annotation.
        body = yaml.safe_dump_all(docs)
        _kubectl(
            cluster,
            [
                "apply",
                "--server-side",
                "--force-conflicts",
                f"--field-manager={manager}",
                "-f",
                "-",
            ],
            body,
        )


# ------------------------------------------------------------------------- running


def component_name(peer: Peer) -> str:
    return f"peer-{peer.name}"


def start(
    cluster: LocalCluster,
    peer: Peer,
    timeout: float = 120.0,
    progress: Callable[[str], None] = lambda m: None,
) -> None:
    """Install the peer's CRDs, run its manager against the cluster, register its webhooks
    and apply what it ships to run on (the Trainer's runtimes). Idempotent: a peer already
    running is left as it is."""
    if peer.config is None:
        raise PeerError(f"{peer.name} is built for benchmarks only and not started here")
    if not peer.built():
        raise PeerError(
            f"{peer.name} {peer.version} is not built; run "
            f"`muster local-cluster build --peers {peer.name}`"
        )
    name = component_name(peer)
    if any(c.name == name for c in cluster.running()):
        return
    progress(f"{peer.name}: installing CRDs")
    crds = _documents(_yaml_files(peer.manifest_dir, peer.crds))
    _apply(cluster, crds, f"muster-peer-{peer.name}")
    _wait_established(cluster, [crd["metadata"]["name"] for crd in crds], timeout)
    _wait_admissible(cluster, crds, timeout)

    home = cluster.directory / "peers" / peer.name
    certs = home / "k8s-webhook-server" / "serving-certs"
    # ca.crt, tls.crt and tls.key, where controller-runtime looks for them.
    ca = pki.CertificateAuthority(certs, f"muster-peer-{peer.name}-ca")
    ca.issue("tls", HOST, server=True)
    ports = Ports(free_port(), free_port())
    config = home / "config.yaml"
    config.write_text(yaml.safe_dump(peer.config(ports, certs)))

    progress(f"{peer.name}: starting {peer.binary_path.name}")
    cluster.start_component(
        name,
        [str(peer.binary_path), f"--config={config}", f"--kubeconfig={cluster.kubeconfig}"],
        health_url=f"http://{HOST}:{ports.health}/readyz",
        env=dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), **peer.env(certs)),
    )
    # Registered before waiting: a manager's readiness may wait on its webhook answering.
    _apply(
        cluster,
        webhook_configurations(peer, f"https://{HOST}:{ports.webhook}", ca.cert_path.read_bytes()),
        f"muster-peer-{peer.name}",
    )
    try:
        cluster.wait_component(name, timeout)
        extras = _documents(_yaml_files(peer.manifest_dir, peer.extras))
        _apply_when_served(cluster, extras, peer, timeout)
    except (ClusterError, PeerError):
        stop(cluster, peer)
        raise
    progress(f"{peer.name}: ready")


def _wait_established(cluster: LocalCluster, names: list[str], timeout: float) -> None:
    # Not `kubectl wait` (nor a jsonpath filter): both fail at once on a CRD whose status
    # has no conditions yet.
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = json.loads(_kubectl(cluster, ["get", "crd", name, "-o", "json"]))
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(
                c.get("type") == "Established" and c.get("status") == "True" for c in conditions
            ):
                break
            if time.monotonic() > deadline:
                raise PeerError(f"CRD {name} was not established within {timeout:.0f}s")
            time.sleep(0.25)


def _wait_admissible(cluster: LocalCluster, crds: list[dict[str, Any]], timeout: float) -> None:
    """Wait until a labelled object of each new kind can be created. Where Muster's admission
    policies match the kind (JobSets, TrainJobs), the apiserver needs the kind's schema, which
    it reads every 5 s: until then it answers such creates with 503 "Resource kind ... not
    found". Probed with dry runs of a bare object; any other answer (it is invalid) means the
    policies got past that point."""
    deadline = time.monotonic() + timeout
    for crd in crds:
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("served", True))
        probe = {
            "apiVersion": f"{spec['group']}/{version}",
            "kind": spec["names"]["kind"],
            "metadata": {
                "generateName": "muster-probe-",
                "namespace": "default",
                "labels": {QUEUE_LABEL: "muster-probe"},
            },
            "spec": {},
        }
        if spec.get("scope") != "Namespaced":
            del probe["metadata"]["namespace"]
        while True:
            try:
                _kubectl(cluster, ["create", "--dry-run=server", "-f", "-"], json.dumps(probe))
                break
            except PeerError as error:
                if "There can be a delay" not in str(error):
                    break
                if time.monotonic() > deadline:
                    raise PeerError(
                        f"{spec['names']['kind']}: the apiserver did not take in its schema "
                        f"within {timeout:.0f}s ({error})"
                    ) from None
            time.sleep(0.5)


def _apply_when_served(
    cluster: LocalCluster, docs: list[dict[str, Any]], peer: Peer, timeout: float
) -> None:
    """Apply through the peer's webhooks, retrying while they are still coming up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _apply(cluster, docs, f"muster-peer-{peer.name}")
            return
        except PeerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def stop(cluster: LocalCluster, peer: Peer) -> bool:
    """Stop the peer's manager (by its pid) and take its webhooks out of the apiserver's
    path; its CRDs and objects stay. False if it was not running."""
    names = [doc["metadata"]["name"] for doc in webhook_configurations(peer, "https://unused", b"")]
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        for config_name in names:
            _kubectl(cluster, ["delete", kind, config_name, "--ignore-not-found"])
    return cluster.stop_component(component_name(peer))


def start_all(
    cluster: LocalCluster,
    names: str,
    timeout: float = 120.0,
    progress: Callable[[str], None] = lambda m: None,
) -> list[Peer]:
    """Build (if needed) and start the named peers and those they require, in order."""
    peers = parse_names(names)
    for peer in peers:
        if not peer.built():
            progress(f"{peer.name}: building {peer.version} (first time: slow)")
            build(peer)
        start(cluster, peer, timeout, progress)
    return peers
