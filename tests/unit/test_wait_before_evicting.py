"""waitBeforeEvicting: a pending workload evicts no one until it has waited this long for
room to free by completions; inherited down the tree; the reason says from when; the
simulator decides again at that instant."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import yaml

from quota.admission.cycle import admission_cycle
from quota.model.snapshot import Snapshot
from quota.simulation.scenario import parse_scenario
from quota.simulation.simulator import simulate
from tests.unit.strategies import GPU, queue, queues_of, workload
from tests.unit.test_min_runtime import cluster_queue, specs
from tests.unit.test_preemption_nodes import BIG, A, B, cycle, gangs, gpu_nodes, pending_reason

# Arrived at 1000 (00:16:40 UTC); its queue waits 30s: it may evict from 00:17:10 UTC.
ARRIVAL = 1_000.0


def within_queue(now: float) -> Snapshot:
    spec = queue("a", quota=4, within_queue="LowerPriority", wait_before_evicting_s=30.0)
    return Snapshot(
        now=now,
        queues=queues_of(spec),
        flavors={},
        admitted=(workload("ns/low", "a", gpus=4, flavor="h100", admitted_at=0.0),),
        pending=(workload("ns/urgent", "a", gpus=2, priority=5, arrival=ARRIVAL),),
    )


def test_nobody_is_evicted_before_the_wait_and_the_reason_says_from_when() -> None:
    result = admission_cycle(within_queue(now=ARRIVAL + 12))
    assert not result.preempt
    (pending,) = result.pending
    assert pending.reason.endswith(
        "it may evict from 00:17:10 UTC (in 18s): queue a waits 30s (waitBeforeEvicting) for "
        "room to free by completions first"
    )


def test_the_preemptor_evicts_once_it_has_waited() -> None:
    result = admission_cycle(within_queue(now=ARRIVAL + 30))
    assert [v.workload for p in result.preempt for v in p.victims] == ["ns/low"]


def test_reclaim_waits_too() -> None:
    queues = queues_of(
        queue("a", quota=4, reclaim="Any", wait_before_evicting_s=30.0), queue("b", quota=4)
    )
    borrowed = tuple(
        workload(f"ns/b{i}", "b", gpus=2, flavor="h100", admitted_at=0.0) for i in range(4)
    )
    early = Snapshot(
        now=ARRIVAL + 1,
        queues=queues,
        flavors={},
        capacity={("h100", "nvidia.com/gpu"): 8},
        admitted=borrowed,
        pending=(workload("ns/mine", "a", gpus=2, arrival=ARRIVAL),),
    )
    assert not admission_cycle(early).preempt
    later = admission_cycle(replace(early, now=ARRIVAL + 30))
    assert [v.kind for p in later.preempt for v in p.victims] == ["Reclaimed"]


def test_preemption_on_nodes_waits_too() -> None:
    nodes = gpu_nodes(10)
    ws, pods = gangs([0] * 5)
    patient = replace(A, wait_before_evicting_s=60.0)
    big = replace(BIG, arrival=9_990.0)  # the cycle runs at 10_000: 10s after
    result = cycle([patient, B], [big], nodes, ws, pods)
    assert not result.preempt
    assert "it may evict from 02:47:30 UTC (in 50s)" in pending_reason(result, "ns/big")
    assert cycle([replace(A, wait_before_evicting_s=10.0), B], [big], nodes, ws, pods).preempt


def test_a_team_inherits_its_departments_wait_and_none_set_means_thirty_seconds() -> None:
    queues = specs(
        cluster_queue("dept", waitBeforeEvicting="1m"),
        cluster_queue("team-a", "dept"),
        cluster_queue("team-b", "dept", waitBeforeEvicting="0s"),
        cluster_queue("other"),
    )
    assert queues["team-a"].wait_before_evicting_s == 60.0
    assert queues["team-b"].wait_before_evicting_s == 0.0  # evicts at once
    assert queues["other"].wait_before_evicting_s == 30.0


SCENARIO = """
apiVersion: simulate.muster.dev/v1alpha1
kind: Simulation
metadata: {name: grace}
---
apiVersion: muster.dev/v1alpha1
kind: ResourceFlavor
metadata: {name: gpu}
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {name: a}
spec:
  flavors: [{name: gpu, quota: {nvidia.com/gpu: 4}}]
  preemption: {withinQueue: LowerPriority, waitBeforeEvicting: 7s}
