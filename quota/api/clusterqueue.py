"""ClusterQueue: a node in the tree of teams, with guaranteed quota, an over-quota weight
and hard limits per flavor and resource."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Literal, Self

from pydantic import Field, WithJsonSchema, model_validator

from quota.api.conditions import Condition, conditions_field
from quota.api.meta import (
    API_VERSION,
    INT32_MAX,
    INT32_MIN,
    ApiModel,
    ApiObject,
    CrdInfo,
    Duration,
    LabelSelector,
    PrinterColumn,
    cel,
    reference,
    validations,
)
from quota.api.quantity import RESOURCE_LIST_SCHEMA, ResourceList, format_quantity
from quota.api.workercluster import Dispatch

MAX_FLAVORS = 16
# KAI-Scheduler's default: priority 100 and above is inference, which runs within quota and
# is never evicted; lower priorities are training jobs that may use surplus and be evicted.
DEFAULT_PREEMPTIBLE_BELOW = 100
MAX_SUMMARY = 1024

FlavorResources = Annotated[
    dict[str, ResourceList],
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_FLAVORS,
            "additionalProperties": RESOURCE_LIST_SCHEMA,
        }
    ),
]
"""Amounts per flavor and resource, in base units: ``{"h100": {"nvidia.com/gpu": 8}}``."""

# Both sides go through quantity() so that "1" and "1000m" compare as equal amounts.
_QUOTA_WITHIN_LIMIT = (
    "!isQuantity(string(self.quota[r])) || !isQuantity(string(self.limit[r])) || "
    "quantity(string(self.quota[r])).compareTo(quantity(string(self.limit[r]))) <= 0"
)


class FlavorQuota(ApiModel):
    """What a queue is guaranteed, and may at most use, of one resource flavor."""

    model_config = validations(
        cel(
            f"!has(self.quota) || !has(self.limit) || "
            f"self.limit.all(r, !(r in self.quota) || {_QUOTA_WITHIN_LIMIT})",
            "quota must not exceed limit",
            message_expression=(
                f"'quota must not exceed limit in flavor ' + self.name + ': ' + "
                f"self.limit.filter(r, (r in self.quota) && !({_QUOTA_WITHIN_LIMIT}))[0]"
            ),
            field_path=".quota",
        )
    )

    name: str = reference("The ResourceFlavor this entry is about.")
    quota: ResourceList = Field(
        default_factory=dict,
        description="Guaranteed amount per resource (e.g. cpu: 64, memory: 512Gi, "
        "nvidia.com/gpu: 8). For a parent queue, what it receives and divides among its "
        "children. Resources not listed have no guarantee.",
    )
    limit: ResourceList = Field(
        default_factory=dict,
        description="Hard cap per resource, guarantee plus anything borrowed. Resources not "
        "listed are capped only by what the parent can give.",
    )

    @model_validator(mode="after")
    def _quota_within_limit(self) -> Self:
        over = [r for r, cap in self.limit.items() if self.quota.get(r, 0) > cap]
        if over:
            raise ValueError(
                f"quota must not exceed limit in flavor {self.name}: "
                + ", ".join(
                    f"{r} (quota {format_quantity(self.quota[r], r)} > limit "
                    f"{format_quantity(self.limit[r], r)})"
                    for r in over
                )
            )
        return self


# What `waitBeforeEvicting` is where no queue on the path sets it. On Kueue's baseline trace
# every value from 10s up avoids all 6,050 evictions with the same waits (2s suffices at a
# tenth; docs/benchmarks.md has the sweep and its command). 30s keeps a margin for a
# cluster's slower pipeline, and is nothing next to the work an evicted training job loses.
DEFAULT_WAIT_BEFORE_EVICTING = timedelta(seconds=30)


class Preemption(ApiModel):
    """When workloads of this queue may evict others, and how long they are safe themselves."""

    within_queue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = Field(
        "Never",
        description="Whether a pending workload may preempt admitted workloads of the same "
        "queue: never, only lower-priority ones, or also newer ones of equal priority.",
    )
    reclaim: Literal["Never", "LowerPriority", "Any"] = Field(
        "Any",
        description="Whether a pending workload that fits in this queue's guaranteed quota may "
        "evict workloads of queues using more than their fair share: never, only those of "
        "lower priority, or any. Defaults to Any, because a guarantee that cannot be "
        "reclaimed is not a guarantee.",
    )
    preempt_min_runtime: Duration | None = Field(
        None,
        description="Admitted workloads of this queue that have run for less than this are "
        "not preempted from within the queue (e.g. '10m').",
    )
    reclaim_min_runtime: Duration | None = Field(
        None,
        description="Admitted workloads of this queue that have run for less than this are "
        "not reclaimed by other queues (e.g. '1h').",
    )
    wait_before_evicting: Duration | None = Field(
        None,
        description="A pending workload of this queue evicts others (preemption or reclaim) "
        "only once it has waited this long for room to free by completions (e.g. '2m'; "
        "'0s' evicts at once). Inherited from the nearest ancestor that sets it; 30s when "
        "none does.",
    )
    preemptible_below_priority: int = Field(
        DEFAULT_PREEMPTIBLE_BELOW,
        ge=INT32_MIN,
        le=INT32_MAX,
        description="Workloads of this queue with a lower priority are preemptible: they may "
        "borrow beyond the queue's quota and be evicted. The others are not: they are "
        "admitted only within the queue's guaranteed quota and are never chosen to be "
        "preempted, reclaimed or moved (a stopPolicy of HoldAndDrain still drains them). "
        'The annotation muster.dev/preemptible: "true" or "false" on a workload\'s '
        "object overrides this for that workload.",
    )


class Consolidation(ApiModel):
    """Whether this queue's running workloads may be moved to other nodes to defragment."""

    movable: bool = Field(
        False,
        description="Running workloads of this queue may be moved (their pods restarted on "
        "other nodes, with room held for them) when a gang of equal or higher priority "
        "cannot be placed only because free room is scattered across nodes. Only for "
        "workloads that tolerate a restart.",
    )
    below_priority: int | None = Field(
        None,
        ge=-(2**31),
        le=2**31 - 1,
        description="Only workloads with a priority below this are moved (none: any "
        "priority up to the gang's own).",
    )


