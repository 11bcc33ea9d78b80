"""Reclaim with nodes: a queue taking back its quota from a borrower evicts the borrower's
workloads that stand on the nodes its gang needs, not any it could evict for quota alone
(KAI-Scheduler's reclaim scale test: a cluster full of one-GPU jobs of a queue with no
quota, then one job of whole-node pods for half the nodes in a queue owning that half)."""

from __future__ import annotations

from collections import Counter

import pytest

from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult
from quota.model.nodes import BoundPod
from quota.model.snapshot import Assignment, PodSet, QueueSpec, Snapshot, Workload
from tests.unit.strategies import GPU, queue, queues_of, workload
from tests.unit.test_preemption_nodes import H100, NOW, gpu_nodes

PARENT = queue("all", quota=64)
BORROWER = queue("borrower", parent="all", quota=0)


OWNER = queue("owner", parent="all", quota=32, reclaim="Any", wait_before_evicting_s=0.0)


def fillers(nodes: int, spread: bool) -> tuple[list[Workload], list[BoundPod]]:
    """One-GPU workloads of the borrower filling every GPU; with `spread`, admitted in an
    order that goes round the nodes (so the newest are on every node), else node by node."""
    ws: list[Workload] = []
    pods: list[BoundPod] = []
    for j in range(nodes * 8):
        node = j % nodes if spread else j // 8
        w = Workload(
            f"fill/w{j:03d}",
            "borrower",
            0,
            float(j),
            (PodSet("main", 1, {GPU: 1}),),
            admission=(Assignment("main", 1, {GPU: "h100"}, ((f"h100-{node}", 1),)),),
            admitted_at=float(j),
        )
        ws.append(w)
        pods.append(BoundPod(f"fill/w{j:03d}-0", f"h100-{node}", {GPU: 1}, w.key))
    return ws, pods


def reclaim(
    spread: bool, borrower: QueueSpec = BORROWER, owner_queue: QueueSpec | None = None
) -> tuple[CycleResult, dict[str, str]]:
    """The borrower's one-GPU workloads fill 8 nodes; the owner asks for 4 whole nodes."""
    ws, pods = fillers(8, spread)
    large = workload("own/large", "owner", gpus=8, count=4)
    result = admission_cycle(
        Snapshot(
            now=NOW,
            queues=queues_of(PARENT, borrower, owner_queue or OWNER),
            flavors={"h100": H100},
            admitted=tuple(ws),
            pending=(large,),
            nodes=gpu_nodes(8),
            pods=tuple(pods),
        )
    )
    return result, {p.key: p.node for p in pods}


@pytest.mark.parametrize("spread", [True, False], ids=["spread", "node-by-node"])
def test_the_owner_reclaims_whole_nodes_evicting_exactly_the_fillers_on_them(spread: bool) -> None:
    result, node_of = reclaim(spread)
    assert not result.admit
    (preempt,) = result.preempt
    assert preempt.preemptor == "own/large"
    victims = [v.workload for v in preempt.victims]
    assert all(v.kind == "Reclaimed" for v in preempt.victims)
    assert len(victims) == 32, "half the fillers: the least that frees four whole nodes"
    on = Counter(node_of[f"{v}-0"] for v in victims)
    assert len(on) == 4 and set(on.values()) == {8}, f"whole nodes only: {on}"


def test_fillers_their_queue_protects_by_reclaim_min_runtime_are_never_taken() -> None:
    protected = queue("borrower", parent="all", quota=0, min_runtime_reclaim_s=NOW * 2)
    result, _ = reclaim(True, borrower=protected)
    assert not result.preempt and not result.admit


def test_with_lower_priority_reclaim_equal_priorities_are_never_taken() -> None:
    lower_only = queue(
        "owner", parent="all", quota=32, reclaim="LowerPriority", wait_before_evicting_s=0.0
    )
    result, _ = reclaim(True, owner_queue=lower_only)
    assert not result.preempt and not result.admit
