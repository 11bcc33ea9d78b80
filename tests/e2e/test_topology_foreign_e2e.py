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
    crds,  # noqa: F401 - fixture
    flavor,
    get,
    local_queue,
    unique,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest
from tests.e2e.test_podgroup_intake_e2e import (
    NATIVE,
    VOLCANO,
    bound,
    cond,
    group_pod,
    intake_controller,  # noqa: F401 - fixture
    native_group,
    podgroup_workloads,
    volcano_crd,  # noqa: F401 - fixture
    volcano_group,
)
from tests.e2e.test_topology_e2e import occupy

pytestmark = pytest.mark.e2e

BLOCK = "e2e.muster.dev/block"
RACK = "e2e.muster.dev/rack"
HOST = "kubernetes.io/hostname"
POOL = "muster-e2e/pool"  # the label group_pod's pods select


class Fabric:
    """2 blocks x 2 racks x 2 nodes of 4 cpu, a Topology (block, rack, hostname), a flavor
    naming it and a queue (LocalQueue `team`) over it; the nodes are deleted at the end."""

    def __init__(self, cluster: ClusterHandle, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.pool = unique("tf")
        self.rack_of: dict[str, str] = {}
        for b in range(2):
            for r in range(2):
                rack = f"{self.pool}-b{b}-r{r}"
                labels = {POOL: self.pool, BLOCK: f"{self.pool}-b{b}", RACK: rack}
                for node in cluster.nodes(2, prefix=rack, cpu="4", memory="64Gi", labels=labels):
                    self.rack_of[node] = rack
        self.topology = unique("fabric")
        cq = unique("cq")
        apply(
            cluster,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "Topology",
                "metadata": {"name": self.topology},
                "spec": {
                    "levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]
                },
            },
            flavor(self.pool, self.pool, topologyName=self.topology),
            cq_manifest(cq, [{"name": self.pool, "quota": {"cpu": "32"}, "limit": {"cpu": "32"}}]),
            local_queue("team", namespace, cq),
        )

    def fragment(self) -> None:
        """One cpu taken, by a pod Muster does not manage, on the first node of three racks:
        their first nodes are then the fullest with room, where flat bin-packing puts pods."""
        for rack in sorted(set(self.rack_of.values()))[:3]:
            assert f"{rack}-0" in self.rack_of, rack
            occupy(self.cluster, self.namespace, f"{rack}-0", {"cpu": "1"})

    def pod(self, name: str, group: dict[str, Any]) -> dict[str, Any]:
        """A bare pod of `group` asking 2 cpu, naming Muster's scheduler, on the fabric."""
        return group_pod(name, group, self.namespace, self.pool, "2")

    def racks(self, pods: list[str]) -> set[str]:
        items = get(self.cluster, "pods", "-n", self.namespace)["items"]
        return {
            self.rack_of[p["spec"]["nodeName"]]
            for p in items
            if p["metadata"]["name"] in pods and p["spec"].get("nodeName")
        }

    def delete(self) -> None:
        self.cluster.kubectl("delete", "node", *self.rack_of, "--wait=false", check=False)


@pytest.fixture
def fabric(cluster: ClusterHandle, namespace: str) -> Iterator[Fabric]:
    made = Fabric(cluster, namespace)
    try:
        yield made
    finally:
        made.delete()


def with_network_topology(group: dict[str, Any], **network: Any) -> dict[str, Any]:
    group["spec"]["networkTopology"] = network
    return group


def test_a_native_and_a_volcano_group_each_bind_inside_one_rack(
    cluster: ClusterHandle,
    intake_controller: Controller,  # noqa: F811
    namespace: str,
    fabric: Fabric,
) -> None:
    fabric.fragment()
    # Native (KEP-5732): 4 pods of 2 cpu in one rack; only the untouched rack holds 8 cpu.
    native = native_group("native", namespace, 4, "team")
    native["spec"]["schedulingConstraints"] = {"topology": [{"key": RACK}]}
    native_pods = [f"native-{i}" for i in range(4)]
    apply(cluster, native, *(fabric.pod(p, native) for p in native_pods))
    # The apiserver keeps the constraint (the local cluster runs with the
    # TopologyAwareWorkloadScheduling gate), and Muster takes it.
    kept = get(cluster, NATIVE, "native", "-n", namespace)["spec"]
    assert kept["schedulingConstraints"] == {"topology": [{"key": RACK}]}
    cluster.wait_for(
        "every pod of the native group bound",
        lambda: len(bound(cluster, namespace, native_pods)) == 4,
        timeout=120,
    )
    assert fabric.racks(native_pods) == {f"{fabric.pool}-b1-r1"}
    (wl,) = podgroup_workloads(cluster, namespace, "native")
    assert wl["spec"]["podSets"][0]["topologyRequest"] == {"required": RACK}

    # Volcano, hard mode, highest tier 1 (the rack): 3 pods of 2 cpu. Flat bin-packing would
    # put one on each fragmented rack's fuller node (3 cpu free); Muster keeps them in one.
    volcano = with_network_topology(
        volcano_group("hard", namespace, 3, "team"), mode="hard", highestTierAllowed=1
    )
    volcano_pods = [f"hard-{i}" for i in range(3)]
    apply(cluster, volcano, *(fabric.pod(p, volcano) for p in volcano_pods))
    cluster.wait_for(
        "every pod of the Volcano group bound",
        lambda: len(bound(cluster, namespace, volcano_pods)) == 3,
        timeout=120,
    )
    assert len(fabric.racks(volcano_pods)) == 1, fabric.racks(volcano_pods)
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
    intake_controller: Controller,  # noqa: F811
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
        fabric.pod("beyond-0", beyond),
        zero,
        fabric.pod("zero-0", zero),
        unknown,
        fabric.pod("unknown-0", unknown),
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
