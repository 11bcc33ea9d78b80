"""Topology in Muster's controller, against an in-memory apiserver: the admission view reads
the Topologies and plans a gang inside one domain; the scheduler loop binds inside the
domain its pod set asks for, keeps a gang whose pods are partly bound in their domain, and
binds nothing of a group whose request cannot be honoured. A builder that does not read
Topologies never admits as if the nodes were flat."""

from __future__ import annotations

from typing import Any

from controllers.admission.loop import AdmissionLoop
from controllers.runtime.resources import NODE, POD, RESOURCE_FLAVOR, TOPOLOGY, WORKLOAD
from controllers.state import workloads as wls
from tests.unit import test_controller_admission as admission
from tests.unit import test_scheduler as scheduler

RACK = "example.com/rack"
HOST = "kubernetes.io/hostname"
GPU = scheduler.GPU


def _pending_message(h: admission.Harness, name: str) -> str:
    h.loop.pending_writer.flush_due()
    reserved = wls.condition(h.get(name), "QuotaReserved")
    assert reserved is not None and reserved["reason"] != "QuotaReserved"
    return str(reserved["message"])


def _topology(name: str = "fabric") -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"levels": [{"nodeLabel": RACK}, {"nodeLabel": HOST}]},
    }


def _rack_nodes(put: Any, racks: int, per_rack: int, labels: dict[str, str]) -> None:
    for r in range(racks):
        for i in range(per_rack):
            name = f"r{r}-n{i}"
            put(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "resourceVersion": "1",
                        "labels": {**labels, RACK: f"r{r}", HOST: name},
                    },
                    "status": {
                        "allocatable": {"cpu": "8", "pods": "110", GPU: "8"},
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }
            )


def _required_workload(
    h: admission.Harness, name: str, pods: int, request: dict[str, Any], cpu: str = "1"
) -> None:
    h.put(
        WORKLOAD,
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {
                "queueName": "team",
                "podSets": [
                    {
                        "name": "main",
                        "count": pods,
                        "requests": {"cpu": cpu},
                        "topologyRequest": request,
                    }
                ],
            },
        },
    )


def _flavor_naming(h: admission.Harness, topology: str) -> None:
    flavor = h.kube.get(RESOURCE_FLAVOR, None, "pool")
    assert flavor is not None
    flavor["spec"]["topologyName"] = topology
    h.put(RESOURCE_FLAVOR, flavor)


# ------------------------------------------------------------------ admission


def test_the_admission_plans_a_required_gang_inside_one_rack() -> None:
    h = admission.Harness(cpu_quota="64")
    h.loop = AdmissionLoop(h.ctx)  # places on nodes, as the controller does
    _flavor_naming(h, "fabric")
    h.caches.topologies.write_through(h.kube.put(TOPOLOGY, _topology()))
    _rack_nodes(lambda n: h.caches.nodes.write_through(h.kube.put(NODE, n)), 2, 4, {"pool": "a"})
    # Three of r0's nodes have 7 of their 8 CPUs taken: bin-packing three pods of 4 CPUs
    # on the fullest nodes first would put two on r0-n0 and the third in r1.
    for i in (1, 2, 3):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"other-{i}", "namespace": "ns", "resourceVersion": "1"},
            "spec": {
                "nodeName": f"r0-n{i}",
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "7"}}}],
            },
            "status": {"phase": "Running"},
        }
        h.caches.node_pods.write_through(h.kube.put(POD, pod))
    _required_workload(h, "w", 3, {"required": RACK}, cpu="4")
    result = h.cycle()
    assert [a.workload for a in result.admit] == ["ns/w"]
    nodes = h.get("w")["status"]["admission"]["podSetAssignments"][0]["nodes"]
    assert {n["name"].split("-")[0] for n in nodes} == {"r1"}
    assert sum(n["count"] for n in nodes) == 3


def test_a_flavor_naming_a_missing_topology_keeps_its_workloads_waiting_and_says_why() -> None:
    h = admission.Harness(cpu_quota="8")
    h.loop = AdmissionLoop(h.ctx)
    _flavor_naming(h, "fabric")
    h.workload("w", 2)
    assert not h.cycle().admit
    assert "flavor pool names Topology fabric, which does not exist" in _pending_message(h, "w")
    # Created later: the next cycle admits.
    h.caches.topologies.write_through(h.kube.put(TOPOLOGY, _topology()))
    assert [a.workload for a in h.cycle().admit] == ["ns/w"]


def test_an_unknown_level_is_refused_naming_the_field_and_the_levels() -> None:
    h = admission.Harness(cpu_quota="8")
    h.loop = AdmissionLoop(h.ctx)
    _flavor_naming(h, "fabric")
    h.caches.topologies.write_through(h.kube.put(TOPOLOGY, _topology()))
    _required_workload(h, "w", 2, {"required": "example.com/block"})
    assert not h.cycle().admit
    message = _pending_message(h, "w")
    assert "example.com/block is not a level of Topology fabric" in message
    assert f"levels: {RACK}, {HOST}" in message


def test_a_builder_that_does_not_read_topologies_keeps_such_workloads_waiting() -> None:
    h = admission.Harness(cpu_quota="8")  # use_node_capacity=False: quota alone
    _flavor_naming(h, "fabric")
    h.caches.topologies.write_through(h.kube.put(TOPOLOGY, _topology()))
    h.workload("w", 2)
    assert not h.cycle().admit
    assert "this admission does not read Topologies" in _pending_message(h, "w")


def test_a_workload_asking_for_topology_on_a_flat_flavor_waits_naming_the_field() -> None:
    h = admission.Harness(cpu_quota="8")
    h.loop = AdmissionLoop(h.ctx)
    _required_workload(h, "w", 2, {"required": RACK})
    assert not h.cycle().admit
    assert "names none (spec.topologyName)" in _pending_message(h, "w")


