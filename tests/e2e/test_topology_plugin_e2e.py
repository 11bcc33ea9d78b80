"""`kubectl muster topology` on the real local cluster, run through kubectl as a user runs it:
kwok nodes labelled into 2 blocks of 2 racks of 2 nodes (8 GPUs each), a flavor naming a
Topology of those labels, two pods bound (one Muster's); the tree shows the free GPUs and
pods of every block, rack and node, the room for 8-GPU pods and where a gang would go. A
queue reader is refused at the Nodes, in words naming the right; given Nodes but not Pods,
they see allocatable only and why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from quota.api.names import SCHEDULER_NAME
from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import apply, crds, flavor, unique  # noqa: F401 - fixture
from tests.e2e.test_plugin_e2e import VENV_BIN, kubectl_muster
from tests.e2e.test_roles_e2e import person, refused_plainly, render_roles

pytestmark = pytest.mark.e2e

BLOCK, RACK = "muster-e2e/block", "muster-e2e/rack"


def bound_pod(name: str, namespace: str, node: str, gpus: int, scheduler: str = "") -> Any:
    """A pod bound to `node` at creation (spec.nodeName), as a scheduler would have bound it."""
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {
                    "requests": {"nvidia.com/gpu": str(gpus)},
                    "limits": {"nvidia.com/gpu": str(gpus)},
                },
            }
        ],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def fabric(cluster: ClusterHandle, crds: None) -> Iterator[dict[str, Any]]:  # noqa: F811
    pool, topology, namespace = unique("fabric"), unique("fabric"), unique("topo")
    nodes: dict[str, list[str]] = {}
    for b in range(2):
        for r in range(2):
            rack = f"{pool}-b{b}-r{r}"
            labels = {"muster-e2e/pool": pool, BLOCK: f"{pool}-b{b}", RACK: rack}
            nodes[rack] = cluster.nodes(2, prefix=rack, gpu=8, labels=labels)
    apply(
        cluster,
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "Topology",
            "metadata": {"name": topology},
            "spec": {
                "levels": [
                    {"nodeLabel": BLOCK},
                    {"nodeLabel": RACK},
                    {"nodeLabel": "kubernetes.io/hostname"},
                ]
            },
        },
        flavor(pool, pool, topologyName=topology),
    )
    cluster.kubectl("create", "namespace", namespace)
    b0r0, b0r1 = nodes[f"{pool}-b0-r0"], nodes[f"{pool}-b0-r1"]
    apply(
        cluster,
        bound_pod("other", namespace, b0r0[0], 8),
        bound_pod("trainer", namespace, b0r1[0], 4, scheduler=SCHEDULER_NAME),
    )
    try:
        yield {"pool": pool, "topology": topology, "namespace": namespace, "nodes": nodes}
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceflavor", pool, "--ignore-not-found")
        cluster.kubectl("delete", "topology", topology, "--ignore-not-found")
        every = [n for rack in nodes.values() for n in rack]
        cluster.kubectl("delete", "node", *every, "--wait=false", check=False)


def lines(out: str) -> dict[str, str]:
    """Each row of the tree by the domain or node it shows (the word after its level)."""
    found = {}
    for line in out.splitlines():
        words = line.replace("│", " ").replace("├──", " ").replace("└──", " ").split()
        if len(words) > 1 and words[0] in ("block", "rack", "node"):
            found[words[1]] = " ".join(words)
    return found


def test_the_tree_shows_free_gpus_pods_and_room_per_block_rack_and_node(
    cluster: ClusterHandle, fabric: dict[str, Any]
) -> None:
    pool, topology = fabric["pool"], fabric["topology"]
    result = kubectl_muster(
        cluster, "topology", topology, "--gpus", "8", "--fits", "2", "--color", "never"
    )
    out = result.stdout
    assert f"Topology {topology} ({BLOCK} > {RACK} > kubernetes.io/hostname)" in out
    assert f"flavor {pool} (muster-e2e/pool={pool})" in out
    assert "8 nodes in all nvidia.com/gpu 52/64 free pods 2 (1 Muster's)" in " ".join(out.split())
    rows = lines(out)
    assert rows[f"{pool}-b0"] == (
        f"block {pool}-b0 4 nodes nvidia.com/gpu 20/32 free pods 2 (1 Muster's) "
        "room for 2 x 8 nvidia.com/gpu"
    )
    assert rows[f"{pool}-b0-r0"].startswith(f"rack {pool}-b0-r0 2 nodes nvidia.com/gpu 8/16 free")
    assert "pods 1 (1 Muster's)" in rows[f"{pool}-b0-r1"]
    other = fabric["nodes"][f"{pool}-b0-r0"][0]
    assert rows[other].startswith(f"node {other} nvidia.com/gpu 0/8 free pods 1")
    assert rows[f"{pool}-b1"].startswith(f"block {pool}-b1 4 nodes nvidia.com/gpu 32/32 free")
    # Where a gang of two 8-GPU pods would go, as admission chooses: no rack of block b0
    # holds two (each has one node's room), so a rack of b1 (tied, by name); but block b0,
    # the fullest that holds two, when it asks for one block only.
    flat = " ".join(out.split())
    assert f"a gang of 2 x 8 nvidia.com/gpu required in one rack: rack {pool}-b1-r0" in flat
    assert f"required in one block: block {pool}-b0" in flat
    assert "required in one node: no node of Topology" in flat
    assert "Traceback" not in result.stderr


def test_a_large_tree_is_cut_to_the_roomiest_and_expands_on_request(
    cluster: ClusterHandle, fabric: dict[str, Any]
) -> None:
    pool, topology = fabric["pool"], fabric["topology"]
    out = kubectl_muster(
        cluster, "topology", "--flavor", pool, "--depth", "2", "--limit", "1", "--color", "never"
    ).stdout
    rows = lines(out)
    assert set(rows) == {f"{pool}-b1", f"{pool}-b1-r0"}  # the roomiest block, then rack
    assert "... 1 more block 4 nodes nvidia.com/gpu 20/32 free" in " ".join(out.split())
    everything = lines(kubectl_muster(cluster, "topology", topology, "--all").stdout)
    assert len(everything) == 2 + 4 + 8


def test_a_queue_reader_is_told_which_rights_the_view_needs(
    cluster: ClusterHandle, fabric: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    release = unique("muster-topo")
    roles = render_roles(release)
    apply(cluster, *[d for d in roles if d["metadata"]["name"] == f"{release}-queue-reader"])
    namespace, topology = fabric["namespace"], fabric["topology"]
    home = tmp_path_factory.mktemp("readers")
    try:
        # Without the queue-reader role, the Topologies are what it lacks first.
        nobody = person(cluster, namespace, "nobody", home)
        said = refused_plainly(nobody.muster(cluster, "topology"))
        assert "kubectl muster topology reads every Topology" in said
        assert "queue-reader role" in said and "listing Topologies:" in said
        reader = person(cluster, namespace, "reader", home, f"cluster:{release}-queue-reader")
        said = refused_plainly(reader.muster(cluster, "topology", topology))
        # Topologies and flavors it read; the Nodes are what it lacks, and it says so.
        assert "kubectl muster topology reads every Node" in said
        assert "no Muster role grants it" in said
        cluster.kubectl(
            "create", "clusterrole", f"{release}-nodes", "--verb=list", "--resource=nodes"
        )
        cluster.kubectl(
            "create", "clusterrolebinding", f"{release}-nodes", f"--clusterrole={release}-nodes",
            f"--serviceaccount={namespace}:reader",
        )  # fmt: skip
        cluster.wait_for(
            "the nodes right to apply",
            lambda: reader.muster(cluster, "topology", topology).returncode == 0,
            timeout=30,
        )
        result = reader.muster(cluster, "topology", topology, "--color", "never")
        out = " ".join(result.stdout.split())
        assert f"block {fabric['pool']}-b0 4 nodes nvidia.com/gpu 32 " in out
        assert "bound pods and where a gang would go are not shown, only allocatable" in out
        assert "pods" not in lines(result.stdout)[f"{fabric['pool']}-b0"]
    finally:
        cluster.kubectl(
            "delete", "clusterrole,clusterrolebinding", "-l",
            f"app.kubernetes.io/instance={release}", "--ignore-not-found",
        )  # fmt: skip
        bindings = (f"{release}-nodes", f"{namespace}-reader-{release}-queue-reader")
        cluster.kubectl("delete", "clusterrolebinding", *bindings, "--ignore-not-found")
        cluster.kubectl("delete", "clusterrole", f"{release}-nodes", "--ignore-not-found")


def test_kubectl_completes_topology_and_flavor_names_from_the_cluster(
    cluster: ClusterHandle, fabric: dict[str, Any]
) -> None:
    path = os.pathsep.join([str(VENV_BIN), os.environ["PATH"]])
    env = dict(os.environ, PATH=path, KUBECONFIG=cluster.kubeconfig)

    def complete(*words: str) -> list[str]:
        result = subprocess.run(
            [cluster.kubectl_bin, "__complete", "muster", *words],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        return result.stdout.split()

    assert fabric["topology"] in complete("topology", fabric["topology"][:8])
    assert fabric["pool"] in complete("topology", "--flavor", fabric["pool"][:8])
