"""Every metric Muster exports that counts or times something as it happens, and the small
functions the rest of the shell calls to record it.

Names follow Kueue's (`kueue_` -> `muster_`) wherever the concept is the same, so a Kueue
dashboard user finds what they know: see docs/metrics.md for the table. Figures that
describe the present state (pending workloads, usage, quota, fair share, leader, backlog)
are read from the caches at scrape time by `collector.py` instead, so every replica serves
them and none can drift from what the controller knows.

The endpoint serves prometheus_client's default registry, so a metric any module defines
the usual way (`Counter(name, help)`) is scraped too, with the process's own (`process_*`,
`python_*`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import REGISTRY, Counter, Histogram

from quota.model.decisions import CycleResult
from quota.model.nodes import Node
from quota.placement.topology import SPREAD, DomainRequest, landed_level

# Admission cycles take milliseconds to seconds; waits take seconds to days.
_FAST = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_WAIT = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 12 * 3600, 86400, 7 * 86400)

ADMISSION_ATTEMPTS = Counter(
    "muster_admission_attempts",
    "Workloads an admission cycle considered, by result: success (admitted) or "
    "inadmissible (still pending).",
    ["result"],
    registry=REGISTRY,
)
ADMISSION_ATTEMPT_DURATION = Histogram(
    "muster_admission_attempt_duration_seconds",
    "Duration of one admission cycle (snapshot, fair share, decisions, writes), by result: "
    "success if it admitted anything, else inadmissible.",
    ["result"],
    buckets=_FAST,
    registry=REGISTRY,
)
PREEMPTION_DECISIONS = Counter(
    "muster_preemption_decisions",
    "Preemptions an admission cycle decided (one per preempting workload), by kind of the "
    "first victim: Preempted (within its queue) or Reclaimed (across queues).",
    ["kind"],
    registry=REGISTRY,
)
ADMITTED_WORKLOADS = Counter(
    "muster_admitted_workloads",
    "Workloads admitted (quota reserved), per ClusterQueue.",
    ["cluster_queue"],
    registry=REGISTRY,
)
ADMISSION_WAIT_TIME = Histogram(
    "muster_admission_wait_time_seconds",
    "Time from a Workload's creation (or its last requeue) to its admission, per ClusterQueue.",
    ["cluster_queue"],
    buckets=_WAIT,
    registry=REGISTRY,
)
EVICTED_WORKLOADS = Counter(
    "muster_evicted_workloads",
    "Workloads evicted, per ClusterQueue and reason (the Evicted condition's reason).",
    ["cluster_queue", "reason"],
    registry=REGISTRY,
)
PREEMPTED_WORKLOADS = Counter(
    "muster_preempted_workloads",
    "Workloads preempted, per ClusterQueue of the victim and reason (WithinQueue, Reclaim).",
    ["cluster_queue", "reason"],
    registry=REGISTRY,
)
PREEMPTED_PODS = Counter(
    "muster_preempted_pods",
    "Pods single-pod preemption took from admitted workloads (disruptionMode Single), the "
    "workload itself not evicted, per ClusterQueue of the victim.",
    ["cluster_queue"],
    registry=REGISTRY,
)
FINISHED_WORKLOADS = Counter(
    "muster_finished_workloads",
    "Workloads finished (succeeded, failed or replaced by a new slice), per ClusterQueue.",
    ["cluster_queue"],
    registry=REGISTRY,
)
PLACEMENT_ATTEMPTS = Counter(
    "muster_placement_attempts",
    "Groups the scheduler loop tried to place, by result: placed or unplaceable.",
    ["result"],
    registry=REGISTRY,
)
PLACEMENT_DURATION = Histogram(
    "muster_placement_attempt_duration_seconds",
    "Duration of one scheduler pass (deciding placements and binding).",
    buckets=_FAST,
    registry=REGISTRY,
)
BIND_DURATION = Histogram(
    "muster_bind_duration_seconds",
    "Latency of one pods/binding request, by result: bound or failed.",
    ["result"],
    buckets=_FAST,
    registry=REGISTRY,
)
TOPOLOGY_PLACEMENTS = Counter(
    "muster_topology_placements",
    "Pod sets with a topology request placed, per ClusterQueue, the level whose one domain "
    "holds all their pods (as reasons name it: rack, block, node; spread when none does) and "
    "the request's mode (required, preferred, unconstrained).",
    ["cluster_queue", "level", "mode"],
    registry=REGISTRY,
)
WEBHOOK_DURATION = Histogram(
    "muster_webhook_request_duration_seconds",
    "Latency of admission webhook requests, by path and HTTP status code.",
    ["path", "code"],
    buckets=_FAST,
    registry=REGISTRY,
)


def admission_cycle(result: CycleResult, seconds: float) -> None:
    """One admission cycle finished with `result` after `seconds`."""
    ADMISSION_ATTEMPTS.labels("success").inc(len(result.admit))
    ADMISSION_ATTEMPTS.labels("inadmissible").inc(len(result.pending))
    outcome = "success" if result.admit else "inadmissible"
    ADMISSION_ATTEMPT_DURATION.labels(outcome).observe(seconds)
    for preempt in result.preempt:
        kind = preempt.victims[0].kind if preempt.victims else ""
        PREEMPTION_DECISIONS.labels(kind).inc()


def scheduler_pass(placed: int, unplaceable: int, seconds: float) -> None:
    """One scheduler pass placed `placed` groups and could not place `unplaceable`."""
    PLACEMENT_ATTEMPTS.labels("placed").inc(placed)
    PLACEMENT_ATTEMPTS.labels("unplaceable").inc(unplaceable)
    PLACEMENT_DURATION.observe(seconds)


def bind(seconds: float, ok: bool) -> None:
    """One pods/binding request took `seconds`."""
    BIND_DURATION.labels("bound" if ok else "failed").observe(seconds)


def topology_placements(
    cluster_queue: str,
    placed: Iterable[tuple[DomainRequest, Iterable[str]]],
    node: Callable[[str], Node],
) -> None:
    """Pod sets that keep to the domains of a Topology were placed: each (its request, the
    nodes of its pods) counted at the level it landed, so a preferred one that had to climb
    counts at the wider level. `node` looks a node up by name."""
    for request, names in placed:
        if request.required:
            mode = "required"
        else:
            mode = "preferred" if request.level is not None else "unconstrained"
        level = landed_level([node(n) for n in sorted(set(names))], request.levels) or SPREAD
        TOPOLOGY_PLACEMENTS.labels(cluster_queue, level, mode).inc()


def webhook(path: str, code: int, seconds: float) -> None:
    """One webhook request to `path` was answered with `code` after `seconds`."""
    # Anyone who reaches the port chooses the path: only the webhooks' own become labels.
    known = path.startswith(("/mutate-", "/validate-")) and len(path) <= 64
    WEBHOOK_DURATION.labels(path if known else "other", str(code)).observe(seconds)
