"""Scenarios for `muster simulate`.

A scenario is a multi-document YAML of the manifests an admin already has — ResourceFlavor,
ClusterQueue, LocalQueue (muster.dev/v1alpha1), PriorityClass (scheduling.k8s.io/v1),
Node and Namespace (v1), batch/v1 Job, and the serving kinds leaderworkerset.x-k8s.io/v1
LeaderWorkerSet and apps/v1 Deployment (`quota.simulation.serving`: one gang per replica
group; one elastic workload of its replicas) — plus four kinds that exist only in simulations
(apiVersion simulate.muster.dev/v1alpha1):

- Simulation: settings (wall-clock start, stop time, requeue backoff, eviction delay);
- NodePool: `count` identical Ready nodes with `labels` and `allocatable` (a shape), named
  `<pool>-0`, `<pool>-1`, ...;
- WorkloadGenerator: classes of workloads in the style of Kueue's performance tests, each
  with a count per target queue, a creation interval, a runtime, a priority and a request;
- ScaleEvent: at time `at`, set the parallelism of an elastic Job (or a Deployment's replicas);
- Cluster: a worker cluster a ClusterQueue with `spec.dispatch` sends its admitted workloads
  to (the WorkerCluster of a management cluster): its `metadata.labels` are what
  `spec.dispatch.clusterSelector` selects, and it has nodes of its own, `spec.nodes` (Node
  manifests, as the scenario's Node documents) and `spec.nodePools` (a NodePool's spec with
  a `name`). Node names are unique across the whole scenario.

A Job carries its simulated timing in annotations: `muster.dev/submit-at` (when it is
created, a duration from the scenario start, default 0s) and `muster.dev/run-for` (how long
it runs once admitted; required). Durations are Go durations ("90s", "1h30m", "100ms").

Nodes (a Node or a NodePool) make the simulation place pods on nodes, as the controller does;
a scenario without any simulates quota alone. A Node written without conditions is Ready, and
a node whose allocatable has no `pods` entry takes the kubelet's default of 110 pods.

Everything here is pure: it takes decoded YAML documents and returns frozen values, or raises
ManifestError naming the document index, the object, the field and the rule. The documents
every file of manifests holds are read by quota.manifests.documents; this module adds the
scenario's own kinds and timing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, Self

from pydantic import AwareDatetime, Field, ValidationError, model_validator

from quota.api import ManifestError
from quota.api.clusterqueue import ClusterQueue
from quota.api.meta import DNS_SUBDOMAIN, ApiModel, Duration, ObjectMeta, parse_duration
from quota.api.names import ELASTIC_ANNOTATION, JOB_POD_SET, QUEUE_LABEL
from quota.api.quantity import ResourceList, format_quantity
from quota.api.topology import LABEL_KEY, TopologyRequest
from quota.dispatch import NO_WORKERS
from quota.lifecycle.backoff import REQUEUE_BASE_S, REQUEUE_MAX_S
from quota.manifests.documents import (
    Documents,
    capacity,
    flavors,
    invalid,
    nodes,
    priority_classes,
    problem,
    queues,
    read_documents,
    ready,
    subject,
    topologies,
    with_max_pods,
)
from quota.model import convert
from quota.model.nodeconvert import node_from_manifest
from quota.model.nodes import Node
from quota.model.resources import FlavorResource
from quota.model.snapshot import Flavor, PodSet, QueueSpec
from quota.placement.topology import level_name
from quota.simulation import serving
from quota.simulation.serving import SERVING_KINDS

SCENARIO_API: Final = "simulate.muster.dev/v1alpha1"
SUBMIT_AT_ANNOTATION = "muster.dev/submit-at"
RUN_FOR_ANNOTATION = "muster.dev/run-for"
DEFAULT_START = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)  # a Monday morning, for the history
# A simulated span is sampled every sample interval; more samples than this would take
# minutes and gigabytes, so such a scenario is refused with what to change.
MAX_SAMPLES = 100_000
# Simulated wall-clock time stays well inside what datetime can represent.
EARLIEST_START = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_START = datetime(9000, 1, 1, tzinfo=UTC)


# ----------------------------------------------------------------- simulation-only kinds


class _SimObject(ApiModel):
    api_version: Literal["simulate.muster.dev/v1alpha1"] = SCENARIO_API
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


class SimulationSpec(ApiModel):
    """How the simulation runs."""

    start: AwareDatetime = Field(
        DEFAULT_START, description="Wall-clock time of simulated second 0 (for the history)."
    )
    until: Duration | None = Field(None, description="Stop simulating at this time.")
    requeue_base: Duration = Field(
        timedelta(seconds=REQUEUE_BASE_S),
        description="Backoff before an evicted workload competes again, doubled per eviction.",
    )
    requeue_max: Duration = Field(
        timedelta(seconds=REQUEUE_MAX_S), description="Cap on that backoff."
    )
    eviction_delay: Duration = Field(
        timedelta(0),
        description="How long an evicted workload keeps its quota (pods terminating).",
    )
    sample_interval: Duration = Field(
        timedelta(minutes=1), description="Resolution of queue samples in the history store."
    )


class Simulation(_SimObject):
    """Settings of a simulation; at most one per scenario."""

    kind: Literal["Simulation"] = "Simulation"
    spec: SimulationSpec = Field(default_factory=SimulationSpec)


class PoolLevel(ApiModel):
    """One level of a pool's topology: `domains` domains inside each domain of the level
    above, told apart by the node label `label`."""

    label: str = Field(min_length=1, max_length=316, pattern=LABEL_KEY)
    domains: int = Field(ge=1, le=100_000)


class NodePoolSpec(ApiModel):
    """`count` identical Ready nodes, optionally split evenly into nested domains."""

    count: int = Field(ge=0, le=100_000)
    labels: dict[str, str] = Field(default_factory=dict)
    allocatable: ResourceList
    levels: list[PoolLevel] = Field(
        default_factory=list,
        max_length=8,
        description="Widest first, e.g. 4 blocks of 8 racks: node i carries each level's "
        "label with the value <pool>-<level><j>[-<level><k>...] of its domain.",
    )

    @model_validator(mode="after")
    def _levels_split_evenly(self) -> Self:
        domains = 1
        for level in self.levels:
            domains *= level.domains
        if self.count % domains:
            raise ValueError(f"levels: count {self.count} is not a multiple of {domains} domains")
        labels = [level.label for level in self.levels]
        if len(set(labels)) != len(labels) or set(labels) & set(self.labels):
            raise ValueError("levels: each label once, and not among spec.labels")
        return self

    def node_labels(self, pool: str, i: int) -> dict[str, str]:
        """The labels of node `i` of pool `pool`: the pool's, and its domain at each level."""
        out = dict(self.labels)
        per = self.count
        value = pool
        for level in self.levels:
            per //= level.domains
            value += f"-{level_name(level.label)}{i // per % level.domains}"
            out[level.label] = value
        return out