class ClusterQueueSpec(ApiModel):
    """The queue's place in the tree, its share of capacity and its admission policy."""

    parent: str | None = reference(
        "The parent ClusterQueue. Queues without a parent are roots; only leaf "
        "queues (queues no other queue names as parent) hold workloads.",
        optional=True,
    )
    priority: int = Field(
        0,
        ge=INT32_MIN,
        le=INT32_MAX,
        description="Surplus capacity goes to higher-priority siblings first.",
    )
    over_quota_weight: int = Field(
        1,
        ge=0,
        le=1_000_000,
        description="Share of surplus capacity among siblings of equal priority; 0 means the "
        "queue never gets more than its quota.",
    )
    flavors: list[FlavorQuota] = Field(
        default_factory=list,
        max_length=MAX_FLAVORS,
        description="Quota and limit per resource flavor, in order of preference: admission "
        "tries the first flavor first.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    queueing_strategy: Literal["StrictFIFO", "BestEffortFIFO"] = Field(
        "BestEffortFIFO",
        description="StrictFIFO: the head of the queue blocks those behind it until it fits. "
        "BestEffortFIFO: a workload that does not fit is skipped so smaller ones can run.",
    )
    preemption: Preemption = Field(
        default_factory=Preemption,
        description="Preemption within the queue and reclaim from other queues.",
        json_schema_extra={"default": {}},
    )
    namespace_selector: LabelSelector | None = Field(
        None,
        description="Namespaces whose LocalQueues may point at this queue; all namespaces "
        "when unset.",
    )
    stop_policy: Literal["None", "Hold", "HoldAndDrain"] = Field(
        "None",
        description="Hold: admit nothing new; HoldAndDrain: also evict what is admitted.",
    )
    consolidation: Consolidation = Field(
        default_factory=Consolidation,
        description="Moving this queue's running workloads to defragment nodes (opt-in).",
        json_schema_extra={"default": {}},
    )
    dispatch: Dispatch | None = Field(
        None,
        description="Run this queue's admitted workloads in worker clusters (WorkerCluster) "
        "instead of this one: each goes, whole, to a selected worker cluster where it fits "
        "now. Unset: they run here.",
    )
    placement_strategy: Literal["BinPack", "Spread"] = Field(
        "BinPack",
        description="How Muster places this queue's pods on nodes. BinPack fills the most "
        "allocated node that fits, scarcest resource first, leaving whole nodes free for the "
        "next large gang; Spread puts each pod on the least allocated node.",
    )

    @model_validator(mode="after")
    def _unique_flavors(self) -> Self:
        names = [f.name for f in self.flavors]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"flavors: each flavor may appear once: {', '.join(duplicates)}")
        return self

    def flavor(self, name: str) -> FlavorQuota | None:
        """The quota entry for a flavor, if the queue has one."""
        return next((f for f in self.flavors if f.name == name), None)


