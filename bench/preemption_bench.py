"""Benchmark of preemption on nodes in the admission core, in memory.

Shape: kube-scheduler's scheduler_perf PreemptionPodGroupDisruptionMode (docs: the native gang
scheduling notes): 1,000 nodes of 4 cpu, filled by 1,000 low-priority groups of 10 pods at
300m (bin-packed: one group per node, 3 cpu), then 100 high-priority preemptors of one pod at
3970m, whose quota is free but which fit nowhere. Each must evict exactly one group, whole
(disruptionMode all).

Prints, for one preemptor: the whole admission cycle (snapshot of 1,000 admitted workloads
and 10,000 bound pods, node view, victim search), the node view build alone, and the victim
search alone on a built view; then one cycle deciding all 100 preemptors. Never fails on
time. Run with `python bench/preemption_bench.py` (or `muster bench preemption`).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from functools import partial
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.timing import timed
from quota.admission.cycle import admission_cycle
from quota.model.nodes import BoundPod, Node, PodShape
from quota.model.snapshot import (
    Assignment,
    Flavor,
    FlavorQuota,
    PodSet,
    QueueSpec,
    Snapshot,
    Workload,
)
from quota.placement.gang import GangRequest, PodSetRequest, place_gang
from quota.placement.nodes import NodeView
from quota.preemption.nodes import NodePlan, preempt_on_nodes
from quota.preemption.victims import Candidate, victim_order

POOL = {"pool": "cpu"}


def cluster(
    nodes_count: int, node_cpu: int, group_size: int, cpu_per_pod: int
) -> tuple[tuple[Node, ...], list[Workload], list[BoundPod]]:
    """Nodes of `node_cpu` millicores, each running one low-priority group."""
    nodes = tuple(
        Node(f"node-{i:05d}", {"cpu": node_cpu, "pods": 110}, dict(POOL))
        for i in range(nodes_count)
    )
    workloads: list[Workload] = []
    pods: list[BoundPod] = []
    for i in range(nodes_count):
        key = f"low/g{i:05d}"
        node = f"node-{i:05d}"
        workloads.append(
            Workload(
                key,
                "low",
                10,
                float(i),
                (PodSet("main", group_size, {"cpu": cpu_per_pod}),),
                admission=(Assignment("main", group_size, {"cpu": "cpu"}, ((node, group_size),)),),
                admitted_at=float(i),
            )
        )
        pods.extend(
            BoundPod(f"{key}-{j}", node, {"cpu": cpu_per_pod}, key) for j in range(group_size)
        )
    return nodes, workloads, pods


def preemptors(count: int, group_size: int, cpu_per_pod: int) -> list[Workload]:
    return [
        Workload(
            f"high/p{i:04d}",
            "high",
            1000,
            10_000.0 + i,
            (PodSet("main", group_size, {"cpu": cpu_per_pod}),),
        )
        for i in range(count)
    ]


def snapshot(
    nodes: tuple[Node, ...],
    admitted: list[Workload],
    pods: list[BoundPod],
    pending: list[Workload],
) -> Snapshot:
    plenty = {"cpu": 10**9}
    queues = {
        "low": QueueSpec("low", flavors=(FlavorQuota("cpu", plenty),)),
        "high": QueueSpec("high", flavors=(FlavorQuota("cpu", plenty),), reclaim="Any"),
    }
    return Snapshot(
        now=20_000.0,
        queues=queues,
        flavors={"cpu": Flavor("cpu", dict(POOL))},
        admitted=tuple(admitted),
        pending=tuple(pending),
        nodes=nodes,
        pods=tuple(pods),
    )


def line(label: str, times: list[float]) -> str:
    median = statistics.median(times) * 1000
    return f"{label:<58} median {median:8.1f} ms  (min {min(times) * 1000:.1f}, n={len(times)})"


def bench(args: argparse.Namespace) -> None:
    nodes, admitted, pods = cluster(args.nodes, args.node_cpu, args.group_size, args.cpu)
    high = preemptors(args.preemptors, args.preemptor_pods, args.preemptor_cpu)
    print(
        f"{args.nodes} nodes of {args.node_cpu}m, {len(admitted)} low-priority groups x "
        f"{args.group_size} pods at {args.cpu}m ({len(pods)} bound pods), {len(high)} "
        f"preemptors x {args.preemptor_pods} pods at {args.preemptor_cpu}m"
    )
    one = snapshot(nodes, admitted, pods, high[:1])
    times, result = timed(lambda: admission_cycle(one), args.repeat)
    victims = [v.workload for p in result.preempt for v in p.victims]
    print(line("admission cycle, 1 preemptor (everything)", times) + f"  victims {len(victims)}")
    times, _ = timed(lambda: NodeView(nodes, pods), args.repeat)
    print(line(f"  of which: node view of {len(pods):,} pods", times))
    view = NodeView(nodes, pods)
    pods_of: dict[str, list[str]] = {}
    for pod in pods:
        pods_of.setdefault(str(pod.workload), []).append(pod.key)
    candidates = sorted(
        (Candidate(w, "low", {("cpu", "cpu"): args.group_size * args.cpu}) for w in admitted),
        key=victim_order,
    )
    shape = PodShape({"cpu": args.preemptor_cpu}, dict(POOL))
    gang = GangRequest((PodSetRequest("main", args.preemptor_pods, shape),))

    by_key = {pod.key: pod for pod in pods}
    times = []
    for _ in range(args.repeat):
        gc.collect()
        started = time.perf_counter()
        plan = preempt_on_nodes(view, candidates, pods_of, (), partial(place_gang, view, gang))
        times.append(time.perf_counter() - started)
        if isinstance(plan, NodePlan):  # put the view back for the next round
            view.forget(plan.placement)
            for key in plan.freed:
                for pod_key in pods_of[key]:
                    if pod_key not in view.pods:
                        view.add_pod(by_key[pod_key])
    print(line("  of which: victim search on a built view (KEP-5710)", times))
    many = snapshot(nodes, admitted, pods, high)
    times, result = timed(lambda: admission_cycle(many), max(1, args.repeat // 2))
    chosen = [v.workload for p in result.preempt for v in p.victims]
    per = [t / len(high) for t in times]
    print(
        line(f"admission cycle, {len(high)} preemptors at once", times)
        + f"  victims {len(chosen)} ({len(set(chosen))} distinct)"
    )
    print(line("  per preemptor", per))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--node-cpu", type=int, default=4000, help="millicores per node")
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--cpu", type=int, default=300, help="millicores per low pod")
    parser.add_argument("--preemptors", type=int, default=100)
    parser.add_argument("--preemptor-pods", type=int, default=1)
    parser.add_argument("--preemptor-cpu", type=int, default=3970, help="millicores per pod")
    parser.add_argument("--repeat", type=int, default=5)
    bench(parser.parse_args(argv))


if __name__ == "__main__":
    main()
