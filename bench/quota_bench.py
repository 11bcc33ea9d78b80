"""Benchmark of the quota engine: fair share over a big queue tree, one big admission cycle.

Shapes (the issue's targets, and Kueue's large-scale test):
- fair share over 1,110 queues in 3 levels (10 x 10 x 10, 1,000 leaves) x 4 resources;
- one admission cycle over 50,000 pending workloads in those 1,000 leaf queues;
and the same at 10x (10 x 10 x 100 leaves; 500,000 workloads). Prints figures; never fails
on time. Run with `muster bench quota` or `python bench/quota_bench.py [--scale 10]`.

`--memory N` measures instead what the controller holds for N pending Workloads (see
`memory`); `--memory-top` adds where it goes (tracemalloc, several times slower).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.meter import rss_mib
from bench.harness.timing import timed
from controllers.runtime.gcpause import paused_collection
from quota.admission.cycle import admission_cycle
from quota.fairness.fairshare import distribute, fair_share, usage_and_demand
from quota.model.decisions import CycleResult
from quota.model.snapshot import (
    FlavorQuota,
    PodSet,
    QueueSpec,
    Snapshot,
    Workload,
    queue_tree,
)

GPU = "nvidia.com/gpu"
RESOURCES = ("cpu", "memory", GPU, "ephemeral-storage")
FLAVOR = "default"
NODE_POOL_LABEL = "muster-bench/pool"
GI = 1 << 30

# Per-leaf guarantee; parents guarantee the sum of their children.
LEAF_QUOTA = {"cpu": 64_000, "memory": 256 * GI, GPU: 8, "ephemeral-storage": 1024 * GI}


def build_queues(roots: int, mids: int, leaves: int, seed: int = 7) -> dict[str, QueueSpec]:
    """A 3-level tree with random weights, priorities and some limits."""
    rng = random.Random(seed)
    queues: dict[str, QueueSpec] = {}

    def spec(name: str, parent: str | None, scale: int) -> QueueSpec:
        quota = {r: amount * scale for r, amount in LEAF_QUOTA.items()}
        limit = {GPU: quota[GPU] * 2} if rng.random() < 0.3 else {}
        return QueueSpec(
            name=name,
            parent=parent,
            priority=rng.choice((0, 0, 1, 2)),
            over_quota_weight=rng.choice((0.5, 1.0, 1.0, 2.0, 4.0)),
            flavors=(FlavorQuota(FLAVOR, quota, limit),),
            queueing_strategy="BestEffortFIFO",
        )

    for r in range(roots):
        root = f"org-{r}"
        queues[root] = spec(root, None, mids * leaves)
        for m in range(mids):
            mid = f"{root}-dept-{m}"
            queues[mid] = spec(mid, root, leaves)
            for leaf in range(leaves):
                name = f"{mid}-team-{leaf}"
                queues[name] = spec(name, mid, 1)
    return queues


SHAPES = [
    {"cpu": 4_000 * g or 2_000, "memory": 32 * GI * max(g, 1), GPU: g, "ephemeral-storage": 10 * GI}
    for g in (0, 1, 1, 2, 4, 8)
]


def build_workloads(leaves: list[str], per_leaf: int, seed: int = 11) -> tuple[Workload, ...]:
    """`per_leaf` pending workloads in each leaf, from a small catalog of shapes."""
    rng = random.Random(seed)
    pod_sets = [
        PodSet("main", count, shape, min_count=(1 if count > 1 and rng.random() < 0.2 else None))
        for shape in SHAPES
        for count in (1, 2, 4)
    ]
    out: list[Workload] = []
    arrival = 0.0
    for i in range(per_leaf):
        for leaf in leaves:
            arrival += 0.001
            out.append(
                Workload(
                    key=f"{leaf}/job-{i}",
                    queue=leaf,
                    priority=rng.choice((0, 0, 0, 10, 100)),
                    arrival=arrival,
                    pod_sets=(rng.choice(pod_sets),),
                )
            )
    return tuple(out)


def _cycle(label: str, snapshot: Snapshot, out: Callable[[str], None]) -> tuple[float, object]:
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    with paused_collection():  # as the controller runs it
        result = admission_cycle(snapshot)  # fair share included, as in a real cycle
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    decisions = len(result.admit) + len(result.pending)
    victims = sum(len(p.victims) for p in result.preempt)
    # On a shared machine the wall clock includes time other processes had the core; the
    # process's CPU time is what the cycle itself cost.
    out(
        f"admission cycle ({label}), {len(snapshot.pending):,} pending, "
        f"{len(snapshot.admitted):,} admitted: {elapsed:.2f} s, "
        f"{decisions / elapsed:,.0f} decisions/s (CPU {cpu:.2f} s, "
        f"{decisions / cpu:,.0f}/s of CPU; {len(result.admit):,} admitted, "
        f"{len(result.preempt):,} preempting with {victims:,} victims, "
        f"{len(result.pending):,} pending)"
    )
    return decisions / elapsed, result


def bench(scale: int, per_leaf: int, repeat: int, out: Callable[[str], None]) -> dict[str, float]:
    """Run the benchmarks at one size; print and return the figures."""
    queues = build_queues(10, 10, 10 * scale)
    tree = queue_tree(queues)
    leaves = [n for n in queues if tree.is_leaf(n)]
    pending = build_workloads(leaves, per_leaf)
    # Tight: half of what the leaves are guaranteed, so most workloads wait.
    tight = {(FLAVOR, r): amount * len(leaves) // 2 for r, amount in LEAF_QUOTA.items()}
    snapshot = Snapshot(now=1_000.0, queues=queues, flavors={}, capacity=tight, pending=pending)
    figures: dict[str, float] = {}

    _, demand = usage_and_demand(snapshot, tree)
    times, _ = timed(lambda: distribute(queues, tree, demand, tight), repeat, collect_each=False)
    figures["fair_share_ms"] = statistics.median(times) * 1e3
    out(
        f"fair share, {len(queues):,} queues ({len(leaves):,} leaves) x {len(RESOURCES)} "
        f"resources: median {figures['fair_share_ms']:.2f} ms over {repeat} runs"
    )
    times, _ = timed(lambda: fair_share(snapshot), max(1, repeat // 5), collect_each=False)
    figures["fair_share_with_demand_ms"] = statistics.median(times) * 1e3
    out(
        f"fair share incl. demand of {len(pending):,} pending workloads: median "
        f"{figures['fair_share_with_demand_ms']:.1f} ms"
    )

    figures["tight_decisions_per_s"], _ = _cycle("tight capacity", snapshot, out)
    # Roomy: capacity for about half of all requests, so half the decisions are admissions.
    roomy = {
        key: max(amount, demand[tree.roots[0]].get(key, 0) * len(tree.roots) // 2)
        for key, amount in tight.items()
    }
    snapshot = replace(snapshot, capacity=roomy)
    figures["decisions_per_s"], result = _cycle("roomy capacity", snapshot, out)

    # Contended: the roomy cluster is full; 10% new workloads of higher priority arrive in
    # queues that may preempt within the queue and reclaim across queues.
    assert isinstance(result, CycleResult)
    admits = {a.workload: a for a in result.admit}
    running = tuple(
        replace(w, admission=admits[w.key].assignments, admitted_at=500.0)
        for w in pending
        if w.key in admits
    )
    rng = random.Random(3)
    arrivals = tuple(
        replace(w, key=w.key + "-hi", priority=w.priority + 50, arrival=w.arrival + 900)
        for w in rng.sample(pending, len(pending) // 10)
    )
    policy_queues = {
        n: replace(q, within_queue="LowerPriority", reclaim="Any") for n, q in queues.items()
    }
    contended = Snapshot(
        now=1_000.0,
        queues=policy_queues,
        flavors={},
        capacity=roomy,
        admitted=running,
        pending=arrivals,
    )
    figures["contended_decisions_per_s"], _ = _cycle("contended, preemption on", contended, out)
    return figures


def api_quantity(resource: str, amount: int) -> str:
    """The engine's whole number (millicores for cpu) as the API writes it."""
    return f"{amount}m" if resource == "cpu" else str(amount)


