"""Benchmark of the gang-placement core on a large in-memory cluster.

Shapes (the placement issue's targets):
- 5,000 nodes of 8 GPUs, 64 cpu, 512Gi, 110 pods, in 4 label classes (pool x zone), one
  daemon pod bound on each; (a) 1,000 gangs of 3 small pods (100m cpu, 100Mi), each placed
  and assumed in turn: median and p99 per gang (target ~1 ms);
  (b) 10 gangs of 1,000 small pods and (c) 10 gangs of 5,000 (target: tens of ms each);
- (d) 500 nodes of 8 GPUs filled by 4,000 one-GPU pods, one pod per gang, then as one gang.
- Topology (issue 30; `--topology` runs only these): 5,000 nodes in 8 blocks x 25 racks x 25
  nodes; (t1) 1,000 gangs of 64 pods each requiring one rack, placed and assumed in turn
  (targets: median <= 2 ms, all <= 2 s); (t2) a 4,096-pod gang preferring one block
  (target <= 50 ms); (t3) a gang no rack can hold, reason included.
Prints figures; never fails on time. Run with `python bench/placement_bench.py`.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.timing import percentile, timed
from controllers.runtime.gcpause import paused_collection
from quota.api.names import HOSTNAME_LABEL
from quota.placement import (
    STRATEGIES,
    BoundPod,
    GangRequest,
    Node,
    NodeView,
    Placement,
    PodSetRequest,
    PodShape,
    Requirement,
    SelectorTerm,
    Strategy,
    Unplaceable,
    place_gang,
)
from quota.placement.topology import DomainRequest, domain_request

GPU = "nvidia.com/gpu"
GI = 1 << 30
MI = 1 << 20
NODE = {GPU: 8, "cpu": 64_000, "memory": 512 * GI, "ephemeral-storage": 1024 * GI, "pods": 110}
SMALL = {"cpu": 100, "memory": 100 * MI}
DAEMON = {"cpu": 200, "memory": 256 * MI}
POOLS = ("h100", "a100")
ZONES = ("zone-a", "zone-b")


def cluster(count: int) -> tuple[list[Node], list[BoundPod]]:
    """`count` GPU nodes in pool x zone classes, each running one daemon pod."""
    nodes = []
    pods = []
    for i in range(count):
        name = f"node-{i:05d}"
        labels = {
            "kubernetes.io/hostname": name,
            "pool": POOLS[i % len(POOLS)],
            "topology.kubernetes.io/zone": ZONES[(i // len(POOLS)) % len(ZONES)],
        }
        nodes.append(Node(name, NODE, labels))
        pods.append(BoundPod(f"kube-system/daemon-{i}", name, DAEMON))
    return nodes, pods


def gang(
    count: int, requests: dict[str, int], selector: dict[str, str] | None = None
) -> GangRequest:
    """One pod set of `count` identical pods."""
    shape = PodShape(requests, node_selector=selector or {})
    return GangRequest((PodSetRequest("workers", count, shape),))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _place_all(
    view: NodeView, gangs: list[GangRequest], strategy: Strategy = "BinPack"
) -> tuple[list[float], list[float], int, float]:
    """Place and assume each gang in turn: (place times, place+assume times, unplaced, CPU
    seconds of the whole loop: on a shared machine the wall clock is partly other processes)."""
    gc.collect()
    place_times, total_times, failed = [], [], 0
    cpu = time.process_time()
    with paused_collection():
        for request in gangs:
            start = time.perf_counter()
            result = place_gang(view, request, strategy)
            placed = time.perf_counter()
            if isinstance(result, Placement):
                view.assume(result)
            else:
                failed += 1
            end = time.perf_counter()
            place_times.append(placed - start)
            total_times.append(end - start)
    return place_times, total_times, failed, time.process_time() - cpu


def _summary(label: str, times: list[float], out: Callable[[str], None]) -> None:
    ordered = sorted(times)
    out(
        f"{label}: median {_ms(statistics.median(ordered))}, p99 {_ms(percentile(ordered, 99))}, "
        f"max {_ms(ordered[-1])}, total {_ms(sum(ordered))} over {len(ordered):,}"
    )


def bench(nodes_count: int, out: Callable[[str], None]) -> None:
    """Run every shape once and print the figures."""
    nodes, pods = cluster(nodes_count)
    [built], view = timed(lambda: NodeView(nodes, pods), 1)
    out(
        f"view of {len(nodes):,} nodes and {len(pods):,} bound pods built in "
        f"{_ms(built)} ({len(view.classes)} node classes)"
    )

    # (a) small 3-pod gangs; every other one pinned to a pool.
    small = [gang(3, SMALL, {"pool": POOLS[i % 2]} if i % 2 else None) for i in range(1_000)]
    place, total, failed, _ = _place_all(view, small)
    _summary(f"(a) 3-pod gangs on {nodes_count:,} nodes, place", place, out)
    _summary("(a) 3-pod gangs, place + assume", total, out)
    if failed:
        out(f"    {failed} unplaced")

    for label, size in (("(b)", 1_000), ("(c)", 5_000)):
        for strategy in STRATEGIES:
            fresh = NodeView(nodes, pods)
            gangs = [gang(size, SMALL) for _ in range(10)]
            place, total, failed, _ = _place_all(fresh, gangs, strategy)
            _summary(f"{label} 10 gangs x {size:,} pods, {strategy}, place + assume", total, out)
            if failed:
                out(f"    {failed} unplaced")

    # (d) a 500-node GPU pool filled one pod at a time, then by one gang.
    gpu_nodes = [Node(f"gpu-{i:04d}", NODE) for i in range(500)]
    one = gang(1, {GPU: 1, "cpu": 8_000, "memory": 64 * GI})
    gpu_view = NodeView(gpu_nodes)
    place, total, failed, _ = _place_all(gpu_view, [one] * 4_000)
    _summary("(d) 4,000 one-GPU pods on 500 nodes, one gang each, place + assume", total, out)
    full = place_gang(gpu_view, one)
    assert isinstance(full, Unplaceable), "the pool should be full"
    out(f"    unplaced: {failed}; next pod: {full.reason}")
    for strategy in STRATEGIES:
        fresh = NodeView(gpu_nodes)
        request = gang(4_000, {GPU: 1, "cpu": 8_000, "memory": 64 * GI})
        [elapsed], result = timed(partial(place_gang, fresh, request, strategy), 1)
        assert isinstance(result, Placement)
        out(f"(d) one gang of 4,000 one-GPU pods on 500 nodes, {strategy}: {_ms(elapsed)}")

    # A busier cluster to build: ten bound pods per node.
    busy = [BoundPod(f"team/{n.name}-{j}", n.name, SMALL) for n in nodes for j in range(10)]
    [built], _ = timed(lambda: NodeView(nodes, [*pods, *busy]), 1)
    out(
        f"view of {len(nodes):,} nodes and {len(pods) + len(busy):,} bound pods built in "
        f"{_ms(built)}"
    )

    # Avoiding one node by hostname: nodes are judged one by one (the slow path).
    avoid = SelectorTerm((Requirement("kubernetes.io/hostname", "NotIn", ("node-00000",)),))
    shape = PodShape(SMALL, affinity=(avoid,))
    pinned = [GangRequest((PodSetRequest("workers", 3, shape),))] * 100
    place, total, failed, _ = _place_all(NodeView(nodes, pods), pinned)
    _summary(f"3-pod gangs avoiding one node by hostname on {nodes_count:,} nodes", total, out)

    # The fragmented cluster: every node half used, an 8-GPU gang does not fit.
    half = [BoundPod(f"other/half-{i}", n.name, {GPU: 4}) for i, n in enumerate(nodes)]
    frag = NodeView(nodes, [*pods, *half])
    request = gang(4, {GPU: 8})
    times, result = timed(lambda: place_gang(frag, request), 50)
    assert isinstance(result, Unplaceable)
    _summary(f"unplaceable 4 x 8-GPU gang on {nodes_count:,} fragmented nodes", times, out)
    out(f"    reason: {result.reason}")


BLOCK = "example.com/block"
RACK = "example.com/rack"
LEVELS = (BLOCK, RACK, HOSTNAME_LABEL)


def fabric(
    blocks: int = 8, racks: int = 25, per_rack: int = 25
) -> tuple[list[Node], list[BoundPod]]:
    """Blocks of racks of GPU nodes, each running one daemon pod."""
    nodes = []
    pods = []
    for b in range(blocks):
        for r in range(racks):
            for n in range(per_rack):
                name = f"b{b}-r{r:02d}-n{n:02d}"
                labels = {HOSTNAME_LABEL: name, BLOCK: f"b{b}", RACK: f"b{b}-r{r:02d}"}
                nodes.append(Node(name, NODE, labels))
                pods.append(BoundPod(f"kube-system/daemon-{name}", name, DAEMON))
    return nodes, pods


def in_domain(count: int, requests: dict[str, int], mode: str, level: str) -> GangRequest:
    """One pod set of `count` identical pods, kept in one domain at `level` as `mode` says."""
    domain = domain_request("fabric", LEVELS, mode, level, None, None)
    assert isinstance(domain, DomainRequest)
    return GangRequest((PodSetRequest("workers", count, PodShape(requests), None, domain),))


def topology_bench(out: Callable[[str], None]) -> None:
    """The topology shapes: required racks one after another, a big gang preferring a block."""
    nodes, pods = fabric()
    [built], view = timed(lambda: NodeView(nodes, pods), 1)
    out(
        f"topology: view of {len(nodes):,} nodes (8 blocks x 25 racks x 25 nodes) built in "
        f"{_ms(built)} ({len(view.classes)} node classes)"
    )
    rack_gang = in_domain(64, {"cpu": 2_000, "memory": 16 * GI}, "Required", RACK)
    _, total, failed, cpu = _place_all(view, [rack_gang] * 1_000)
    _summary("(t1) 64-pod gangs requiring one rack, place + assume", total, out)
    out(f"    unplaced: {failed}; CPU time for all 1,000: {_ms(cpu)}")
    for strategy in STRATEGIES:
        fresh = NodeView(nodes, pods)
        big = in_domain(4_096, {GPU: 1, "cpu": 4_000, "memory": 32 * GI}, "Preferred", BLOCK)
        gc.collect()
        cpu, started = time.process_time(), time.perf_counter()
        result = place_gang(fresh, big, strategy)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert isinstance(result, Placement)
        out(
            f"(t2) one 4,096-pod gang preferring one block, {strategy}: {_ms(elapsed)} "
            f"(CPU {_ms(cpu)})"
        )
    # A rack holds 200 GPUs: 26 pods of 8 never fit one, and the reason says which racks.
    never = in_domain(26, {GPU: 8}, "Required", RACK)
    times, refused = timed(lambda: place_gang(view, never), 20)
    assert isinstance(refused, Unplaceable)
    _summary("(t3) gang no rack can hold, reason included", times, out)
    out(f"    reason: {refused.reason}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5_000, help="nodes in the big cluster")
    parser.add_argument("--profile", action="store_true", help="print the top of a cProfile")
    parser.add_argument("--topology", action="store_true", help="run only the topology shapes")
    args = parser.parse_args(argv)

    def run(out: Callable[[str], None]) -> None:
        if not args.topology:
            bench(args.nodes, out)
        topology_bench(out)

    if not args.profile:
        run(print)
        return
    profile = cProfile.Profile()
    profile.runcall(run, print)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
