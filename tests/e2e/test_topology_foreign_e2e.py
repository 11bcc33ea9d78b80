"""Topology asked for through other projects' PodGroups, end to end with kubectl: kwok nodes
labelled into 2 blocks of 2 racks of 2 nodes (4 cpu each), a Topology (block, rack,
hostname), a flavor naming it.

- A native scheduling.k8s.io/v1beta1 PodGroup with `schedulingConstraints.topology` (the rack
  label, KEP-5732) and a Volcano PodGroup with `networkTopology` hard mode (tier 1: the rack)
  each have every pod bound inside one rack by Muster's scheduler, where bin-packing on a flat
  list of nodes would have spread them over the fullest nodes of three racks.
- What Muster cannot honour is refused with the field and the rule, on the PodGroup: a tier
  beyond the Topology, a tier below 1, a label that is no level of the Topology.

The harness (Volcano's CRD, one controller for the module) is the PodGroup intake's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    apply,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    get,
)
from tests.e2e.fabric import BLOCK, HOST, RACK, Fabric
from tests.e2e.test_podgroup_intake_e2e import (
    NATIVE,
    VOLCANO,
    before_controller,  # noqa: F401 - fixture: Volcano's CRD before the controller
    bound,
    cond,
    group_pod,
    native_group,
    podgroup_workloads,
    volcano_group,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def fabric(cluster: ClusterHandle, namespace: str) -> Iterator[Fabric]:
    """2 blocks x 2 racks x 2 nodes of 4 cpu."""
    yield from Fabric.made(
        cluster,
        namespace,
        blocks=2,
        racks=2,
        per_rack=2,
        node={"cpu": "4", "memory": "64Gi"},
        quota={"cpu": "32"},
    )


def fragment(fabric: Fabric) -> None:
    """One cpu taken, by a pod Muster does not manage, on the first node of three racks:
    their first nodes are then the fullest with room, where flat bin-packing puts pods."""
    for rack in sorted(set(fabric.rack_of.values()))[:3]:
        assert f"{rack}-0" in fabric.rack_of, rack
        fabric.occupy(f"{rack}-0", {"cpu": "1"})


def pod_of(fabric: Fabric, name: str, group: dict[str, Any]) -> dict[str, Any]:
    """A bare pod of `group` asking 2 cpu, naming Muster's scheduler, on the fabric."""
    return group_pod(name, group, fabric.namespace, fabric.pool, "2")


def racks_of(fabric: Fabric, pods: list[str]) -> set[str]:
    """The racks the named pods are bound in."""
    items = get(fabric.cluster, "pods", "-n", fabric.namespace)["items"]
    return fabric.racks(
        p["spec"]["nodeName"]
        for p in items
        if p["metadata"]["name"] in pods and p["spec"].get("nodeName")
    )


def with_network_topology(group: dict[str, Any], **network: Any) -> dict[str, Any]:
    group["spec"]["networkTopology"] = network
    return group


