"""A deposed leader cannot write (issue 16, hole 6), against the real apiserver.

Replica "a" reaches the apiserver through a proxy the test can partition; replica "b" reaches
it directly. Both run the real elector on one Lease. When "a" is cut off, "b" takes over once
the Lease expires; whatever "a" still had in hand must not reach the apiserver: neither a
write it decided before the partition and sends after it (a retry after a conflict
included), nor a write that was on its way when the partition began.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from controllers.runtime import apply
from controllers.runtime.client import FencedKube, NotLeaderError, api_client
from controllers.runtime.leader import LeaderElector, lease_request_timeout
from controllers.runtime.resources import JOB, Kube, Obj
from tests.conftest import ClusterHandle

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 2.5, 0.5


class PartitionProxy:
    """Forwards a local port to the apiserver. `partition()` stops forwarding without closing
    anything (requests hang, as across a dead link); `heal()` drops the connections that were
    cut off (so nothing they held is delivered late) and forwards new ones again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.lock = threading.Lock()
        self.conns: set[socket.socket] = set()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def partition(self) -> None:
        self.forwarding.clear()

    def heal(self) -> None:
        with self.lock:
            conns, self.conns = self.conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self.forwarding.set()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.heal()

    def _accept(self) -> None:
        while not self.closed:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            self.forwarding.wait()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                downstream.close()
                continue
            with self.lock:
                self.conns |= {downstream, upstream}
            threading.Thread(target=self._pump, args=(downstream, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                if not self.forwarding.is_set():
                    time.sleep(0.05)
                    if a.fileno() < 0:
                        return
                    continue
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    # Cut while these bytes were on their way: they are lost with the link
                    # (heal() closes this connection, and sending then fails).
                    while not self.forwarding.is_set():
                        time.sleep(0.05)
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()


class Replica:
    """One candidate: its elector running in a thread, and the leader's fenced access."""

    def __init__(self, api: client.ApiClient, namespace: str, lease: str, identity: str) -> None:
        self.elector = LeaderElector(
            Kube(api, request_timeout=lease_request_timeout(RENEW_DEADLINE, RETRY_PERIOD)),
            namespace,
            lease,
            identity,
            lease_duration=LEASE_DURATION,
            renew_deadline=RENEW_DEADLINE,
            retry_period=RETRY_PERIOD,
        )
        self.kube = FencedKube(api, self.elector.leadership_left)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.elector.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.fixture
def replicas(
    cluster: ClusterHandle, namespace: str
) -> Iterator[tuple[Replica, Replica, PartitionProxy]]:
    direct = api_client(cluster.kubeconfig)
    host, port = direct.configuration.host.removeprefix("https://").rsplit(":", 1)
    proxy = PartitionProxy((host, int(port)))
    proxied = api_client(cluster.kubeconfig)
    proxied.configuration.host = f"https://127.0.0.1:{proxy.port}"
    lease = f"fence-{uuid.uuid4().hex[:6]}"
    a = Replica(proxied, namespace, lease, "a")
    assert a.elector.wait_leader(threading.Event()), "a never led"
    b = Replica(direct, namespace, lease, "b")
    try:
        yield a, b, proxy
    finally:
        a.close()
        b.close()
        proxy.close()


def make_job(cluster: ClusterHandle, namespace: str) -> Obj:
    name = f"j-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "job", name, "-n", namespace, "--image=busybox", "--", "true")
    cluster.kubectl("patch", "job", name, "-n", namespace, "-p", '{"spec":{"suspend":true}}')
    job: Obj = cluster.get_json("job", name, "-n", namespace)
    return job


def label(obj: Obj, key: str) -> Any:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(key)


def takeover(cluster: ClusterHandle, a: Replica, b: Replica, proxy: PartitionProxy) -> None:
    """Cut `a` off until `b` leads, then let `a` reach the apiserver again."""
    proxy.partition()
    cluster.wait_for("b to take the Lease", b.elector.is_leader, timeout=30, interval=0.1)
    assert not a.elector.is_leader()
    proxy.heal()


def test_a_write_decided_before_the_takeover_and_retried_after_it_is_never_sent(
    cluster: ClusterHandle, namespace: str, replicas: tuple[Replica, Replica, PartitionProxy]
) -> None:
    a, b, proxy = replicas
    job = make_job(cluster, namespace)
    key = f"{namespace}/{job['metadata']['name']}"
    # While it leads, a's writes go through.
    apply.update(
        a.kube,
        JOB,
        key,
        lambda j: j["metadata"].setdefault("labels", {}).update({"writer": "a-leading"}) is None,
        current=job,
    )
    assert (
        label(cluster.get_json("job", key.split("/")[1], "-n", namespace), "writer") == "a-leading"
    )

    # a decides a change; before its write lands, someone else writes the Job (409), and by
    # the time a has re-read and decided again it has been deposed.
    calls = 0

    def decide(j: Obj) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            cluster.kubectl("label", "job", j["metadata"]["name"], "-n", namespace, "bump=1")
        else:
            takeover(cluster, a, b, proxy)
        j["metadata"].setdefault("labels", {})["writer"] = "a-deposed"
        return True

    stale = cluster.get_json("job", key.split("/")[1], "-n", namespace)
    with pytest.raises(NotLeaderError):
        apply.update(a.kube, JOB, key, decide, current=stale)
    assert calls == 2, "the first attempt met the conflict, the retry met the fence"
    assert a.kube.refused == 1

    # The new leader writes; the Job never carries the deposed leader's change.
    apply.update(
        b.kube, JOB, key, lambda j: j["metadata"]["labels"].update({"writer": "b"}) is None
    )
    time.sleep(1.0)
    assert label(cluster.get_json("job", key.split("/")[1], "-n", namespace), "writer") == "b"


def test_a_write_in_flight_when_the_leader_is_cut_off_is_abandoned_before_anyone_takes_over(
    cluster: ClusterHandle, namespace: str, replicas: tuple[Replica, Replica, PartitionProxy]
) -> None:
    a, b, proxy = replicas
    job = make_job(cluster, namespace)
    key = f"{namespace}/{job['metadata']['name']}"
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            apply.update(
                a.kube,
                JOB,
                key,
                lambda j: (
                    j["metadata"].setdefault("labels", {}).update({"writer": "a-in-flight"}) is None
                ),
                current=job,
            )
            outcome["result"] = "written"
        except Exception as error:  # the timeout the fence set, in urllib3's words
            outcome["result"] = type(error).__name__
        outcome["ended_while_b_led"] = b.elector.is_leader()

    proxy.partition()
    assert a.elector.leadership_left() > 0, "a still leads when its write leaves"
    writer = threading.Thread(target=write)
    writer.start()
    cluster.wait_for("b to take the Lease", b.elector.is_leader, timeout=30, interval=0.05)
    writer.join(timeout=60)
    proxy.heal()
    # The request was given only the lead a had left: it was abandoned before b could start.
    assert outcome.get("result") not in (None, "written"), outcome
    assert outcome["ended_while_b_led"] is False, outcome
    current = cluster.get_json("job", key.split("/")[1], "-n", namespace)
    assert label(current, "writer") is None
