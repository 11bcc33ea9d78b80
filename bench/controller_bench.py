"""Benchmark of the controller on the real local cluster: N labelled one-pod Jobs created
with kubectl (through the webhooks), timed until every one is admitted and unsuspended.

Two scenarios: `stream` times from the first `kubectl create` to the last admission (what
a user submitting a burst sees; the creation rate bounds it); `backlog` creates the Jobs
into a held queue first and times from lifting the hold to the last admission (the
controller's own admission throughput). For each: admissions per second, and API writes
per admitted Job, counted by wrapping the controller's ApiClient.call_api (every
POST/PUT/PATCH/DELETE it sends: Workload creates, admission and status writes, Job
updates, Events, Lease renewals).

The controller runs in this process (the same Manager `muster controller` runs) so its
requests can be counted. Prints figures; never fails on time.

    python bench/controller_bench.py [--jobs 1000] [--scenario stream|backlog|both]
        [--baseline] [--no-events] [--kubeconfig PATH]

Without --kubeconfig a fresh local cluster is started in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from controllers.localcluster.binaries import ensure_binaries
from controllers.localcluster.cluster import LocalCluster, free_port
from controllers.localcluster.kubectl import kubectl
from controllers.localcluster.nodes import create_nodes
from controllers.manager.manager import Manager
from controllers.manager.options import Options
from controllers.runtime.client import api_client
from controllers.runtime.logs import setup_logging
from controllers.runtime.resources import JOB, WORKLOAD, Kube, WriteCounter

REPO = Path(__file__).resolve().parents[1]


class PathCounter(WriteCounter):
    """Counts writes by method and resource kind (from the URL)."""

    def __init__(self, client: Any) -> None:
        self.by_kind: Counter[str] = Counter()
        original = client.call_api

        def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if method.upper() in self.WRITES:
                parts = url.split("?", 1)[0].rstrip("/").split("/")
                kind = _kind_of(parts)
                with self._lock:
                    self.by_kind[f"{method.upper()} {kind}"] += 1
            return original(method, url, *args, **kwargs)

        client.call_api = counted
        super().__init__(client)


def _kind_of(parts: list[str]) -> str:
    # .../namespaces/<ns>/<plural>[/<name>[/status]]
    for plural in (
        "workloads",
        "jobs",
        "events",
        "pods",
        "leases",
        "clusterqueues",
        "localqueues",
        "secrets",
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
        "namespaces",
    ):
        if plural in parts:
            suffix = "/status" if parts[-1] == "status" else ""
            return plural + suffix
    return "/".join(parts[-2:])


def manifests(n: int, namespaces: list[str], flavor: str, pool: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"muster-bench/pool": pool}},
        },
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ClusterQueue",
            "metadata": {"name": f"{flavor}-org"},
            "spec": {"flavors": [{"name": flavor, "quota": {"cpu": str(n // 10 + 10)}}]},
        },
    ]
    for ns in namespaces:
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        docs.append(
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "ClusterQueue",
                "metadata": {"name": f"{flavor}-{ns}"},
                "spec": {
                    "parent": f"{flavor}-org",
                    "flavors": [
                        {"name": flavor, "quota": {"cpu": str(n // 10 // len(namespaces) + 2)}}
                    ],
                },
            }
        )
        docs.append(
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "LocalQueue",
                "metadata": {"name": "q", "namespace": ns},
                "spec": {"clusterQueue": f"{flavor}-{ns}"},
            }
        )
    return docs


def jobs(n: int, namespaces: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"bench-{i:05d}",
                "namespace": namespaces[i % len(namespaces)],
                "labels": {"muster.dev/queue-name": "q"},
            },
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "resources": {"requests": {"cpu": "100m"}},
                            }
                        ],
                    }
                }
            },
        }
        for i in range(n)
    ]


def create_all(kc: str, kubeconfig: str, docs: list[dict[str, Any]]) -> None:
    """kubectl create, as a user would; 4 processes of 250 objects each."""
    chunk = max(1, (len(docs) + 3) // 4)
    creators = []
    for i in range(0, len(docs), chunk):
        part = yaml.safe_dump_all(docs[i : i + chunk])
        t = threading.Thread(
            target=kubectl,
            args=(kc, kubeconfig, "create", "-f", "-"),
            kwargs={"input": part, "timeout": 900},
        )
        t.start()
        creators.append(t)
    for t in creators:
        t.join()


def create_baseline(kc: str, kubeconfig: str, n: int, tag: str) -> float:
    """Seconds to create the same number of unlabelled, suspended Jobs (no webhook is
    called for them): what the apiserver alone costs on this machine."""
    ns = f"bench-{tag}-baseline"
    kubectl(kc, kubeconfig, "create", "namespace", ns)
    docs = jobs(n, [ns])
    for doc in docs:
        del doc["metadata"]["labels"]
        doc["spec"]["suspend"] = True
    started = time.monotonic()
    create_all(kc, kubeconfig, docs)
    elapsed = round(time.monotonic() - started, 2)
    kubectl(kc, kubeconfig, "delete", "namespace", ns, "--wait=false")
    return elapsed


def wait_admitted(
    reader: Kube, namespaces: list[str], n: int, started: float, timeout: float
) -> tuple[float, float, list[float]]:
    """Poll until `n` Workloads in `namespaces` hold quota and their Jobs run; returns
    (seconds to all admitted, seconds to all started, each admission's second)."""
    admitted_at: list[float] = []
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items, _ = reader.list(WORKLOAD)
        now = time.monotonic() - started
        for wl in items:
            if wl["metadata"]["namespace"] not in namespaces:
                continue
            conditions = (wl.get("status") or {}).get("conditions", [])
            reserved = any(
                c["type"] == "QuotaReserved" and c["status"] == "True" for c in conditions
            )
            if reserved and wl["metadata"]["uid"] not in seen:
                seen.add(wl["metadata"]["uid"])
                admitted_at.append(now)
        if len(seen) >= n:
            break
        time.sleep(1.0)
    all_admitted = time.monotonic() - started
    while time.monotonic() < deadline:
        items, _ = reader.list(JOB, label_selector="muster.dev/queue-name")
        running = sum(
            1
            for j in items
            if j["metadata"]["namespace"] in namespaces and not j["spec"].get("suspend")
        )
        if running >= n:
            break
        time.sleep(1.0)
    return all_admitted, time.monotonic() - started, admitted_at


def scenario(
    name: str,
    args: argparse.Namespace,
    kc: str,
    kubeconfig: str,
    manager: Manager,
    counter: PathCounter,
    reader: Kube,
) -> dict[str, Any]:
    """`stream`: time from the first `kubectl create` to all admitted. `backlog`: the Jobs
    are created into a held queue first; time from lifting the hold to all admitted (the
    admission loop's own throughput, without the creation rate in the way)."""
    tag = uuid.uuid4().hex[:6]
    pool = f"bench-{tag}"
    create_nodes(
        kc,
        kubeconfig,
        max(2, args.jobs // 100 + 1),
        prefix=pool,
        cpu="32",
        memory="256Gi",
        pods=110,
        labels={"muster-bench/pool": pool},
    )
    namespaces = [f"bench-{tag}-{i}" for i in range(args.namespaces)]
    queues = manifests(args.jobs, namespaces, pool, pool)
    if name == "backlog":
        queues[1]["spec"]["stopPolicy"] = "Hold"
    kubectl(kc, kubeconfig, "apply", "-f", "-", input=yaml.safe_dump_all(queues))
    time.sleep(1.5)  # the queues reach the caches
    docs = jobs(args.jobs, namespaces)

    writes_before = counter.writes
    kinds_before = Counter(counter.by_kind)
    started = time.monotonic()
    create_all(kc, kubeconfig, docs)
    created = time.monotonic() - started
    if name == "backlog":
        # Every Job has its Workload, and every Workload says why it waits (the steady
        # state of a held queue): now lift the hold.
        while True:
            items, _ = reader.list(WORKLOAD)
            waiting = sum(
                1
                for w in items
                if w["metadata"]["namespace"] in namespaces
                and any(
                    c["type"] == "QuotaReserved"
                    for c in (w.get("status") or {}).get("conditions", [])
                )
            )
            if waiting >= args.jobs and not manager.loop.pending_writer.pending():
                break
            time.sleep(1.0)
        writes_before = counter.writes
        kinds_before = Counter(counter.by_kind)
        kubectl(
            kc,
            kubeconfig,
            "patch",
            "clusterqueues.muster.dev",
            f"{pool}-org",
            "--type=merge",
            "-p",
            '{"spec":{"stopPolicy":"None"}}',
        )
        started = time.monotonic()
    all_admitted, all_started, admitted_at = wait_admitted(
        reader, namespaces, args.jobs, started, args.timeout
    )
    # Count every write the admissions caused: let coalesced status writes land and the
    # Event writer (best-effort, in the background) catch up.
    time.sleep(args.settle)
    drain_deadline = time.monotonic() + 300
    while manager.events.backlog() and time.monotonic() < drain_deadline:
        time.sleep(0.5)
    writes = counter.writes - writes_before
    kinds = Counter(counter.by_kind)
    kinds.subtract(kinds_before)
    n = len(admitted_at)
    return {
        "scenario": name,
        "jobs": args.jobs,
        "admitted": n,
        "create_seconds": round(created, 2),
        "all_admitted_seconds": round(all_admitted, 2),
        "all_started_seconds": round(all_started, 2),
        "admissions_per_second": round(n / all_admitted, 1) if all_admitted else 0,
        "median_admission_seconds": round(statistics.median(admitted_at), 2)
        if admitted_at
        else None,
        "api_writes": writes,
        "api_writes_per_admitted_job": round(writes / n, 2) if n else None,
        "writes_by_kind": {k: v for k, v in sorted(kinds.items()) if v},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    binaries = ensure_binaries(build=False)
    cluster: LocalCluster | None = None
    if args.kubeconfig:
        kubeconfig = args.kubeconfig
    else:
        cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="muster-bench-")), binaries)
        cluster.up()
        kubeconfig = str(cluster.kubeconfig)
    kc = binaries["kubectl"]
    try:
        kubectl(kc, kubeconfig, "apply", "--server-side", "-f", str(REPO / "crds"))
        kubectl(kc, kubeconfig, "wait", "--for", "condition=Established", "crd", "--all")
        baseline = (
            create_baseline(kc, kubeconfig, args.jobs, uuid.uuid4().hex[:6])
            if args.baseline
            else None
        )
        setup_logging("warning")
        client = api_client(kubeconfig)
        counter = PathCounter(client)
        options = Options(
            webhook_port=free_port(),
            leader_elect=True,
            lease_name=f"bench-{uuid.uuid4().hex[:6]}",
            events=not args.no_events,
            workers=args.workers,
        )
        manager = Manager(client, options)
        manager.start()
        if manager.elector is not None:
            manager.elector.wait_leader(threading.Event())
        time.sleep(1.5)  # webhooks registered, caches warm
        reader = Kube(api_client(kubeconfig, pool_size=4))
        names = ["stream", "backlog"] if args.scenario == "both" else [args.scenario]
        results = [scenario(n, args, kc, kubeconfig, manager, counter, reader) for n in names]
        manager.stop_event.set()
        manager.shutdown()
        return {
            "events": not args.no_events,
            "baseline_create_seconds_without_webhooks": baseline,
            "admission_cycles": manager.loop.cycles,
            "scenarios": results,
        }
    finally:
        if cluster is not None:
            cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--no-events", action="store_true")
    parser.add_argument("--scenario", choices=("stream", "backlog", "both"), default="both")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also time creating as many unlabelled Jobs, which no webhook sees",
    )
    args = parser.parse_args()
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
