"""What one simulation run returns: Job outcomes, transitions, preemptions, node use, buckets.

These are the types the report, the history store and the plugin read; they sit apart from
the loop that produces them so a reader of a run need not import (or read) the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from quota.model.decisions import Victim
from quota.model.nodes import Node
from quota.model.resources import FlavorResource
from quota.model.snapshot import QueueSpec
from quota.simulation.scenario import Settings, Worker

TransitionKind = Literal[
    "created",
    "admitted",
    "preempted",
    "reclaimed",
    "evicted",
    "requeued",
    "slice_replaced",
    "finished",
    "dispatched",  # sent to a worker cluster (the actor names it)
]
Measure = Literal["usage", "fairShare", "demand"]
MEASURES: tuple[Measure, ...] = ("usage", "fairShare", "demand")
TOTAL = ""  # the pseudo-queue for the whole cluster in the meter
# How the admission cycle words a wait that placement, not quota, decided; and how the
# choice of a worker cluster does (`quota.dispatch`: admitted by quota, no cluster has room).
PLACEMENT_REASON_PREFIXES = (
    "quota is available but the pods cannot be placed",
    "no worker cluster",
)


def is_placement_reason(reason: str) -> bool:
    """Whether a pending reason says the pods could not be placed (quota allowed them)."""
    return reason.startswith(PLACEMENT_REASON_PREFIXES)


@dataclass(frozen=True, slots=True)
class Transition:
    """One step of a workload's life, for the history store."""

    at: float
    kind: TransitionKind
    job: str  # "namespace/name" of the Job
    workload: str  # the engine's key of the slice it concerns
    sequence: int  # tells repeated transitions of one kind apart (requeues, slices)
    local_queue: str
    cluster_queue: str
    flavors: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, int] = field(default_factory=dict)
    reason: str = ""
    actor: str = ""  # the preemptor, for evictions


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """A preemptor and the victims one cycle chose for it."""

    at: float
    preemptor: str  # Job key
    cluster_queue: str
    sequence: int
    victims: tuple[tuple[str, str, int, Victim], ...]  # (job, cluster queue, priority, victim)


@dataclass(frozen=True, slots=True)
class Resize:
    """A scale event of an elastic Job and when the running pods reached the new size."""

    at: float
    parallelism: int
    effective_at: float | None


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What happened to one Job (or generated workload)."""

    key: str
    local_queue: str
    cluster_queue: str
    priority: int
    submitted_at: float
    admitted_at: float | None  # first admission
    finished_at: float | None
    evictions: int
    waited: float  # seconds spent pending (including backoff) before its last admission
    flavors: Mapping[str, str]  # resource -> flavor of its last admission
    resizes: tuple[Resize, ...] = ()
    last_pending_reason: str = ""  # why it last waited, as the admission cycle said
    pods_preempted: int = 0  # pods taken from it by single-pod disruption (no eviction)
    # Seconds of `waited` during which the cycle said its pods could not be placed: quota
    # allowed it, the nodes did not (only in scenarios with nodes).
    placement_wait: float = 0.0
    # The narrowest level of its flavor's Topology whose one domain held all its pods at its
    # last admission ("rack", "block", "node", or "spread"); None for a single pod, no
    # Topology, or never admitted.
    landed: str | None = None
    # The worker cluster it ran in at its last run (a queue with spec.dispatch); None: here.
    cluster: str | None = None


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """From `at` on, the pods bound to `node` request `used` in all (pod slots included)."""

    at: float
    node: str
    used: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Bucket:
    """Time-averaged measures over [start, end) per queue and flavor/resource."""

    start: float
    end: float
    values: Mapping[str, Mapping[Measure, Mapping[FlavorResource, float]]]


@dataclass(frozen=True)
class SimResult:
    """Everything a report needs from one simulation."""

    settings: Settings
    seed: int
    queues: Mapping[str, QueueSpec]
    capacity: Mapping[FlavorResource, int]  # what was shared at the root
    jobs: tuple[JobOutcome, ...]
    end: float  # simulated seconds covered
    makespan: float
    # Per queue (TOTAL for the whole cluster): integral over [0, end] of each measure.
    integrals: Mapping[str, Mapping[Measure, Mapping[FlavorResource, float]]]
    timeline: tuple[Bucket, ...]  # for plots
    samples: tuple[Bucket, ...]  # at settings.sample_interval_s, for the history store
    transitions: tuple[Transition, ...]
    preemptions: tuple[PreemptionRecord, ...]
    cycles: int
    evictions: int
    finished_all: bool
    # The nodes pods were placed on (None: quota-only mode) and every change of their use,
    # in time order, starting from nothing used at time 0.
    nodes: tuple[Node, ...] | None = None
    node_events: tuple[NodeEvent, ...] = ()
    # The scenario's Topologies (name -> node labels, widest first), for fragmentation by level.
    topologies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The worker clusters (their nodes are in `nodes` too), for the per-cluster figures.
    clusters: tuple[Worker, ...] = ()
