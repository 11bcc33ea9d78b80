"""The cluster a benchmark runs against: a fresh local cluster (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok) in a temporary directory, stopped at the end,
or one that is already running, known by its kubeconfig or its state directory; either way
with Muster's CRDs installed."""

from __future__ import annotations

import contextlib
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.create import apply
from controllers.localcluster.binaries import ensure_binaries
from controllers.localcluster.cluster import STATE_FILE, LocalCluster
from controllers.localcluster.kubectl import kubectl

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    kc: str  # the kubectl binary
    kubeconfig: str  # the admin's
    # The local cluster's processes and files; None for a cluster known only by kubeconfig
    # (then no component's pid, log or metrics endpoint is within reach).
    local: LocalCluster | None

    def kubectl(
        self, *argv: str, input: str | None = None, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return kubectl(self.kc, self.kubeconfig, *argv, input=input, check=check, timeout=timeout)

    def apply(self, docs: Sequence[Mapping[str, Any]], server_side: bool = False) -> None:
        apply(self.kc, self.kubeconfig, docs, server_side)

    def install_crds(self, *extra: Mapping[str, Any]) -> None:
        """Muster's CRDs (and `extra` ones), served before this returns."""
        self.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        if extra:
            self.apply(extra, server_side=True)
        self.kubectl("wait", "--for", "condition=Established", "crd", "--all", "--timeout=120s")

    def component_pids(self) -> dict[str, int]:
        """The local cluster's processes by component name (none for a foreign cluster)."""
        if self.local is None or self.local.state is None:
            return {}
        return {c.name: c.pid for c in self.local.state.components}

    def metrics_url(self, component: str) -> str | None:
        """Where a local cluster's kube-apiserver or kube-scheduler serves /metrics."""
        state = self.local.state if self.local is not None else None
        if state is None:
            return None
        if component == "kube-apiserver":
            return f"https://127.0.0.1:{state.api_port}/metrics"
        return next(
            (
                c.health_url.replace("/healthz", "/metrics")
                for c in state.components
                if c.name == component and c.health_url
            ),
            None,
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The admin's client certificate, which reads the components' /metrics."""
        # The local cluster's own health checks read its components the same way.
        return self.local._ssl_context() if self.local is not None else None


@contextlib.contextmanager
def running_cluster(
    kubeconfig: str | None = None,
    *,
    directory: Path | None = None,
    fresh_in: Path | None = None,
    prefix: str = "muster-bench-",
    kind: type[LocalCluster] = LocalCluster,
    prepare: Callable[[LocalCluster], None] | None = None,
    build: bool = False,
    keep: bool = False,
) -> Iterator[Cluster]:
    """The cluster at `kubeconfig` (a local one if it sits in a local cluster's state
    directory), or the local cluster in `directory`, or else a fresh local cluster of class
    `kind` in `fresh_in` (a new temporary directory by default), `prepare`d before it starts
    and stopped at the end unless `keep`; a temporary directory of its own is deleted with it
    (about 140 MiB of etcd data and logs a run) unless the run failed, whose logs it keeps.
    Binaries are built first only with `build`."""
    binaries = ensure_binaries(build=build)
    local: LocalCluster | None = None
    owned = False
    temporary: Path | None = None
    if kubeconfig is not None:
        state_dir = Path(kubeconfig).resolve().parent
        if (state_dir / STATE_FILE).exists():
            local = LocalCluster(state_dir, binaries)
    elif directory is not None:
        local = LocalCluster(directory, binaries)
        kubeconfig = str(local.kubeconfig)
    else:
        if fresh_in is None:
            fresh_in = temporary = Path(tempfile.mkdtemp(prefix=prefix))
        local = kind(fresh_in, binaries)
        if prepare is not None:
            prepare(local)
        local.up()
        owned = True
        kubeconfig = str(local.kubeconfig)
    failed = True
    try:
        yield Cluster(binaries["kubectl"], kubeconfig, local)
        failed = False
    finally:
        if owned and local is not None:
            if keep:
                print(f"cluster left running: --kubeconfig {local.kubeconfig}", file=sys.stderr)
            else:
                local.down()
                if temporary is not None and not failed:
                    shutil.rmtree(temporary, ignore_errors=True)
                elif temporary is not None:
                    print(f"the failed run's cluster logs: {temporary}", file=sys.stderr)
