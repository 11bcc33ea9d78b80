"""Scenarios for `muster simulate`, and cluster states for `muster fairshare` / `muster admit`.

A scenario is a multi-document YAML of the manifests an admin already has — ResourceFlavor,
ClusterQueue, LocalQueue (muster.dev/v1alpha1), PriorityClass (scheduling.k8s.io/v1),
Node and Namespace (v1), batch/v1 Job — plus four kinds that exist only in simulations
(apiVersion simulate.muster.dev/v1alpha1):

- Simulation: settings (wall-clock start, stop time, requeue backoff, eviction delay);
- NodePool: `count` identical Ready nodes with `labels` and `allocatable` (a shape), named
  `<pool>-0`, `<pool>-1`, ...;
- WorkloadGenerator: classes of workloads in the style of Kueue's performance tests, each
  with a count per target queue, a creation interval, a runtime, a priority and a request;
- ScaleEvent: at time `at`, set the parallelism of an elastic Job.

A Job carries its simulated timing in annotations: `muster.dev/submit-at` (when it is
created, a duration from the scenario start, default 0s) and `muster.dev/run-for` (how long
it runs once admitted; required). Durations are Go durations ("90s", "1h30m", "100ms").

Nodes (a Node or a NodePool) make the simulation place pods on nodes, as the controller does;
a scenario without any simulates quota alone. A Node written without conditions is Ready, and
a node whose allocatable has no `pods` entry takes the kubelet's default of 110 pods.

Everything here is pure: it takes decoded YAML documents and returns frozen values, or raises
ManifestError naming the document index, the object, the field and the rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, Self

from pydantic import AwareDatetime, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from quota.api import ManifestError, parse_manifest
from quota.api.clusterqueue import ClusterQueue
from quota.api.conditions import find_condition
from quota.api.localqueue import LocalQueue
from quota.api.meta import DNS_SUBDOMAIN, ApiModel, Duration, ObjectMeta, parse_duration
from quota.api.names import ELASTIC_ANNOTATION, JOB_POD_SET, QUEUE_LABEL
from quota.api.quantity import QuantityError, ResourceList, format_quantity, parse_quantity
from quota.api.queuetree import check_queue_tree
from quota.api.resourceflavor import ResourceFlavor
from quota.api.workload import Workload as WorkloadModel
from quota.lifecycle.backoff import REQUEUE_BASE_S, REQUEUE_MAX_S
from quota.model import convert
from quota.model.nodeconvert import node_from_manifest
from quota.model.nodes import Node
from quota.model.resources import FlavorResource
from quota.model.snapshot import Flavor, PodSet, QueueSpec, Snapshot, Workload

SCENARIO_API: Final = "simulate.muster.dev/v1alpha1"
SUBMIT_AT_ANNOTATION = "muster.dev/submit-at"
RUN_FOR_ANNOTATION = "muster.dev/run-for"
DEFAULT_START = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)  # a Monday morning, for the history
DEFAULT_MAX_PODS = 110  # the kubelet's default, for nodes that do not say
_DNS = re.compile(DNS_SUBDOMAIN)
# A simulated span is sampled every sample interval; more samples than this would take
# minutes and gigabytes, so such a scenario is refused with what to change.
MAX_SAMPLES = 100_000
MAX_TREE_DEPTH = 32  # levels of ClusterQueues, far more than any organisation has
# Simulated wall-clock time stays well inside what datetime can represent.
EARLIEST_START = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_START = datetime(9000, 1, 1, tzinfo=UTC)

# Cross-object rules the tree check reports that make a scenario or cluster file unusable
# (as opposed to Stopped, which is a legitimate state to simulate).
_BROKEN_TREE = {"Cycle": "spec.parent", "ParentNotFound": "spec.parent"}


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


class NodePoolSpec(ApiModel):
    """`count` identical Ready nodes."""

    count: int = Field(ge=0, le=100_000)
    labels: dict[str, str] = Field(default_factory=dict)
    allocatable: ResourceList


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
    jitter: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Spread interval and runtime by up to this fraction, seeded by --seed.",
    )

    @model_validator(mode="after")
    def _one_priority(self) -> Self:
        if self.priority is not None and self.priority_class_name is not None:
            raise ValueError("give priority or priorityClassName, not both")
        if self.runtime <= timedelta(0):
            raise ValueError("runtime must be positive")
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


SIM_KINDS: dict[str, type[_SimObject]] = {
    "Simulation": Simulation,
    "NodePool": NodePool,
    "WorkloadGenerator": WorkloadGenerator,
    "ScaleEvent": ScaleEvent,
}


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

    def workload_count(self) -> int:
        """Jobs plus generated workloads."""
        return len(self.jobs) + sum(g.workload_count() for g in self.generators)


@dataclass(frozen=True)
class ClusterState:
    """A cluster file for `muster fairshare` / `muster admit`: one snapshot, plus names."""

    snapshot: Snapshot
    # Workload key -> its LocalQueue ("" for admitted workloads found by ClusterQueue).
    local_queue_of: Mapping[str, str] = field(default_factory=dict)


# -------------------------------------------------------------------------- parsing


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int) or "." in part or "/" in part:
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _rule(error: ErrorDetails) -> str:
    if error["type"] == "missing":
        return "required field is missing"
    if error["type"] == "extra_forbidden":
        return "unknown field (check the spelling; the files in examples/ use every field)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] not in ("value_error", "missing"):
        message += f" (got {error['input']!r})"
    return message


def _problem(error: ErrorDetails) -> tuple[str, str]:
    path, rule = _path(error["loc"]), _rule(error)
    if rule.startswith("[") and "]: " in rule:
        # A rule about one entry of a mapping starts with its key: "[nvidia.com/gpu]: ...".
        entry, _, rule = rule.partition(": ")
        path += entry
    return path, rule


def _subject(doc: Mapping[str, Any]) -> str:
    kind = doc.get("kind") or "object without kind"
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name")
    if not name:
        return str(kind)
    namespace = meta.get("namespace")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def _error(index: int, doc: Mapping[str, Any], path: str, rule: str) -> ManifestError:
    return ManifestError(index, _subject(doc), [(path, rule)])


@dataclass
class _Docs:
    """Documents sorted by kind, each with its index in the file."""

    flavors: list[tuple[int, ResourceFlavor]] = field(default_factory=list)
    cluster_queues: list[tuple[int, ClusterQueue]] = field(default_factory=list)
    local_queues: list[tuple[int, LocalQueue]] = field(default_factory=list)
    workloads: list[tuple[int, WorkloadModel]] = field(default_factory=list)
    priority_classes: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    nodes: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    jobs: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    simulations: list[tuple[int, Simulation]] = field(default_factory=list)
    node_pools: list[tuple[int, NodePool]] = field(default_factory=list)
    generators: list[tuple[int, WorkloadGenerator]] = field(default_factory=list)
    scale_events: list[tuple[int, ScaleEvent]] = field(default_factory=list)
    raw: dict[int, Mapping[str, Any]] = field(default_factory=dict)


# Kubernetes kinds a scenario or cluster file may hold, with the apiVersion each must have.
_CORE_KINDS_BY_KIND = {
    "Namespace": "v1",
    "Node": "v1",
    "PriorityClass": "scheduling.k8s.io/v1",
    "Job": "batch/v1",
}


def _name_of(doc: Mapping[str, Any], index: int, namespaced: bool) -> tuple[str, str]:
    """The namespace and name of a Kubernetes object, checked as the apiserver checks them."""
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise _error(index, doc, "metadata.name", "required field is missing")
    fields = [("metadata.name", meta["name"])]
    if namespaced and meta.get("namespace") is not None:
        fields.append(("metadata.namespace", meta["namespace"]))
    for path, value in fields:
        limit = 63 if path == "metadata.namespace" else 253
        if not isinstance(value, str) or len(value) > limit or not _DNS.fullmatch(value):
            raise _error(
                index,
                doc,
                path,
                f"{value!r} is not a valid name: lower-case letters, digits, '-' and '.', "
                f"starting and ending with a letter or digit, at most {limit} characters",
            )
    for field_name in ("labels", "annotations"):
        value = meta.get(field_name)
        if value is not None and not (
            isinstance(value, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            raise _error(
                index, doc, f"metadata.{field_name}", "must be a mapping of strings to strings"
            )
    namespace = str(meta.get("namespace") or ("default" if namespaced else ""))
    return namespace, str(meta["name"])


def _sort(docs: Sequence[Any], accepted: frozenset[str], tool: str) -> _Docs:
    """Validate each document of a kind `tool` accepts and file it by kind; names unique."""
    out = _Docs()
    seen: dict[tuple[str, str, str], int] = {}
    for index, doc in enumerate(docs):
        if doc is None:
            continue  # an empty document (a stray "---") is not an object
        if not isinstance(doc, Mapping):
            raise ManifestError(index, "document", [("", "expected a mapping (a manifest)")])
        kind = str(doc.get("kind") or "")
        api_version = str(doc.get("apiVersion") or "")
        if kind not in accepted:
            raise _error(
                index,
                doc,
                "kind",
                f"kind {kind!r} is not accepted by {tool} (one of {', '.join(sorted(accepted))})",
            )
        out.raw[index] = doc
        if kind in SIM_KINDS:
            model_type = SIM_KINDS[kind]
            if api_version != SCENARIO_API:
                raise _error(index, doc, "apiVersion", f"{kind} needs apiVersion {SCENARIO_API}")
            try:
                sim = model_type.model_validate(doc)
            except ValidationError as error:
                problems = [_problem(e) for e in error.errors(include_url=False)]
                raise ManifestError(index, _subject(doc), problems) from None
            if not sim.metadata.name and kind != "Simulation":
                raise _error(index, doc, "metadata.name", "required field is missing")
            _remember(seen, (kind, "", sim.metadata.name or ""), index, doc)
            if isinstance(sim, Simulation):
                if out.simulations:
                    raise _error(index, doc, "kind", "at most one Simulation per scenario")
                out.simulations.append((index, sim))
            elif isinstance(sim, NodePool):
                out.node_pools.append((index, sim))
            elif isinstance(sim, WorkloadGenerator):
                out.generators.append((index, sim))
            elif isinstance(sim, ScaleEvent):
                out.scale_events.append((index, sim))
            continue
        if kind in _CORE_KINDS_BY_KIND:
            expected = _CORE_KINDS_BY_KIND[kind]
            if api_version != expected:
                raise _error(index, doc, "apiVersion", f"{kind} needs apiVersion {expected}")
            namespaced = kind == "Job"
            namespace, name = _name_of(doc, index, namespaced)
            _remember(seen, (kind, namespace, name), index, doc)
            if kind == "Node":
                _check_node(index, doc)
                out.nodes.append((index, doc))
            elif kind == "PriorityClass":
                _check_priority_class(index, doc)
                out.priority_classes.append((index, doc))
            elif kind == "Job":
                out.jobs.append((index, doc))
            continue
        model = parse_manifest(doc, index)
        namespace = model.metadata.namespace or ""
        if isinstance(model, LocalQueue | WorkloadModel):
            namespace = namespace or "default"
        if not model.name:
            raise _error(index, doc, "metadata.name", "required field is missing")
        _remember(seen, (kind, namespace, model.name), index, doc)
        if isinstance(model, ResourceFlavor):
            out.flavors.append((index, model))
        elif isinstance(model, ClusterQueue):
            out.cluster_queues.append((index, model))
        elif isinstance(model, LocalQueue):
            out.local_queues.append((index, model))
        elif isinstance(model, WorkloadModel):
            out.workloads.append((index, model))
    return out


def _remember(
    seen: dict[tuple[str, str, str], int],
    key: tuple[str, str, str],
    index: int,
    doc: Mapping[str, Any],
) -> None:
    if key in seen:
        raise _error(
            index,
            doc,
            "metadata.name",
            f"duplicate: document {seen[key]} already defines {key[0]} "
            + (f"{key[1]}/{key[2]}" if key[1] else key[2]),
        )
    seen[key] = index


def _check_node(index: int, doc: Mapping[str, Any]) -> None:
    node_from_manifest(doc, index=index)  # the type of every field placement reads
    status = doc.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping) or not allocatable:
        raise _error(index, doc, "status.allocatable", "required: what the node offers to pods")
    for resource, value in allocatable.items():
        try:
            parse_quantity(value, str(resource))
        except QuantityError as error:
            raise _error(
                index, doc, f"status.allocatable[{resource}]", str(error).split(": ", 1)[-1]
            ) from None


def _check_priority_class(index: int, doc: Mapping[str, Any]) -> None:
    value = doc.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(index, doc, "value", f"required: a whole number (got {value!r})")


def _priority_classes(docs: _Docs) -> tuple[dict[str, int], str | None]:
    classes: dict[str, int] = {}
    default: str | None = None
    for index, doc in docs.priority_classes:
        name = str(doc["metadata"]["name"])
        classes[name] = int(doc["value"])
        if doc.get("globalDefault"):
            if default is not None:
                raise _error(
                    index, doc, "globalDefault", f"PriorityClass {default} is already the default"
                )
            default = name
    return classes, default


def _check_depth(docs: _Docs) -> None:
    """Refuse a queue tree deeper than MAX_TREE_DEPTH (before the tree checks, whose cost
    grows with the square of the depth). Cycles and missing parents are the tree check's."""
    parents = {cq.name: cq.spec.parent for _, cq in docs.cluster_queues}
    depth: dict[str, int] = {}
    for index, cq in docs.cluster_queues:
        chain: list[str] = []
        name: str | None = cq.name
        while name is not None and name in parents and name not in depth:
            if name in chain:
                break  # a cycle: reported by the tree check
            chain.append(name)
            name = parents[name]
        below = depth.get(name, 0) if name is not None else 0
        for offset, queue in enumerate(reversed(chain)):
            depth[queue] = below + offset + 1
        if depth.get(cq.name, 0) > MAX_TREE_DEPTH:
            raise _error(
                index,
                docs.raw[index],
                "spec.parent",
                f"the queue is {depth[cq.name]} levels deep; a queue tree has at most "
                f"{MAX_TREE_DEPTH} levels",
            )


