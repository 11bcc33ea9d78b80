"""Topology as an operator watches it, end to end: a running controller places a 16-pod gang
requiring one rack (kwok nodes in 4 racks of 4, three racks partly taken by others); its
/metrics then count the placement at the rack level, `kubectl muster topology` shows that
rack full of Muster's pods, and a second such gang, which no rack can hold, is counted as a
topology wait at the rack level.
"""

from __future__ import annotations

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    workloads_of,
)
from tests.e2e.fabric import Fabric
from tests.e2e.test_metrics_e2e import scrape, total
from tests.e2e.test_plugin_e2e import kubectl_muster
from tests.e2e.test_topology_e2e import (  # noqa: F401 - fixture
    fabric,
    first_gang_in_the_one_whole_rack,
    rack_job,
)
from tests.e2e.test_topology_plugin_e2e import lines

pytestmark = pytest.mark.e2e


def test_placements_and_waits_by_level_are_counted_and_the_rack_shows_full(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
    fabric: Fabric,  # noqa: F811
) -> None:
    rack = first_gang_in_the_one_whole_rack(cluster, namespace, fabric)
    placed = "muster_topology_placements_total"
    assert total(scrape(controller), placed, level="rack", mode="required") == 1
    assert total(scrape(controller), placed, level="node") == 0

    out = kubectl_muster(cluster, "topology", fabric.topology, "--gpus", "2", "--color", "never")
    rows = lines(out.stdout)
    assert rows[rack].startswith(f"rack {rack} 4 nodes nvidia.com/gpu 0/32 free pods 16")
    assert "(16 Muster's)" in rows[rack] and "room for 0 x 2 nvidia.com/gpu" in rows[rack]
    assert "room for 15 x 2 nvidia.com/gpu" in rows[f"{fabric.pool}-r0"]

    apply(cluster, rack_job("second", namespace, 16, 2))

    def waiting_for_a_rack() -> bool:
        found = workloads_of(cluster, namespace, "second")
        if not found or admitted(found[0]):
            return False
        return "no rack of Topology" in condition(found[0], "QuotaReserved").get("message", "")

    cluster.wait_for("the second gang waits for a rack", waiting_for_a_rack, timeout=90)
    waits = "muster_topology_waiting_workloads"
    cluster.wait_for(
        "the wait counted at the rack level",
        lambda: total(scrape(controller), waits, level="rack") == 1,
        timeout=30,
    )
    assert total(scrape(controller), placed) == 1  # the waiting gang placed nothing
