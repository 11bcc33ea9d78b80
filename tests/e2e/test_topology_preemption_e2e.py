"""Preemption by topology domain end to end, driven with kubectl: kwok nodes labelled into
blocks and racks, a Topology, a flavor naming it, a ClusterQueue whose workloads may preempt
lower priorities in it, and every rack full of lower-priority Jobs.

A higher-priority Job requiring one rack (the `muster.dev/podset-required-topology`
annotation) evicts lower-priority Jobs in one rack only, the rack whose victims cost least,
each whole; while they terminate it waits with its room held in that rack (the reason names
it); then all its pods are bound there and every other Job keeps all of its pods.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e import test_topology_e2e as topology_e2e
from tests.e2e.controller_harness import (
    Controller,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    get,
    priority_class,
    unique,
    workloads_of,
)
from tests.e2e.fabric import Fabric
from tests.e2e.test_preemption_e2e import evicted, slow_to_stop, waiting_reason
from tests.e2e.test_scheduler_e2e import GPU, placement, with_priority

pytestmark = pytest.mark.e2e

BLOCKS, RACKS, PER_RACK = 2, 2, 4


@pytest.fixture
def fabric(cluster: ClusterHandle, namespace: str) -> Iterator[Fabric]:
    """2 blocks x 2 racks x 4 nodes of 8 GPUs and a queue that may preempt lower priorities
    in itself. Four nodes of the flavor outside the Topology (no block or rack label) count in
    its capacity, so quota is never what a gang waits for, only room in a rack."""
    yield from Fabric.made(
        cluster,
        namespace,
        blocks=BLOCKS,
        racks=RACKS,
        per_rack=PER_RACK,
        outside=4,
        quota={"cpu": "10000", GPU: "10000"},
        preemption={"withinQueue": "LowerPriority"},
    )


def rack_job(name: str, namespace: str, pods: int, priority: str) -> dict[str, Any]:
    """A Job of `pods` pods x 8 GPUs (a node each) that must keep to one rack."""
    return with_priority(topology_e2e.rack_job(name, namespace, pods, 8), priority)


def test_a_higher_priority_gang_evicts_in_one_rack_only_each_victim_whole(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
    fabric: Fabric,
) -> None:
    low, mid, high = unique("low"), unique("mid"), unique("high")
    apply(cluster, priority_class(low, 10), priority_class(mid, 20), priority_class(high, 1000))
    # Eight 2-node Jobs fill the four racks, two per rack (each keeps to one rack): six of
    # priority 20, then two of priority 10. Created one after another, each bound first.
    names = [f"fill-{i}" for i in range(8)]
    for i, name in enumerate(names):
        job = rack_job(name, namespace, 2, low if i >= 6 else mid)
        apply(cluster, slow_to_stop(job, "15s"))
        cluster.wait_for(
            f"{name} bound",
            lambda name=name: sum(placement(cluster, namespace, name).values()) == 2,
            90,
            0.5,
        )
    before = {name: placement(cluster, namespace, name) for name in names}
    assert all(len(fabric.racks(nodes)) == 1 for nodes in before.values())
    cheapest = fabric.racks(before["fill-6"]) | fabric.racks(before["fill-7"])
    assert len(cheapest) == 1, before  # the two low ones filled the last rack together
    (rack,) = cheapest

    # A 4-node gang requiring one rack: no rack has a free node. The cheapest rack to free
    # is the one of the two priority-10 Jobs.
    apply(cluster, rack_job("urgent", namespace, 4, high))

    def held() -> str:
        reason = waiting_reason(cluster, namespace, "urgent")
        return reason if "its room is held" in reason else ""

    cluster.wait_for("the gang waits with its room held", held, 60, 0.5)
    assert f"its room is held in rack {rack} of Topology {fabric.topology}" in held()

    cluster.wait_for(
        "every pod of the gang bound",
        lambda: sum(placement(cluster, namespace, "urgent").values()) == 4,
        120,
        1.0,
    )
    assert fabric.racks(placement(cluster, namespace, "urgent")) == {rack}
    # Only the two Jobs of that rack were evicted, whole: no pod left, the Job suspended.
    # Every other Job keeps both its pods where they were.
    for name in names:
        if name in ("fill-6", "fill-7"):
            assert evicted(cluster, namespace, name)
            assert get(cluster, "job", name, "-n", namespace)["spec"]["suspend"] is True
            assert not placement(cluster, namespace, name)
        else:
            assert not evicted(cluster, namespace, name)
            assert placement(cluster, namespace, name) == before[name]
    messages = [
        str(condition(w, "Evicted").get("message", ""))
        for w in workloads_of(cluster, namespace, "fill-6")
    ]
    assert any(
        f"to free nodes {rack}-" in m and f"in rack {rack} of Topology {fabric.topology}" in m
        for m in messages
    ), messages