def _queues(docs: _Docs) -> tuple[dict[str, QueueSpec], dict[tuple[str, str], str]]:
    """Check the tree and LocalQueues; raise on what makes the file unusable."""
    _check_depth(docs)
    flavor_names = [rf for _, rf in docs.flavors]
    tree = check_queue_tree(
        [cq for _, cq in docs.cluster_queues], flavor_names, [lq for _, lq in docs.local_queues]
    )
    queues: dict[str, QueueSpec] = {}
    for index, cq in docs.cluster_queues:
        state = tree.cluster_queues[cq.name]
        if not state.active and state.reason in _BROKEN_TREE:
            raise _error(index, docs.raw[index], _BROKEN_TREE[state.reason], state.message)
        if not state.active and state.reason == "FlavorNotFound":
            known = {rf.name for _, rf in docs.flavors}
            position = next(i for i, f in enumerate(cq.spec.flavors) if f.name not in known)
            raise _error(index, docs.raw[index], f"spec.flavors[{position}].name", state.message)
        queues[cq.name] = convert.queue_spec(cq, state.active, state.message)
    local: dict[tuple[str, str], str] = {}
    for index, lq in docs.local_queues:
        key = (lq.metadata.namespace or "default", lq.name)
        lq_state = tree.local_queues.get((lq.metadata.namespace or "", lq.name))
        target = lq.spec.cluster_queue
        if target not in queues:
            raise _error(
                index,
                docs.raw[index],
                "spec.clusterQueue",
                f"ClusterQueue {target!r} does not exist",
            )
        if lq_state is not None and lq_state.reason == "ClusterQueueNotLeaf":
            raise _error(index, docs.raw[index], "spec.clusterQueue", lq_state.message)
        local[key] = target
    # As the controller does (controllers/admission/view.py): protection flows down the tree.
    return convert.inherit_min_runtimes(queues, [cq for _, cq in docs.cluster_queues]), local