class NodePool(_SimObject):
    """A pool of identical nodes, given as a count and a shape."""

    kind: Literal["NodePool"] = "NodePool"
    spec: NodePoolSpec


class WorkloadClassSpec(ApiModel):
    """One class of generated workloads (e.g. "small": 1 cpu for 200ms every 100ms)."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_SUBDOMAIN)
    count: int = Field(ge=0, le=10_000_000, description="Workloads per target queue.")
    interval: Duration = Field(
        description="Time between two creations in one target queue (0s: all at once)."
    )
    start_at: Duration = Field(timedelta(0), description="Time of the first creation.")
    runtime: Duration = Field(description="How long each workload runs once admitted.")
    priority: int | None = None
    priority_class_name: str | None = None
    pods: int = Field(1, ge=1, le=100_000, description="Pods per workload.")
    requests: ResourceList = Field(description="What one pod requests.")
    topology_request: TopologyRequest | None = Field(
        None, description="As a Workload pod set's: keep the pods in one domain, or prefer to."
    )
    jitter: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Spread interval and runtime by up to this fraction, seeded by --seed.",
    )
    preemptible: bool | None = Field(
        None,
        description="As the annotation muster.dev/preemptible on each workload: overrides "
        "its queue's preemptibleBelowPriority (unset: the queue's threshold decides).",
    )

    @model_validator(mode="after")
    def _one_priority(self) -> Self:
        if self.priority is not None and self.priority_class_name is not None:
            raise ValueError("give priority or priorityClassName, not both")
        if self.runtime <= timedelta(0):
            raise ValueError("runtime must be positive")
        size = self.topology_request.slice_size if self.topology_request else None
        if size is not None and self.pods % size:
            raise ValueError(f"topologyRequest.sliceSize {size} does not divide pods {self.pods}")
        return self


class WorkloadGeneratorSpec(ApiModel):
    """Classes of workloads created in every target LocalQueue."""

    targets: list[str] = Field(default_factory=list, description='LocalQueues as "namespace/name".')
    all_local_queues: bool = Field(False, description="Target every LocalQueue.")
    classes: list[WorkloadClassSpec] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _some_target(self) -> Self:
        if not self.targets and not self.all_local_queues:
            raise ValueError("name targets or set allLocalQueues: true")
        names = [c.name for c in self.classes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"class names must be unique: {', '.join(duplicates)}")
        return self


class WorkloadGenerator(_SimObject):
    """Workloads generated in the style of Kueue's performance tests."""

    kind: Literal["WorkloadGenerator"] = "WorkloadGenerator"
    spec: WorkloadGeneratorSpec