# -------------------------------------------------------------- scheduler loop


def _scheduler(racks: int = 2, per_rack: int = 4, topology: bool = True) -> scheduler.Harness:
    h = scheduler.Harness()
    h.caches.flavors.write_through(
        h.kube.put(
            RESOURCE_FLAVOR,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "ResourceFlavor",
                "metadata": {"name": "h100", "resourceVersion": "1"},
                "spec": {"topologyName": "fabric"},
            },
        )
    )
    if topology:
        h.caches.topologies.write_through(h.kube.put(TOPOLOGY, _topology()))
    _rack_nodes(lambda n: h.put(NODE, n), racks, per_rack, {})
    return h


def _ask(h: scheduler.Harness, job: str, request: dict[str, Any]) -> None:
    """The admitted Workload of `job` asks for `request` on flavor h100."""
    wl = h.kube.get(WORKLOAD, "ns", f"job-{job}")
    assert wl is not None
    wl["spec"]["podSets"][0]["topologyRequest"] = request
    wl["status"]["admission"]["podSetAssignments"][0]["flavors"] = {GPU: "h100", "cpu": "h100"}
    h.put(WORKLOAD, wl)


def _racks(h: scheduler.Harness, job: str) -> set[str]:
    return {node.split("-")[0] for node in h.placement(job)}


def test_the_loop_binds_a_required_gang_inside_one_rack_where_flat_packing_would_not() -> None:
    h = _scheduler()
    # r0's first node is taken: r0 has three free nodes, r1 four. Flat bin-packing of four
    # whole-node pods would take r0's three and one of r1.
    h.pod("foreign", gpu=8, node="r0-n0", scheduler="default-scheduler")
    h.job("gang", 4, gpu=8, pods=0)
    _ask(h, "gang", {"required": RACK})
    uid = "uid-gang"
    for i in range(4):
        h.pod(f"gang-{i}", uid, gpu=8)
    h.run()
    assert _racks(h, "gang") == {"r1"} and sum(h.placement("gang").values()) == 4


def test_a_stale_plan_is_replaced_by_a_whole_other_rack_never_split() -> None:
    h = _scheduler()
    h.job("gang", 4, gpu=8, pods=0, plan={f"r0-n{i}": 1 for i in range(4)})
    _ask(h, "gang", {"required": RACK})
    # Since the admission, someone took a node of the planned rack.
    h.pod("foreign", gpu=8, node="r0-n2", scheduler="default-scheduler")
    for i in range(4):
        h.pod(f"gang-{i}", "uid-gang", gpu=8)
    h.run()
    assert _racks(h, "gang") == {"r1"}


def test_a_gang_with_pods_bound_in_a_rack_waits_for_room_there_rather_than_spread() -> None:
    h = _scheduler()
    h.job("gang", 4, gpu=8, pods=0)
    _ask(h, "gang", {"required": RACK})
    h.loop._scheduled.add(("wl-gang", scheduler.RESERVED))  # placed whole once already
    h.pod("gang-0", "uid-gang", gpu=8, node="r0-n0")
    h.pod("gang-1", "uid-gang", gpu=8, node="r0-n1")
    h.pod("foreign-2", gpu=8, node="r0-n2", scheduler="default-scheduler")
    h.pod("foreign-3", gpu=8, node="r0-n3", scheduler="default-scheduler")
    h.pod("gang-2", "uid-gang", gpu=8)  # a replacement pod: r0 is full, r1 empty
    h.run()
    assert h.placement("gang") == {"r0-n0": 1, "r0-n1": 1}
    [(_, _, reason, message), *_] = h.events.seen
    assert reason == "FailedPlacement" and "have room for 0 (r0)" in message
    h.kube.delete(POD, "ns", "foreign-3")
    h.caches.node_pods.forget("ns/foreign-3")
    h.run()
    assert h.placement("gang") == {"r0-n0": 1, "r0-n1": 1, "r0-n3": 1}


def test_a_group_whose_topology_is_gone_binds_nothing_and_says_why() -> None:
    h = _scheduler(topology=False)
    h.job("gang", 2, gpu=8)
    _ask(h, "gang", {"required": RACK})
    h.run()
    assert h.placement("gang") == {}
    message = scheduler.condition(h.pod_group("gang"))["message"]
    assert "flavor h100 names Topology fabric, which does not exist" in message
    # Created again: the next pass reads it (the group's requests are worked out anew).
    h.caches.topologies.write_through(h.kube.put(TOPOLOGY, _topology()))
    h.run()
    assert _racks(h, "gang") and len(_racks(h, "gang")) == 1


def test_pods_of_one_pod_set_in_several_shapes_are_kept_in_one_rack() -> None:
    # A PodGroup's leader (1 GPU) and workers (8 GPUs) make one pod set. Placed apart, the
    # workers would take r1 and the leader the last GPU of r0-n0 (the fullest node).
    h = _scheduler()
    h.pod("foreign-0", gpu=7, node="r0-n0", scheduler="default-scheduler")
    for i in (1, 2, 3):
        h.pod(f"foreign-{i}", gpu=8, node=f"r0-n{i}", scheduler="default-scheduler")
    h.job("gang", 4, gpu=8, pods=0)
    _ask(h, "gang", {"required": RACK})
    h.pod("gang-leader", "uid-gang", gpu=1)
    for i in range(3):
        h.pod(f"gang-{i}", "uid-gang", gpu=8)
    h.run()
    assert _racks(h, "gang") == {"r1"} and sum(h.placement("gang").values()) == 4