def _flavors(docs: _Docs) -> dict[str, Flavor]:
    return {rf.name: convert.flavor(rf) for _, rf in docs.flavors}


def _ready(node: Mapping[str, Any]) -> Mapping[str, Any]:
    # In a scenario a Node without conditions is taken to be Ready: writing the kubelet's
    # status by hand is noise; a node written NotReady stays NotReady.
    status = node.get("status") or {}
    if status.get("conditions"):
        return node
    return {**node, "status": {**status, "conditions": [{"type": "Ready", "status": "True"}]}}


def _pool_nodes(docs: _Docs) -> list[Mapping[str, Any]]:
    nodes: list[Mapping[str, Any]] = []
    for _, pool in docs.node_pools:
        allocatable = {r: format_quantity(v, r) for r, v in pool.spec.allocatable.items()}
        for i in range(pool.spec.count):
            nodes.append(
                {
                    "metadata": {
                        "name": f"{pool.metadata.name}-{i}",
                        "labels": dict(pool.spec.labels),
                    },
                    "status": {
                        "allocatable": allocatable,
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }
            )
    return nodes


def _nodes(docs: _Docs) -> tuple[Node, ...] | None:
    """The scenario's nodes as placement sees them; None when it has none (quota-only)."""
    nodes: list[Node] = []
    names: dict[str, int] = {}
    for index, doc in docs.nodes:
        node = node_from_manifest(_ready(doc), index=index)
        names[node.name] = index
        nodes.append(node)
    for index, pool in docs.node_pools:
        for i in range(pool.spec.count):
            name = f"{pool.metadata.name}-{i}"
            if name in names:
                raise _error(
                    index,
                    docs.raw[index],
                    "metadata.name",
                    f"the pool's node {name} has the name of the Node in document {names[name]}; "
                    "rename the pool or the Node",
                )
            names[name] = index
            nodes.append(
                Node(
                    name=name,
                    allocatable=dict(pool.spec.allocatable),
                    labels=dict(pool.spec.labels),
                )
            )
    if not nodes:
        return None
    return tuple(
        n
        if "pods" in n.allocatable
        else Node(
            n.name,
            {**n.allocatable, "pods": DEFAULT_MAX_PODS},
            n.labels,
            n.taints,
            n.unschedulable,
            n.ready,
        )
        for n in nodes
    )


def _capacity(
    docs: _Docs, flavors: Mapping[str, Flavor], strict: bool
) -> dict[FlavorResource, int] | None:
    nodes = [_ready(doc) for _, doc in docs.nodes] + _pool_nodes(docs)
    if not nodes:
        return None
    capacity = convert.node_capacity(nodes, flavors)
    if strict:
        # A simulated flavor no node provides can never admit anything: that is a mistake in
        # the scenario, not an interesting outcome.
        used = {f.name for _, cq in docs.cluster_queues for f in cq.spec.flavors}
        for index, rf in docs.flavors:
            if rf.name not in used:
                continue
            provided = any(amount > 0 for (fl, _), amount in capacity.items() if fl == rf.name)
            if not provided:
                raise _error(
                    index,
                    docs.raw[index],
                    "spec.nodeLabels",
                    "no Node or NodePool of the scenario carries all of these labels, so the "
                    "flavor would have no capacity",
                )
    return capacity or None


def _seconds(value: timedelta) -> float:
    return value.total_seconds()


def _job_timing(index: int, doc: Mapping[str, Any]) -> tuple[float, float]:
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    raw_submit = annotations.get(SUBMIT_AT_ANNOTATION, "0s")
    path = f"metadata.annotations[{SUBMIT_AT_ANNOTATION}]"
    try:
        submit = parse_duration(raw_submit).total_seconds()
    except ValueError as error:
        raise _error(index, doc, path, str(error)) from None
    path = f"metadata.annotations[{RUN_FOR_ANNOTATION}]"
    if RUN_FOR_ANNOTATION not in annotations:
        raise _error(index, doc, path, "required: how long the Job runs once admitted (e.g. 2h)")
    try:
        run_for = parse_duration(annotations[RUN_FOR_ANNOTATION]).total_seconds()
    except ValueError as error:
        raise _error(index, doc, path, str(error)) from None
    if run_for <= 0:
        raise _error(index, doc, path, "must be a positive duration")
    return submit, run_for


def _jobs(
    docs: _Docs,
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
            raise _error(
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
            )
        )
    return tuple(jobs)


def _generators(
    docs: _Docs, local: Mapping[tuple[str, str], str], classes: Mapping[str, int]
) -> tuple[Generator, ...]:
    out: list[Generator] = []
    for index, gen in docs.generators:
        doc = docs.raw[index]
        targets: list[Target] = []
        if gen.spec.all_local_queues:
            targets = [Target(ns, name, cq) for (ns, name), cq in sorted(local.items())]
        for i, target in enumerate(gen.spec.targets):
            namespace, _, name = target.rpartition("/")
            namespace = namespace or "default"
            if (namespace, name) not in local:
                raise _error(
                    index,
                    doc,
                    f"spec.targets[{i}]",
                    f"LocalQueue {namespace}/{name} does not exist in the scenario",
                )
            targets.append(Target(namespace, name, local[(namespace, name)]))
        resolved: list[WorkloadClass] = []
        for i, cls in enumerate(gen.spec.classes):
            priority = cls.priority or 0
            if cls.priority_class_name is not None:
                if cls.priority_class_name not in classes:
                    raise _error(
                        index,
                        doc,
                        f"spec.classes[{i}].priorityClassName",
                        f"PriorityClass {cls.priority_class_name!r} does not exist",
                    )
                priority = classes[cls.priority_class_name]
            resolved.append(
                WorkloadClass(
                    name=cls.name,
                    count=cls.count,
                    interval_s=_seconds(cls.interval),
                    start_s=_seconds(cls.start_at),
                    runtime_s=_seconds(cls.runtime),
                    priority=priority,
                    pod_set=PodSet(JOB_POD_SET, cls.pods, dict(cls.requests)),
                    jitter=cls.jitter,
                )
            )
        out.append(Generator(gen.metadata.name or "", tuple(resolved), tuple(targets)))
    return tuple(out)


def _scale_events(docs: _Docs, jobs: Sequence[JobSpec]) -> tuple[Scale, ...]:
    by_key = {job.key: job for job in jobs}
    out: list[Scale] = []
    for index, event in docs.scale_events:
        doc = docs.raw[index]
        name = event.spec.job if "/" in event.spec.job else f"default/{event.spec.job}"
        job = by_key.get(name)
        if job is None:
            raise _error(index, doc, "spec.job", f"Job {name} does not exist in the scenario")
        if not job.elastic:
            raise _error(
                index,
                doc,
                "spec.job",
                f"Job {name} is not elastic: only Jobs annotated "
                f'{ELASTIC_ANNOTATION}: "true" resize without a restart',
            )
        out.append(Scale(_seconds(event.spec.at), name, event.spec.parallelism))
    return tuple(sorted(out, key=lambda s: s.at))


SCENARIO_KINDS = frozenset(
    {"ResourceFlavor", "ClusterQueue", "LocalQueue", "PriorityClass", "Node", "Namespace", "Job"}
    | set(SIM_KINDS)
)
CLUSTER_KINDS = frozenset(
    {"ResourceFlavor", "ClusterQueue", "LocalQueue", "PriorityClass", "Node", "Namespace"}
    | {"Workload"}
)


def _check_span(docs: _Docs, settings: Settings, jobs: Sequence[JobSpec]) -> None:
    """Refuse a scenario whose simulated span needs more samples than MAX_SAMPLES: name the
    Job (or the Simulation's `until`) that makes it so long, and what to change."""
    interval = settings.sample_interval_s
    if settings.until_s is not None:
        if settings.until_s / interval > MAX_SAMPLES:
            index, _ = docs.simulations[0] if docs.simulations else (0, None)
            raise ManifestError(
                index,
                "Simulation" if docs.simulations else "the command line",
                [
                    (
                        "spec.until" if docs.simulations else "--until",
                        f"{settings.until_s:,.0f}s at a sample interval of {interval:,.0f}s is "
                        f"more than {MAX_SAMPLES:,} samples; shorten it or raise "
                        "spec.sampleInterval",
                    )
                ],
            )
        return
    for (index, doc), job in zip(docs.jobs, jobs, strict=True):
        end = job.submit_at + job.run_for
        if end / interval > MAX_SAMPLES:
            raise _error(
                index,
                doc,
                f"metadata.annotations[{RUN_FOR_ANNOTATION}]",
                f"the Job ends {end:,.0f}s into the simulation: more than {MAX_SAMPLES:,} "
                f"samples at a sample interval of {interval:,.0f}s; shorten it, set a "
                "Simulation's spec.until, or raise its spec.sampleInterval",
            )


def parse_scenario(docs: Sequence[Any], name: str = "scenario") -> Scenario:
    """Check and resolve a scenario's documents; raise ManifestError on the first problem."""
    sorted_docs = _sort(docs, SCENARIO_KINDS, "muster simulate")
    classes, default_class = _priority_classes(sorted_docs)
    queues, local = _queues(sorted_docs)
    flavors = _flavors(sorted_docs)
    capacity = _capacity(sorted_docs, flavors, strict=True)
    jobs = _jobs(sorted_docs, local, classes, default_class)
    settings = Settings(name=name)
    if sorted_docs.simulations:
        index, sim = sorted_docs.simulations[0]
        spec = sim.spec
        if not EARLIEST_START <= spec.start <= LATEST_START:
            raise _error(
                index,
                sorted_docs.raw[index],
                "spec.start",
                f"must be between {EARLIEST_START:%Y-%m-%d} and {LATEST_START:%Y-%m-%d} "
                f"(got {spec.start.isoformat()})",
            )
        settings = Settings(
            name=sim.metadata.name or name,
            start=spec.start.astimezone(UTC),
            until_s=_seconds(spec.until) if spec.until is not None else None,
            requeue_base_s=_seconds(spec.requeue_base),
            requeue_max_s=max(_seconds(spec.requeue_max), _seconds(spec.requeue_base)),
            eviction_delay_s=_seconds(spec.eviction_delay),
            sample_interval_s=max(1.0, _seconds(spec.sample_interval)),
        )
    _check_span(sorted_docs, settings, jobs)
    return Scenario(
        settings=settings,
        queues=queues,
        flavors=flavors,
        capacity=capacity,
        jobs=jobs,
        generators=_generators(sorted_docs, local, classes),
        scale_events=_scale_events(sorted_docs, jobs),
        local_queues=local,
        nodes=_nodes(sorted_docs),
    )


def _check_admission(
    index: int,
    doc: Mapping[str, Any],
    wl: WorkloadModel,
    queues: Mapping[str, QueueSpec],
    flavors: Mapping[str, Flavor],
) -> None:
    """An admission the file claims must be one Muster could have made: to a leaf queue, of
    pod sets the Workload has, at most their count, on flavors that exist and the queue
    lists for each requested resource. Anything else would be counted wrongly."""
    admission = wl.status.admission
    assert admission is not None
    queue = queues[admission.cluster_queue]
    if any(spec.parent == queue.name for spec in queues.values()):
        raise _error(
            index,
            doc,
            "status.admission.clusterQueue",
            f"ClusterQueue {queue.name!r} has child queues; only a leaf queue admits",
        )
    pod_sets = {ps.name: ps for ps in wl.spec.pod_sets}
    listed = {fq.flavor for fq in queue.flavors}
    for i, assignment in enumerate(admission.pod_set_assignments):
        path = f"status.admission.podSetAssignments[{i}]"
        pod_set = pod_sets.get(assignment.name)
        if pod_set is None:
            raise _error(
                index,
                doc,
                f"{path}.name",
                f"no pod set {assignment.name!r} in spec.podSets ({', '.join(pod_sets)})",
            )
        if assignment.count > pod_set.count:
            raise _error(
                index,
                doc,
                f"{path}.count",
                f"{assignment.count} pods admitted, but pod set {pod_set.name} has {pod_set.count}",
            )
        for resource in pod_set.requests:
            chosen = assignment.flavors.get(resource)
            where = f"{path}.flavors[{resource}]"
            if chosen is None:
                if assignment.count:
                    raise _error(index, doc, where, "required: the flavor the resource came from")
                continue
            if chosen not in flavors:
                raise _error(index, doc, where, f"ResourceFlavor {chosen!r} does not exist")
            if chosen not in listed:
                raise _error(
                    index,
                    doc,
                    where,
                    f"ClusterQueue {queue.name} lists no flavor {chosen!r}",
                )


def cluster_state(docs: Sequence[Any], now: float) -> ClusterState:
    """The snapshot a cluster file describes (for `muster fairshare` and `muster admit`).

    A pending Workload's `spec.queueName` names a LocalQueue of its namespace; in files
    without that LocalQueue it may name a ClusterQueue directly. An admitted Workload
    (`status.admission` set) is charged to `status.admission.clusterQueue`. Arrival is
    `metadata.creationTimestamp` (workloads without one arrive first, in file order), and
    the admission time is the QuotaReserved condition's lastTransitionTime.
    """
    sorted_docs = _sort(docs, CLUSTER_KINDS, "muster fairshare / muster admit")
    classes, _ = _priority_classes(sorted_docs)
    queues, local = _queues(sorted_docs)
    flavors = _flavors(sorted_docs)
    capacity = _capacity(sorted_docs, flavors, strict=False)
    admitted: list[Workload] = []
    pending: list[Workload] = []
    lq_of: dict[str, str] = {}
    for index, wl in sorted_docs.workloads:
        doc = sorted_docs.raw[index]
        namespace = wl.metadata.namespace or "default"
        class_name = wl.spec.priority_class_name
        if wl.spec.priority is None and class_name and class_name not in classes:
            raise _error(
                index,
                doc,
                "spec.priorityClassName",
                f"PriorityClass {class_name!r} does not exist in the file "
                "(add it, or set spec.priority)",
            )
        created = wl.metadata.creation_timestamp
        arrival = created.timestamp() if created is not None else float(index)
        admission = wl.status.admission
        if admission is not None:
            if admission.cluster_queue not in queues:
                raise _error(
                    index,
                    doc,
                    "status.admission.clusterQueue",
                    f"ClusterQueue {admission.cluster_queue!r} does not exist",
                )
            _check_admission(index, doc, wl, queues, flavors)
            reserved = find_condition(wl.status.conditions, "QuotaReserved")
            admitted_at = reserved.last_transition_time.timestamp() if reserved else arrival
            engine = convert.workload(
                wl,
                admission.cluster_queue,
                arrival=arrival,
                admitted_at=admitted_at,
                priority_classes=classes,
            )
            admitted.append(engine)
            lq_of[engine.key] = wl.spec.queue_name
            continue
        cluster_queue = local.get((namespace, wl.spec.queue_name))
        if cluster_queue is None and wl.spec.queue_name in queues:
            cluster_queue = wl.spec.queue_name
        if cluster_queue is None:
            raise _error(
                index,
                doc,
                "spec.queueName",
                f"queue {wl.spec.queue_name!r} does not exist: no LocalQueue "
                f"{namespace}/{wl.spec.queue_name} and no ClusterQueue of that name",
            )
        engine = convert.workload(wl, cluster_queue, arrival=arrival, priority_classes=classes)
        pending.append(engine)
        lq_of[engine.key] = wl.spec.queue_name
    snapshot = Snapshot(
        now=now,
        queues=queues,
        flavors=flavors,
        capacity=capacity,
        admitted=tuple(admitted),
        pending=tuple(pending),
    )
    return ClusterState(snapshot=snapshot, local_queue_of=lq_of)
