"""WorkerCluster: a cluster a management cluster's Muster dispatches admitted workloads to.

Quota and fair share are decided once, in the management cluster; a ClusterQueue whose
`spec.dispatch` is set sends its admitted workloads to one of the worker clusters its
selector picks, the one where the whole gang fits now (docs/multicluster.md). The worker
cluster is reached with a kubeconfig kept in a Secret of the management cluster, as Kueue's
MultiKueueCluster does; its own Muster admits and places what it is sent.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from quota.api.conditions import Condition, conditions_field
from quota.api.meta import (
    API_VERSION,
    ApiModel,
    ApiObject,
    CrdInfo,
    Duration,
    LabelSelector,
    PrinterColumn,
    format_duration,
    reference,
)
from quota.api.quantity import ResourceList

# A worker that has not answered for this long is lost: what was sent there and never
# started may be sent elsewhere once its dispatch lease (shorter) has run out.
DEFAULT_LOST_AFTER = timedelta(seconds=60)


class SecretKeyRef(ApiModel):
    """A key of a Secret in Muster's own namespace (as Kueue keeps MultiKueue's kubeconfigs
    in its own), so that Muster reads no other namespace's Secrets."""

    name: str = reference("The Secret, in the namespace Muster runs in.")
    key: str = Field(
        "kubeconfig",
        min_length=1,
        max_length=253,
        description="The key holding the kubeconfig.",
    )


class WorkerClusterSpec(ApiModel):
    """How to reach the worker cluster, and when to give up on it."""

    kubeconfig: SecretKeyRef = Field(
        description="A kubeconfig for the worker cluster (its current context is used). It "
        "needs to read nodes and pods, and to create, read, update and delete the workloads "
        "sent there and their Workloads."
    )
    lost_after: Duration = Field(
        DEFAULT_LOST_AFTER,
        description="How long the worker may fail to answer before it is lost (e.g. '60s'): "
        "workloads sent there that never started are then sent elsewhere; running ones stay "
        "until the worker answers again.",
        json_schema_extra={"default": format_duration(DEFAULT_LOST_AFTER)},
    )


class WorkerClusterStatus(ApiModel):
    """The worker as the management cluster last saw it, written by the controller."""

    conditions: list[Condition] = conditions_field(
        "Active: True (Connected) while the worker answers; False with Unreachable while it "
        "has not answered for less than lostAfter, Lost after that, or BadKubeconfig."
    )
    last_seen: datetime | None = Field(None, description="When the worker last answered.")
    nodes: int = Field(0, ge=0, description="Ready nodes.")
    capacity: ResourceList = Field(
        default_factory=dict, description="Allocatable of its Ready nodes, per resource."
    )
    usage: ResourceList = Field(
        default_factory=dict, description="Requests of the pods bound to its nodes."
    )
    dispatched: int = Field(0, ge=0, description="Workloads sent there and not finished.")


class WorkerCluster(ApiObject):
    """A cluster admitted workloads may be sent to (cluster-scoped, short name wc). Its
    labels are what a ClusterQueue's `spec.dispatch.clusterSelector` selects."""

    crd = CrdInfo(
        plural="workerclusters",
        scope="Cluster",
        short_names=("wc",),
        printer_columns=(
            PrinterColumn(
                "Active",
                '.status.conditions[?(@.type=="Active")].status',
                description="Whether the worker answers.",
            ),
            PrinterColumn("Nodes", ".status.nodes", "integer"),
            PrinterColumn("Dispatched", ".status.dispatched", "integer"),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )

    api_version: Literal["muster.dev/v1alpha1"] = API_VERSION
    kind: Literal["WorkerCluster"] = "WorkerCluster"
    spec: WorkerClusterSpec
    status: WorkerClusterStatus = Field(default_factory=WorkerClusterStatus)


class Dispatch(ApiModel):
    """Where a queue's admitted workloads run when they run in worker clusters."""

    cluster_selector: LabelSelector = Field(
        default_factory=LabelSelector,
        description="The WorkerClusters (by their labels) this queue's workloads may be sent "
        "to; empty: every one.",
        json_schema_extra={"default": {}},
    )