def _job(
    namespace: str, name: str, uid: str, shape: dict[str, int], count: int, when: str
) -> dict[str, Any]:
    """A labelled, suspended batch Job as the apiserver returns it (defaults filled in)."""
    requests = {r: api_quantity(r, v) for r, v in shape.items() if v}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": str(random.randrange(1, 10**9)),
            "generation": 1,
            "creationTimestamp": when,
            "labels": {"muster.dev/queue-name": "default"},
            "annotations": {},
            "managedFields": [
                {
                    "manager": "kubectl-create",
                    "operation": "Update",
                    "apiVersion": "batch/v1",
                    "time": when,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, "f:muster.dev/queue-name": {}}}
                    },
                }
            ],
        },
        "spec": {
            "parallelism": count,
            "completions": count,
            "backoffLimit": 6,
            "suspend": True,
            "completionMode": "NonIndexed",
            "podReplacementPolicy": "TerminatingOrFailed",
            "manualSelector": False,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
            "template": {
                "metadata": {
                    "labels": {
                        "batch.kubernetes.io/controller-uid": uid,
                        "batch.kubernetes.io/job-name": name,
                        "controller-uid": uid,
                        "job-name": name,
                    }
                },
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/train:v1",
                            "command": ["python", "train.py"],
                            "resources": {"requests": requests, "limits": dict(requests)},
                            "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "File",
                            "imagePullPolicy": "IfNotPresent",
                        }
                    ],
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 30,
                    "dnsPolicy": "ClusterFirst",
                    "securityContext": {},
                    "schedulerName": "default-scheduler",
                },
            },
        },
        "status": {},
    }


