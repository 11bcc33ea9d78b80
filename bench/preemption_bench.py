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
    PodSetTopology,
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


# -- topology: one rack freed for a gang that must sit in one ----------------------------

GPU = "nvidia.com/gpu"
BLOCK = "example.com/block"
RACK = "example.com/rack"


def fabric(
    blocks: int, racks: int, per_rack: int, gang: int
) -> tuple[tuple[Node, ...], list[Workload], list[BoundPod]]:
    """Blocks of racks of 8-GPU nodes, every rack full of low-priority gangs of `gang`
    nodes (one 8-GPU pod per node), of priorities 0 to 3 and start times that vary."""
    nodes: list[Node] = []
    admitted: list[Workload] = []
    pods: list[BoundPod] = []
    for b in range(blocks):
        for r in range(racks):
            names = [f"b{b}-r{r:02d}-n{n:02d}" for n in range(per_rack)]
            labels = {"pool": "gpu", BLOCK: f"b{b}", RACK: f"b{b}-r{r:02d}"}
            nodes.extend(Node(n, {GPU: 8, "pods": 110}, dict(labels)) for n in names)
            for g in range(0, per_rack, gang):
                i = len(admitted)
                key = f"low/g{i:05d}"
                on = names[g : g + gang]
                admitted.append(
                    Workload(
                        key,
                        "low",
                        (i * 7) % 4,
                        0.0,
                        (PodSet("main", len(on), {GPU: 8}),),
                        admission=(
                            Assignment("main", len(on), {GPU: "gpu"}, tuple((n, 1) for n in on)),
                        ),
                        admitted_at=float((i * 13) % 97),
                    )
                )
                pods.extend(BoundPod(f"{key}-{j}", n, {GPU: 8}, key) for j, n in enumerate(on))
    return tuple(nodes), admitted, pods


def topology_snapshot(args: argparse.Namespace, required: bool) -> Snapshot:
    """The fabric and one high-priority gang of a rack's size, requiring one rack (or,
    without `required`, asking for no topology: KEP-5710's whole-cluster search)."""
    nodes, admitted, pods = fabric(args.blocks, args.racks, args.rack_nodes, args.low_nodes)
    ask = PodSetTopology("Required", RACK) if required else None
    preemptor = Workload(
        "high/train",
        "high",
        1000,
        10_000.0,
        (PodSet("main", args.rack_nodes, {GPU: 8}, topology=ask),),
    )
    plenty = {GPU: 10**9}
    return Snapshot(
        now=20_000.0,
        queues={
            "low": QueueSpec("low", flavors=(FlavorQuota("gpu", plenty),)),
            "high": QueueSpec("high", flavors=(FlavorQuota("gpu", plenty),), reclaim="Any"),
        },
        flavors={"gpu": Flavor("gpu", {"pool": "gpu"}, topology="fabric")},
        admitted=tuple(admitted),
        pending=(preemptor,),
        nodes=nodes,
        pods=tuple(pods),
        topologies={"fabric": (BLOCK, RACK, "kubernetes.io/hostname")},
    )


def topology_bench(args: argparse.Namespace) -> None:
    racks = args.blocks * args.racks
    print(
        f"{racks * args.rack_nodes} nodes of 8 GPUs ({args.blocks} blocks x {args.racks} racks "
        f"x {args.rack_nodes} nodes), every rack full of low-priority gangs of "
        f"{args.low_nodes} nodes; one gang of {args.rack_nodes} pods x 8 GPUs"
    )
    for required in (True, False):
        snap = topology_snapshot(args, required)
        times, result = timed(lambda snap=snap: admission_cycle(snap), args.repeat)
        victims = [v.workload for p in result.preempt for v in p.victims]
        on = {w.key: w for w in snap.admitted}
        racks_hit = {
            node.rsplit("-", 1)[0]
            for v in victims
            for a in on[v].admission or ()
            for node, _ in a.nodes
        }
        label = "requiring one rack (by domain)" if required else "no topology (whole cluster)"
        print(
            line(f"admission cycle, {label}", times)
            + f"  victims {len(victims)} in {len(racks_hit)} rack(s)"
        )


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
    parser.add_argument(
        "--topology",
        action="store_true",
        help="a gang requiring one rack of a fabric (--blocks, --racks, --rack-nodes)",
    )
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--racks", type=int, default=8, help="racks per block")
    parser.add_argument("--rack-nodes", type=int, default=16, help="nodes per rack")
    parser.add_argument("--low-nodes", type=int, default=4, help="nodes per low-priority gang")
    args = parser.parse_args(argv)
    if args.topology:
        topology_bench(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