class ScaleEventSpec(ApiModel):
    """Set an elastic Job's parallelism at a given time."""

    job: str = Field(description='The Job, as "namespace/name".')
    at: Duration
    parallelism: int = Field(ge=1, le=100_000)


class ScaleEvent(_SimObject):
    """At time `at`, the Job's parallelism becomes `parallelism` (scale up or down)."""

    kind: Literal["ScaleEvent"] = "ScaleEvent"
    spec: ScaleEventSpec


class ClusterNodePool(NodePoolSpec):
    """A NodePool of a worker cluster: a NodePool's spec and the pool's name."""

    name: str = Field(min_length=1, max_length=200, pattern=DNS_SUBDOMAIN)


class ClusterSpec(ApiModel):
    """The nodes of a worker cluster."""

    nodes: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=100_000,
        description="Node manifests (metadata.name, labels, status.allocatable, ...), as the "
        "scenario's Node documents; apiVersion and kind may be left out.",
    )
    node_pools: list[ClusterNodePool] = Field(default_factory=list, max_length=1_000)


class Cluster(_SimObject):
    """A worker cluster: its labels (metadata.labels) and its own nodes."""

    kind: Literal["Cluster"] = "Cluster"
    spec: ClusterSpec = Field(default_factory=ClusterSpec)


SIM_KINDS: dict[str, type[_SimObject]] = {
    "Simulation": Simulation,
    "NodePool": NodePool,
    "WorkloadGenerator": WorkloadGenerator,
    "ScaleEvent": ScaleEvent,
    "Cluster": Cluster,
}
# A label value: at most 63 characters, alphanumerics at both ends (empty is allowed).
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


# ----------------------------------------------------------------------- the result


@dataclass(frozen=True, slots=True)
class Settings:
    """Simulation settings, in seconds."""

    name: str = "scenario"
    start: datetime = DEFAULT_START
    until_s: float | None = None
    requeue_base_s: float = REQUEUE_BASE_S
    requeue_max_s: float = REQUEUE_MAX_S
    eviction_delay_s: float = 0.0
    sample_interval_s: float = 60.0


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A workload to submit at `submit_at` that runs for `run_for` once admitted."""

    key: str  # "namespace/name"
    local_queue: str
    cluster_queue: str
    priority: int
    submit_at: float
    run_for: float
    pod_sets: tuple[PodSet, ...]
    elastic: bool = False
    waits_for: str = ""  # why it can never be decided (`convert.priority_wait`), if it cannot
    preemptible: bool | None = None  # its muster.dev/preemptible annotation, if any
    disruption_single: bool = False  # muster.dev/disruption-mode: single


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """One class of a generator, resolved: times in seconds, one pod set shape."""

    name: str
    count: int
    interval_s: float
    start_s: float
    runtime_s: float
    priority: int
    pod_set: PodSet
    jitter: float = 0.0
    waits_for: str = ""  # as JobSpec.waits_for
    preemptible: bool | None = None  # as JobSpec.preemptible


@dataclass(frozen=True, slots=True)
class Target:
    """A LocalQueue a generator creates workloads in."""

    namespace: str
    local_queue: str
    cluster_queue: str


@dataclass(frozen=True, slots=True)
class Generator:
    """A WorkloadGenerator, resolved against the scenario's queues."""

    name: str
    classes: tuple[WorkloadClass, ...]
    targets: tuple[Target, ...]

    def workload_count(self) -> int:
        """How many workloads the generator creates."""
        return sum(c.count for c in self.classes) * len(self.targets)


@dataclass(frozen=True, slots=True)
class Scale:
    """A resolved ScaleEvent."""

    at: float
    job: str
    parallelism: int


