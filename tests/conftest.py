"""Session-wide fixtures: one real local control plane per test session.

End-to-end tests never skip: if the control plane cannot be built or started, the fixture
raises and every e2e test fails with the reason.
"""

from __future__ import annotations

import atexit
import json
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest

from controllers.localcluster.binaries import ensure_binaries
from controllers.localcluster.cluster import LocalCluster
from controllers.localcluster.kubectl import kubectl
from controllers.localcluster.nodes import create_nodes
from controllers.localcluster.peers import start_all as start_peers
from controllers.localcluster.peers import stop as stop_peer

REPO = Path(__file__).resolve().parent.parent


@dataclass
class ClusterHandle:
    """What an end-to-end test gets: the kubeconfig and the real kubectl bound to it."""

    local: LocalCluster
    kubeconfig: str
    kubectl_bin: str

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return kubectl(
            self.kubectl_bin, self.kubeconfig, *args, input=input, check=check, timeout=timeout
        )

    def get_json(self, *args: str) -> dict[str, object]:
        result: dict[str, object] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return result

    def nodes(
        self,
        count: int,
        *,
        prefix: str | None = None,
        cpu: str = "32",
        memory: str = "256Gi",
        gpu: int = 0,
        labels: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
    ) -> list[str]:
        return create_nodes(
            self.kubectl_bin,
            self.kubeconfig,
            count,
            prefix=prefix or f"n{uuid.uuid4().hex[:6]}",
            cpu=cpu,
            memory=memory,
            gpu=gpu,
            labels=labels,
            taints=taints,
        )

    def wait_for(
        self, what: str, predicate: Callable[[], bool], timeout: float = 60, interval: float = 0.5
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    binaries = ensure_binaries(build=True)
    local = LocalCluster(tmp_path_factory.mktemp("local-cluster"), binaries)
    # If the interpreter dies on an exception outside pytest's control, don't leave
    # apiservers behind.
    atexit.register(local.down)
    # SIGTERM (a CI timeout, `kill`) would end the interpreter without running `finally`
    # or atexit, leaving etcd and the apiserver running; as an interrupt, pytest tears the
    # session down as it does on Ctrl-C.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    local.up()
    try:
        yield ClusterHandle(local, str(local.kubeconfig), binaries["kubectl"])
    finally:
        local.down()
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture
def namespace(cluster: ClusterHandle) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # The service-account controller creates `default` asynchronously; pods need it.
    cluster.wait_for(
        f"serviceaccount default in {name}",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def peers(cluster: ClusterHandle, request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """The peer controllers a test module names in its `PEERS` ("jobset,trainer"), built
    once and run against the session's cluster for that module only; stopped at its end
    (their CRDs stay)."""
    started = start_peers(cluster.local, str(getattr(request.module, "PEERS", "")))
    try:
        yield [p.name for p in started]
    finally:
        for peer in reversed(started):
            stop_peer(cluster.local, peer)


@pytest.fixture(scope="module")
def before_controller(peers: list[str]) -> None:
    """What must be served before a module's controller starts (it watches the kinds the
    apiserver serves at start): the peers the module names (`PEERS`), with their CRDs. A
    module that needs more overrides this fixture."""