def test_a_native_and_a_volcano_group_each_bind_inside_one_rack(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811
    namespace: str,
    fabric: Fabric,
) -> None:
    fragment(fabric)
    # Native (KEP-5732): 4 pods of 2 cpu in one rack; only the untouched rack holds 8 cpu.
    native = native_group("native", namespace, 4, "team")
    native["spec"]["schedulingConstraints"] = {"topology": [{"key": RACK}]}
    native_pods = [f"native-{i}" for i in range(4)]
    apply(cluster, native, *(pod_of(fabric, p, native) for p in native_pods))
    # The apiserver keeps the constraint (the local cluster runs with the
    # TopologyAwareWorkloadScheduling gate), and Muster takes it.
    kept = get(cluster, NATIVE, "native", "-n", namespace)["spec"]
    assert kept["schedulingConstraints"] == {"topology": [{"key": RACK}]}
    cluster.wait_for(
        "every pod of the native group bound",
        lambda: len(bound(cluster, namespace, native_pods)) == 4,
        timeout=120,
    )
    assert racks_of(fabric, native_pods) == {f"{fabric.pool}-b1-r1"}
    (wl,) = podgroup_workloads(cluster, namespace, "native")
    assert wl["spec"]["podSets"][0]["topologyRequest"] == {"required": RACK}

    # Volcano, hard mode, highest tier 1 (the rack): 3 pods of 2 cpu. Flat bin-packing would
    # put one on each fragmented rack's fuller node (3 cpu free); Muster keeps them in one.
    volcano = with_network_topology(
        volcano_group("hard", namespace, 3, "team"), mode="hard", highestTierAllowed=1
    )
    volcano_pods = [f"hard-{i}" for i in range(3)]
    apply(cluster, volcano, *(pod_of(fabric, p, volcano) for p in volcano_pods))
    cluster.wait_for(
        "every pod of the Volcano group bound",
        lambda: len(bound(cluster, namespace, volcano_pods)) == 3,
        timeout=120,
    )
    assert len(racks_of(fabric, volcano_pods)) == 1, racks_of(fabric, volcano_pods)
    (wl,) = podgroup_workloads(cluster, namespace, "hard")
    assert wl["spec"]["podSets"][0]["topologyRequest"] == {"requiredTier": 1}
    cluster.wait_for(
        "the Volcano group Running",
        lambda: (
            (get(cluster, VOLCANO, "hard", "-n", namespace).get("status") or {}).get("phase")
            == "Running"
        ),
    )


def test_what_muster_cannot_honour_is_refused_on_the_podgroup_with_field_and_rule(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811
    namespace: str,
    fabric: Fabric,
) -> None:
    # A tier beyond the Topology (2 tiers: rack, block): admitted nowhere, told why.
    beyond = with_network_topology(
        volcano_group("beyond", namespace, 1, "team"), mode="hard", highestTierAllowed=3
    )
    # A tier below 1: Volcano's CRD lets it through; Muster refuses the group.
    zero = with_network_topology(
        volcano_group("zero", namespace, 1, "team"), mode="hard", highestTierAllowed=0
    )
    # A label that is no level of the Topology.
    unknown = native_group("unknown", namespace, 1, "team")
    unknown["spec"]["schedulingConstraints"] = {"topology": [{"key": "e2e.muster.dev/zone"}]}
    apply(
        cluster,
        beyond,
        pod_of(fabric, "beyond-0", beyond),
        zero,
        pod_of(fabric, "zero-0", zero),
        unknown,
        pod_of(fabric, "unknown-0", unknown),
    )

    def told(kind: str, name: str, condition: str, words: str) -> None:
        """Wait until the PodGroup's condition says `words`."""

        def says() -> bool:
            found = cond(get(cluster, kind, name, "-n", namespace), condition)
            return words in str(found.get("message"))

        cluster.wait_for(f"{kind} {name} told: {words}", says, timeout=90)

    told(
        VOLCANO,
        "beyond",
        "Unschedulable",
        f"requiredTier 3 is beyond Topology {fabric.topology}, which has 2 tiers "
        f"(tier 1 is {RACK}, tier 2 is {BLOCK})",
    )
    told(
        VOLCANO,
        "zero",
        "Unschedulable",
        f"Volcano PodGroup {namespace}/zero: spec.networkTopology.highestTierAllowed: "
        "must be a tier, at least 1 (got 0)",
    )
    zero = cond(get(cluster, VOLCANO, "zero", "-n", namespace), "Unschedulable")
    assert zero["reason"] == "InvalidPodGroup"
    assert podgroup_workloads(cluster, namespace, "zero") == []
    told(
        NATIVE,
        "unknown",
        "PodGroupInitiallyScheduled",
        f"e2e.muster.dev/zone is not a level of Topology {fabric.topology} "
        f"(levels: {BLOCK}, {RACK}, {HOST})",
    )
    assert bound(cluster, namespace, ["beyond-0", "zero-0", "unknown-0"]) == []
