"""Pods grouped by their owner (controllers/state/ownergroups.py) and the Workload a group
asks for (controllers/owners/workload.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.owners.workload import Refused, Shape, group_spec, workload_name
from controllers.state.ownergroups import (
    OwnerGroup,
    gid_of,
    group_of,
    pod_set_of,
)
from controllers.webhooks.decisions import mutate_queued_pod
from quota.model.serving import LEADER, MAIN, WORKERS, lws_group, replicas_group

QL = "muster.dev/queue-name"


def pod(
    name: str = "p",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    cpu: str = "1",
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "labels": {QL: "lq", **(labels or {})},
        "annotations": annotations or {},
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    if owner is not None:
        meta["ownerReferences"] = [{"controller": True, **owner}]
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}], **spec},
    }


LWS_LABELS = {
    "leaderworkerset.sigs.k8s.io/name": "serve",
    "leaderworkerset.sigs.k8s.io/group-index": "1",
}


def test_a_leaderworkersets_pods_are_grouped_by_replica_and_split_into_leader_and_workers() -> None:
    leader = pod("serve-1", {**LWS_LABELS, "leaderworkerset.sigs.k8s.io/worker-index": "0"})
    worker = pod("serve-1-2", {**LWS_LABELS, "leaderworkerset.sigs.k8s.io/worker-index": "2"})
    group = group_of(leader)
    assert group is not None and group == group_of(worker)
    assert group.gid == "owner.leaderworkerset.x-k8s.io/LeaderWorkerSet:ns/serve#1"
    assert pod_set_of(leader, group) == LEADER and pod_set_of(worker, group) == WORKERS
    other = pod("serve-0", {**LWS_LABELS, "leaderworkerset.sigs.k8s.io/group-index": "0"})
    assert gid_of(other) != group.gid


def test_a_deployments_pods_are_grouped_across_its_replicasets() -> None:
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "uid": "rs"}
    old = pod("a", {"pod-template-hash": "abc12"}, owner={**rs, "name": "web-abc12"})
    new = pod("b", {"pod-template-hash": "ff00d"}, owner={**rs, "name": "web-ff00d"})
    assert gid_of(old) == gid_of(new) == "owner.apps/Deployment:ns/web"
    # A ReplicaSet of its own (no template hash in its name) is its own owner.
    lone = pod("c", owner={**rs, "name": "mine"})
    assert gid_of(lone) == "owner.apps/ReplicaSet:ns/mine"


def test_any_other_owner_groups_its_pods_and_a_bare_pod_is_its_own_group() -> None:
    widget = {"apiVersion": "e2e.example/v1", "kind": "Widget", "name": "w", "uid": "w1"}
    group = group_of(pod("w-0", owner=widget))
    assert group == OwnerGroup("e2e.example/v1", "Widget", "ns", "w", "w1")
    assert gid_of(pod("bare")) == "owner.core/Pod:ns/bare"
    labelled = pod("x", {"muster.dev/pod-group": "g"}, owner=widget)
    assert gid_of(labelled) == "owner.core/PodGroupLabel:ns/g"


@pytest.mark.parametrize(
    "labels,annotations,spec",
    [
        ({"muster.dev/owner-uid": "u"}, {}, {}),  # a JobSet's or TrainJob's: by its uid
        ({"batch.kubernetes.io/controller-uid": "u"}, {}, {}),  # a Job's
        ({}, {"scheduling.k8s.io/group-name": "g"}, {}),  # a Volcano PodGroup's
        ({}, {}, {"schedulingGroup": {"podGroupName": "g"}}),  # a native PodGroup's
    ],
)
def test_pods_queued_otherwise_are_not_grouped_nor_gated(
    labels: dict[str, str], annotations: dict[str, str], spec: dict[str, Any]
) -> None:
    found = pod("p", labels, annotations, **spec)
    assert group_of(found) is None
    assert not any(
        op["path"].startswith("/spec/schedulingGates") for op in mutate_queued_pod(found)
    )


def test_an_unlabelled_pod_is_left_alone() -> None:
    found = pod()
    del found["metadata"]["labels"][QL]
    assert group_of(found) is None and mutate_queued_pod(found) == []


LQ = [{"metadata": {"name": "lq", "namespace": "ns"}, "spec": {"clusterQueue": "cq"}}]


def test_a_group_asks_for_the_most_any_of_its_pods_asks_per_pod_set() -> None:
    group = OwnerGroup("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "ns", "s", index="0")
    pods = {LEADER: [pod("l", cpu="2")], WORKERS: [pod("w1", cpu="1"), pod("w2", cpu="3")]}
    shape = Shape(lws_group(4, degradable=True), elastic=False, single=True)
    spec = group_spec(group, shape, pods, LQ, {}, None)
    sets = {ps["name"]: ps for ps in spec["podSets"]}
    assert sets[LEADER]["count"] == 1 and sets[LEADER]["requests"] == {"cpu": "2"}
    assert sets[WORKERS]["count"] == 3 and sets[WORKERS]["requests"] == {"cpu": "3"}
    # Degradable: workers one by one, never the leader.
    assert spec["disruptionMode"] == "Single"
    assert sets[LEADER]["protectedCount"] == 1 and sets[WORKERS]["protectedCount"] == 0


def test_workers_not_created_yet_are_sized_from_the_template() -> None:
    group = OwnerGroup("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "ns", "s", index="0")
    template = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "4"}}}]}
    shape = Shape(lws_group(3, degradable=False), elastic=False, templates={WORKERS: template})
    spec = group_spec(group, shape, {LEADER: [pod("l")]}, LQ, {}, None)
    assert spec["podSets"][1]["requests"] == {"cpu": "4"}
    assert spec["disruptionMode"] == "All"


def test_a_missing_queue_is_refused_naming_the_label() -> None:
    group = OwnerGroup("apps/v1", "Deployment", "ns", "web")
    with pytest.raises(Refused) as refused:
        group_spec(group, Shape(replicas_group(1), elastic=True), {MAIN: [pod()]}, [], {}, None)
    assert refused.value.reason == "QueueNotFound"
    assert "Deployment ns/web" in str(refused.value) and QL in str(refused.value)


def test_lws_exclusive_topology_is_refused_not_dropped() -> None:
    group = OwnerGroup("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "ns", "s", index="0")
    leader = pod("l", annotations={"leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"})
    with pytest.raises(Refused) as refused:
        shape = Shape(lws_group(1, degradable=False), elastic=False)
        group_spec(group, shape, {LEADER: [leader]}, LQ, {}, None)
    assert refused.value.reason == "UnsupportedTopology"


@given(
    name=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=300),
    serial=st.integers(min_value=0, max_value=10**6),
)
def test_workload_names_are_valid_and_differ_by_serial(name: str, serial: int) -> None:
    group = OwnerGroup("apps/v1", "Deployment", "ns", name)
    made = workload_name(group, serial)
    assert len(made) <= 253 and made == workload_name(group, serial)
    assert made != workload_name(group, serial + 1)