def kubelet_node(name: str, index: int) -> dict[str, object]:
    """An 8-GPU node as a kubelet reports it: labels, capacity, conditions, addresses, node
    info, the images it holds and the managed fields of the two writers."""
    from controllers.localcluster.nodes import node_manifest

    node = node_manifest(name, "96", "1536Gi", 8, 110, {NODE_POOL_LABEL: FLAVOR})
    when = "2026-11-24T00:00:00Z"
    meta = cast(dict[str, Any], node["metadata"])
    meta.update(
        uid=f"node-{index:08x}",
        resourceVersion=str(index + 1),
        creationTimestamp=when,
        managedFields=[
            {
                "manager": manager,
                "operation": "Update",
                "apiVersion": "v1",
                "time": when,
                "fieldsType": "FieldsV1",
                "fieldsV1": {f"f:{part}": {f"f:{k}": {} for k in keys}},
                **({"subresource": "status"} if part == "status" else {}),
            }
            for manager, part, keys in (
                ("kubelet", "metadata", ("labels", "annotations")),
                ("kubelet", "status", ("allocatable", "capacity", "conditions", "images")),
            )
        ],
    )
    status = cast(dict[str, Any], node["status"])
    status["capacity"] = status["allocatable"] = {
        **status["capacity"],
        "ephemeral-storage": "3500Gi",
    }
    status.update(
        conditions=[
            {
                "type": kind,
                "status": "True" if kind == "Ready" else "False",
                "lastHeartbeatTime": when,
                "lastTransitionTime": when,
                "reason": f"Kubelet{kind}",
                "message": f"kubelet reports {kind}",
            }
            for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
        ],
        addresses=[
            {
                "type": "InternalIP",
                "address": f"10.{index // 65536}.{index // 256 % 256}.{index % 256}",
            },
            {"type": "Hostname", "address": name},
        ],
        daemonEndpoints={"kubeletEndpoint": {"Port": 10250}},
        nodeInfo={
            "machineID": f"{index:032x}",
            "systemUUID": f"{index:08x}-0000-0000-0000-000000000000",
            "bootID": f"{index:08x}-1111-1111-1111-111111111111",
            "kernelVersion": "6.1.0-27-amd64",
            "osImage": "Debian GNU/Linux 12 (bookworm)",
            "containerRuntimeVersion": "containerd://2.1.0",
            "kubeletVersion": "v1.37.1",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
        images=[
            {"names": [f"registry.example/team/image-{i}@sha256:{i:064x}"], "sizeBytes": 10**9 + i}
            for i in range(12)
        ],
    )
    return node


def memory(
    pending: int, out: Callable[[str], None], top: bool = False, nodes: int = 0
) -> dict[str, float]:
    """What the controller holds for `pending` pending Workloads, without an apiserver.

    The controller's own caches are fed the objects the apiserver would send (a suspended
    Job and its pending Workload each, with the spec the Job integration writes and the
    Pending condition the admission loop writes), over the 1x queue tree (1,110
    ClusterQueues, 1,000 LocalQueues); then the admission loop's view is built from them
    (each Workload parsed and converted, kept for the next cycle) and one cycle runs. Peak
    RSS is the process's high-water mark (VmHWM), which includes the interpreter and the
    imports (the baseline printed first).
    """
    # The controller's modules, imported here so that the quota benchmark alone stays lean.
    from controllers.admission.view import ViewBuilder
    from controllers.jobs.batchjob import workload_spec
    from controllers.runtime.events import EventRecorder
    from controllers.state import workloads as wls
    from controllers.state.caches import Caches, Context
    from quota.fairness.fairshare import fair_share as compute_fair_share

    if top:
        tracemalloc.start(1)
    figures: dict[str, float] = {}
    gc.collect()
    figures["baseline_rss_mib"], _ = rss_mib()
    out(f"memory: baseline (interpreter and imports) {figures['baseline_rss_mib']:.0f} MiB RSS")
    queues = build_queues(10, 10, 10)
    tree = queue_tree(queues)
    leaves = [n for n in queues if tree.is_leaf(n)]
    caches = Caches.create(None)  # type: ignore[arg-type]  # fed directly, never listed
    for name, spec in queues.items():
        cq = {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ClusterQueue",
            "metadata": {"name": name, "resourceVersion": "1", "uid": f"cq-{name}"},
            "spec": {
                "flavors": [
                    {
                        "name": FLAVOR,
                        "quota": {r: api_quantity(r, v) for r, v in spec.flavors[0].quota.items()},
                    }
                ],
                "overQuotaWeight": max(1, int(spec.over_quota_weight)),  # whole in the API
                "priority": spec.priority,
                **({"parent": spec.parent} if spec.parent else {}),
            },
        }
        caches.cluster_queues.write_through(cq)
    caches.flavors.write_through(
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR, "resourceVersion": "1", "uid": "rf"},
            # With nodes, the flavor is theirs: admission then places on them.
            "spec": {"nodeLabels": {NODE_POOL_LABEL: FLAVOR}} if nodes else {},
        }
    )
    if nodes:
        for i in range(nodes):
            caches.nodes.write_through(kubelet_node(f"node-{i:05d}", i))
        gc.collect()
        figures["nodes_rss_mib"], _ = rss_mib()
        out(
            f"memory: caches of {nodes:,} nodes (as kubelets report them): "
            f"{figures['nodes_rss_mib']:.0f} MiB RSS, "
            f"{(figures['nodes_rss_mib'] - figures['baseline_rss_mib']) * 1024 / nodes:.1f} KiB "
            "a node"
        )
    before_workloads = figures.get("nodes_rss_mib", figures["baseline_rss_mib"])
    for i, leaf in enumerate(leaves):
        caches.local_queues.write_through(
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "LocalQueue",
                "metadata": {
                    "name": "default",
                    "namespace": f"ns-{i}",
                    "resourceVersion": "1",
                    "uid": f"lq-{i}",
                },
                "spec": {"clusterQueue": leaf},
            }
        )
    rng = random.Random(5)
    start = datetime(2026, 11, 24, tzinfo=UTC)
    for n in range(pending):
        namespace = f"ns-{n % len(leaves)}"
        moment = start + timedelta(milliseconds=n)
        when = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        uid = f"{n:08x}-5e1f-4c6b-9a0e-{rng.getrandbits(48):012x}"
        job = _job(namespace, f"job-{n}", uid, rng.choice(SHAPES), rng.choice((1, 2, 4)), when)
        caches.jobs.write_through(job)
        wl = wls.new_workload(
            wls.workload_name(f"job-{n}", uid), namespace, job, workload_spec(job, {})
        )
        meta = wl["metadata"]
        meta.update(
            uid=f"wl-{uid}",
            resourceVersion=str(10**9 + n),
            generation=1,
            creationTimestamp=when,
            managedFields=[
                {
                    "manager": "muster",
                    "operation": "Apply",
                    "apiVersion": "muster.dev/v1alpha1",
                    "time": when,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:podSets": {}, "f:queueName": {}}},
                },
                {
                    "manager": "muster",
                    "operation": "Update",
                    "apiVersion": "muster.dev/v1alpha1",
                    "subresource": "status",
                    "time": when,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}}},
                },
            ],
        )
        wls.mark_pending(
            wl,
            "Pending",
            f"insufficient quota for nvidia.com/gpu in flavor {FLAVOR}: requested 8, "
            "available 2, fair share 4",
            moment,
        )
        caches.workloads.write_through(wl)
    gc.collect()
    figures["caches_rss_mib"], _ = rss_mib()
    out(
        f"memory: caches of {pending:,} pending Workloads and their Jobs (and the queues): "
        f"{figures['caches_rss_mib']:.0f} MiB RSS"
        + (
            f", {(figures['caches_rss_mib'] - before_workloads) * 1024 / pending:.1f} KiB "
            "a Workload"
            if pending
            else ""
        )
    )
    events = EventRecorder(None, "bench")
    ctx = Context(kube=None, caches=caches, events=events, identity="bench")  # type: ignore[arg-type]
    views = ViewBuilder(ctx, use_node_capacity=bool(nodes))
    started = time.perf_counter()
    view = views.build()
    built = time.perf_counter() - started
    gc.collect()
    figures["view_rss_mib"], _ = rss_mib()
    out(
        f"memory: + the admission loop's view ({len(view.snapshot.pending):,} pending parsed "
        f"and converted, kept for the next cycle; built in {built:.1f} s): "
        f"{figures['view_rss_mib']:.0f} MiB RSS"
    )
    # The next cycle's view when nothing changed: what every cycle pays per Workload.
    rebuilds, _ = timed(views.build, 5, collect_each=False)
    figures["view_rebuild_seconds"] = statistics.median(rebuilds)
    out(
        f"memory: the view rebuilt with nothing changed (what each later cycle pays): "
        f"median {figures['view_rebuild_seconds'] * 1000:.0f} ms of 5"
    )
    with paused_collection():
        fair = compute_fair_share(view.snapshot)
        result = admission_cycle(view.snapshot, fair)
    _, figures["peak_rss_mib"] = rss_mib()
    out(
        f"memory: peak during one cycle ({len(result.admit):,} admitted, "
        f"{len(result.pending):,} pending): {figures['peak_rss_mib']:.0f} MiB peak RSS, "
        f"{figures['peak_rss_mib'] - figures['baseline_rss_mib']:.0f} MiB above the baseline"
    )
    if top:
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
        for stat in snapshot.statistics("lineno")[:15]:
            out(f"  {stat.size / 2**20:8.1f} MiB {stat.count:>9,} blocks  {stat.traceback[0]}")
    del view, views, caches, result, fair
    return figures


