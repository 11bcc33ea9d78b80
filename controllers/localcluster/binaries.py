"""Where the control-plane binaries come from: a directory the user names, or our own build.

Order: `MUSTER_K8S_BIN` (every binary), then `KUBEBUILDER_ASSETS` (envtest ships etcd,
kube-apiserver and kubectl only), then the versioned cache that `build_binaries.sh` fills
from the Go module proxy. Nothing else is ever downloaded.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

K8S_VERSION = os.environ.get("MUSTER_K8S_VERSION", "v1.37.1")
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    # The real node's (realnode.py); built with the rest, run only with --real-node.
    "kubelet",
    "kube-proxy",
)
BUILD_SCRIPT = Path(__file__).with_name("build_binaries.sh")


class BinariesError(RuntimeError):
    """The control plane could not be obtained; the message says what failed."""


def cache_root() -> Path:
    return Path(os.environ.get("MUSTER_CACHE_DIR", Path.home() / ".cache" / "muster"))


def cache_bin_dir() -> Path:
    return cache_root() / f"k8s-{K8S_VERSION}" / "bin"


@dataclass(frozen=True)
class Binaries:
    paths: dict[str, Path]

    def __getitem__(self, component: str) -> str:
        return str(self.paths[component])


def _search_dirs() -> list[Path]:
    dirs = [
        Path(os.environ[var])
        for var in ("MUSTER_K8S_BIN", "KUBEBUILDER_ASSETS")
        if os.environ.get(var)
    ]
    dirs.append(cache_bin_dir())
    return dirs


def find_binaries() -> tuple[dict[str, Path], list[str]]:
    """Return the binaries found and the names of those still missing."""
    found: dict[str, Path] = {}
    for component in COMPONENTS:
        for directory in _search_dirs():
            candidate = directory / component
            if candidate.is_file() and os.access(candidate, os.X_OK):
                found[component] = candidate
                break
    return found, [c for c in COMPONENTS if c not in found]


def build_binaries(log: Path | None = None) -> None:
    """Build what is missing into the cache with the Go toolchain (slow once, then cached)."""
    env = dict(os.environ, MUSTER_K8S_VERSION=K8S_VERSION)
    out = open(log, "ab") if log else None  # noqa: SIM115 - closed below
    try:
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT), str(cache_bin_dir())],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            check=False,
        )
    except FileNotFoundError as exc:
        raise BinariesError(f"cannot run the build script {BUILD_SCRIPT}: {exc}") from exc
    finally:
        if out:
            out.close()
    if result.returncode != 0:
        where = f"; see {log}" if log else ""
        raise BinariesError(
            f"building the control plane failed (bash {BUILD_SCRIPT} "
            f"exited {result.returncode}){where}"
        )


def ensure_binaries(build: bool = True) -> Binaries:
    """Find every component, building the missing ones when allowed."""
    found, missing = find_binaries()
    if missing and build:
        build_binaries()
        found, missing = find_binaries()
    if missing:
        raise BinariesError(
            f"missing control-plane binaries: {', '.join(missing)} "
            f"(looked in {', '.join(str(d) for d in _search_dirs())}); "
            "run `muster local-cluster build` or set MUSTER_K8S_BIN"
        )
    return Binaries(found)