class ClusterQueueStatus(ApiModel):
    """What the queue is using and is entitled to right now, written by the controller."""

    pending_workloads: int = Field(0, ge=0, description="Workloads waiting for admission.")
    admitted_workloads: int = Field(0, ge=0, description="Workloads currently admitted.")
    fair_share: FlavorResources = Field(
        default_factory=dict,
        description="What the queue is entitled to now per flavor and resource: its quota plus "
        "its share of the surplus.",
    )
    usage: FlavorResources = Field(
        default_factory=dict, description="What admitted workloads use per flavor and resource."
    )
    borrowed: FlavorResources = Field(
        default_factory=dict,
        description="The part of usage above quota, per flavor and resource.",
    )
    usage_summary: str = Field(
        "",
        max_length=MAX_SUMMARY,
        description="Usage against quota at a glance, e.g. 'h100: gpu 6/8 cpu 40/64'.",
    )
    conditions: list[Condition] = conditions_field(
        "Active (with reason Ready, ParentNotFound, Cycle, FlavorNotFound, "
        "AncestorInactive or Stopped)."
    )


class ClusterQueue(ApiObject):
    """A queue in the tree of teams (cluster-scoped, short name cq)."""

    crd = CrdInfo(
        plural="clusterqueues",
        scope="Cluster",
        short_names=("cq",),
        printer_columns=(
            PrinterColumn("Parent", ".spec.parent", description="The parent queue."),
            PrinterColumn("Priority", ".spec.priority", "integer"),
            PrinterColumn("Weight", ".spec.overQuotaWeight", "integer"),
            PrinterColumn("Pending", ".status.pendingWorkloads", "integer"),
            PrinterColumn("Admitted", ".status.admittedWorkloads", "integer"),
            PrinterColumn(
                "Active",
                '.status.conditions[?(@.type=="Active")].status',
                description="Whether the queue admits workloads.",
            ),
            PrinterColumn("Usage", ".status.usageSummary", description="Usage / quota."),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )
    root_validations = (
        cel(
            "!has(self.spec.parent) || self.spec.parent != self.metadata.name",
            "a ClusterQueue cannot be its own parent",
            field_path=".spec.parent",
        ),
    )

    api_version: Literal["muster.dev/v1alpha1"] = API_VERSION
    kind: Literal["ClusterQueue"] = "ClusterQueue"
    spec: ClusterQueueSpec = Field(default_factory=ClusterQueueSpec)
    status: ClusterQueueStatus = Field(default_factory=ClusterQueueStatus)

    @model_validator(mode="after")
    def _not_own_parent(self) -> Self:
        if self.spec.parent is not None and self.spec.parent == self.metadata.name:
            raise ValueError("spec.parent: a ClusterQueue cannot be its own parent")
        return self


def _short_names(resources: list[str]) -> dict[str, str]:
    # "nvidia.com/gpu" reads as "gpu" in a table cell, unless another vendor's gpu is there.
    short = {r: r.rsplit("/", 1)[-1] for r in resources}
    taken = [short[r] for r in resources]
    return {r: short[r] if taken.count(short[r]) == 1 else r for r in resources}


def _display_order(resource: str) -> tuple[int, str]:
    # Accelerators are what people look for first; the apiserver sorts map keys, so the
    # order must come from here, not from the manifest.
    rank = {"cpu": 1, "memory": 2}.get(resource, 0 if "/" in resource else 3)
    return rank, resource


def usage_summary(spec: ClusterQueueSpec, usage: Mapping[str, Mapping[str, int]]) -> str:
    """Usage against quota per flavor for the `kubectl get cq` column, e.g.
    ``h100: gpu 6/8 cpu 40/64 memory 100Gi/512Gi; a100: gpu 0/4``. Flavors the queue
    has no entry for appear when something is used in them (quota 0)."""
    parts: list[str] = []
    named = [f.name for f in spec.flavors]
    for name in named + sorted(set(usage) - set(named)):
        entry = spec.flavor(name)
        quota = entry.quota if entry else {}
        used = usage.get(name, {})
        resources = sorted(set(quota) | set(used), key=_display_order)
        if not resources:
            continue
        label = _short_names(resources)
        shown = " ".join(
            f"{label[r]} {format_quantity(used.get(r, 0), r)}/{format_quantity(quota.get(r, 0), r)}"
            for r in resources
        )
        parts.append(f"{name}: {shown}")
    summary = "; ".join(parts)
    return summary if len(summary) <= MAX_SUMMARY else summary[: MAX_SUMMARY - 3] + "..."