---
apiVersion: muster.dev/v1alpha1
kind: LocalQueue
metadata: {name: q, namespace: ns}
spec: {clusterQueue: a}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: urgent}
value: 10
"""


def job(name: str, submit_at: str, priority_class: str | None = None) -> dict[str, Any]:
    """A one-pod Job asking for the queue's 4 GPUs, running for an hour."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "main", "image": "main:latest", "resources": {"requests": {GPU: 4}}}
        ],
    }
    if priority_class:
        pod["priorityClassName"] = priority_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"muster.dev/queue-name": "q"},
            "annotations": {"muster.dev/submit-at": submit_at, "muster.dev/run-for": "1h"},
        },
        "spec": {"template": {"spec": pod}},
    }


def test_the_simulator_evicts_at_the_instant_the_wait_ends() -> None:
    docs = [*yaml.safe_load_all(SCENARIO), job("low", "0s"), job("urgent", "10s", "urgent")]
    result = simulate(parse_scenario(docs))
    (record,) = result.preemptions
    # Nothing else happens at 17s: the simulator decides again then, on its own.
    assert record.at == 17.0


def waiting_queue(within: str) -> Snapshot:
    """Queue a is guaranteed 4 GPUs; 3 are in use; ns/urgent needs all 4 and waits before it
    may evict; ns/filler (lower) and ns/peer (as urgent's priority) would fit in the one left."""
    spec = queue("a", quota=4, within_queue=within, wait_before_evicting_s=30.0)
    return Snapshot(
        now=ARRIVAL + 12,
        queues=queues_of(spec),
        flavors={},
        admitted=(workload("ns/low", "a", gpus=3, flavor="h100", admitted_at=0.0),),
        pending=(
            workload("ns/urgent", "a", gpus=4, priority=5, arrival=ARRIVAL),
            workload("ns/filler", "a", gpus=1, priority=0, arrival=ARRIVAL + 1),
        ),
    )


def test_lower_priorities_are_not_started_while_a_preemptor_waits_for_their_room() -> None:
    result = admission_cycle(waiting_queue("LowerPriority"))
    assert not result.admit and not result.preempt
    reasons = {p.workload: p.reason for p in result.pending}
    assert reasons["ns/filler"].startswith(
        "held back for ns/urgent (priority 5) of its queue, which waits for room"
    )
    # Once the wait is over ns/urgent evicts ns/low; ns/filler still does not start into
    # the room ns/urgent takes.
    later = admission_cycle(replace(waiting_queue("LowerPriority"), now=ARRIVAL + 30))
    assert [v.workload for p in later.preempt for v in p.victims] == ["ns/low"]
    assert "ns/filler" not in {a.workload for a in later.admit}


def test_what_a_waiting_workload_could_never_evict_is_started() -> None:
    # A queue that never preempts within itself: ns/urgent waits for completions alone, and
    # ns/filler, which it could never evict, takes the room left.
    result = admission_cycle(waiting_queue("Never"))
    assert [a.workload for a in result.admit] == ["ns/filler"]
    # An equal priority is never held back: it is not a victim of ns/urgent.
    peer = workload("ns/peer", "a", gpus=1, priority=5, arrival=ARRIVAL + 1)
    snapshot = waiting_queue("LowerPriority")
    result = admission_cycle(replace(snapshot, pending=(snapshot.pending[0], peer)))
    assert [a.workload for a in result.admit] == ["ns/peer"]