def run(scales: list[int], per_leaf: int, repeat: int, out: Callable[[str], None]) -> None:
    """Run the benchmark at each scale and print how the figures grow."""
    results = {}
    for scale in scales:
        out(f"-- scale {scale}x --")
        results[scale] = bench(scale, per_leaf, repeat, out)
    if 1 in results and len(results) > 1:
        base = results[1]
        for scale, figures in results.items():
            if scale == 1:
                continue
            out(
                f"growth at {scale}x queues and workloads: fair share "
                f"x{figures['fair_share_ms'] / base['fair_share_ms']:.1f} in time, decisions/s "
                f"x{figures['decisions_per_s'] / base['decisions_per_s']:.2f} (roomy), "
                f"x{figures['contended_decisions_per_s'] / base['contended_decisions_per_s']:.2f}"
                " (contended)"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, action="append", help="1 and/or 10 (default both)")
    parser.add_argument("--per-leaf", type=int, default=50, help="pending workloads per leaf")
    parser.add_argument("--repeat", type=int, default=20, help="fair share repetitions")
    parser.add_argument(
        "--memory",
        type=int,
        metavar="N",
        help="instead: the controller's memory for N pending Workloads (50000: the issue's)",
    )
    parser.add_argument(
        "--memory-nodes",
        type=int,
        default=0,
        metavar="M",
        help="with --memory: and M 8-GPU nodes, which admission then places on (5000: the issue's)",
    )
    parser.add_argument(
        "--memory-top", action="store_true", help="with --memory: the largest allocation sites"
    )
    args = parser.parse_args(argv)
    if args.memory is not None:
        memory(args.memory, print, args.memory_top, args.memory_nodes)
        return
    run(args.scale or [1, 10], args.per_leaf, args.repeat, print)


if __name__ == "__main__":
    main()