@dataclass(frozen=True, slots=True)
class Worker:
    """A worker cluster of the scenario: its name, labels and nodes."""

    name: str
    labels: Mapping[str, str]
    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class Scenario:
    """Everything a simulation needs, resolved and checked."""

    settings: Settings
    queues: Mapping[str, QueueSpec]
    flavors: Mapping[str, Flavor]
    capacity: Mapping[FlavorResource, int] | None
    jobs: tuple[JobSpec, ...] = ()
    generators: tuple[Generator, ...] = ()
    scale_events: tuple[Scale, ...] = ()
    local_queues: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # The nodes pods are placed on (Nodes, then NodePools' nodes); None: quota-only mode.
    nodes: tuple[Node, ...] | None = None
    topologies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Worker clusters (Cluster documents), by name order, and, for each ClusterQueue that
    # dispatches (QueueSpec.remote), the clusters its clusterSelector picks, by name. A
    # dispatching queue missing here (a Scenario built by other means than a file) has its
    # workloads run at admission, on quota alone.
    clusters: tuple[Worker, ...] = ()
    dispatch_to: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Why a dispatching queue's workloads can go nowhere, for a selector that picks no cluster.
    no_workers: Mapping[str, str] = field(default_factory=dict)

    def workload_count(self) -> int:
        """Jobs plus generated workloads."""
        return len(self.jobs) + sum(g.workload_count() for g in self.generators)


# -------------------------------------------------------------------------- parsing


@dataclass
class _SimDocs:
    """The scenario's own kinds, each with its index in the file."""

    simulations: list[tuple[int, Simulation]] = field(default_factory=list)
    node_pools: list[tuple[int, NodePool]] = field(default_factory=list)
    generators: list[tuple[int, WorkloadGenerator]] = field(default_factory=list)
    scale_events: list[tuple[int, ScaleEvent]] = field(default_factory=list)
    serving: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    clusters: list[tuple[int, Cluster]] = field(default_factory=list)

    def file(self, docs: Documents, index: int, doc: Mapping[str, Any]) -> None:
        """Check one document of a simulation-only kind and file it (`OtherKinds`)."""
        kind = str(doc.get("kind") or "")
        if kind in SERVING_KINDS:
            meta = doc.get("metadata") or {}
            if not meta.get("name"):
                raise invalid(index, doc, "metadata.name", "required field is missing")
            namespace = str(meta.get("namespace") or "default")
            docs.remember((kind, namespace, str(meta["name"])), index, doc)
            self.serving.append((index, doc))
            return
        if doc.get("apiVersion") != SCENARIO_API:
            raise invalid(index, doc, "apiVersion", f"{kind} needs apiVersion {SCENARIO_API}")
        try:
            sim = SIM_KINDS[kind].model_validate(doc)
        except ValidationError as error:
            problems = [problem(e) for e in error.errors(include_url=False)]
            raise ManifestError(index, subject(doc), problems) from None
        if not sim.metadata.name and kind != "Simulation":
            raise invalid(index, doc, "metadata.name", "required field is missing")
        docs.remember((kind, "", sim.metadata.name or ""), index, doc)
        if isinstance(sim, Simulation):
            if self.simulations:
                raise invalid(index, doc, "kind", "at most one Simulation per scenario")
            self.simulations.append((index, sim))
        elif isinstance(sim, NodePool):
            self.node_pools.append((index, sim))
        elif isinstance(sim, WorkloadGenerator):
            self.generators.append((index, sim))
        elif isinstance(sim, ScaleEvent):
            self.scale_events.append((index, sim))
        elif isinstance(sim, Cluster):
            self.clusters.append((index, sim))


