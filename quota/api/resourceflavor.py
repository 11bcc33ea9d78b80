"""ResourceFlavor: one kind of capacity (say, H100 nodes), and how pods get onto it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from quota.api.meta import (
    API_VERSION,
    ApiModel,
    ApiObject,
    CrdInfo,
    PrinterColumn,
    Taint,
    Toleration,
    reference,
)


class ResourceFlavorSpec(ApiModel):
    """Where pods admitted with this flavor run, and what lets them run there."""

    node_labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        description="Labels a node must carry to provide this flavor; Muster adds them to the "
        "nodeSelector of every pod admitted with the flavor.",
    )
    node_taints: list[Taint] = Field(
        default_factory=list,
        max_length=16,
        description="Taints the flavor's nodes carry. A workload is only given this flavor "
        "if its pod sets tolerate every one of them (or the flavor's tolerations do).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=16,
        description="Tolerations Muster adds to every pod admitted with this flavor, so "
        "users need not know the nodes' taints.",
    )
    topology_name: str | None = reference(
        "The Topology its nodes form (levels of node labels): pod sets admitted with this "
        "flavor may then ask to be placed inside one domain. Workloads that need a flavor "
        "naming a Topology that does not exist wait.",
        optional=True,
    )


class ResourceFlavor(ApiObject):
    """A kind of capacity in the cluster (cluster-scoped). ClusterQueues hold quota per
    flavor; admitting a workload picks a flavor for each of its resources."""

    crd = CrdInfo(
        plural="resourceflavors",
        scope="Cluster",
        short_names=("rf",),
        printer_columns=(
            PrinterColumn(
                "Node-Labels", ".spec.nodeLabels", description="Labels of the flavor's nodes."
            ),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )

    api_version: Literal["muster.dev/v1alpha1"] = API_VERSION
    kind: Literal["ResourceFlavor"] = "ResourceFlavor"
    spec: ResourceFlavorSpec = Field(default_factory=ResourceFlavorSpec)
