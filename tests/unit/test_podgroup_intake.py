"""PodGroup intake, the parts without an apiserver: the queue mapping rule, the Workload a
group becomes, the ids that tie pods and Workloads to their group, and the status each
foreign API is told."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from controllers.podgroups.intake import Refused, new_workload, workload_name, workload_spec
from controllers.podgroups.kinds import NATIVE, VOLCANO, Told
from controllers.podgroups.queues import resolve
from controllers.state import workloads as wls
from controllers.state.caches import job_uid_of_pod
from controllers.state.foreigngroups import (
    group_id,
    group_id_of_pod,
    group_id_of_workload,
    parse_group_id,
)

NOW = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)


def lq(name: str, namespace: str, cq: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cq}}


def pod(name: str, cpu: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "schedulerName": "muster-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
            **spec,
        },
    }


def volcano(queue: str | None = None, *, min_member: int = 2, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "g", "namespace": "ns", "uid": "u-1"}
    if queue is not None:
        meta["annotations"] = {"scheduling.volcano.sh/queue-name": queue}
    return {"metadata": meta, "spec": {"minMember": min_member, **spec}}


# ----------------------------------------------------------------- the queue mapping


def test_a_localqueue_of_the_queues_name_wins() -> None:
    queues = [lq("gpu", "ns", "other"), lq("team", "ns", "gpu")]
    assert resolve("ns", "gpu", queues)[0] == "gpu"


def test_else_the_localqueue_pointing_at_the_clusterqueue_of_that_name() -> None:
    queues = [lq("b-team", "ns", "gpu"), lq("a-team", "ns", "gpu"), lq("gpu", "elsewhere", "x")]
    name, how = resolve("ns", "gpu", queues)
    assert name == "a-team"  # the first by name when several point at it
    assert "ClusterQueue gpu" in how


def test_no_queue_in_the_namespace_is_refused_with_what_to_create() -> None:
    name, why = resolve("ns", "gpu", [lq("gpu", "other-ns", "gpu")])
    assert name is None
    assert "no LocalQueue gpu in namespace ns" in why and "ClusterQueue gpu" in why


def test_a_deleting_localqueue_does_not_count() -> None:
    leaving = lq("gpu", "ns", "gpu")
    leaving["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    assert resolve("ns", "gpu", [leaving])[0] is None


# ----------------------------------------------------------------- the Workload


def test_volcano_group_becomes_one_pod_set_of_min_member_pods() -> None:
    pods = [pod("a", "500m", nodeSelector={"pool": "x"}), pod("b", "1")]
    spec = workload_spec(
        VOLCANO,
        volcano("gpu", min_member=3, priorityClassName="high"),
        pods,
        [lq("team", "ns", "gpu")],
        {"high": 1000},
        None,
    )
    assert spec["queueName"] == "team"
    assert spec["priority"] == 1000 and spec["priorityClassName"] == "high"
    (pod_set,) = spec["podSets"]
    assert pod_set["count"] == 3
    # The most any pod asks for, so quota is never under-counted.
    assert pod_set["requests"] == {"cpu": "1"}
    assert pod_set["template"]["nodeSelector"] == {"pool": "x"}


def test_volcano_spec_queue_is_read_when_no_annotation() -> None:
    pg = volcano(None)
    pg["spec"]["queue"] = "q"
    spec = workload_spec(VOLCANO, pg, [pod("a", "1")], [lq("q", "ns", "cq")], {}, None)
    assert spec["queueName"] == "q"


def test_volcano_default_queue_is_default() -> None:
    with pytest.raises(Refused) as refused:
        workload_spec(VOLCANO, volcano(None), [pod("a", "1")], [], {}, None)
    assert refused.value.reason == "QueueNotFound"
    assert "spec.queue" in str(refused.value) and "'default'" in str(refused.value)


def test_unknown_queue_names_the_podgroup_and_field() -> None:
    with pytest.raises(Refused) as refused:
        workload_spec(VOLCANO, volcano("nope"), [pod("a", "1")], [lq("x", "ns", "y")], {}, None)
    message = str(refused.value)
    assert refused.value.reason == "QueueNotFound"
    assert "Volcano PodGroup ns/g" in message
    assert "metadata.annotations[scheduling.volcano.sh/queue-name]" in message
    assert "'nope'" in message


def test_min_member_below_one_is_refused() -> None:
    with pytest.raises(Refused, match=r"spec.minMember must be at least 1"):
        workload_spec(VOLCANO, volcano("q", min_member=0), [pod("a", "1")], [], {}, None)


def test_unknown_priority_class_is_refused() -> None:
    with pytest.raises(Refused, match=r"PriorityClass 'gold' does not exist"):
        workload_spec(
            VOLCANO,
            volcano("q", priorityClassName="gold"),
            [pod("a", "1")],
            [lq("q", "ns", "cq")],
            {},
            None,
        )


def test_bad_pod_request_is_refused_naming_the_pod() -> None:
    with pytest.raises(Refused, match=r"Pod ns/a"):
        workload_spec(VOLCANO, volcano("q"), [pod("a", "lots")], [lq("q", "ns", "cq")], {}, None)


def test_native_group_needs_a_queue_label() -> None:
    native = {
        "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}},
    }
    with pytest.raises(Refused) as refused:
        workload_spec(NATIVE, native, [pod("a", "1")], [lq("q", "ns", "cq")], {}, None)
    assert refused.value.reason == "NoQueue"
    assert "metadata.labels[muster.dev/queue-name]" in str(refused.value)
    native["metadata"]["labels"] = {"muster.dev/queue-name": "q"}
    native["spec"]["priority"] = 7
    spec = workload_spec(NATIVE, native, [pod("a", "1")], [lq("q", "ns", "cq")], {}, None)
    assert spec["podSets"][0]["count"] == 4 and spec["priority"] == 7


def test_the_workload_is_owned_by_the_podgroup_and_indexed_by_its_id() -> None:
    pg = volcano("q")
    body = new_workload(VOLCANO, pg, workload_name("g", "u-1"), {"queueName": "q"})
    ref = body["metadata"]["ownerReferences"][0]
    assert (ref["apiVersion"], ref["kind"], ref["uid"]) == (
        "scheduling.volcano.sh/v1beta1",
        "PodGroup",
        "u-1",
    )
    assert wls.holds_finalizer(body)
    gid = group_id("scheduling.volcano.sh", "ns", "g")
    assert group_id_of_workload(body) == gid == wls.owner_job_uid(body)
    assert parse_group_id(gid) == ("scheduling.volcano.sh", "ns", "g")


def test_pods_are_indexed_by_the_group_they_name() -> None:
    volcano_pod = pod("a", "1")
    volcano_pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "g"}
    volcano_pod["metadata"]["labels"] = {"batch.kubernetes.io/controller-uid": "job-uid"}
    # Found by its Job's uid and by its group's id: whichever Workload admits it finds it.
    assert list(job_uid_of_pod(volcano_pod)) == [
        "job-uid",
        group_id("scheduling.volcano.sh", "ns", "g"),
    ]
    native_pod = pod("b", "1", schedulingGroup={"podGroupName": "n"})
    assert group_id_of_pod(native_pod) == group_id("scheduling.k8s.io", "ns", "n")
    plain = pod("c", "1")
    plain["metadata"]["labels"] = {"batch.kubernetes.io/controller-uid": "job-uid"}
    assert list(job_uid_of_pod(plain)) == ["job-uid"]


# ----------------------------------------------------------------- telling


def test_volcano_phases_follow_the_workload() -> None:
    pg: dict[str, Any] = {"metadata": {"name": "g"}}
    assert VOLCANO.tell(pg, Told("queued", "NotEnoughResources", "insufficient quota", 0), NOW)
    assert pg["status"]["phase"] == "Pending"
    unschedulable = wls.condition(pg, "Unschedulable")
    assert unschedulable is not None and unschedulable["status"] == "True"
    # Saying the same again writes nothing.
    assert not VOLCANO.tell(pg, Told("queued", "NotEnoughResources", "insufficient quota", 0), NOW)
    assert VOLCANO.tell(pg, Told("admitted", "Admitted", "placing", 0), NOW)
    assert pg["status"]["phase"] == "Inqueue"
    assert VOLCANO.tell(pg, Told("placed", "Scheduled", "3 of 3 pods bound", 3), NOW)
    assert pg["status"]["phase"] == "Running" and pg["status"]["running"] == 3
    assert (wls.condition(pg, "Scheduled") or {}).get("status") == "True"
    assert (wls.condition(pg, "Unschedulable") or {}).get("status") == "False"
    assert VOLCANO.tell(pg, Told("finished", "Completed", "done", 0), NOW)
    assert pg["status"]["phase"] == "Completed"


def test_native_condition_is_terminal_once_true() -> None:
    pg: dict[str, Any] = {"metadata": {"name": "g", "generation": 1}}
    assert NATIVE.tell(pg, Told("queued", "Pending", "insufficient quota", 0), NOW)
    found = wls.condition(pg, "PodGroupInitiallyScheduled")
    assert found is not None and (found["status"], found["reason"]) == ("False", "Unschedulable")
    assert NATIVE.tell(pg, Told("placed", "Scheduled", "4 of 4 pods bound", 4), NOW)
    assert (wls.condition(pg, "PodGroupInitiallyScheduled") or {}).get("status") == "True"
    assert not NATIVE.tell(pg, Told("queued", "Evicted", "preempted", 0), NOW)


def test_native_basic_group_is_refused_naming_the_field() -> None:
    native = {
        "metadata": {"name": "g", "namespace": "ns", "labels": {"muster.dev/queue-name": "q"}},
        "spec": {"schedulingPolicy": {"basic": {}}},
    }
    with pytest.raises(Refused, match=r"spec.schedulingPolicy.basic: Muster admits and places"):
        workload_spec(NATIVE, native, [pod("a", "1")], [lq("q", "ns", "cq")], {}, None)


def test_a_native_topology_constraint_becomes_a_required_topology_request() -> None:
    native = {
        "metadata": {"name": "g", "namespace": "ns", "labels": {"muster.dev/queue-name": "q"}},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 4}},
            "schedulingConstraints": {"topology": [{"key": "example.com/rack"}]},
        },
    }
    spec = workload_spec(NATIVE, native, [pod("a", "1")], [lq("q", "ns", "cq")], {}, None)
    assert spec["podSets"][0]["topologyRequest"] == {"required": "example.com/rack"}


def native_with(*constraints: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "g", "namespace": "ns", "labels": {"muster.dev/queue-name": "q"}},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 4}},
            "schedulingConstraints": {"topology": list(constraints)},
        },
    }


@pytest.mark.parametrize(
    ("constraints", "reason", "words"),
    [
        (
            [{"key": "example.com/rack"}, {"key": "example.com/block"}],
            "UnsupportedTopology",
            "spec.schedulingConstraints.topology: Muster honours one topology constraint per "
            "group (as kube-scheduler 1.37 does), got 2",
        ),
        (
            [{}],
            "InvalidPodGroup",
            "spec.schedulingConstraints.topology[0].key: must name a node label",
        ),
    ],
)
def test_a_native_constraint_muster_cannot_honour_is_refused_naming_the_field(
    constraints: list[dict[str, Any]], reason: str, words: str
) -> None:
    with pytest.raises(Refused) as refused:
        workload_spec(
            NATIVE, native_with(*constraints), [pod("a", "1")], [lq("q", "ns", "cq")], {}, None
        )
    assert refused.value.reason == reason
    assert str(refused.value) == f"native PodGroup ns/g: {words}"


@pytest.mark.parametrize(
    ("network", "request_"),
    [
        ({"mode": "hard", "highestTierAllowed": 2}, {"requiredTier": 2}),
        # Volcano's CRD defaults: hard, highest tier 1.
        ({}, {"requiredTier": 1}),
        ({"mode": "hard"}, {"requiredTier": 1}),
        # Soft: as close as it can, climbing from the lowest tier; the highest tier is
        # Volcano's for hard mode only.
        ({"mode": "soft", "highestTierAllowed": 3}, {"preferredTier": 1}),
    ],
)
def test_a_volcano_network_topology_becomes_a_request_in_tiers(
    network: dict[str, Any], request_: dict[str, Any]
) -> None:
    pg = volcano("q", networkTopology=network)
    spec = workload_spec(VOLCANO, pg, [pod("a", "1")], [lq("q", "ns", "cq")], {}, None)
    assert spec["podSets"][0]["topologyRequest"] == request_


@pytest.mark.parametrize(
    ("network", "reason", "words"),
    [
        ({"mode": "strict"}, "InvalidPodGroup", "mode: must be hard or soft (got 'strict')"),
        (
            {"mode": "hard", "highestTierAllowed": 0},
            "InvalidPodGroup",
            "highestTierAllowed: must be a tier, at least 1 (got 0)",
        ),
        (
            {"mode": "hard", "highestTierAllowed": 9},
            "UnsupportedTopology",
            "highestTierAllowed: tier 9 is beyond any Muster Topology, which has at most 8 levels",
        ),
    ],
)
def test_a_volcano_network_topology_muster_cannot_honour_is_refused_naming_the_field(
    network: dict[str, Any], reason: str, words: str
) -> None:
    pg = volcano("q", networkTopology=network)
    with pytest.raises(Refused) as refused:
        workload_spec(VOLCANO, pg, [pod("a", "1")], [lq("q", "ns", "cq")], {}, None)
    assert refused.value.reason == reason
    assert str(refused.value) == f"Volcano PodGroup ns/g: spec.networkTopology.{words}"
