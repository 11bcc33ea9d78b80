"""A ClusterQueue's namespaceSelector in the controller: a LocalQueue in a namespace it does
not select admits nothing, saying why, until the namespace's labels change (the namespaces
come from the controller's watch of them; tests/e2e/test_roles_e2e.py shows it on a cluster)."""

from __future__ import annotations

from typing import Any

from controllers.state import workloads as wls
from tests.unit.test_controller_admission import Harness


def namespace(name: str, version: int, **labels: str) -> dict[str, Any]:
    meta = {"name": name, "labels": labels, "resourceVersion": str(version)}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def test_a_namespace_the_selector_does_not_admit_gets_nothing_until_it_is_labelled() -> None:
    h = Harness(cpu_quota="4", namespaceSelector={"matchLabels": {"team": "a"}})
    h.caches.namespaces.write_through(namespace("ns", 1, team="b"))
    h.workload("w", 1)
    assert not h.cycle().admit
    h.loop.pending_writer.flush_due()
    why = wls.condition(h.get("w"), "QuotaReserved")
    assert why is not None and why["reason"] == "Inadmissible"
    assert (
        "LocalQueue team is inactive: namespace 'ns' does not match the namespaceSelector of "
        "ClusterQueue 'cq'"
    ) in why["message"]
    h.caches.namespaces.write_through(namespace("ns", 2, team="a"))
    assert [a.workload for a in h.cycle().admit] == ["ns/w"]
