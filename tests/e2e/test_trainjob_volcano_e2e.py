"""A Kubeflow TrainJob configured for Volcano runs on Muster unchanged (KEP-2437's shape):
its runtime asks for Volcano's podGroupPolicy, the real Trainer controller (v2.2.0, built
from the Go module proxy) makes a PodGroup with minMember and the queue from the runtime's
`scheduling.volcano.sh/queue-name` annotation, and Muster admits that PodGroup as one
Workload and places its pods whole. Deleting the TrainJob deletes the PodGroup (Trainer
owns it) and with it the Workload.

Volcano's CRD is installed before the Trainer starts: its Volcano plugin watches PodGroups
only if the CRD is served when it starts.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import REPO, ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    apply,
    crds,  # noqa: F401 - fixture
    flavor,
    get,
    local_queue,
    unique,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

PEERS = "jobset,trainer"
VOLCANO_CRD = REPO / "crds" / "third_party" / "volcano" / "scheduling.volcano.sh_podgroups.yaml"
VOLCANO = "podgroups.v1beta1.scheduling.volcano.sh"


def volcano_established(cluster: ClusterHandle) -> bool:
    """Read whole: `kubectl wait` and jsonpath filters fail on a CRD with no conditions yet."""
    crd = get(cluster, "crd", "podgroups.scheduling.volcano.sh")
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


@pytest.fixture(scope="module")
def stack(
    cluster: ClusterHandle,
    crds: None,  # noqa: F811 - fixture
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Controller]:
    """Volcano's CRD, then JobSet and the Trainer, then Muster's controller."""
    cluster.kubectl("apply", "--server-side", "-f", str(VOLCANO_CRD))
    cluster.wait_for("Volcano's PodGroup CRD established", lambda: volcano_established(cluster))
    request.getfixturevalue("peers")
    ctl = Controller(cluster, tmp_path_factory.mktemp("controller"), "ctl-" + uuid.uuid4().hex[:6])
    ctl.start()
    try:
        ctl.wait_leading()
        yield ctl
    finally:
        ctl.stop()


def runtime(name: str, namespace: str, pool: str, queue: str, nodes: int) -> dict[str, Any]:
    """A TrainingRuntime asking for Volcano's gang scheduling, its pods on Muster's scheduler."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "mlPolicy": {"numNodes": nodes},
            "podGroupPolicy": {"volcano": {}},
            "template": {
                "metadata": {"annotations": {"scheduling.volcano.sh/queue-name": queue}},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {
                                    "labels": {
                                        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
                                    }
                                },
                                "spec": {
                                    "template": {
                                        "metadata": {
                                            # kwok: the pods run this long, then succeed.
                                            "annotations": {
                                                "pod-complete.stage.kwok.x-k8s.io/delay": "600s"
                                            }
                                        },
                                        "spec": {
                                            "schedulerName": "muster-scheduler",
                                            "nodeSelector": {"muster-e2e/pool": pool},
                                            "containers": [
                                                {
                                                    "name": "node",
                                                    "image": "busybox",
                                                    "resources": {"requests": {"cpu": "1"}},
                                                }
                                            ],
                                        },
                                    }
                                },
                            },
                        }
                    ]
                },
            },
        },
    }


def train_job(name: str, namespace: str, runtime_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtimeRef": {
                "name": runtime_name,
                "kind": "TrainingRuntime",
                "apiGroup": "trainer.kubeflow.org",
            }
        },
    }


def group_pods(cluster: ClusterHandle, namespace: str, group: str) -> list[dict[str, Any]]:
    return [
        p
        for p in get(cluster, "pods", "-n", namespace)["items"]
        if (p["metadata"].get("annotations") or {}).get("scheduling.k8s.io/group-name") == group
    ]


def exists(cluster: ClusterHandle, *args: str) -> bool:
    return cluster.kubectl("get", *args, check=False).returncode == 0


def test_trainjob_with_volcano_podgroup_policy_is_admitted_and_gang_placed(
    cluster: ClusterHandle, stack: Controller, namespace: str
) -> None:
    pool = unique("tj")
    # Room for two 1-cpu pods at first; the gang is three.
    nodes = cluster.nodes(1, cpu="2", memory="16Gi", gpu=0, labels={"muster-e2e/pool": pool})
    try:
        cq = unique("cq")
        apply(
            cluster,
            flavor(pool, pool),
            cq_manifest(cq, [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}]),
            # The runtime names the ClusterQueue, as a Volcano queue; this LocalQueue is the
            # namespace's door to it (docs/podgroups.md, the mapping rule).
            local_queue("team", namespace, cq),
            runtime("volcano-gang", namespace, pool, cq, nodes=3),
            train_job("train", namespace, "volcano-gang"),
        )

        cluster.wait_for(
            "Trainer's PodGroup", lambda: exists(cluster, VOLCANO, "train", "-n", namespace)
        )
        pg = get(cluster, VOLCANO, "train", "-n", namespace)
        assert pg["spec"]["minMember"] == 3
        assert pg["spec"]["queue"] == cq
        assert pg["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"

        def waiting() -> bool:
            found = get(cluster, VOLCANO, "train", "-n", namespace)
            told = [
                c
                for c in (found.get("status") or {}).get("conditions") or []
                if c.get("type") == "Unschedulable" and c.get("status") == "True"
            ]
            return len(group_pods(cluster, namespace, "train")) == 3 and bool(told)

        cluster.wait_for("the gang of three told it waits for room", waiting, timeout=120)
        assert [
            p for p in group_pods(cluster, namespace, "train") if p["spec"].get("nodeName")
        ] == []
        assert (get(cluster, VOLCANO, "train", "-n", namespace).get("status") or {}).get(
            "phase"
        ) == "Pending"

        nodes += cluster.nodes(1, cpu="2", memory="16Gi", gpu=0, labels={"muster-e2e/pool": pool})

        def placed() -> bool:
            pods = group_pods(cluster, namespace, "train")
            return len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods)

        cluster.wait_for("the TrainJob's three pods bound", placed, timeout=120)
        assert {p["spec"]["nodeName"] for p in group_pods(cluster, namespace, "train")} <= set(
            nodes
        )
        cluster.wait_for(
            "the PodGroup Running",
            lambda: (
                (get(cluster, VOLCANO, "train", "-n", namespace).get("status") or {}).get("phase")
                == "Running"
            ),
        )
        (wl,) = get(
            cluster, "workloads.muster.dev", "-n", namespace, "-l", "muster.dev/podgroup=train"
        )["items"]
        assert wl["status"]["admission"]["clusterQueue"] == cq
        assert wl["spec"]["podSets"][0]["count"] == 3
        assert wl["metadata"]["ownerReferences"][0]["kind"] == "PodGroup"

        cluster.kubectl("delete", "trainjob", "train", "-n", namespace, "--wait=false")
        cluster.wait_for(
            "the PodGroup deleted with the TrainJob",
            lambda: not exists(cluster, VOLCANO, "train", "-n", namespace),
            timeout=90,
        )
        cluster.wait_for(
            "its Workload gone once its pods are",
            lambda: (
                get(
                    cluster,
                    "workloads.muster.dev",
                    "-n",
                    namespace,
                    "-l",
                    "muster.dev/podgroup=train",
                )["items"]
                == []
            ),
            timeout=120,
        )
    finally:
        cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)
