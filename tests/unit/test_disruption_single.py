"""disruptionMode Single: a victim loses only the single pods the preemptor needs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from quota.admission.cycle import admission_cycle
from quota.api import ManifestError
from quota.api.workload import Workload as WorkloadModel
from quota.model.convert import workload as to_model
from quota.model.decisions import CycleResult, Victim
from quota.model.nodes import BoundPod, Node
from quota.model.snapshot import Assignment, Flavor, PodSet, QueueSpec, Snapshot, Workload
from quota.placement.reservations import leaving_of
from quota.preemption.partial import admitted_counts
from tests.unit import test_simulator as sim
from tests.unit.strategies import GPU, queue, queues_of, workload


def cycle(spec: QueueSpec, admitted: list[Workload], pending: list[Workload]) -> CycleResult:
    return admission_cycle(
        Snapshot(
            now=1_000.0,
            queues=queues_of(spec),
            flavors={},
            admitted=tuple(admitted),
            pending=tuple(pending),
        )
    )


def victims(result: CycleResult) -> dict[str, Victim]:
    return {v.workload: v for p in result.preempt for v in p.victims}


def elastic(
    key: str, pods: int, protected: int = 0, single: bool = True, started: float = 0.0
) -> Workload:
    """An admitted workload of `pods` one-GPU pods."""
    w = workload(key, "a", gpus=1, count=pods, flavor="h100", admitted_at=started)
    return replace(
        w,
        pod_sets=(replace(w.pod_sets[0], protected_count=protected),),
        disruption_single=single,
    )


def gang(gpus: int) -> Workload:
    return workload("ns/p", "a", gpus=1, count=gpus, priority=5)


SPEC = queue("a", quota=4, within_queue="LowerPriority")


def test_single_victim_loses_only_the_pods_needed() -> None:
    result = cycle(SPEC, [elastic("ns/e", 4)], [gang(1)])
    (victim,) = victims(result).values()
    assert victim.pods == (("main", 1),)
    assert victim.kind == "Preempted"


def test_all_victim_still_goes_whole() -> None:
    result = cycle(SPEC, [elastic("ns/e", 4, single=False)], [gang(1)])
    assert victims(result)["ns/e"].pods is None


def test_every_pod_needed_and_none_protected_is_a_whole_victim() -> None:
    result = cycle(SPEC, [elastic("ns/e", 4)], [gang(4)])
    assert victims(result)["ns/e"].pods is None


def test_fully_protected_pod_set_is_never_a_victim() -> None:
    # A LeaderWorkerSet's leader alone: count 1, protectedCount 1.
    result = cycle(
        queue("a", quota=1, within_queue="LowerPriority"), [elastic("ns/l", 1, 1)], [gang(1)]
    )
    assert result.preempt == ()


def test_protected_pods_stay_and_others_make_up_the_rest() -> None:
    # 2 of 3 pods protected: it can give 1, the preemptor needs 2, so it loses its one
    # unprotected pod and a whole All workload of equal standing gives the other.
    admitted = [elastic("ns/e", 3, protected=2), elastic("ns/w", 1, single=False, started=5)]
    result = cycle(SPEC, admitted, [gang(2)])
    found = victims(result)
    assert found["ns/e"].pods == (("main", 1),)
    assert found["ns/w"].pods is None


def test_unprotected_pods_not_enough_and_nothing_else_means_no_eviction() -> None:
    result = cycle(SPEC, [elastic("ns/e", 4, protected=3)], [gang(2)])
    assert result.preempt == ()


def test_single_victim_preferred_over_whole_all_victim_of_equal_standing() -> None:
    # The All workload started later, so it would go first by start time; taking one pod of
    # the Single one disrupts fewer pods.
    admitted = [elastic("ns/e", 2, started=0), elastic("ns/w", 2, single=False, started=10)]
    result = cycle(SPEC, admitted, [gang(1)])
    assert {k: v.pods for k, v in victims(result).items()} == {"ns/e": (("main", 1),)}


def test_admitted_counts_after_a_shrink() -> None:
    w = Workload(
        "ns/lws",
        "a",
        0,
        0.0,
        (PodSet("leader", 1, {"gpu": 1}, protected_count=1), PodSet("workers", 3, {"gpu": 1})),
        admission=(Assignment("leader", 1, {"gpu": "h"}), Assignment("workers", 3, {"gpu": "h"})),
        disruption_single=True,
    )
    assert admitted_counts(w, (("workers", 2),)) == {"leader": 1, "workers": 1}
    assert admitted_counts(w, None) == {"leader": 0, "workers": 0}


@given(
    sizes=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 4)), min_size=1, max_size=4),
    need=st.integers(1, 12),
)
def test_single_victims_lose_exactly_what_is_needed(
    sizes: list[tuple[int, int]], need: int
) -> None:
    admitted = [
        elastic(f"ns/e{i}", pods, min(protected, pods), started=i)
        for i, (pods, protected) in enumerate(sizes)
    ]
    quota = sum(pods for pods, _ in sizes)
    takeable = sum(pods - min(protected, pods) for pods, protected in sizes)
    result = cycle(queue("a", quota=quota, within_queue="LowerPriority"), admitted, [gang(need)])
    found = victims(result)
    if need > quota or need > takeable:
        assert found == {}
        return
    by_key = {w.key: w for w in admitted}
    lost = 0
    for key, victim in found.items():
        w = by_key[key]
        pods = w.pod_sets[0].count if victim.pods is None else dict(victim.pods)["main"]
        # never a protected pod, never an empty take
        assert 0 < pods <= w.pod_sets[0].count - w.pod_sets[0].protected_count
        lost += pods
    assert lost == need  # the queue is full: exactly the pods needed, never more


def test_protected_count_above_count_is_refused_naming_the_field() -> None:
    manifest = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "lws", "namespace": "ns"},
        "spec": {
            "queueName": "q",
            "disruptionMode": "Single",
            "podSets": [{"name": "leader", "count": 1, "protectedCount": 2}],
        },
    }
    with pytest.raises(ValidationError, match="protectedCount must not exceed count"):
        WorkloadModel.model_validate(manifest)
    manifest["spec"]["podSets"][0]["protectedCount"] = 1  # type: ignore[index]
    model = to_model(WorkloadModel.model_validate(manifest), "a")
    assert model.disruption_single and model.pod_sets[0].protected_count == 1


# -- the simulator runs the same decisions ----------------------------------------------

# test_simulator's cluster without its nodes: the simulation admits on quota alone.
QUOTA_ONLY = "---".join(doc for doc in sim.CLUSTER.split("---") if "NodePool" not in doc)


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize(("mode", "pods_lost", "evictions"), [("single", 2, 0), ("all", 0, 1)])
def test_simulated_single_job_loses_only_the_pods_a_gang_needs(
    mode: str, pods_lost: int, evictions: int, nodes: bool
) -> None:
    # On quota alone, and on the one node of 8 GPUs the Job fills.
    text = (
        (sim.CLUSTER if nodes else QUOTA_ONLY)
        + sim.queue("a", 8, within="LowerPriority", wait="0s")
        + sim.job("a", "train", gpus=1, pods=8, run="1000s", elastic=True, disruption=mode)
        + sim.job("a", "urgent", gpus=1, pods=2, at="10s", run="50s", priority="high")
    )
    result = sim.run(text)
    train, urgent = sim.outcome(result, "a/train"), sim.outcome(result, "a/urgent")
    assert train["podsPreempted"] == pods_lost
    assert train["evictions"] == evictions
    assert urgent["admittedAt"] == 10
    if mode == "single":
        # It ran on with 6 pods and got its 2 back once the gang was done: never restarted.
        assert train["admittedAt"] == 0 and train["finishedAt"] == 1000


def test_a_bad_disruption_mode_annotation_is_refused_naming_it() -> None:
    text = QUOTA_ONLY + sim.queue("a", 8) + sim.job("a", "train", gpus=1, disruption="some")
    with pytest.raises(ManifestError, match=r"disruption-mode.*must be \"single\" or \"all\""):
        sim.run(text)


# -- on nodes: a Single victim loses the pods in the preemptor's way, never a protected one

NODES = tuple(
    Node(f"n{i}", {GPU: 8, "cpu": 64_000, "pods": 110}, {"pool": "h100"}) for i in range(4)
)


def serving_group(
    key: str, single: bool = True, workers: int = 3, priority: int = 0
) -> tuple[Workload, tuple[BoundPod, ...]]:
    """A LeaderWorkerSet group: its leader on n0, a worker on each of n1.., 8 GPUs a pod."""
    on = [(f"n{i}", 1) for i in range(1, workers + 1)]
    w = Workload(
        key,
        "a",
        priority,
        0.0,
        (PodSet("leader", 1, {GPU: 8}, protected_count=1), PodSet("workers", workers, {GPU: 8})),
        admission=(
            Assignment("leader", 1, {GPU: "h100"}, (("n0", 1),)),
            Assignment("workers", workers, {GPU: "h100"}, tuple(on)),
        ),
        disruption_single=single,
    )
    pods = (
        BoundPod(f"{key}-0", "n0", {GPU: 8}, key, "leader"),
        *(
            BoundPod(f"{key}-0-{i}", node, {GPU: 8}, key, "workers")
            for i, (node, _) in enumerate(on, start=1)
        ),
    )
    return w, pods


def on_nodes_cycle(
    admitted: list[Workload], pods: list[BoundPod], pending: list[Workload], quota: int = 1_000
) -> CycleResult:
    """One cycle on the four nodes; with `quota` 32 the queue's quota is as full as they are
    (the victims are then chosen for quota first)."""
    return admission_cycle(
        Snapshot(
            now=1_000.0,
            queues=queues_of(queue("a", quota=quota, within_queue="LowerPriority")),
            flavors={"h100": Flavor("h100", {"pool": "h100"})},
            admitted=tuple(admitted),
            pending=tuple(pending),
            nodes=NODES,
            pods=tuple(pods),
        )
    )


def urgent(nodes: int) -> Workload:
    return workload("ns/urgent", "a", gpus=8, count=nodes, priority=100)


@pytest.mark.parametrize("quota", [1_000, 32])
@pytest.mark.parametrize("need", [1, 2, 3])
def test_on_nodes_a_single_victim_loses_only_workers_in_the_way(need: int, quota: int) -> None:
    group, pods = serving_group("ns/serve")
    result = on_nodes_cycle([group], list(pods), [urgent(need)], quota)
    (victim,) = victims(result).values()
    assert victim.pods == (("workers", need),)
    assert len(victim.pod_names) == need
    assert "ns/serve-0" not in victim.pod_names  # never the leader
    assert all(name.startswith("ns/serve-0-") for name in victim.pod_names)
    assert f"it loses {need} workers pod" in victim.reason


@pytest.mark.parametrize("quota", [1_000, 32])
def test_on_nodes_the_leader_is_never_taken_even_when_the_gang_needs_its_node(quota: int) -> None:
    group, pods = serving_group("ns/serve")
    result = on_nodes_cycle([group], list(pods), [urgent(4)], quota)
    assert result.preempt == () and result.admit == ()
    (pending,) = result.pending
    assert ("cannot be placed" if quota > 32 else "no set of workloads") in pending.reason


@pytest.mark.parametrize("quota", [1_000, 32])
def test_on_nodes_an_all_group_goes_whole(quota: int) -> None:
    group, pods = serving_group("ns/serve", single=False)
    result = on_nodes_cycle([group], list(pods), [urgent(1)], quota)
    (victim,) = victims(result).values()
    assert victim.pods is None and victim.pod_names == ()


def test_on_nodes_pods_already_taken_count_as_leaving_and_no_one_more_is_taken() -> None:
    # The cycle after: the victim's admission shrank to 2 workers, the lost pod (still
    # terminating on n3) is marked leaving; the preemptor waits for it and takes no more.
    group, pods = serving_group("ns/serve")
    first = on_nodes_cycle([group], list(pods), [urgent(1)])
    (victim,) = victims(first).values()
    (lost,) = victim.pod_names
    (held,) = [p.hold for p in first.pending if p.workload == "ns/urgent"]
    shrunk = replace(
        group,
        admission=(group.admission[0], replace(group.admission[1], count=2)),  # type: ignore[index]
    )
    marked = [replace(p, workload=leaving_of("ns/serve")) if p.key == lost else p for p in pods]
    waiting = replace(urgent(1), hold=held)
    second = on_nodes_cycle([shrunk], marked, [waiting])
    assert second.preempt == ()
    assert not second.admit  # its room is still taken by the leaving pod
    # Once the pod is gone, the preemptor is admitted where it was held.
    gone = [p for p in marked if p.key != lost]
    third = on_nodes_cycle([shrunk], gone, [waiting])
    assert [a.workload for a in third.admit] == ["ns/urgent"]
    assert third.preempt == ()


def test_on_nodes_the_same_pods_are_never_taken_twice() -> None:
    # Two preemptors of one node each. A victim is chosen once a cycle: the first takes a
    # worker, the second waits; in the next cycle (the first holding its room, the lost
    # worker leaving) the second takes another worker, never the leader.
    group, pods = serving_group("ns/serve")
    a = workload("ns/u1", "a", gpus=8, count=1, priority=100)
    b = workload("ns/u2", "a", gpus=8, count=1, priority=100, arrival=1.0)
    first = on_nodes_cycle([group], list(pods), [a, b])
    (taken,) = [n for p in first.preempt for v in p.victims for n in v.pod_names]
    holds = {p.workload: p.hold for p in first.pending}
    shrunk = replace(
        group,
        admission=(group.admission[0], replace(group.admission[1], count=2)),  # type: ignore[index]
    )
    marked = [replace(p, workload=leaving_of("ns/serve")) if p.key == taken else p for p in pods]
    second = on_nodes_cycle(
        [shrunk], marked, [replace(a, hold=holds["ns/u1"]), replace(b, hold=holds["ns/u2"])]
    )
    (again,) = [n for p in second.preempt for v in p.victims for n in v.pod_names]
    assert again != taken and again != "ns/serve-0"
    assert [p.preemptor for p in second.preempt] == ["ns/u2"]
