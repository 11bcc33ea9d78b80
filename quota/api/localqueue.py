"""LocalQueue: a namespace's door into a leaf ClusterQueue."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from quota.api.clusterqueue import FlavorResources
from quota.api.conditions import Condition, conditions_field
from quota.api.meta import (
    API_VERSION,
    ApiModel,
    ApiObject,
    CrdInfo,
    PrinterColumn,
    reference,
)


class LocalQueueSpec(ApiModel):
    """Which ClusterQueue the namespace's workloads are queued in."""

    cluster_queue: str = reference(
        "The leaf ClusterQueue that admits this namespace's workloads. Jobs select "
        "this LocalQueue with the label muster.dev/queue-name."
    )


class LocalQueueStatus(ApiModel):
    """The namespace's share of its ClusterQueue, written by the controller."""

    pending_workloads: int = Field(0, ge=0, description="Workloads waiting for admission.")
    admitted_workloads: int = Field(0, ge=0, description="Workloads currently admitted.")
    usage: FlavorResources = Field(
        default_factory=dict,
        description="What this queue's admitted workloads use per flavor and resource.",
    )
    conditions: list[Condition] = conditions_field(
        "Active (with reason Ready, ClusterQueueNotFound, ClusterQueueNotLeaf or "
        "ClusterQueueInactive)."
    )


class LocalQueue(ApiObject):
    """A namespaced queue (short name lq) pointing at a leaf ClusterQueue."""

    crd = CrdInfo(
        plural="localqueues",
        scope="Namespaced",
        short_names=("lq",),
        printer_columns=(
            PrinterColumn("ClusterQueue", ".spec.clusterQueue"),
            PrinterColumn("Pending", ".status.pendingWorkloads", "integer"),
            PrinterColumn("Admitted", ".status.admittedWorkloads", "integer"),
            PrinterColumn("Active", '.status.conditions[?(@.type=="Active")].status'),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )

    api_version: Literal["muster.dev/v1alpha1"] = API_VERSION
    kind: Literal["LocalQueue"] = "LocalQueue"
    spec: LocalQueueSpec
    status: LocalQueueStatus = Field(default_factory=LocalQueueStatus)
