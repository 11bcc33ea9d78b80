"""Benchmark of the choice of a worker cluster (`quota.dispatch.choose_cluster`), the pure
part of each dispatch: a 4-pod gang of 8 GPUs placed in every worker of a fleet whose nodes
are half taken, for fleets of 2 to 8 workers of 100 to 5,000 nodes. What a dispatch pass
costs per waiting workload; the dispatcher tries a workload that fit nowhere again only once
room may have freed, so a deep queue costs this once per change, not once per pass.

Prints figures; never fails on time. Run with `python bench/dispatch_bench.py`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quota.dispatch import WorkerState, choose_cluster
from quota.model.nodes import BoundPod, Node
from quota.model.snapshot import Assignment, Flavor, PodSet, Workload

GPU = "nvidia.com/gpu"


def fleet(workers: int, nodes: int) -> list[WorkerState]:
    """`workers` workers of `nodes` nodes of 8 GPUs; every other node half taken."""
    out = []
    for w in range(workers):
        name = f"w{w}"
        made = tuple(
            Node(f"{name}-{i}", {GPU: 8, "cpu": 64_000, "pods": 110}, {"pool": "gpu"})
            for i in range(nodes)
        )
        taken = tuple(
            BoundPod(f"other/{name}-{i}", f"{name}-{i}", {GPU: 4}) for i in range(0, nodes, 2)
        )
        out.append(WorkerState(name, made, taken, {}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="choices timed per shape")
    args = parser.parse_args()
    gang = Workload(
        "ns/gang",
        "fleet",
        0,
        0.0,
        (PodSet("main", 4, {GPU: 8}),),
        admission=(Assignment("main", 4, {GPU: "gpu"}),),
    )
    flavors = {"gpu": Flavor("gpu", {"pool": "gpu"})}
    print(f"{'workers':>7} {'nodes each':>10} {'median ms':>10} {'max ms':>8} {'us/node':>8}")
    for workers in (2, 8):
        for nodes in (100, 1_000, 5_000):
            states = fleet(workers, nodes)
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                choose_cluster(gang, flavors, states)
                times.append((time.perf_counter() - start) * 1000)
            median = statistics.median(times)
            per_node = median * 1000 / (workers * nodes)
            print(f"{workers:>7} {nodes:>10} {median:>10.2f} {max(times):>8.2f} {per_node:>8.2f}")


if __name__ == "__main__":
    main()
