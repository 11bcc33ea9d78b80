"""PodGroup: a group of pods placed all-or-nothing. The fields mirror
scheduling.k8s.io/v1beta1 PodGroup as Kubernetes 1.37 serves it, so that a PodGroup can be
moved between Muster and the native API by changing apiVersion alone."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from quota.api.conditions import Condition, conditions_field
from quota.api.meta import (
    API_VERSION,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ApiModel,
    ApiObject,
    CrdInfo,
    PrinterColumn,
    cel,
    validations,
)

# kube-apiserver's bound for user-defined priorities (HighestUserDefinablePriority).
HIGHEST_USER_PRIORITY = 1_000_000_000


class WorkloadReference(ApiModel):
    """The Workload, and the pod set template within it, this group was made from."""

    workload_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    template_name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)


class BasicSchedulingPolicy(ApiModel):
    """Schedule the pods one by one, as the default scheduler does (empty on purpose)."""


class GangSchedulingPolicy(ApiModel):
    """Schedule the pods all-or-nothing."""

    min_count: int = Field(
        ge=1,
        le=2**31 - 1,
        description="How many pods must fit at the same time for any of them to be bound.",
    )


class PodGroupSchedulingPolicy(ApiModel):
    """Exactly one of basic or gang."""

    model_config = validations(
        cel("has(self.basic) != has(self.gang)", "exactly one of basic or gang must be set")
    )

    basic: BasicSchedulingPolicy | None = None
    gang: GangSchedulingPolicy | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.basic is None) == (self.gang is None):
            raise ValueError("exactly one of basic or gang must be set")
        return self


class TopologyConstraint(ApiModel):
    """Keep all pods of the group within one value of a node label (e.g. one rack)."""

    key: str = Field(min_length=1, max_length=316, description="The node label, e.g. a rack.")


class PodGroupSchedulingConstraints(ApiModel):
    """Placement constraints on the whole group."""

    topology: list[TopologyConstraint] = Field(default_factory=list, max_length=1)


class SingleDisruptionMode(ApiModel):
    """Pods of the group may be disrupted one at a time (empty on purpose)."""


class AllDisruptionMode(ApiModel):
    """Pods of the group are only ever disrupted together (empty on purpose)."""


class DisruptionMode(ApiModel):
    """Exactly one of single or all."""

    model_config = validations(
        cel("has(self.single) != has(self.all)", "exactly one of single or all must be set")
    )

    single: SingleDisruptionMode | None = None
    all: AllDisruptionMode | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.single is None) == (self.all is None):
            raise ValueError("exactly one of single or all must be set")
        return self


def _single() -> DisruptionMode:
    return DisruptionMode(single=SingleDisruptionMode())


class PodGroupSpec(ApiModel):
    """How the group is scheduled and how it may be disrupted."""

    workload_ref: WorkloadReference | None = Field(
        None, description="The Workload and pod set this group was created from."
    )
    scheduling_policy: PodGroupSchedulingPolicy = Field(
        description="basic: {} (pod by pod) or gang: {minCount: N} (all-or-nothing)."
    )
    scheduling_constraints: PodGroupSchedulingConstraints | None = Field(
        None, description="Topology constraints on the whole group."
    )
    disruption_mode: DisruptionMode = Field(
        default_factory=_single,
        description="single: {} - pods may be preempted individually; all: {} - preempting "
        "one pod preempts the whole group.",
        json_schema_extra={"default": {"single": {}}},
    )
    priority_class_name: str | None = Field(None, max_length=253)
    priority: int | None = Field(
        None,
        ge=-(2**31),
        le=HIGHEST_USER_PRIORITY,
        description="Higher-priority groups are scheduled first and may preempt lower ones.",
    )
    preemption_policy: Literal["Never", "PreemptLowerPriority"] | None = Field(
        None, description="Whether the group may preempt lower-priority pods and groups."
    )


class PodGroupStatus(ApiModel):
    """Scheduling state of the group, written by the scheduler."""

    conditions: list[Condition] = conditions_field(
        "PodGroupInitiallyScheduled (reasons Unschedulable, SchedulerError) and "
        "DisruptionTarget (reason PreemptionByScheduler)."
    )
    scheduled: int = Field(
        0, ge=0, le=2**31 - 1, description="How many pods of the group are bound to nodes."
    )


class PodGroup(ApiObject):
    """A gang of pods (namespaced, short name pg)."""

    crd = CrdInfo(
        plural="podgroups",
        scope="Namespaced",
        short_names=("pg",),
        printer_columns=(
            PrinterColumn("Min-Count", ".spec.schedulingPolicy.gang.minCount", "integer"),
            PrinterColumn("Priority", ".spec.priority", "integer"),
            PrinterColumn(
                "Scheduled", '.status.conditions[?(@.type=="PodGroupInitiallyScheduled")].status'
            ),
            PrinterColumn("Bound", ".status.scheduled", "integer"),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )

    api_version: Literal["muster.dev/v1alpha1"] = API_VERSION
    kind: Literal["PodGroup"] = "PodGroup"
    spec: PodGroupSpec
    status: PodGroupStatus = Field(default_factory=PodGroupStatus)
