"""Topology requests in tiers (Volcano's `networkTopology`): tier 1 is the narrowest level of
the flavor's Topology that is not the hostname, tier 2 the one above. One rule, in the core,
for the controller and the simulator alike.

The fabric of `test_topology`: 2 blocks x 3 racks x 4 nodes of 8 GPUs, so a rack holds 4 pods
of 8 GPUs and a block 12.
"""

from __future__ import annotations

from typing import Any

import pytest

from quota.api import ManifestError, parse_manifest
from quota.api import Workload as WorkloadModel
from quota.model import convert
from quota.model.snapshot import PodSetTopology
from quota.placement.topology import DomainRequest, domain_request
from tests.unit.test_topology import BLOCK, LEVELS, RACK, topo_cycle, workload_doc

TOPOLOGIES = {"fabric": LEVELS}


def test_a_pod_set_may_ask_for_a_tier_instead_of_a_label() -> None:
    wl = parse_manifest(workload_doc(8, {"requiredTier": 2}), 0)
    assert isinstance(wl, WorkloadModel)
    (ps,) = convert.pod_sets(wl)
    assert ps.topology == PodSetTopology("Required", tier=2)
    wl = parse_manifest(workload_doc(8, {"preferredTier": 1}), 0)
    assert isinstance(wl, WorkloadModel)
    assert convert.pod_sets(wl)[0].topology == PodSetTopology("Preferred", tier=1)


@pytest.mark.parametrize(
    ("request_", "rule"),
    [
        ({"required": RACK, "requiredTier": 1}, "at most one of required, preferred, requiredTier"),
        ({"requiredTier": 1, "preferredTier": 1}, "at most one of required, preferred"),
        ({"requiredTier": 0}, "greater than or equal to 1"),
        ({"preferredTier": 9}, "less than or equal to 8"),
    ],
)
def test_a_tier_that_makes_no_sense_is_refused_naming_the_field(
    request_: dict[str, Any], rule: str
) -> None:
    with pytest.raises(ManifestError, match="Workload ns/w") as error:
        parse_manifest(workload_doc(8, request_), 0)
    assert rule in str(error.value)
    assert "topologyRequest" in str(error.value)


@pytest.mark.parametrize(
    ("levels", "tier", "level"),
    [
        (LEVELS, 1, RACK),  # the hostname is no tier
        (LEVELS, 2, BLOCK),
        ((BLOCK, RACK), 1, RACK),
        ((BLOCK, RACK), 2, BLOCK),
    ],
)
def test_tiers_count_up_from_the_narrowest_level_that_is_not_the_host(
    levels: tuple[str, ...], tier: int, level: str
) -> None:
    found = domain_request("fabric", levels, "Required", None, None, None, tier=tier)
    assert isinstance(found, DomainRequest)
    assert found.levels[found.level or 0] == level
    assert found.required


def test_a_tier_beyond_the_topology_says_what_its_tiers_are() -> None:
    found = domain_request("fabric", LEVELS, "Required", None, None, None, tier=3)
    assert found == (
        "requiredTier 3 is beyond Topology fabric, which has 2 tiers "
        f"(tier 1 is {RACK}, tier 2 is {BLOCK})"
    )
    only_hosts = domain_request(
        "hosts", ("kubernetes.io/hostname",), "Preferred", None, None, None, tier=1
    )
    assert only_hosts == (
        "preferredTier 1 is beyond Topology hosts, which has 0 tiers (its only level is the host)"
    )


def test_a_slice_wider_than_the_tier_is_refused_naming_both() -> None:
    found = domain_request("fabric", LEVELS, "Required", None, 2, BLOCK, tier=1)
    assert found == f"slice level {BLOCK} is wider than the level {RACK} asked for"


def racks(admitted: Any) -> set[str]:
    ((assignment,),) = [a.assignments for a in admitted]
    return {node.rsplit("-", 1)[0] for node, _ in assignment.nodes}


def test_required_tier_one_keeps_the_gang_in_one_rack() -> None:
    admit, _ = topo_cycle(PodSetTopology("Required", tier=1), topologies=TOPOLOGIES, count=4)
    assert len(racks(admit)) == 1


def test_required_tier_two_keeps_a_gang_too_big_for_a_rack_in_one_block() -> None:
    admit, _ = topo_cycle(PodSetTopology("Required", tier=2), topologies=TOPOLOGIES, count=8)
    blocks = {rack.split("-")[0] for rack in racks(admit)}
    assert len(blocks) == 1
    # As few racks as possible inside it: 8 pods of 4 per rack take two.
    assert len(racks(admit)) == 2


def test_required_tier_one_never_fits_a_gang_larger_than_any_rack() -> None:
    admit, pending = topo_cycle(PodSetTopology("Required", tier=1), topologies=TOPOLOGIES, count=8)
    assert not admit
    assert "no rack of Topology fabric can ever hold" in pending[0].reason


def test_preferred_tier_one_climbs_to_a_block_only_when_no_rack_fits() -> None:
    admit, _ = topo_cycle(PodSetTopology("Preferred", tier=1), topologies=TOPOLOGIES, count=4)
    assert len(racks(admit)) == 1
    admit, _ = topo_cycle(PodSetTopology("Preferred", tier=1), topologies=TOPOLOGIES, count=6)
    assert len({rack.split("-")[0] for rack in racks(admit)}) == 1


def test_a_tier_beyond_the_flavors_topology_waits_with_the_reason() -> None:
    admit, pending = topo_cycle(PodSetTopology("Required", tier=3), topologies=TOPOLOGIES)
    assert not admit
    assert pending[0].reason.endswith(
        "its topologyRequest cannot be honoured on flavor h100: requiredTier 3 is beyond "
        f"Topology fabric, which has 2 tiers (tier 1 is {RACK}, tier 2 is {BLOCK})"
    )
