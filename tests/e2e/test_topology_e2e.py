"""Topology end to end, driven with kubectl: kwok nodes labelled into racks, a Topology, a
flavor naming it (`fabric.py`), and Jobs asking (a pod-template annotation) to keep every
pod in one rack.

- A 16-pod gang requiring one rack has every pod bound in one rack, where bin-packing on a
  flat list of nodes would have split it over the racks others had partly filled.
- With every rack fragmented, the next such gang waits with the reason and none of its pods
  is bound.
- A request Muster cannot honour is refused with a clear error: a level the Topology lacks
  keeps the Workload waiting, naming the level and the Topology's levels; a slice size that
  does not divide the Job's pods is an InvalidJob Event naming the annotation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    events_on,
    pods_of,
    workloads_of,
)
from tests.e2e.fabric import HOST, RACK, Fabric
from tests.e2e.test_scheduler_e2e import gpu_job, placement

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
RACKS, PER_RACK = 4, 4


@pytest.fixture
def fabric(cluster: ClusterHandle, namespace: str) -> Iterator[Fabric]:
    """4 racks of 4 nodes of 8 GPUs."""
    quota = {"cpu": str(32 * RACKS * PER_RACK), GPU: str(8 * RACKS * PER_RACK)}
    yield from Fabric.made(cluster, namespace, racks=RACKS, per_rack=PER_RACK, quota=quota)


def rack_job(name: str, namespace: str, pods: int, gpu: int, **annotations: str) -> dict[str, Any]:
    job = gpu_job(name, namespace, pods, gpu=gpu)
    job["spec"]["template"]["metadata"] = {
        "annotations": {"muster.dev/podset-required-topology": RACK, **annotations}
    }
    return job


def first_gang_in_the_one_whole_rack(cluster: ClusterHandle, namespace: str, fabric: Fabric) -> str:
    """A GPU taken on a node of each of the first three racks, then Job `first` (16 pods x 2
    GPUs, a whole rack's 32, required in one rack) bound: only in the fourth rack, which is
    returned, where flat bin-packing would fill the three fuller racks' free GPUs first."""
    for r in range(3):
        fabric.occupy(f"{fabric.pool}-r{r}-0", {GPU: "1"})
    apply(cluster, rack_job("first", namespace, 16, 2))
    cluster.wait_for(
        "every pod of the first gang bound",
        lambda: sum(placement(cluster, namespace, "first").values()) == 16,
        timeout=120,
    )
    rack = f"{fabric.pool}-r3"
    assert fabric.racks(placement(cluster, namespace, "first")) == {rack}
    return rack


def test_a_gang_requiring_one_rack_binds_there_and_the_next_waits_when_all_are_fragmented(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
    fabric: Fabric,
) -> None:
    first_gang_in_the_one_whole_rack(cluster, namespace, fabric)

    # Now every rack has a GPU or more taken: no rack can hold another such gang.
    apply(cluster, rack_job("second", namespace, 16, 2))

    def waiting_says_why() -> bool:
        found = workloads_of(cluster, namespace, "second")
        if not found or admitted(found[0]):
            return False
        message = condition(found[0], "QuotaReserved").get("message", "")
        return f"no rack of Topology {fabric.topology} can hold" in message

    cluster.wait_for("the second gang waits saying why", waiting_says_why, timeout=90)
    [wl] = workloads_of(cluster, namespace, "second")
    assert not admitted(wl)
    assert not [p for p in pods_of(cluster, namespace, "second") if p["spec"].get("nodeName")]


def test_requests_muster_cannot_honour_are_refused_with_the_field_and_rule(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
    fabric: Fabric,
) -> None:
    unknown = rack_job("unknown", namespace, 2, 1)
    annotations = unknown["spec"]["template"]["metadata"]["annotations"]
    annotations["muster.dev/podset-required-topology"] = "e2e.muster.dev/block"
    apply(cluster, unknown)

    def refused() -> str:
        found = workloads_of(cluster, namespace, "unknown")
        return condition(found[0], "QuotaReserved").get("message", "") if found else ""

    cluster.wait_for(
        "the unknown level refused", lambda: "is not a level of Topology" in refused(), timeout=60
    )
    message = refused()
    assert f"e2e.muster.dev/block is not a level of Topology {fabric.topology}" in message
    assert f"levels: {RACK}, {HOST}" in message
    assert not [p for p in pods_of(cluster, namespace, "unknown") if p["spec"].get("nodeName")]

    apply(
        cluster,
        rack_job(
            "sliced",
            namespace,
            8,
            1,
            **{
                "muster.dev/podset-slice-required-topology": HOST,
                "muster.dev/podset-slice-size": "3",
            },
        ),
    )

    def told() -> list[str]:
        return [
            str(e.get("message"))
            for e in events_on(cluster, namespace, "Job", "sliced")
            if e.get("reason") == "InvalidJob"
        ]

    cluster.wait_for("the bad slice size told on the Job", told, timeout=60)
    [text, *_] = told()
    assert "3 does not divide the Job's 8 pods" in text
    assert "muster.dev/podset-slice-size" in text
    assert not workloads_of(cluster, namespace, "sliced")
    assert not pods_of(cluster, namespace, "sliced")


def test_an_elastic_job_requiring_a_rack_grows_inside_its_rack(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
    fabric: Fabric,
) -> None:
    grow = rack_job("grow", namespace, 2, 8)
    grow["metadata"]["annotations"] = {"muster.dev/elastic-job": "true"}
    del grow["spec"]["completions"]  # grows with its parallelism
    apply(cluster, grow)
    cluster.wait_for(
        "the first slice bound",
        lambda: sum(placement(cluster, namespace, "grow").values()) == 2,
        timeout=90,
    )
    [rack] = fabric.racks(placement(cluster, namespace, "grow"))
    # Every other rack is left room for one whole-node pod, its own rack for two: the
    # fullest rack that fits the extra pod is any other one, where bin-packing alone would
    # put it.
    for node, its_rack in fabric.rack_of.items():
        if its_rack != rack and not node.endswith("-3"):
            fabric.occupy(node, {GPU: "8"})
    cluster.kubectl("patch", "job", "grow", "-n", namespace, "-p", '{"spec":{"parallelism":3}}')
    cluster.wait_for(
        "the scale-up bound",
        lambda: sum(placement(cluster, namespace, "grow").values()) == 3,
        timeout=90,
    )
    assert fabric.racks(placement(cluster, namespace, "grow")) == {rack}
