"""Workloads queued by their pods, end to end with kubectl against the real apiserver and
controller-manager (Deployments' ReplicaSets make the pods): a labelled Deployment scales
up through slices and never runs more replicas than admitted; pods of a kind no integration
knows (a custom resource's) are grouped by their owner, admitted whole and released; a
group with an inconsistent count and a Deployment naming no queue are told why, and nothing
else admitted is disturbed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    LabelledPool,
    admitted,
    apply,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    events_on,
    finished,
    gated,
    get,
    live,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest
from tests.e2e.test_plugin_e2e import kubectl_muster

pytestmark = pytest.mark.e2e

QUEUE = "muster.dev/queue-name"


class Pool(LabelledPool):
    """A labelled pool whose pods ask for one cpu each."""

    def pod_spec(self, cpu: str = "1") -> dict[str, Any]:
        # No nodeSelector of its own: admission writes the flavor's node labels into the pods.
        return {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
            ],
        }


@pytest.fixture
def pool(cluster: ClusterHandle, namespace: str) -> Iterator[Pool]:
    made = Pool(cluster, namespace, "og")
    try:
        yield made
    finally:
        made.delete()


def deployment(name: str, namespace: str, queue: str, replicas: int, pod_spec: Any) -> Any:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE: queue}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def pods(cluster: ClusterHandle, namespace: str, selector: str) -> list[dict[str, Any]]:
    return live(get(cluster, "pods", "-n", namespace, "-l", selector)["items"])


def group_workloads(cluster: ClusterHandle, namespace: str, gid_part: str) -> list[dict[str, Any]]:
    items = get(cluster, "workloads.muster.dev", "-n", namespace)["items"]
    return [
        w
        for w in items
        if gid_part
        in ((w["metadata"].get("annotations") or {}).get("muster.dev/owner-group") or "")
    ]


def bound(cluster: ClusterHandle, namespace: str, selector: str) -> int:
    """How many of the pods `selector` picks are bound to a node."""
    return len([p for p in pods(cluster, namespace, selector) if p["spec"].get("nodeName")])


def wait_bound(
    cluster: ClusterHandle, namespace: str, selector: str, count: int, what: str
) -> None:
    """Wait until exactly `count` of the pods `selector` picks are bound (`what`: in words)."""
    cluster.wait_for(what, lambda: bound(cluster, namespace, selector) == count, timeout=90)


def reasons(cluster: ClusterHandle, namespace: str, kind: str, name: str) -> list[str]:
    return [f"{e['reason']}: {e['message']}" for e in events_on(cluster, namespace, kind, name)]


def test_a_deployment_scales_up_through_slices_and_never_runs_past_its_admission(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811
    namespace: str,
    pool: Pool,
) -> None:
    pool.add_nodes(4)
    pool.queue("2")
    apply(cluster, deployment("web", namespace, "lq", 2, pool.pod_spec()))
    made = get(cluster, "deployment", "web", "-n", namespace)
    # Muster's admission carried the queue label into the template.
    assert made["spec"]["template"]["metadata"]["labels"][QUEUE] == "lq"
    wait_bound(cluster, namespace, "app=web", 2, "two replicas placed")
    for pod in pods(cluster, namespace, "app=web"):
        assert pod["spec"]["schedulerName"] == "muster-scheduler"
        assert pod["spec"]["nodeSelector"] == {"muster-e2e/pool": pool.name}
        assert pod["spec"]["nodeName"] in pool.nodes
    [first] = group_workloads(cluster, namespace, "/Deployment:")
    assert first["spec"]["podSets"][0]["count"] == 2 and admitted(first)
    assert first["metadata"]["ownerReferences"][0]["kind"] == "Deployment"

    # Past the queue's limit: two new pods exist, gated, and a slice for four waits.
    cluster.kubectl("scale", "deployment", "web", "-n", namespace, "--replicas=4")
    cluster.wait_for(
        "four pods, two gated",
        lambda: len([p for p in pods(cluster, namespace, "app=web") if gated(p)]) == 2,
    )

    def slice_waits() -> bool:
        found = group_workloads(cluster, namespace, "/Deployment:")
        return any(
            w["spec"].get("replaces") == first["metadata"]["name"] and not admitted(w)
            for w in found
        )

    cluster.wait_for("a scale-up slice waits for quota", slice_waits)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        ungated = [p for p in pods(cluster, namespace, "app=web") if not gated(p)]
        assert len(ungated) <= 2, [p["metadata"]["name"] for p in ungated]
        time.sleep(0.5)
    cluster.wait_for(
        "the Deployment told why its new replicas wait",
        lambda: any("cpu" in r for r in reasons(cluster, namespace, "Deployment", "web")),
    )

    # Room: the slice is admitted, the old one retired, four replicas run.
    apply(
        cluster,
        cq_manifest(pool.cq, [{"name": pool.name, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}]),
    )
    wait_bound(cluster, namespace, "app=web", 4, "four replicas placed")
    found = group_workloads(cluster, namespace, "/Deployment:")
    old = next(w for w in found if w["metadata"]["name"] == first["metadata"]["name"])
    assert finished(old)
    current = [w for w in found if admitted(w) and not finished(w)]
    assert [w["status"]["admission"]["podSetAssignments"][0]["count"] for w in current] == [4]

    # Scale-down in place: the admission follows the pods as they go.
    cluster.kubectl("scale", "deployment", "web", "-n", namespace, "--replicas=1")

    def shrunk() -> bool:
        active = [
            w
            for w in group_workloads(cluster, namespace, "/Deployment:")
            if admitted(w) and not finished(w)
        ]
        return [w["status"]["admission"]["podSetAssignments"][0]["count"] for w in active] == [1]

    cluster.wait_for("the admission shrunk to one", shrunk, timeout=60)
    cluster.kubectl("delete", "deployment", "web", "-n", namespace)
    cluster.wait_for(
        "its quota released",
        lambda: all(
            finished(w) or w["metadata"].get("deletionTimestamp")
            for w in group_workloads(cluster, namespace, "/Deployment:")
        ),
        timeout=60,
    )


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.e2e.muster.dev"},
    "spec": {
        "group": "e2e.muster.dev",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def test_pods_of_an_unknown_owner_are_grouped_admitted_whole_and_released(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811
    namespace: str,
    pool: Pool,
) -> None:
    apply(cluster, WIDGET_CRD)
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/widgets.e2e.muster.dev", "--timeout=60s"
    )
    pool.add_nodes(2)
    pool.queue("3")
    widget = {
        "apiVersion": "e2e.muster.dev/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": namespace},
    }
    apply(cluster, widget)
    uid = get(cluster, "widgets.e2e.muster.dev", "w", "-n", namespace)["metadata"]["uid"]
    owner = {"apiVersion": "e2e.muster.dev/v1", "kind": "Widget", "name": "w", "uid": uid}
    members = [f"w-{i}" for i in range(3)]
    # What a custom operator does: pods it owns, labelled with the queue by its user.
    apply(
        cluster,
        *(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {QUEUE: "lq", "widget": "w"},
                    "ownerReferences": [{**owner, "controller": True}],
                },
                "spec": pool.pod_spec(),
            }
            for name in members
        ),
    )
    cluster.wait_for(
        "one Workload for the widget's three pods",
        lambda: len(group_workloads(cluster, namespace, "/Widget:")) == 1,
    )
    [wl] = group_workloads(cluster, namespace, "/Widget:")
    assert wl["spec"]["podSets"][0]["count"] == 3
    assert wl["metadata"]["ownerReferences"][0]["uid"] == uid
    # Quota for three, but two nodes of one cpu hold two (what the flavor can hold caps
    # what it lends): the gang waits whole, and says why.
    name = wl["metadata"]["name"]

    def waits_for_nodes() -> bool:
        found = get(cluster, "wl", name, "-n", namespace)
        reserved = next(
            (c for c in found["status"].get("conditions") or [] if c["type"] == "QuotaReserved"),
            {},
        )
        return reserved.get("status") == "False" and "cpu" in reserved.get("message", "")

    cluster.wait_for("the gang waits, saying why", waits_for_nodes)
    assert bound(cluster, namespace, "widget=w") == 0
    assert all(gated(p) for p in pods(cluster, namespace, "widget=w"))
    pool.add_nodes(1)
    wait_bound(cluster, namespace, "widget=w", 3, "all three bound together")
    cluster.kubectl("delete", "pods", "-l", "widget=w", "-n", namespace, "--grace-period=0")
    cluster.wait_for(
        "released once its pods are gone",
        lambda: all(
            finished(w) or w["metadata"].get("deletionTimestamp")
            for w in group_workloads(cluster, namespace, "/Widget:")
        ),
        timeout=60,
    )


def test_bad_groups_are_told_why_and_disturb_nothing_admitted(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811
    namespace: str,
    pool: Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool.add_nodes(2)
    pool.queue("2")
    apply(cluster, deployment("ok", namespace, "lq", 1, pool.pod_spec()))
    wait_bound(cluster, namespace, "app=ok", 1, "a healthy Deployment placed")
    # A group label whose pods disagree on the count.
    apply(
        cluster,
        *(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"bad-{i}",
                    "namespace": namespace,
                    "labels": {QUEUE: "lq", "muster.dev/pod-group": "bad"},
                    "annotations": {"muster.dev/pod-group-total-count": str(2 + i)},
                },
                "spec": pool.pod_spec(),
            }
            for i in range(2)
        ),
    )
    cluster.wait_for(
        "the group told its count is inconsistent",
        lambda: any(
            "InconsistentGroup" in r and "pod-group-total-count" in r
            for r in reasons(cluster, namespace, "Pod", "bad-0")
        ),
    )
    # A Deployment naming a queue that does not exist.
    apply(cluster, deployment("lost", namespace, "nowhere", 1, pool.pod_spec()))
    cluster.wait_for(
        "the Deployment told its queue does not exist",
        lambda: any(
            r.startswith("QueueNotFound") and "nowhere" in r
            for r in reasons(cluster, namespace, "Deployment", "lost")
        ),
    )
    assert all(gated(p) for p in pods(cluster, namespace, "app=lost"))
    assert all(gated(p) for p in pods(cluster, namespace, "muster.dev/pod-group=bad"))
    # Its first pod alone may have been queued before the second disagreed: withdrawn.
    cluster.wait_for(
        "no Workload for the inconsistent group",
        lambda: not group_workloads(cluster, namespace, "PodGroupLabel"),
    )
    # The healthy one is untouched.
    [ok] = group_workloads(cluster, namespace, "/Deployment:" + namespace + "/ok")
    assert admitted(ok) and not finished(ok)
    assert bound(cluster, namespace, "app=ok") == 1
    # `kubectl muster explain` answers for the owner kinds by KIND/NAME, its timeline holding
    # the owner's own Events (the controller-manager's scaling of its ReplicaSet), found by
    # the uid its Workload's owner reference carries. Wide, so that no cell wraps.
    monkeypatch.setenv("COLUMNS", "250")
    told = kubectl_muster(cluster, "explain", "deploy/ok", "-n", namespace, "--color", "never")
    assert f"Deployment {namespace}/ok" in told.stdout and "admitted" in told.stdout
    assert ok["metadata"]["name"] in told.stdout
    assert any(
        "Deployment/ok" in line and "ScalingReplicaSet" in line for line in told.stdout.splitlines()
    ), told.stdout
    lost = kubectl_muster(cluster, "explain", "deploy/lost", "-n", namespace, check=False)
    assert lost.returncode != 0 and "no Workload queued for 'deploy/lost'" in lost.stderr


def statefulset(name: str, namespace: str, replicas: int, pod_spec: Any, *, policy: str) -> Any:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {QUEUE: "lq"},
            "annotations": {"muster.dev/gang": "true"},
        },
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": policy,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def test_a_gang_statefulset_is_placed_all_or_nothing(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811
    namespace: str,
    pool: Pool,
) -> None:
    pool.add_nodes(2)
    pool.queue("3")
    apply(cluster, statefulset("db", namespace, 3, pool.pod_spec(), policy="Parallel"))
    cluster.wait_for(
        "its three pods made, gated",
        lambda: len(pods(cluster, namespace, "app=db")) == 3,
    )
    time.sleep(3)  # two nodes of one cpu hold two of three: nothing is bound
    assert bound(cluster, namespace, "app=db") == 0
    pool.add_nodes(1)
    wait_bound(cluster, namespace, "app=db", 3, "all three bound")
    [wl] = group_workloads(cluster, namespace, "/StatefulSet:")
    assert wl["spec"]["podSets"][0]["count"] == 3
    # OrderedReady would wait for pod 0 to run before making pod 1: refused, saying why.
    apply(cluster, statefulset("slow", namespace, 2, pool.pod_spec(), policy="OrderedReady"))
    cluster.wait_for(
        "the OrderedReady gang told why",
        lambda: any(
            r.startswith("InvalidStatefulSet") and "Parallel" in r
            for r in reasons(cluster, namespace, "StatefulSet", "slow")
        ),
    )
