"""A topology on the local cluster for end-to-end tests: kwok nodes labelled into (blocks of)
racks, a Topology of those levels and the hostname, a flavor naming it and a queue
(LocalQueue `team`) over it; the nodes are deleted at the end (`Fabric.made`).

Racks are named `<pool>-r<j>` (`<pool>-b<i>-r<j>` with blocks), their nodes `<rack>-<k>`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import apply, create, flavor, local_queue, unique
from tests.e2e.controller_harness import cluster_queue as cq_manifest

BLOCK = "e2e.muster.dev/block"
RACK = "e2e.muster.dev/rack"
HOST = "kubernetes.io/hostname"
POOL = "muster-e2e/pool"  # the label the flavor selects its nodes by


class Fabric:
    """`blocks` (0: no block level) x `racks` x `per_rack` nodes of the given size, and
    `outside` more of the flavor that carry no level's label (capacity no gang asking for a
    rack can use)."""

    def __init__(
        self,
        cluster: ClusterHandle,
        namespace: str,
        *,
        racks: int,
        per_rack: int,
        quota: Mapping[str, str],
        blocks: int = 0,
        outside: int = 0,
        node: Mapping[str, Any] | None = None,
        **cq_spec: Any,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.pool = unique("topo")
        self.rack_of: dict[str, str] = {}
        size = dict(node or {"cpu": "32", "gpu": 8})
        for b in range(max(blocks, 1)):
            for r in range(racks):
                rack = f"{self.pool}-b{b}-r{r}" if blocks else f"{self.pool}-r{r}"
                labels = {POOL: self.pool, RACK: rack}
                if blocks:
                    labels[BLOCK] = f"{self.pool}-b{b}"
                for name in cluster.nodes(per_rack, prefix=rack, labels=labels, **size):
                    self.rack_of[name] = rack
        self.outside = (
            cluster.nodes(outside, prefix=f"{self.pool}-loose", labels={POOL: self.pool}, **size)
            if outside
            else []
        )
        self.topology = unique("fabric")
        levels = [BLOCK, RACK, HOST] if blocks else [RACK, HOST]
        cq = unique("cq")
        apply(
            cluster,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "Topology",
                "metadata": {"name": self.topology},
                "spec": {"levels": [{"nodeLabel": label} for label in levels]},
            },
            flavor(self.pool, self.pool, topologyName=self.topology),
            cq_manifest(cq, [{"name": self.pool, "quota": dict(quota)}], **cq_spec),
            local_queue("team", namespace, cq),
        )

    @classmethod
    def made(cls, cluster: ClusterHandle, namespace: str, **shape: Any) -> Iterator[Fabric]:
        """A fixture's body: the fabric, its nodes deleted afterwards."""
        fabric = cls(cluster, namespace, **shape)
        try:
            yield fabric
        finally:
            nodes = [*fabric.rack_of, *fabric.outside]
            cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)

    def racks(self, nodes: Iterable[str]) -> set[str]:
        """The racks of `nodes`."""
        return {self.rack_of[n] for n in nodes}

    def occupy(self, node: str, requests: Mapping[str, str]) -> None:
        occupy(self.cluster, self.namespace, node, requests)


def occupy(cluster: ClusterHandle, namespace: str, node: str, requests: Mapping[str, str]) -> None:
    """A pod Muster does not manage, bound to `node` (as another scheduler would)."""
    create(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": unique("other"), "namespace": namespace},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"requests": dict(requests), "limits": dict(requests)},
                    }
                ],
            },
        },
    )
