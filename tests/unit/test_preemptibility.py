"""Preemptibility: a workload at or above its queue's preemptibleBelowPriority (or annotated
muster.dev/preemptible: "false") is admitted only within its queue path's quota and is never
chosen by any victim search: within-queue preemption, reclaim, preemption on nodes,
consolidation. Each test runs the same cycle with the workload preemptible as a control."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.admission.cycle import admission_cycle
from quota.api import ManifestError, parse_manifest
from quota.api.names import PREEMPTIBLE_ANNOTATION
from quota.api.workload import Workload as WorkloadModel
from quota.model.convert import job_to_workload_model
from quota.model.convert import workload as convert_workload
from quota.model.decisions import CycleResult, Pending
from quota.model.nodes import BoundPod
from quota.model.queues import queue_spec
from quota.model.snapshot import (
    QueueSpec,
    Snapshot,
    Workload,
    is_preemptible,
    pod_set_usage,
    queue_tree,
)
from tests.unit.strategies import CPU, GPU, apply_cycle, queue, queues_of, snapshots, workload
from tests.unit.test_consolidation import SVC, TRAIN, scattered
from tests.unit.test_preemption_nodes import H100, NOW, gpu_nodes, running

# A cohort of 16 GPUs: serve is guaranteed 4 of them, train 12 and idle.
ORG = queue("org", quota=16)
SERVE = queue("serve", "org", quota=4, preemptible_below=100)
IDLE = queue("train", "org", quota=12)


def cycle(
    specs: Sequence[QueueSpec],
    pending: Sequence[Workload],
    admitted: Sequence[Workload] = (),
    pods: Sequence[BoundPod] | None = None,
    nodes: int = 0,
) -> CycleResult:
    return admission_cycle(
        Snapshot(
            now=NOW,
            queues=queues_of(*specs),
            flavors={"h100": H100},
            admitted=tuple(admitted),
            pending=tuple(pending),
            nodes=gpu_nodes(nodes) if pods is not None else None,
            pods=tuple(pods or ()),
        )
    )


def pending_of(result: CycleResult, key: str) -> Pending:
    (found,) = [p for p in result.pending if p.workload == key]
    return found


def victims(result: CycleResult) -> set[str]:
    return {v.workload for p in result.preempt for v in p.victims}


# -- never borrows ----------------------------------------------------------------------


def test_a_non_preemptible_workload_waits_beyond_its_quota_with_the_reason() -> None:
    w = workload("ml/chat", "serve", gpus=8, priority=150)
    result = cycle([ORG, SERVE, IDLE], [w])
    assert not result.admit
    assert pending_of(result, "ml/chat").reason == (
        "non-preemptible (priority 150 >= 100 in queue serve): admitted only within the "
        "queue's guaranteed quota of nvidia.com/gpu in flavor h100: requested 8, quota left 4"
    )
    # Below the threshold it borrows the idle cohort's GPUs.
    (admit,) = cycle([ORG, SERVE, IDLE], [replace(w, priority=50)]).admit
    assert admit.borrowing


def test_the_annotation_overrides_the_threshold_both_ways() -> None:
    high = workload("ml/high", "serve", gpus=8, priority=150, preemptible=True)
    assert [a.workload for a in cycle([ORG, SERVE, IDLE], [high]).admit] == ["ml/high"]
    low = workload("ml/low", "serve", gpus=8, priority=0, preemptible=False)
    result = cycle([ORG, SERVE, IDLE], [low])
    assert not result.admit
    assert pending_of(result, "ml/low").reason.startswith(
        "non-preemptible (by its annotation): admitted only within"
    )


def test_within_quota_a_non_preemptible_workload_is_admitted_and_not_borrowing() -> None:
    (admit,) = cycle([ORG, SERVE, IDLE], [workload("ml/chat", "serve", gpus=4, priority=150)]).admit
    assert not admit.borrowing


def test_the_queue_threshold_and_annotation_come_from_the_api_objects() -> None:
    cq = parse_manifest(
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ClusterQueue",
            "metadata": {"name": "serve"},
            "spec": {},
        },
        0,
    )
    spec = queue_spec(cq)  # type: ignore[arg-type]
    assert spec.preemptible_below == 100  # the API's default, KAI's
    doc = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "a", "namespace": "ml", "annotations": {}},
        "spec": {
            "queueName": "q",
            "priority": 150,
            "podSets": [{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": 1}}],
        },
    }
    plain = parse_manifest(doc, 0)
    assert isinstance(plain, WorkloadModel)
    assert not is_preemptible(convert_workload(plain, "serve"), spec)
    doc["metadata"]["annotations"] = {PREEMPTIBLE_ANNOTATION: "true"}  # type: ignore[index]
    marked = parse_manifest(doc, 0)
    assert isinstance(marked, WorkloadModel)
    assert is_preemptible(convert_workload(marked, "serve"), spec)


# -- never a victim: one test per search --------------------------------------------------


def test_within_queue_preemption_never_chooses_a_non_preemptible_workload() -> None:
    q = queue("q", quota=8, within_queue="LowerPriority", preemptible_below=100)
    old = workload("ml/old", "q", gpus=8, priority=150, flavor="h100")
    new = workload("ml/new", "q", gpus=8, priority=500, arrival=1.0)
    result = cycle([q], [new], [old])
    assert not victims(result)
    assert "1 workload in its way is non-preemptible and never evicted: ml/old" in (
        pending_of(result, "ml/new").reason
    )
    # Control: the same workload, annotated preemptible, is preempted.
    assert victims(cycle([q], [new], [replace(old, preemptible=True)])) == {"ml/old"}


def test_reclaim_never_chooses_a_non_preemptible_workload() -> None:
    org = queue("org", quota=16)
    a = queue("a", "org", quota=8, reclaim="Any")
    b = queue("b", "org", quota=8, reclaim="Any")
    # b borrows 8 from a; its lower-priority, newer workload would be the first victim.
    kept = workload("b/kept", "b", gpus=8, priority=0, flavor="h100", admitted_at=5.0)
    other = workload("b/other", "b", gpus=8, priority=10, flavor="h100", admitted_at=1.0)
    claim = workload("a/claim", "a", gpus=8, priority=0, arrival=10.0)
    assert victims(cycle([org, a, b], [claim], [kept, other])) == {"b/kept"}  # control
    shielded = replace(kept, preemptible=False)
    assert victims(cycle([org, a, b], [claim], [shielded, other])) == {"b/other"}


def test_preemption_on_nodes_never_chooses_a_non_preemptible_workload() -> None:
    q = queue("q", quota=24, within_queue="LowerPriority")
    low, low_pods = running("q/low", "q", ["h100-0"], priority=0)
    mid, mid_pods = running("q/mid", "q", ["h100-1"], priority=5)
    gang = workload("q/gang", "q", gpus=8, priority=100)
    pods = [*low_pods, *mid_pods]
    assert victims(cycle([q], [gang], [low, mid], pods, nodes=2)) == {"q/low"}  # control
    shielded = replace(low, preemptible=False)
    assert victims(cycle([q], [gang], [shielded, mid], pods, nodes=2)) == {"q/mid"}
    # With both shielded it waits, and says who is in its way.
    both = [shielded, replace(mid, preemptible=False)]
    result = cycle([q], [gang], both, pods, nodes=2)
    assert not victims(result)
    assert pending_of(result, "q/gang").reason.endswith(
        "2 workloads in its way are non-preemptible and never evicted: q/low, q/mid"
    )


def test_consolidation_never_moves_a_non_preemptible_workload() -> None:
    ws, pods = scattered()
    gang = workload("ml/gang", "train", gpus=8, count=2, priority=0)
    first = victims(cycle([SVC, TRAIN], [gang], ws, pods, nodes=4))
    assert len(first) == 2  # control: two of the four move
    # The control's choice, now non-preemptible: the other two move instead.
    shielded = [replace(w, preemptible=False) if w.key in first else w for w in ws]
    others = {w.key for w in ws} - first
    assert victims(cycle([SVC, TRAIN], [gang], shielded, pods, nodes=4)) == others


# -- properties ---------------------------------------------------------------------------

fast = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def with_preemptibility(draw: st.DrawFn) -> Snapshot:
    """A random snapshot whose queues have random thresholds and whose workloads are
    sometimes annotated either way."""
    snapshot = draw(
        snapshots(flavors=("h100", "a100"), resources=(GPU, CPU), policies=True, max_workloads=16)
    )
    thresholds = st.one_of(st.none(), st.integers(min_value=0, max_value=3))
    queues = {
        name: replace(spec, preemptible_below=draw(thresholds))
        for name, spec in snapshot.queues.items()
    }
    flags = st.sampled_from([None, None, True, False])
    pending = tuple(replace(w, preemptible=draw(flags)) for w in snapshot.pending)
    return replace(snapshot, queues=queues, pending=pending)


@fast
@given(with_preemptibility())
def test_no_victim_is_non_preemptible_and_none_takes_its_path_beyond_quota(
    snapshot: Snapshot,
) -> None:
    tree = queue_tree(snapshot.queues)
    for step in range(3):
        result = admission_cycle(snapshot)
        admitted = {w.key: w for w in snapshot.admitted}
        for p in result.preempt:
            for v in p.victims:
                w = admitted[v.workload]
                assert is_preemptible(w, snapshot.queues[w.queue]), f"{w.key} chosen"
        # Replay the admissions on what is held: each non-preemptible one keeps every queue
        # on its path within quota.
        used: dict[str, dict[tuple[str, str], int]] = {name: {} for name in snapshot.queues}
        for w in snapshot.admitted:
            for key, amount in pod_set_usage(w).items():
                for name in tree.paths[w.queue]:
                    used[name][key] = used[name].get(key, 0) + amount
        pending = {w.key: w for w in snapshot.pending}
        for a in result.admit:
            w = replace(pending[a.workload], admission=a.assignments)
            for key, amount in pod_set_usage(w).items():
                for name in tree.paths[a.queue]:
                    used[name][key] = used[name].get(key, 0) + amount
            if not is_preemptible(w, snapshot.queues[a.queue]):
                assert not a.borrowing, a
                for name in tree.paths[a.queue]:
                    quotas = snapshot.queues[name].quotas
                    for key in pod_set_usage(w):
                        assert used[name].get(key, 0) <= quotas.get(key, 0), (a, name, key)
        snapshot = apply_cycle(snapshot, result, now=snapshot.now + 1_000 * (step + 1))


# -- the annotation on a user's Job ------------------------------------------------------


def _job(annotations: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "chat",
            "namespace": "ml",
            "labels": {"muster.dev/queue-name": "serve"},
            "annotations": annotations,
        },
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
                    ]
                }
            }
        },
    }


def test_a_jobs_annotation_is_carried_to_its_workload_and_a_bad_one_is_refused() -> None:
    model = job_to_workload_model(_job({PREEMPTIBLE_ANNOTATION: "false"}), {})
    assert model.metadata.annotations == {PREEMPTIBLE_ANNOTATION: "false"}
    assert model.preemptible is False
    assert job_to_workload_model(_job({}), {}).preemptible is None
    with pytest.raises(ManifestError) as refused:
        job_to_workload_model(_job({PREEMPTIBLE_ANNOTATION: "yes"}), {})
    assert refused.value.problems == [
        (
            f"metadata.annotations[{PREEMPTIBLE_ANNOTATION}]",
            'must be "true" or "false" (got \'yes\')',
        )
    ]
