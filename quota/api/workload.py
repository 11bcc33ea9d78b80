"""Workload: the unit of admission. One Job (or one slice of an elastic Job) becomes one
Workload whose pod sets are admitted all together, or not at all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import AwareDatetime, Field, model_validator

from quota.api.conditions import Condition, conditions_field
from quota.api.meta import (
    API_VERSION,
    DNS_LABEL,
    INT32_MAX,
    INT32_MIN,
    ApiModel,
    ApiObject,
    CrdInfo,
    PrinterColumn,
    Toleration,
    cel,
    reference,
    validations,
)
from quota.api.names import PREEMPTIBLE_ANNOTATION
from quota.api.quantity import ResourceList
from quota.api.topology import TopologyRequest

MAX_POD_SETS = 8
MAX_POD_COUNT = 100_000


class PodSetTemplate(ApiModel):
    """The scheduling fields of the pods' template: what decides where the pods may run."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=32, description="The pods' nodeSelector."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="The pods' tolerations."
    )
    affinity: dict[str, Any] | None = Field(
        None,
        description="The pods' affinity (core/v1 Affinity), kept as written.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class PodSet(ApiModel):
    """A group of identical pods, e.g. the workers of a training job."""

    model_config = validations(
        cel(
            "!has(self.minCount) || self.minCount <= self.count",
            "minCount must not exceed count",
            field_path=".minCount",
        ),
        cel(
            "!has(self.topologyRequest) || !has(self.topologyRequest.sliceSize) || "
            "self.count % self.topologyRequest.sliceSize == 0",
            "topologyRequest.sliceSize must divide count",
            field_path=".topologyRequest.sliceSize",
        ),
        cel(
            "!has(self.protectedCount) || self.protectedCount <= self.count",
            "protectedCount must not exceed count",
            field_path=".protectedCount",
        ),
    )

    name: str = Field(
        "main",
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="Unique within the workload.",
    )
    count: int = Field(ge=0, le=MAX_POD_COUNT, description="How many pods the set has.")
    min_count: int | None = Field(
        None,
        ge=1,
        le=MAX_POD_COUNT,
        description="Admit the set with fewer pods, down to this many, when all do not fit "
        "(partial admission). Unset: all or nothing.",
    )
    protected_count: int = Field(
        0,
        ge=0,
        le=MAX_POD_COUNT,
        description="Pods of this set that single-pod disruption (spec.disruptionMode Single) "
        "never takes, e.g. 1 for a LeaderWorkerSet's leader. Ignored in mode All.",
    )
    template: PodSetTemplate = Field(
        default_factory=PodSetTemplate,
        description="The pods' scheduling fields.",
        json_schema_extra={"default": {}},
    )
    requests: ResourceList = Field(
        default_factory=dict,
        description="What one pod requests (sum of its containers, as the scheduler counts it).",
    )
    topology_request: TopologyRequest | None = Field(
        None,
        description="Keep the pods (or each slice of them) inside one domain of the flavor's "
        "Topology; unset: anywhere.",
    )

    @model_validator(mode="after")
    def _min_count_within_count(self) -> Self:
        if self.min_count is not None and self.min_count > self.count:
            raise ValueError(
                f"minCount must not exceed count (pod set {self.name}: "
                f"minCount {self.min_count} > count {self.count})"
            )
        if self.protected_count > self.count:
            raise ValueError(
                f"protectedCount must not exceed count (pod set {self.name}: "
                f"protectedCount {self.protected_count} > count {self.count})"
            )
        size = self.topology_request.slice_size if self.topology_request else None
        if size is not None and self.count % size:
            raise ValueError(
                f"topologyRequest.sliceSize must divide count (pod set {self.name}: "
                f"{size} does not divide {self.count})"
            )
        return self

    def total(self, count: int | None = None) -> dict[str, int]:
        """Requests of ``count`` pods (all of them by default), in base units."""
        pods = self.count if count is None else count
        return {resource: amount * pods for resource, amount in self.requests.items()}


class WorkloadSpec(ApiModel):
    """What to admit, where to queue it and how important it is."""

    model_config = validations(
        cel(
            "!has(self.replaces) || has(self.sliceName)",
            "replaces requires sliceName",
            field_path=".replaces",
        )
    )

    queue_name: str = reference("The LocalQueue, in the workload's namespace, to queue in.")
    priority_class_name: str | None = Field(
        None,
        max_length=253,
        description="The PriorityClass the priority was taken from.",
    )
    priority: int | None = Field(
        None,
        ge=INT32_MIN,
        le=INT32_MAX,
        description="Higher runs first and may preempt lower; resolved from the PriorityClass "
        "(0 when there is none).",
    )
    pod_sets: list[PodSet] = Field(
        min_length=1,
        max_length=MAX_POD_SETS,
        description="The groups of pods, admitted together.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    disruption_mode: Literal["All", "Single"] = Field(
        "All",
        description="What preemption, reclaim and consolidation may take: All, the whole "
        "workload; Single, single pods (as few as the preemptor needs, never a pod set's "
        "protectedCount), the admission shrinking in place (KEP-5710's disruptionMode).",
    )
    slice_name: str | None = Field(
        None,
        max_length=253,
        description="For elastic jobs: the name shared by every slice of the same job.",
    )
    replaces: str | None = Field(
        None,
        max_length=253,
        description="For elastic jobs: the slice this one replaces once admitted (scale-up).",
    )

    @model_validator(mode="after")
    def _unique_pod_sets(self) -> Self:
        names = [p.name for p in self.pod_sets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pod set names must be unique: {', '.join(duplicates)}")
        if self.replaces is not None and self.slice_name is None:
            raise ValueError("replaces requires sliceName")
        return self


# A pod set spans at most this many nodes in a plan (a 5,000-node cluster, one pod each).
MAX_PLANNED_NODES = 5000


class NodePods(ApiModel):
    """How many pods of a pod set are planned on one node."""

    name: str = Field(min_length=1, max_length=253, description="The node.")
    count: int = Field(ge=1, le=MAX_POD_COUNT, description="Pods planned on it.")


class PodSetAssignment(ApiModel):
    """What one pod set was admitted with."""

    name: str = Field(min_length=1, max_length=63, description="The pod set.")
    flavors: dict[str, str] = Field(
        default_factory=dict,
        max_length=32,
        description="The flavor chosen for each resource, e.g. {nvidia.com/gpu: h100}.",
    )
    count: int = Field(
        ge=0, le=MAX_POD_COUNT, description="Pods admitted (below count on partial admission)."
    )
    resource_usage: ResourceList = Field(
        default_factory=dict, description="Total quota charged for the admitted pods."
    )
    nodes: list[NodePods] = Field(
        default_factory=list,
        max_length=MAX_PLANNED_NODES,
        description="Where the admitted pods are planned, when the cluster has nodes: the "
        "placement the admission was decided with. Muster's scheduler binds the pods there "
        "while they still fit, and places again what no longer does.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )


class Admission(ApiModel):
    """Where a workload's quota is reserved."""

    cluster_queue: str = Field(
        min_length=1, max_length=253, description="The ClusterQueue that reserved quota."
    )
    pod_set_assignments: list[PodSetAssignment] = Field(
        min_length=1,
        max_length=MAX_POD_SETS,
        description="What each pod set was admitted with; at least one: an admission that "
        "assigns no pod set admits nothing and is malformed.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )


class RequeueState(ApiModel):
    """Back-off bookkeeping for a workload that was evicted and queued again."""

    count: int = Field(0, ge=0, description="How many times the workload was requeued.")
    requeue_at: AwareDatetime | None = Field(
        None, description="Not reconsidered for admission before this time."
    )


class Nomination(ApiModel):
    """Room on nodes held for a pending workload while the workloads evicted for it leave."""

    since: AwareDatetime = Field(
        description="When the room was first held; the hold lapses after the controller's "
        "--preemption-hold-timeout and the workload is planned again."
    )
    victims: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="The workloads (namespace/name) evicted to make this room.",
    )
    pod_set_assignments: list[PodSetAssignment] = Field(
        default_factory=list,
        max_length=MAX_POD_SETS,
        description="Where its pods go once the room is free: no other workload is placed "
        "there meanwhile.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )


class WorkloadStatus(ApiModel):
    """Admission and lifecycle of the workload, written by the controller."""

    admission: Admission | None = Field(None, description="Set while quota is reserved.")
    conditions: list[Condition] = conditions_field(
        "QuotaReserved, Admitted, Evicted, Preempted, Requeued, Finished, PodsReady."
    )
    requeue_state: RequeueState | None = None
    nomination: Nomination | None = Field(
        None, description="Set while room on nodes is held for it (a preemptor)."
    )
    preempted_pods: list[str] = Field(
        default_factory=list,
        description="Pods (names, in its namespace) that single-pod preemption "
        "(spec.disruptionMode Single) last took from it: gone from its admission, their "
        "room promised to a preemptor; its controller deletes them first.",
    )


class Workload(ApiObject):
    """A unit of admission (namespaced, short name wl)."""

    crd = CrdInfo(
        plural="workloads",
        scope="Namespaced",
        short_names=("wl",),
        printer_columns=(
            PrinterColumn("Queue", ".spec.queueName", description="The LocalQueue."),
            PrinterColumn(
                "Reserved-In",
                ".status.admission.clusterQueue",
                description="The ClusterQueue holding its quota.",
            ),
            PrinterColumn("Admitted", '.status.conditions[?(@.type=="Admitted")].status'),
            PrinterColumn("Finished", '.status.conditions[?(@.type=="Finished")].reason'),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )

    api_version: Literal["muster.dev/v1alpha1"] = API_VERSION
    kind: Literal["Workload"] = "Workload"
    spec: WorkloadSpec
    status: WorkloadStatus = Field(default_factory=WorkloadStatus)

    @model_validator(mode="after")
    def _preemptible_annotation(self) -> Self:
        try:
            preemptible_override(self.metadata.annotations)
        except ValueError as error:
            raise ValueError(f"metadata.annotations[{PREEMPTIBLE_ANNOTATION}]: {error}") from None
        return self

    @property
    def preemptible(self) -> bool | None:
        """Its annotation muster.dev/preemptible (copied from its object), or None: its
        queue's spec.preemption.preemptibleBelowPriority decides."""
        return preemptible_override(self.metadata.annotations)


def preemptible_override(annotations: Mapping[str, Any]) -> bool | None:
    """The annotation muster.dev/preemptible of an object: True, False, or None when it has
    none. Raises ValueError saying the rule for any other value."""
    value = annotations.get(PREEMPTIBLE_ANNOTATION)
    if value is None:
        return None
    if value in ("true", "false"):
        return bool(value == "true")
    raise ValueError(f'must be "true" or "false" (got {value!r})')
