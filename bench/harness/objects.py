"""The objects benchmarks create, in one shape each: a namespace, Muster's queue objects
(ResourceFlavor, ClusterQueue, LocalQueue), a Topology, and labelled one-pod Jobs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Obj = dict[str, Any]
MUSTER_API = "muster.dev/v1alpha1"


def namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def flavor(
    name: str, node_labels: Mapping[str, str], api: str = MUSTER_API, topology: str | None = None
) -> Obj:
    """A ResourceFlavor for the nodes carrying `node_labels` (Muster's, or Kueue's `api`),
    naming a Topology if given."""
    spec: Obj = {"nodeLabels": dict(node_labels)}
    if topology is not None:
        spec["topologyName"] = topology
    return {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def topology(name: str, levels: Sequence[str]) -> Obj:
    """Muster's Topology: node labels, widest first."""
    return {
        "apiVersion": MUSTER_API,
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": label} for label in levels]},
    }


def cluster_queue(
    name: str,
    flavor: str,
    quota: Mapping[str, str],
    *,
    limit: Mapping[str, str] | None = None,
    parent: str | None = None,
    preemption: Mapping[str, str | int] | None = None,
) -> Obj:
    """A ClusterQueue with `quota` (and a `limit`) on one flavor."""
    quotas: Obj = {"name": flavor, "quota": dict(quota)}
    if limit is not None:
        quotas["limit"] = dict(limit)
    spec: Obj = {"flavors": [quotas]}
    if parent is not None:
        spec["parent"] = parent
    if preemption is not None:
        spec["preemption"] = dict(preemption)
    return {
        "apiVersion": MUSTER_API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(namespace: str, cluster_queue: str, name: str = "q", api: str = MUSTER_API) -> Obj:
    """A LocalQueue (Muster's, or Kueue's `api`)."""
    return {
        "apiVersion": api,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


def one_pod_jobs(
    n: int,
    namespaces: Sequence[str],
    *,
    prefix: str,
    labels: Mapping[str, str] | None = None,
    suspend: bool = False,
) -> list[Obj]:
    """`n` Jobs of one 100m pod, `<prefix>-00000` on, spread over `namespaces` in turn."""
    docs = []
    for i in range(n):
        meta: Obj = {"name": f"{prefix}-{i:05d}", "namespace": namespaces[i % len(namespaces)]}
        if labels:
            meta["labels"] = dict(labels)
        spec: Obj = {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"requests": {"cpu": "100m"}},
                        }
                    ],
                }
            }
        }
        if suspend:
            spec["suspend"] = True
        docs.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec})
    return docs