def _pool_manifests(name: str, spec: NodePoolSpec) -> list[Mapping[str, Any]]:
    """The Ready Node manifests of pool `name`: `<name>-0`, `<name>-1`, ..."""
    allocatable = {r: format_quantity(v, r) for r, v in spec.allocatable.items()}
    return [
        {
            "metadata": {"name": f"{name}-{i}", "labels": spec.node_labels(name, i)},
            "status": {
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for i in range(spec.count)
    ]


def _pool_nodes(sim: _SimDocs) -> list[Mapping[str, Any]]:
    nodes: list[Mapping[str, Any]] = []
    for _, pool in sim.node_pools:
        nodes.extend(_pool_manifests(pool.metadata.name or "", pool.spec))
    return nodes


def _cluster_manifests(cluster: Cluster) -> list[tuple[str, Mapping[str, Any]]]:
    """A worker cluster's Ready Node manifests, each with where the Cluster declares it."""
    out: list[tuple[str, Mapping[str, Any]]] = [
        (f"spec.nodes[{i}]", ready(raw) if isinstance(raw, Mapping) else raw)
        for i, raw in enumerate(cluster.spec.nodes)
    ]
    for i, pool in enumerate(cluster.spec.node_pools):
        out.extend((f"spec.nodePools[{i}]", m) for m in _pool_manifests(pool.name, pool))
    return out


def _check_labels(index: int, doc: Mapping[str, Any], labels: Mapping[str, str]) -> None:
    for key, value in labels.items():
        path = f"metadata.labels[{key}]"
        if not re.match(LABEL_KEY, key):
            raise invalid(
                index,
                doc,
                path,
                "a label key is an optional DNS-subdomain prefix and '/', then a name of at "
                "most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric",
            )
        if len(value) > 63 or not LABEL_VALUE.match(value):
            raise invalid(
                index,
                doc,
                path,
                f"a label value is at most 63 letters, digits, '-', '_' or '.', starting and "
                f"ending alphanumeric (got {value!r})",
            )


def _workers(docs: Documents, sim: _SimDocs, local: tuple[Node, ...] | None) -> tuple[Worker, ...]:
    """The scenario's worker clusters, checked: labels, node manifests, node names unique
    across the whole scenario (the report tells nodes apart by name)."""
    where = {node.name: "a Node or NodePool of the scenario" for node in local or ()}
    out: list[Worker] = []
    for index, cluster in sim.clusters:
        doc = docs.raw[index]
        name = cluster.metadata.name or ""
        _check_labels(index, doc, cluster.metadata.labels)
        nodes: list[Node] = []
        for path, raw in _cluster_manifests(cluster):
            nodes.append(_cluster_node(index, doc, path, raw))
            node = nodes[-1].name
            field_path = f"{path}.metadata.name" if path.startswith("spec.nodes[") else path
            if node in where:
                raise invalid(
                    index,
                    doc,
                    field_path,
                    f"node {node} is also {where[node]}: node names are unique across the "
                    "scenario; rename one",
                )
            where[node] = f"a node of Cluster {name}"
        out.append(Worker(name, dict(cluster.metadata.labels), tuple(nodes)))
    return tuple(sorted(out, key=lambda w: w.name))


def _cluster_node(index: int, doc: Mapping[str, Any], path: str, raw: Any) -> Node:
    """One node of a Cluster, read as a Node document is; errors name the Cluster and the
    node's place in it."""
    if not isinstance(raw, Mapping):
        raise invalid(index, doc, path, "expected a Node manifest (a mapping)")
    kind, version = raw.get("kind"), raw.get("apiVersion")
    if kind not in (None, "Node") or version not in (None, "v1"):
        raise invalid(index, doc, path, "expected a Node (apiVersion v1), or no kind at all")
    status = raw.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping) or not allocatable:
        raise invalid(
            index, doc, f"{path}.status.allocatable", "required: what the node offers to pods"
        )
    try:
        return with_max_pods(node_from_manifest(raw, index=index))
    except ManifestError as error:
        raise ManifestError(
            index, subject(doc), [(f"{path}.{field}", rule) for field, rule in error.problems]
        ) from None


def _selector_text(cq: ClusterQueue) -> str:
    assert cq.spec.dispatch is not None
    selector = cq.spec.dispatch.cluster_selector
    parts = [f"{k}={v}" for k, v in sorted(selector.match_labels.items())]
    for e in selector.match_expressions:
        values = f" ({', '.join(e.values)})" if e.values else ""
        parts.append(f"{e.key} {e.operator}{values}")
    return f"({', '.join(parts) or 'every cluster'})"


def _dispatch(
    docs: Documents, workers: Sequence[Worker]
) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Each dispatching queue's clusters, by name, and why a queue whose selector picks none
    has its workloads wait (allowed, as in a cluster whose WorkerClusters come later)."""
    picks: dict[str, tuple[str, ...]] = {}
    why: dict[str, str] = {}
    for _, cq in docs.cluster_queues:
        if cq.spec.dispatch is None:
            continue
        selector = cq.spec.dispatch.cluster_selector
        chosen = tuple(w.name for w in workers if selector.matches(dict(w.labels)))
        picks[cq.name] = chosen
        if not chosen:
            why[cq.name] = f"{NO_WORKERS} {_selector_text(cq)}: " + (
                "the scenario declares no Cluster"
                if not workers
                else f"none of the scenario's Clusters ({', '.join(w.name for w in workers)}) "
                "carries the labels it asks for"
            )
    return picks, why


def _refuse_resizing_remote(
    specs: Mapping[str, QueueSpec], timed: Sequence[tuple[int, Mapping[str, Any], JobSpec]]
) -> None:
    for index, doc, job in timed:
        spec = specs.get(job.cluster_queue)
        if spec is not None and spec.remote and job.elastic:
            raise invalid(
                index,
                doc,
                f"metadata.labels[{QUEUE_LABEL}]",
                f"ClusterQueue {job.cluster_queue} dispatches to worker clusters "
                "(spec.dispatch), where the simulator does not resize workloads: give elastic "
                "Jobs and Deployments a queue without spec.dispatch",
            )


def _nodes(docs: Documents, sim: _SimDocs) -> tuple[Node, ...] | None:
    """The scenario's nodes as placement sees them; None when it has none (quota-only)."""
    found = list(nodes(docs) or ())
    names = {node.name: index for node, (index, _) in zip(found, docs.nodes, strict=True)}
    for index, pool in sim.node_pools:
        for i in range(pool.spec.count):
            name = f"{pool.metadata.name}-{i}"
            if name in names:
                raise invalid(
                    index,
                    docs.raw[index],
                    "metadata.name",
                    f"the pool's node {name} has the name of the Node in document {names[name]}; "
                    "rename the pool or the Node",
                )
            names[name] = index
            found.append(
                with_max_pods(
                    Node(
                        name=name,
                        allocatable=dict(pool.spec.allocatable),
                        labels=pool.spec.node_labels(pool.metadata.name or "", i),
                    )
                )
            )
    return tuple(found) or None


def _capacity(
    docs: Documents, sim: _SimDocs, flavors: Mapping[str, Flavor]
) -> dict[FlavorResource, int] | None:
    # The worker clusters' nodes count too: queues that dispatch share them out, as the
    # controller adds its WorkerClusters' nodes to the capacity it admits against.
    workers = [m for _, cluster in sim.clusters for _, m in _cluster_manifests(cluster)]
    found = capacity(docs, flavors, [*_pool_nodes(sim), *workers])
    if found is None:
        return None
    # A simulated flavor no node provides can never admit anything: that is a mistake in
    # the scenario, not an interesting outcome.
    used = {f.name for _, cq in docs.cluster_queues for f in cq.spec.flavors}
    for index, rf in docs.flavors:
        if rf.name not in used:
            continue
        if not any(amount > 0 for (fl, _), amount in found.items() if fl == rf.name):
            raise invalid(
                index,
                docs.raw[index],
                "spec.nodeLabels",
                "no Node or NodePool of the scenario, nor any node of a Cluster, carries all "
                "of these labels, so the flavor would have no capacity",
            )
    return found or None


def _seconds(value: timedelta) -> float:
    return value.total_seconds()


def _job_timing(index: int, doc: Mapping[str, Any]) -> tuple[float, float]:
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    raw_submit = annotations.get(SUBMIT_AT_ANNOTATION, "0s")
    path = f"metadata.annotations[{SUBMIT_AT_ANNOTATION}]"
    try:
        submit = parse_duration(raw_submit).total_seconds()
    except ValueError as error:
        raise invalid(index, doc, path, str(error)) from None
    path = f"metadata.annotations[{RUN_FOR_ANNOTATION}]"
    if RUN_FOR_ANNOTATION not in annotations:
        raise invalid(index, doc, path, "required: how long the Job runs once admitted (e.g. 2h)")
    try:
        run_for = parse_duration(annotations[RUN_FOR_ANNOTATION]).total_seconds()
    except ValueError as error:
        raise invalid(index, doc, path, str(error)) from None
    if run_for <= 0:
        raise invalid(index, doc, path, "must be a positive duration")
    return submit, run_for


def _jobs(
    docs: Documents,
    local: Mapping[tuple[str, str], str],
    classes: Mapping[str, int],
    default_class: str | None,
) -> tuple[JobSpec, ...]:
    jobs: list[JobSpec] = []
    for index, doc in docs.jobs:
        model = convert.job_to_workload_model(
            doc, classes, global_default=default_class, index=index
        )
        namespace = model.metadata.namespace or "default"
        queue = model.spec.queue_name
        cluster_queue = local.get((namespace, queue))
        if cluster_queue is None:
            raise invalid(
                index,
                doc,
                f"metadata.labels[{QUEUE_LABEL}]",
                f"LocalQueue {namespace}/{queue} does not exist in the scenario",
            )
        submit, run_for = _job_timing(index, doc)
        jobs.append(
            JobSpec(
                key=f"{namespace}/{model.name}",
                local_queue=queue,
                cluster_queue=cluster_queue,
                priority=model.spec.priority or 0,
                submit_at=submit,
                run_for=run_for,
                pod_sets=convert.pod_sets(model),
                elastic=convert.job_is_elastic(doc),
                waits_for=convert.priority_wait(
                    model.spec.priority, model.spec.priority_class_name, classes
                )
                or "",
                preemptible=model.preemptible,
                disruption_single=model.spec.disruption_mode == "Single",
            )
        )
    return tuple(jobs)


def _serving(
    sim: _SimDocs,
    local: Mapping[tuple[str, str], str],
    classes: Mapping[str, int],
    default_class: str | None,
) -> tuple[tuple[int, Mapping[str, Any], JobSpec], ...]:
    """The workloads of the scenario's LeaderWorkerSets and Deployments, each with the index
    and document it comes from."""
    out: list[tuple[int, Mapping[str, Any], JobSpec]] = []
    for index, doc in sim.serving:
        queue, cluster_queue = serving.queue_of(index, doc, lambda ns, q: local.get((ns, q)))
        submit, run_for = _job_timing(index, doc)
        meta = doc.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        spec = doc.get("spec") or {}
        template = (
            ((spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {})
            if doc.get("kind") == "LeaderWorkerSet"
            else (spec.get("template") or {})
        )
        class_name = (template.get("spec") or {}).get("priorityClassName") or default_class
        priority = classes.get(str(class_name), 0) if class_name else 0
        waits = convert.priority_wait(None, class_name, classes) or ""
        for suffix, pod_sets, elastic, single in serving.serving_groups(index, doc):
            job = JobSpec(
                key=f"{namespace}/{meta['name']}{suffix}",
                local_queue=queue,
                cluster_queue=cluster_queue,
                priority=priority,
                submit_at=submit,
                run_for=run_for,
                pod_sets=pod_sets,
                elastic=elastic,
                waits_for=waits,
                disruption_single=single,
            )
            out.append((index, doc, job))
    return tuple(out)


def _generators(
    docs: Documents,
    sim: _SimDocs,
    local: Mapping[tuple[str, str], str],
    classes: Mapping[str, int],
) -> tuple[Generator, ...]:
    out: list[Generator] = []
    for index, gen in sim.generators:
        doc = docs.raw[index]
        targets: list[Target] = []
        if gen.spec.all_local_queues:
            targets = [Target(ns, name, cq) for (ns, name), cq in sorted(local.items())]
        for i, target in enumerate(gen.spec.targets):
            namespace, _, name = target.rpartition("/")
            namespace = namespace or "default"
            if (namespace, name) not in local:
                raise invalid(
                    index,
                    doc,
                    f"spec.targets[{i}]",
                    f"LocalQueue {namespace}/{name} does not exist in the scenario",
                )
            targets.append(Target(namespace, name, local[(namespace, name)]))
        resolved: list[WorkloadClass] = []
        for cls in gen.spec.classes:
            resolved.append(
                WorkloadClass(
                    name=cls.name,
                    count=cls.count,
                    interval_s=_seconds(cls.interval),
                    start_s=_seconds(cls.start_at),
                    runtime_s=_seconds(cls.runtime),
                    priority=convert.workload_priority(
                        cls.priority, cls.priority_class_name, classes
                    ),
                    pod_set=PodSet(
                        JOB_POD_SET,
                        cls.pods,
                        dict(cls.requests),
                        topology=convert.pod_set_topology(cls.topology_request),
                    ),
                    jitter=cls.jitter,
                    waits_for=convert.priority_wait(cls.priority, cls.priority_class_name, classes)
                    or "",
                    preemptible=cls.preemptible,
                )
            )
        out.append(Generator(gen.metadata.name or "", tuple(resolved), tuple(targets)))
    return tuple(out)


def _scale_events(docs: Documents, sim: _SimDocs, jobs: Sequence[JobSpec]) -> tuple[Scale, ...]:
    by_key = {job.key: job for job in jobs}
    out: list[Scale] = []
    for index, event in sim.scale_events:
        doc = docs.raw[index]
        name = event.spec.job if "/" in event.spec.job else f"default/{event.spec.job}"
        job = by_key.get(name)
        if job is None:
            raise invalid(index, doc, "spec.job", f"Job {name} does not exist in the scenario")
        if not job.elastic:
            raise invalid(
                index,
                doc,
                "spec.job",
                f"Job {name} is not elastic: only Jobs annotated "
                f'{ELASTIC_ANNOTATION}: "true" (and Deployments) resize without a restart',
            )
        out.append(Scale(_seconds(event.spec.at), name, event.spec.parallelism))
    return tuple(sorted(out, key=lambda s: s.at))


SCENARIO_KINDS = frozenset(
    {"ResourceFlavor", "ClusterQueue", "LocalQueue", "PriorityClass", "Node", "Namespace", "Job"}
    | {"Topology"}
    | set(SIM_KINDS)
    | set(SERVING_KINDS)
)


def _check_span(
    sim: _SimDocs, settings: Settings, timed: Sequence[tuple[int, Mapping[str, Any], JobSpec]]
) -> None:
    """Refuse a scenario whose simulated span needs more samples than MAX_SAMPLES: name the
    Job (or the Simulation's `until`) that makes it so long, and what to change."""
    interval = settings.sample_interval_s
    if settings.until_s is not None:
        if settings.until_s / interval > MAX_SAMPLES:
            index, _ = sim.simulations[0] if sim.simulations else (0, None)
            raise ManifestError(
                index,
                "Simulation" if sim.simulations else "the command line",
                [
                    (
                        "spec.until" if sim.simulations else "--until",
                        f"{settings.until_s:,.0f}s at a sample interval of {interval:,.0f}s is "
                        f"more than {MAX_SAMPLES:,} samples; shorten it or raise "
                        "spec.sampleInterval",
                    )
                ],
            )
        return
    for index, doc, job in timed:
        end = job.submit_at + job.run_for
        if end / interval > MAX_SAMPLES:
            raise invalid(
                index,
                doc,
                f"metadata.annotations[{RUN_FOR_ANNOTATION}]",
                f"the Job ends {end:,.0f}s into the simulation: more than {MAX_SAMPLES:,} "
                f"samples at a sample interval of {interval:,.0f}s; shorten it, set a "
                "Simulation's spec.until, or raise its spec.sampleInterval",
            )


def parse_scenario(docs: Sequence[Any], name: str = "scenario") -> Scenario:
    """Check and resolve a scenario's documents; raise ManifestError on the first problem."""
    sim = _SimDocs()
    read = read_documents(docs, SCENARIO_KINDS, "muster simulate", sim.file)
    classes, default_class = priority_classes(read)
    specs, local = queues(read)
    engine_flavors = flavors(read)
    local_nodes = _nodes(read, sim)
    workers = _workers(read, sim, local_nodes)
    found = _capacity(read, sim, engine_flavors)
    timed = [
        (index, doc, job)
        for (index, doc), job in zip(
            read.jobs, _jobs(read, local, classes, default_class), strict=True
        )
    ]
    timed += _serving(sim, local, classes, default_class)
    jobs = tuple(job for _, _, job in timed)
    settings = Settings(name=name)
    if sim.simulations:
        index, simulation = sim.simulations[0]
        spec = simulation.spec
        if not EARLIEST_START <= spec.start <= LATEST_START:
            raise invalid(
                index,
                read.raw[index],
                "spec.start",
                f"must be between {EARLIEST_START:%Y-%m-%d} and {LATEST_START:%Y-%m-%d} "
                f"(got {spec.start.isoformat()})",
            )
        settings = Settings(
            name=simulation.metadata.name or name,
            start=spec.start.astimezone(UTC),
            until_s=_seconds(spec.until) if spec.until is not None else None,
            requeue_base_s=_seconds(spec.requeue_base),
            requeue_max_s=max(_seconds(spec.requeue_max), _seconds(spec.requeue_base)),
            eviction_delay_s=_seconds(spec.eviction_delay),
            sample_interval_s=max(1.0, _seconds(spec.sample_interval)),
        )
    _check_span(sim, settings, timed)
    _refuse_resizing_remote(specs, timed)
    dispatch_to, no_workers = _dispatch(read, workers)
    return Scenario(
        settings=settings,
        queues=specs,
        flavors=engine_flavors,
        capacity=found,
        jobs=jobs,
        generators=_generators(read, sim, local, classes),
        scale_events=_scale_events(read, sim, jobs),
        local_queues=local,
        nodes=local_nodes,
        topologies=topologies(read),
        clusters=workers,
        dispatch_to=dispatch_to,
        no_workers=no_workers,
    )
