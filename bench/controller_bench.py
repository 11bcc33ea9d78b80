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
requests can be counted; its webhook server runs in a process of its own, as always. Each
Job's creation and admission are timed from the controller's own caches (polled every
0.1 s: what the apiserver acknowledged, without a second client listing 1,000 objects in
this process), so "last admitted after its creation" is per Job. Webhook latency is reported
twice: as the webhook process measured each review (request line to answer written), and as
the apiserver's own `apiserver_admission_webhook_admission_duration_seconds` saw the calls
(mean, and the bucket the 99th percentile falls in). Pods are placed by kube-scheduler unless
`--scheduler muster`, as in the Kueue side-by-side; Muster's scheduler adds its own writes
(PodGroup, its status, pods/binding), counted apart. Prints figures; never fails on time.

    python bench/controller_bench.py [--jobs 1000] [--scenario stream|backlog|both]
        [--baseline [--baseline-rounds 3]] [--no-events] [--scheduler kube|muster]
        [--kubeconfig PATH]

Without --kubeconfig a fresh local cluster is started in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench.harness import metrics, objects
from bench.harness.cluster import Cluster, running_cluster
from bench.harness.controller import start_manager, stop_manager
from bench.harness.create import create_all
from bench.harness.timing import percentile
from bench.harness.waits import wait_until
from controllers.localcluster.nodes import create_nodes
from controllers.manager.manager import Manager
from controllers.manager.options import Options
from controllers.runtime.client import api_client
from controllers.runtime.logs import setup_logging
from controllers.runtime.resources import WORKLOAD, Kube, WriteCounter
from controllers.state.workloads import has_quota, owner_job_key
from controllers.webhooks import policies
from quota.api.names import QUEUE_LABEL, SCHEDULER_NAME


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
    if parts[-1] == "binding":
        return "pods/binding"
    for plural in (
        "podgroups",
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
    docs = [
        objects.flavor(flavor, {"muster-bench/pool": pool}),
        objects.cluster_queue(f"{flavor}-org", flavor, {"cpu": str(n // 10 + 10)}),
    ]
    quota = {"cpu": str(n // 10 // len(namespaces) + 2)}
    for ns in namespaces:
        docs += [
            objects.namespace(ns),
            objects.cluster_queue(f"{flavor}-{ns}", flavor, quota, parent=f"{flavor}-org"),
            objects.local_queue(ns, f"{flavor}-{ns}"),
        ]
    return docs


def jobs(n: int, namespaces: list[str], labelled: bool = True) -> list[dict[str, Any]]:
    """Labelled for Muster's queue `q`; or unlabelled and suspended (no hook of Muster's
    sees them)."""
    if labelled:
        return objects.one_pod_jobs(n, namespaces, prefix="bench", labels={QUEUE_LABEL: "q"})
    return objects.one_pod_jobs(n, namespaces, prefix="bench", suspend=True)


def create_baseline(
    cluster: Cluster, n: int, tag: str, labelled: bool = False
) -> tuple[float, dict[str, float]]:
    """Seconds to create the same number of Jobs with no controller running: unlabelled and
    suspended (no admission hook of Muster's sees them), what the apiserver alone costs on
    this machine; or `labelled`, through Muster's admission (its policies, or its webhooks
    where those are registered) and nothing else: the cost the hook itself adds. With it,
    what the apiserver's own metrics say each create cost (`admission_costs`)."""
    ns = f"bench-{tag}-{'labelled' if labelled else 'baseline'}"
    cluster.kubectl("create", "namespace", ns)
    docs = jobs(n, [ns], labelled)
    before = admission_seconds(cluster)
    started = time.monotonic()
    create_all(cluster.kc, cluster.kubeconfig, docs)
    elapsed = round(time.monotonic() - started, 2)
    costs = admission_costs(before, admission_seconds(cluster))
    if labelled:
        created = json.loads(cluster.kubectl("get", "jobs", "-n", ns, "-o", "json").stdout)
        assert all(j["spec"].get("suspend") for j in created["items"]), "not suspended"
    # Gone before the controller starts (labelled ones would be queued by it).
    cluster.kubectl("delete", "namespace", ns, f"--wait={str(labelled).lower()}")
    return elapsed, costs


# The apiserver's admission plugins that evaluate Muster's policies, and its webhook plugin.
_PLUGINS = (
    "MutatingAdmissionPolicy",
    "ValidatingAdmissionPolicy",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
)


def creation_baseline(cluster: Cluster, n: int, rounds: int) -> dict[str, Any]:
    """Unlabelled and labelled creation alternated `rounds` times (this machine's noise
    between two runs of the same thing is as large as the difference looked for), then the
    median of each and what the labelled creates cost in the apiserver's admission."""
    unlabelled: list[float] = []
    labelled: list[float] = []
    costs: dict[str, list[dict[str, float]]] = {"unlabelled": [], "labelled": []}
    for i in range(rounds):
        tag = f"{uuid.uuid4().hex[:4]}{i}"
        for kind, times in (("unlabelled", unlabelled), ("labelled", labelled)):
            seconds, cost = create_baseline(cluster, n, tag, labelled=kind == "labelled")
            times.append(seconds)
            costs[kind].append(cost)
    plain, hooked = statistics.median(unlabelled), statistics.median(labelled)
    per_create = {
        kind: {
            key: round(statistics.median(c.get(key, 0.0) for c in runs), 3)
            for key in sorted({k for c in runs for k in c})
        }
        for kind, runs in costs.items()
    }
    hooked_costs = per_create["labelled"]
    hook_ms = sum(v for k, v in hooked_costs.items() if not k.startswith("job create"))
    request_ms = hooked_costs.get("job create request ms")
    return {
        "unlabelled_seconds": unlabelled,
        "labelled_seconds": labelled,
        "median_unlabelled_seconds": plain,
        "median_labelled_seconds": hooked,
        "labelled_over_unlabelled_percent": round(100 * (hooked / plain - 1), 1),
        # Per create, medians over the rounds: the admission plugins and the whole request
        # as the apiserver timed them.
        "create_ms_median": per_create,
        "admission_share_of_labelled_create_request_percent": (
            round(100 * hook_ms / request_ms, 1) if request_ms else None
        ),
    }


ADMISSION_METRIC = "apiserver_admission_controller_admission_duration_seconds"
REQUEST_METRIC = "apiserver_request_duration_seconds"
WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"


def admission_seconds(cluster: Cluster) -> metrics.Scrape:
    """From the apiserver's /metrics: its admission plugins' durations
    (`apiserver_admission_controller_admission_duration_seconds`) and its requests'
    (`apiserver_request_duration_seconds`)."""
    return metrics.apiserver(
        cluster.kc, cluster.kubeconfig, metrics.starting(ADMISSION_METRIC, REQUEST_METRIC)
    )


def admission_costs(before: metrics.Scrape, after: metrics.Scrape) -> dict[str, float]:
    """Mean milliseconds per call between two `admission_seconds` readings: of each admission
    plugin on CREATE, and of the whole Job create request. The plugins run for every create
    (objects their policies do not match cost a few microseconds)."""
    spent: dict[str, metrics.Histogram] = {}
    for labels, h in metrics.histograms(before, after, ADMISSION_METRIC).items():
        plugin = dict(labels)
        if plugin.get("operation") == "CREATE" and plugin.get("name") in _PLUGINS:
            spent[plugin["name"]] = spent.get(plugin["name"], metrics.Histogram()).add(h)
    for labels, h in metrics.histograms(before, after, REQUEST_METRIC).items():
        request = dict(labels)
        if request.get("verb") == "POST" and request.get("resource") == "jobs":
            what = "job create request"
            spent[what] = spent.get(what, metrics.Histogram()).add(h)
    return {
        f"{what} ms": round(mean, 3)
        for what, h in sorted(spent.items())
        if (mean := h.mean_ms()) is not None
    }


def wait_admitted(
    manager: Manager, namespaces: list[str], n: int, started: float, timeout: float
) -> dict[str, Any]:
    """Poll the controller's caches until `n` Jobs in `namespaces` are admitted and
    unsuspended; each Job's creation and admission as first seen there."""
    wanted = set(namespaces)
    created: dict[str, float] = {}  # job key -> seconds after `started` first seen
    workload: dict[str, float] = {}  # job key -> its Workload first seen
    admitted: dict[str, float] = {}
    all_admitted = all_started = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.monotonic() - started
        running = 0
        for job in manager.caches.jobs.objects():
            meta = job["metadata"]
            if meta["namespace"] not in wanted:
                continue
            created.setdefault(f"{meta['namespace']}/{meta['name']}", now)
            running += not (job.get("spec") or {}).get("suspend")
        for wl in manager.caches.workloads.objects():
            key = owner_job_key(wl)
            if key is None or wl["metadata"]["namespace"] not in wanted or key in admitted:
                continue
            workload.setdefault(key, now)
            if has_quota(wl):
                admitted[key] = now
                created.setdefault(key, now)
        if all_admitted is None and len(admitted) >= n:
            all_admitted = now
        if running >= n:
            all_started = now
            break
        time.sleep(0.1)
    lags = sorted(admitted[k] - created[k] for k in admitted)
    # Where a Job's wait goes: the Job reconciler making its Workload, then admission.
    making = sorted(workload[k] - created[k] for k in admitted if k in workload)
    deciding = sorted(admitted[k] - workload[k] for k in admitted if k in workload)
    last = max(admitted, key=lambda k: admitted[k]) if admitted else None
    return {
        "admitted": len(admitted),
        "all_admitted_seconds": round(all_admitted, 2) if all_admitted is not None else None,
        "all_started_seconds": round(all_started, 2) if all_started is not None else None,
        "median_admission_seconds": round(statistics.median(admitted.values()), 2)
        if admitted
        else None,
        "creation_to_admission_p50_seconds": round(percentile(lags, 50), 2) if lags else None,
        "creation_to_admission_max_seconds": round(lags[-1], 2) if lags else None,
        "workload_made_p50_max_seconds": [round(percentile(making, p), 2) for p in (50, 100)]
        if making
        else None,
        "admitted_after_workload_p50_max_seconds": [
            round(percentile(deciding, p), 2) for p in (50, 100)
        ]
        if deciding
        else None,
        "last_job_admitted_after_its_creation_seconds": round(admitted[last] - created[last], 2)
        if last
        else None,
    }


def webhook_figures(
    before: metrics.Scrape, after: metrics.Scrape, served: list[float]
) -> dict[str, Any]:
    """Webhook latency over one scenario, for Muster's Job webhooks: as served (exact
    percentiles) and as the apiserver saw it (mean; the histogram bucket holding the 99th
    percentile)."""
    seen = metrics.Histogram()
    for labels, h in metrics.histograms(before, after, WEBHOOK_METRIC).items():
        if dict(labels).get("name") in ("mjob.muster.dev", "vjob.muster.dev"):
            seen = seen.add(h)
    figures: dict[str, Any] = {"webhook_calls_seen_by_apiserver": int(seen.count)}
    mean = seen.mean_ms()
    if mean is not None:
        figures["webhook_apiserver_mean_ms"] = round(mean, 1)
        figures["webhook_apiserver_p99_at_most_ms"] = seen.bound_ms(0.99)
    if served:
        ordered = sorted(served)
        figures["webhook_served_p50_ms"] = round(1000 * percentile(ordered, 50), 2)
        figures["webhook_served_p99_ms"] = round(1000 * percentile(ordered, 99), 2)
    return figures


def webhook_seconds(cluster: Cluster) -> metrics.Scrape:
    return metrics.apiserver(cluster.kc, cluster.kubeconfig, metrics.starting(WEBHOOK_METRIC))


def scenario(
    name: str,
    args: argparse.Namespace,
    cluster: Cluster,
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
        cluster.kc,
        cluster.kubeconfig,
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
    cluster.apply(queues)
    time.sleep(1.5)  # the queues reach the caches
    docs = jobs(args.jobs, namespaces)

    server = manager.webhooks.server
    served_before = len(server.latencies()) if server is not None else 0
    hooks_before = webhook_seconds(cluster)
    writes_before = counter.writes
    kinds_before = Counter(counter.by_kind)
    folded_before = manager.events.folded
    started = time.monotonic()
    cycles_before, cpu_before = manager.loop.cycles, time.process_time()
    timing: dict[str, Any] = {}
    watcher = threading.Thread(
        target=lambda: timing.update(
            wait_admitted(manager, namespaces, args.jobs, started, args.timeout)
        )
    )
    if name == "stream":
        watcher.start()  # each Job is timed from when the controller first sees it
    create_all(cluster.kc, cluster.kubeconfig, docs)
    created = time.monotonic() - started
    hooks = webhook_figures(
        hooks_before,
        webhook_seconds(cluster),
        server.latencies()[served_before:] if server is not None else [],
    )
    if name == "backlog":
        # Every Job has its Workload, and every Workload says why it waits (the steady
        # state of a held queue): now lift the hold.
        def all_waiting() -> bool:
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
            return waiting >= args.jobs and not manager.loop.pending_writer.pending()

        wait_until(all_waiting, args.timeout, every=1.0)
        manager.events.flush()
        time.sleep(1.0)
        writes_before = counter.writes
        kinds_before = Counter(counter.by_kind)
        folded_before = manager.events.folded
        cluster.kubectl(
            "patch",
            "clusterqueues.muster.dev",
            f"{pool}-org",
            "--type=merge",
            "-p",
            '{"spec":{"stopPolicy":"None"}}',
        )
        started = time.monotonic()
        cycles_before, cpu_before = manager.loop.cycles, time.process_time()
        watcher = threading.Thread(
            target=lambda: timing.update(
                wait_admitted(manager, namespaces, args.jobs, started, args.timeout)
            )
        )
        watcher.start()  # the Jobs wait already: each is timed from lifting the hold
    watcher.join()
    # Until the last admission (the benchmark's own polling included in the CPU).
    timing["admission_cycles"] = manager.loop.cycles - cycles_before
    timing["process_cpu_seconds"] = round(time.process_time() - cpu_before, 2)
    # Count every write the admissions caused: let coalesced status writes land and the
    # Event writer (best-effort, in the background) catch up, folded bursts included.
    time.sleep(args.settle)
    manager.events.flush()
    wait_until(lambda: not manager.events.backlog(), 300)
    time.sleep(0.5)
    writes = counter.writes - writes_before
    kinds = Counter(counter.by_kind)
    kinds.subtract(kinds_before)
    n = timing["admitted"]
    scheduler_writes = sum(
        v for k, v in kinds.items() if k.endswith(("pods/binding", "podgroups", "podgroups/status"))
    )
    events = sum(v for k, v in kinds.items() if k.endswith(" events"))
    # Writes that come with time, not with Jobs: queue status (coalesced, at most one per
    # queue per status interval) and Lease renewals.
    periodic = sum(v for k, v in kinds.items() if k.endswith(("queues/status", "leases", "queues")))
    admission_writes = writes - scheduler_writes
    all_admitted = timing["all_admitted_seconds"]
    return {
        "scenario": name,
        "jobs": args.jobs,
        "create_seconds": round(created, 2),
        **timing,
        "admitted_after_last_create_seconds": round(all_admitted - created, 2)
        if all_admitted is not None and name == "stream"
        else None,
        "admissions_per_second": round(n / all_admitted, 1) if all_admitted else 0,
        **hooks,
        "api_writes": writes,
        "api_writes_per_admitted_job": round(writes / n, 2) if n else None,
        "admission_writes_per_admitted_job": round(admission_writes / n, 2) if n else None,
        "admission_writes_per_admitted_job_without_events": round(
            (admission_writes - events) / n, 2
        )
        if n
        else None,
        "per_job_writes_per_admitted_job": round((admission_writes - periodic) / n, 2)
        if n
        else None,
        "periodic_writes": periodic,
        "events_written": events,
        "events_folded": manager.events.folded - folded_before,
        "writes_by_kind": {k: v for k, v in sorted(kinds.items()) if v},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with running_cluster(args.kubeconfig) as cluster:
        cluster.install_crds()
        setup_logging("warning")
        client = api_client(cluster.kubeconfig)
        baseline: dict[str, Any] | None = None
        if args.baseline:
            # Muster's admission policies as the controller registers them, with no
            # controller: creating labelled Jobs then costs only what the hook adds.
            admin = Kube(client)
            if policies.served(admin):
                cluster.kubectl("create", "namespace", "muster-system")
                policies.register(admin, policies.policies(""))
                assert policies.wait_active(admin, "muster-system", ""), "policies not active"
            baseline = creation_baseline(cluster, args.jobs, args.baseline_rounds)
        counter = PathCounter(client)
        manager = start_manager(
            client,
            events=not args.no_events,
            workers=args.workers,
            status_max_interval=args.status_max_interval,
            scheduler_name=SCHEDULER_NAME if args.scheduler == "muster" else "",
        )
        reader = Kube(api_client(cluster.kubeconfig, pool_size=4))
        names = ["stream", "backlog"] if args.scenario == "both" else [args.scenario]
        results = [scenario(n, args, cluster, manager, counter, reader) for n in names]
        stop_manager(manager)
        return {
            "events": not args.no_events,
            "scheduler": args.scheduler,
            # Creation with no controller: unlabelled (twice, around) and labelled through
            # Muster's admission alone.
            "baseline_create_seconds": baseline,
            "admission_cycles": manager.loop.cycles,
            "scenarios": results,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=4)
    parser.add_argument("--workers", type=int, default=Options.workers)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--no-events", action="store_true")
    parser.add_argument("--status-max-interval", type=float, default=Options.status_max_interval)
    parser.add_argument(
        "--scheduler",
        choices=("kube", "muster"),
        default="kube",
        help="who places the pods: kube-scheduler (as for Kueue) or Muster's scheduler loop",
    )
    parser.add_argument("--scenario", choices=("stream", "backlog", "both"), default="both")
    parser.add_argument(
        "--baseline-rounds",
        type=int,
        default=3,
        help="unlabelled and labelled creation alternated this many times (with --baseline)",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also time creating as many unlabelled Jobs, which no webhook sees",
    )
    args = parser.parse_args()
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
