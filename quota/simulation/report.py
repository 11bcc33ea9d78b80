"""What a simulation means to a person: per-queue wait times, usage against fair share, and
flavor utilisation, shaped for a table, for JSON and for plots. Pure functions of a SimResult.

Wait time is the time a workload spent pending (including requeue backoff after evictions)
before its last admission; a workload still pending when the simulation stops counts the
time it has waited so far, so percentiles of an overloaded queue are lower bounds, never
flattering omissions. Averages are time-weighted over the whole simulation, [0, end].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quota.model.resources import FlavorResource
from quota.model.snapshot import QueueSpec
from quota.simulation.simulator import TOTAL, Bucket, JobOutcome, SimResult

# Times in the JSON are rounded to the millisecond: finer digits are float noise.
_DIGITS = 3
_ACCELERATOR_HINTS = ("gpu", "tpu", "neuron", "accelerator")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def key_name(key: FlavorResource) -> str:
    """ "flavor/resource", as in `muster fairshare` JSON."""
    return f"{key[0]}/{key[1]}"


def is_accelerator(resource: str) -> bool:
    """GPUs and their kin: the resource a GPU cluster's admins look at first."""
    return any(hint in resource.lower() for hint in _ACCELERATOR_HINTS)


def headline_keys(spec: QueueSpec, capacity: Mapping[FlavorResource, int]) -> list[FlavorResource]:
    """The flavor/resources that sum up a queue: its accelerators if it has any quota or limit
    for them, else cpu."""
    keys = sorted(set(spec.quotas) | set(spec.limits))
    if not keys:
        keys = sorted(capacity)
    accelerators = [k for k in keys if is_accelerator(k[1])]
    if accelerators:
        return accelerators
    cpu = [k for k in keys if k[1] == "cpu"]
    return cpu or keys[:1]


def tree_order(queues: Mapping[str, QueueSpec]) -> list[tuple[str, int]]:
    """Queues depth-first (parents before their children, siblings by name) with their depth."""
    children: dict[str | None, list[str]] = {}
    for name, spec in queues.items():
        parent = spec.parent if spec.parent in queues else None
        children.setdefault(parent, []).append(name)
    out: list[tuple[str, int]] = []
    stack = [(name, 0) for name in sorted(children.get(None, []), reverse=True)]
    while stack:
        name, depth = stack.pop()
        out.append((name, depth))
        stack.extend((kid, depth + 1) for kid in sorted(children.get(name, []), reverse=True))
    return out


def parents_of(queues: Mapping[str, QueueSpec]) -> dict[str, str | None]:
    """Map each queue to its parent (None for roots)."""
    return {name: spec.parent for name, spec in queues.items()}


def _ancestors(name: str, parents: Mapping[str, str | None]) -> Iterable[str]:
    current: str | None = name
    seen: set[str] = set()
    while current is not None and current not in seen:
        seen.add(current)
        yield current
        current = parents.get(current)


