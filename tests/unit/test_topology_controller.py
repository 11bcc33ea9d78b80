"""What Muster's controller does today with topology: it does not place by it yet (its
scheduler loop binds without domains), so it must never admit as if the nodes were flat a
workload that needs a flavor naming a Topology, or that asks for topology: such workloads
wait, and their Workload says why."""

from __future__ import annotations

from typing import Any

from controllers.runtime.resources import RESOURCE_FLAVOR, WORKLOAD
from controllers.state import workloads as wls
from tests.unit.test_controller_admission import Harness


def _pending_message(h: Harness, name: str) -> str:
    h.loop.pending_writer.flush_due()
    reserved = wls.condition(h.get(name), "QuotaReserved")
    assert reserved is not None and reserved["reason"] != "QuotaReserved"
    return str(reserved["message"])


def test_a_flavor_naming_a_topology_keeps_its_workloads_waiting_and_says_why() -> None:
    h = Harness(cpu_quota="8")
    flavor = h.kube.get(RESOURCE_FLAVOR, None, "pool")
    assert flavor is not None
    flavor["spec"]["topologyName"] = "fabric"
    h.put(RESOURCE_FLAVOR, flavor)
    h.workload("w", 2)
    result = h.cycle()
    assert not result.admit
    assert "placement by topology is not available here yet" in _pending_message(h, "w")


def test_a_workload_asking_for_topology_on_a_flat_flavor_waits_naming_the_field() -> None:
    h = Harness(cpu_quota="8")
    body: dict[str, Any] = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {
            "queueName": "team",
            "podSets": [
                {
                    "name": "main",
                    "count": 2,
                    "requests": {"cpu": "1"},
                    "topologyRequest": {"required": "example.com/rack"},
                }
            ],
        },
    }
    h.put(WORKLOAD, body)
    result = h.cycle()
    assert not result.admit
    assert "names none (spec.topologyName)" in _pending_message(h, "w")
