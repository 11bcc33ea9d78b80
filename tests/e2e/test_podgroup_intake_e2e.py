"""PodGroup intake end to end, driven with kubectl: a native scheduling.k8s.io/v1beta1
PodGroup and Volcano's scheduling.volcano.sh/v1beta1 PodGroup whose pods name
`muster-scheduler` are admitted as one Workload under the queue they name and placed whole
or not at all, their status kept in their own API's terms; a group naming an unknown queue
is told why it waits.

Volcano's CRD (crds/third_party/volcano/, generated from volcano.sh/apis v1.13.0) is
installed before the controller starts, which watches the PodGroup APIs the apiserver serves
at start. Every test makes nodes of its own (a fresh `muster-e2e/pool` label, which its pods
select) and deletes them at its end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import REPO, ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    LabelledPool,
    apply,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    get,
    local_queue,
)

pytestmark = pytest.mark.e2e

VOLCANO_CRD = REPO / "crds" / "third_party" / "volcano" / "scheduling.volcano.sh_podgroups.yaml"
NATIVE = "podgroups.v1beta1.scheduling.k8s.io"
VOLCANO = "podgroups.v1beta1.scheduling.volcano.sh"


def volcano_established(cluster: ClusterHandle) -> bool:
    """Read whole: `kubectl wait` and jsonpath filters fail on a CRD with no conditions yet."""
    crd = get(cluster, "crd", "podgroups.scheduling.volcano.sh")
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


@pytest.fixture(scope="module")
def before_controller(cluster: ClusterHandle) -> None:
    """Volcano's PodGroup CRD, served before the module's controller starts."""
    cluster.kubectl("apply", "--server-side", "-f", str(VOLCANO_CRD))
    cluster.wait_for("Volcano's PodGroup CRD established", lambda: volcano_established(cluster))


def group_pod(
    name: str, group: dict[str, Any], namespace: str, pool: str, cpu: str
) -> dict[str, Any]:
    """A bare pod of `group` (native: spec.schedulingGroup; Volcano: the annotation Kubeflow
    Trainer writes) that names Muster's scheduler and selects the nodes of `pool`."""
    spec: dict[str, Any] = {
        "schedulerName": "muster-scheduler",
        "nodeSelector": {"muster-e2e/pool": pool},
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
        ],
    }
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if group["apiVersion"].startswith("scheduling.k8s.io"):
        spec["schedulingGroup"] = {"podGroupName": group["metadata"]["name"]}
    else:
        meta["annotations"] = {"scheduling.k8s.io/group-name": group["metadata"]["name"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class Pool(LabelledPool):
    """A labelled pool with a queue; its pods belong to PodGroups."""

    def pod(self, name: str, group: dict[str, Any], cpu: str = "1") -> dict[str, Any]:
        return group_pod(name, group, self.namespace, self.name, cpu)


@pytest.fixture
def pool(cluster: ClusterHandle, namespace: str) -> Iterator[Pool]:
    made = Pool(cluster, namespace, "pg")
    try:
        yield made
    finally:
        made.delete()


def native_group(name: str, namespace: str, min_count: int, queue: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"muster.dev/queue-name": queue},
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }


def volcano_group(name: str, namespace: str, min_member: int, queue: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"scheduling.volcano.sh/queue-name": queue},
        },
        "spec": {"minMember": min_member, "minResources": {"cpu": str(min_member)}},
    }


def bound(cluster: ClusterHandle, namespace: str, pods: list[str]) -> list[str]:
    items = get(cluster, "pods", "-n", namespace)["items"]
    return [
        p["metadata"]["name"]
        for p in items
        if p["metadata"]["name"] in pods and p["spec"].get("nodeName")
    ]