def wait_time(job: JobOutcome) -> float:
    """Seconds the workload spent pending (so far, if it never ran to the end)."""
    return job.waited


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's figures (a parent's cover its whole subtree)."""

    name: str
    depth: int
    leaf: bool
    submitted: int
    admitted: int
    finished: int
    pending: int  # never admitted by the end
    preempted: int  # evictions of its workloads (preempted, reclaimed or drained)
    waits: tuple[float, ...]
    avg_usage: Mapping[FlavorResource, float]
    avg_fair_share: Mapping[FlavorResource, float]
    headline: tuple[FlavorResource, ...]

    def wait(self, q: float) -> float | None:
        """Percentile q of the wait times."""
        return percentile(self.waits, q)


def queue_stats(result: SimResult) -> list[QueueStats]:
    """Figures per queue, in tree order."""
    parents = parents_of(result.queues)
    jobs_of: dict[str, list[JobOutcome]] = {name: [] for name in result.queues}
    for job in result.jobs:
        for name in _ancestors(job.cluster_queue, parents):
            if name in jobs_of:
                jobs_of[name].append(job)
    end = result.end
    out: list[QueueStats] = []
    has_children = {p for p in parents.values() if p is not None}
    for name, depth in tree_order(result.queues):
        jobs = jobs_of[name]
        integral = result.integrals.get(name, {})
        out.append(
            QueueStats(
                name=name,
                depth=depth,
                leaf=name not in has_children,
                submitted=len(jobs),
                admitted=sum(1 for j in jobs if j.admitted_at is not None),
                finished=sum(1 for j in jobs if j.finished_at is not None),
                pending=sum(1 for j in jobs if j.admitted_at is None),
                preempted=sum(j.evictions for j in jobs),
                waits=tuple(wait_time(j) for j in jobs),
                avg_usage=_averages(integral.get("usage", {}), end),
                avg_fair_share=_averages(integral.get("fairShare", {}), end),
                headline=tuple(headline_keys(result.queues[name], result.capacity)),
            )
        )
    return out


def _averages(integral: Mapping[FlavorResource, float], end: float) -> dict[FlavorResource, float]:
    if end <= 0:
        return {}
    return {key: value / end for key, value in sorted(integral.items()) if value}


@dataclass(frozen=True, slots=True)
class FlavorStats:
    """How much of one flavor/resource the cluster used on average."""

    key: FlavorResource
    capacity: int
    avg_usage: float

    @property
    def utilisation(self) -> float | None:
        """Average usage / capacity (None without capacity)."""
        return self.avg_usage / self.capacity if self.capacity else None


def flavor_stats(result: SimResult) -> list[FlavorStats]:
    """Utilisation per flavor/resource that anything was shared of."""
    usage = _averages(result.integrals.get(TOTAL, {}).get("usage", {}), result.end)
    keys = sorted(k for k, v in result.capacity.items() if v > 0)
    return [FlavorStats(k, result.capacity[k], usage.get(k, 0.0)) for k in keys]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, _DIGITS)


def _vector(values: Mapping[FlavorResource, float]) -> dict[str, float]:
    return {key_name(k): round(v, _DIGITS) for k, v in sorted(values.items())}


def to_json(result: SimResult) -> dict[str, Any]:
    """The documented JSON: workloads, queues, makespan (times in seconds from the start)."""
    workloads = [
        {
            "name": j.key,
            "queue": j.local_queue,
            "clusterQueue": j.cluster_queue,
            "priority": j.priority,
            "submittedAt": _round(j.submitted_at),
            "admittedAt": _round(j.admitted_at),
            "finishedAt": _round(j.finished_at),
            "waited": _round(j.waited),
            "evictions": j.evictions,
            "flavors": dict(sorted(j.flavors.items())),
            "lastPendingReason": j.last_pending_reason,
            **(
                {
                    "resizes": [
                        {
                            "at": _round(r.at),
                            "parallelism": r.parallelism,
                            "effectiveAt": _round(r.effective_at),
                        }
                        for r in j.resizes
                    ]
                }
                if j.resizes
                else {}
            ),
        }
        for j in sorted(result.jobs, key=lambda j: (j.submitted_at, j.key))
    ]
    queues = {
        q.name: {
            "parent": result.queues[q.name].parent,
            "admitted": q.admitted,
            "preempted": q.preempted,
            "finished": q.finished,
            "pending": q.pending,
            "waitP50": _round(q.wait(50)),
            "waitP90": _round(q.wait(90)),
            "waitMax": _round(max(q.waits) if q.waits else None),
            "avgUsage": _vector(q.avg_usage),
            "avgFairShare": _vector(q.avg_fair_share),
        }
        for q in queue_stats(result)
    }
    flavors = {
        key_name(f.key): {
            "capacity": f.capacity,
            "avgUsage": round(f.avg_usage, _DIGITS),
            "utilisation": _round(f.utilisation),
        }
        for f in flavor_stats(result)
    }
    return {
        "scenario": result.settings.name,
        "seed": result.seed,
        "workloads": workloads,
        "queues": queues,
        "flavors": flavors,
        "makespan": _round(result.makespan),
        "simulatedUntil": _round(result.end),
        "finishedAll": result.finished_all,
        "cycles": result.cycles,
        "evictions": result.evictions,
    }


def format_seconds(seconds: float | None) -> str:
    """A duration the way people say it: 250ms, 42s, 3m05s, 2h10m, 3d4h; "-" for none."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{round(seconds * 1000)}ms" if seconds > 0 else "0s"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{round(seconds)}s"
    total = round(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


@dataclass(frozen=True, slots=True)
class Series:
    """A plottable step-averaged series: bucket midpoints and values."""

    queue: str
    key: FlavorResource
    times: tuple[float, ...]
    usage: tuple[float, ...]
    fair_share: tuple[float, ...]


def timeline(result: SimResult, buckets: Sequence[Bucket] | None = None) -> list[Series]:
    """Per queue and headline flavor/resource: usage and fair share over time."""
    chosen = result.timeline if buckets is None else buckets
    out: list[Series] = []
    for name, _ in tree_order(result.queues):
        for key in headline_keys(result.queues[name], result.capacity):
            times: list[float] = []
            usage: list[float] = []
            fair: list[float] = []
            for bucket in chosen:
                values = bucket.values.get(name, {})
                times.append((bucket.start + bucket.end) / 2)
                usage.append(values.get("usage", {}).get(key, 0.0))
                fair.append(values.get("fairShare", {}).get(key, 0.0))
            out.append(Series(name, key, tuple(times), tuple(usage), tuple(fair)))
    return out