def cond(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def podgroup_workloads(cluster: ClusterHandle, namespace: str, group: str) -> list[dict[str, Any]]:
    return list(
        get(cluster, "workloads.muster.dev", "-n", namespace, "-l", f"muster.dev/podgroup={group}")[
            "items"
        ]
    )


def events(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    items = get(
        cluster, "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return list(items)


def test_native_podgroup_placed_whole_or_not_at_all(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811 - fixture
    namespace: str,
    pool: Pool,
) -> None:
    pool.add_nodes(3, cpu="1")  # room for 3 pods of 1 cpu, the gang needs 4
    pool.queue("16")
    group = native_group("gang", namespace, 4, "lq")
    pods = [f"gang-{i}" for i in range(4)]
    apply(cluster, group, *(pool.pod(p, group) for p in pods))

    def unschedulable() -> bool:
        pg = get(cluster, NATIVE, "gang", "-n", namespace)
        found = cond(pg, "PodGroupInitiallyScheduled")
        return found.get("status") == "False" and found.get("reason") == "Unschedulable"

    cluster.wait_for("the native PodGroup to be told it waits", unschedulable)
    workloads = podgroup_workloads(cluster, namespace, "gang")
    assert len(workloads) == 1, workloads
    wl = workloads[0]
    assert wl["metadata"]["ownerReferences"][0]["kind"] == "PodGroup"
    assert wl["spec"]["podSets"][0]["count"] == 4
    assert wl["spec"]["queueName"] == "lq"
    # Three would fit; none is bound, because the gang is four.
    assert bound(cluster, namespace, pods) == []
    message = cond(get(cluster, NATIVE, "gang", "-n", namespace), "PodGroupInitiallyScheduled")[
        "message"
    ]
    assert message, "the PodGroup says why it waits"

    pool.add_nodes(1, cpu="1")
    cluster.wait_for(
        "all four pods bound", lambda: len(bound(cluster, namespace, pods)) == 4, timeout=90
    )
    cluster.wait_for(
        "PodGroupInitiallyScheduled True",
        lambda: (
            cond(get(cluster, NATIVE, "gang", "-n", namespace), "PodGroupInitiallyScheduled").get(
                "status"
            )
            == "True"
        ),
    )
    nodes = {
        p["spec"]["nodeName"]
        for p in get(cluster, "pods", "-n", namespace)["items"]
        if p["metadata"]["name"] in pods
    }
    assert nodes <= set(pool.nodes) and len(nodes) == 4

    # Deleting the group and its pods deletes its Workload (owner reference) and frees it.
    cluster.kubectl("delete", NATIVE, "gang", "-n", namespace, "--wait=false")
    cluster.kubectl("delete", "pods", *pods, "-n", namespace, "--wait=false", "--grace-period=0")
    cluster.wait_for(
        "the group's Workload to go", lambda: podgroup_workloads(cluster, namespace, "gang") == []
    )


def test_volcano_podgroups_admitted_under_quota_and_placed_whole(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811 - fixture
    namespace: str,
    pool: Pool,
) -> None:
    pool.add_nodes(2, cpu="4")
    # Quota for one group of three 1-cpu pods. The queue annotation names the ClusterQueue;
    # the namespace's LocalQueue "team" points at it (the mapping rule's second step).
    pool.queue("3", lq="team")
    first = volcano_group("first", namespace, 3, pool.cq)
    first_pods = [f"first-{i}" for i in range(3)]
    apply(cluster, first, *(pool.pod(p, first) for p in first_pods))
    cluster.wait_for(
        "the first group placed whole",
        lambda: len(bound(cluster, namespace, first_pods)) == 3,
        timeout=90,
    )
    cluster.wait_for(
        "the first group Running",
        lambda: (
            get(cluster, VOLCANO, "first", "-n", namespace).get("status", {}).get("phase")
            == "Running"
        ),
    )
    pg = get(cluster, VOLCANO, "first", "-n", namespace)
    assert pg["status"]["running"] == 3
    assert cond(pg, "Scheduled").get("status") == "True"
    (wl,) = podgroup_workloads(cluster, namespace, "first")
    assert wl["spec"]["queueName"] == "team"
    assert wl["status"]["admission"]["clusterQueue"] == pool.cq

    second = volcano_group("second", namespace, 3, pool.cq)
    second_pods = [f"second-{i}" for i in range(3)]
    apply(cluster, second, *(pool.pod(p, second) for p in second_pods))

    seen: list[Any] = []

    def waiting_for_quota() -> bool:
        found = get(cluster, VOLCANO, "second", "-n", namespace)
        workloads = podgroup_workloads(cluster, namespace, "second")
        pending = cond(workloads[0], "QuotaReserved") if workloads else {}
        told = cond(found, "Unschedulable")
        seen[:] = [found.get("status"), pending]
        # The PodGroup tells the admission cycle's own reason, in Volcano's terms.
        return (
            (found.get("status") or {}).get("phase") == "Pending"
            and told.get("status") == "True"
            and pending.get("status") == "False"
            and bool(pending.get("message"))
            and told.get("message") == pending["message"]
        )

    try:
        cluster.wait_for("the second group waiting for quota", waiting_for_quota)
    except AssertionError as error:
        raise AssertionError(f"{error}; PodGroup status and Workload condition: {seen}") from None
    assert pool.cq in seen[1]["message"] and "cpu" in seen[1]["message"], seen
    assert bound(cluster, namespace, second_pods) == []

    # The first group goes (its PodGroup and pods): its quota comes back, the second runs.
    cluster.kubectl("delete", VOLCANO, "first", "-n", namespace, "--wait=false")
    cluster.kubectl(
        "delete", "pods", *first_pods, "-n", namespace, "--wait=false", "--grace-period=0"
    )
    cluster.wait_for(
        "the second group placed whole",
        lambda: len(bound(cluster, namespace, second_pods)) == 3,
        timeout=90,
    )
    cluster.wait_for(
        "the second group Running",
        lambda: (
            get(cluster, VOLCANO, "second", "-n", namespace).get("status", {}).get("phase")
            == "Running"
        ),
    )
    assert podgroup_workloads(cluster, namespace, "first") == []


def test_podgroup_naming_an_unknown_queue_is_told_why(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811 - fixture
    namespace: str,
    pool: Pool,
) -> None:
    pool.add_nodes(1, cpu="4")
    pool.queue("4")
    group = volcano_group("lost", namespace, 1, "no-such-queue")
    apply(cluster, group, pool.pod("lost-0", group))

    def refused() -> bool:
        found = get(cluster, VOLCANO, "lost", "-n", namespace)
        c = cond(found, "Unschedulable")
        return (found.get("status") or {}).get("phase") == "Pending" and c.get(
            "reason"
        ) == "QueueNotFound"

    cluster.wait_for("the PodGroup told its queue is unknown", refused)
    message = cond(get(cluster, VOLCANO, "lost", "-n", namespace), "Unschedulable")["message"]
    assert "no-such-queue" in message and namespace in message, message
    assert "metadata.annotations[scheduling.volcano.sh/queue-name]" in message, message
    cluster.wait_for(
        "a Warning Event on the PodGroup",
        lambda: any(
            e.get("reason") == "QueueNotFound" and e.get("type") == "Warning"
            for e in events(cluster, namespace, "lost")
        ),
    )
    assert podgroup_workloads(cluster, namespace, "lost") == []
    assert bound(cluster, namespace, ["lost-0"]) == []

    # Creating the LocalQueue it names lets it in.
    apply(cluster, local_queue("no-such-queue", namespace, pool.cq))
    cluster.wait_for(
        "the group placed once its queue exists",
        lambda: bound(cluster, namespace, ["lost-0"]) == ["lost-0"],
        timeout=90,
    )
