"""What a simulation means to a person: per-queue wait times, usage against fair share, and
flavor utilisation, shaped for a table, for JSON and for plots. Pure functions of a SimResult.

In a scenario with nodes the report also shows placement: how long workloads waited for
room on nodes while their quota allowed them (the admission cycle's "quota is available
but the pods cannot be placed" reasons), and, per accelerator resource, how fragmented the
free room was over time — free devices on nodes that are partly used (stranded for a gang
that needs whole nodes) against free devices on nodes with none of them in use — and each
node's use over time, for a heat map.

In a scenario with worker clusters (`Cluster` documents) each workload of a dispatching queue
says which cluster it ran in, and each cluster has a row: its nodes, the workloads it ran,
and, per resource placement cares about, its capacity and time-weighted use (its pods').

Wait time is the time a workload spent pending (including requeue backoff after evictions)
before its last admission; a workload still pending when the simulation stops counts the
time it has waited so far, so percentiles of an overloaded queue are lower bounds, never
flattering omissions. Averages are time-weighted over the whole simulation, [0, end].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quota.model.nodes import Node
from quota.model.resources import FlavorResource
from quota.model.snapshot import QueueSpec
from quota.placement.nodes import HOSTNAME_LABEL
from quota.placement.topology import SPREAD, domain_path, level_name
from quota.simulation.results import TOTAL, Bucket, JobOutcome, NodeEvent, SimResult

# Times in the JSON are rounded to the millisecond: finer digits are float noise.
_DIGITS = 3
_ACCELERATOR_HINTS = ("gpu", "tpu", "neuron", "accelerator")
# Columns of the per-node timeline: enough to see a day's shape, small enough for a page.
NODE_BUCKETS = 240


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


def queue_keys(spec: QueueSpec, capacity: Mapping[FlavorResource, int]) -> list[FlavorResource]:
    """Every flavor/resource a queue has quota or a limit for (all of the cluster's if none,
    leaving out pod slots, which only count where a queue gives quota for them)."""
    keys = sorted(set(spec.quotas) | set(spec.limits))
    return keys or sorted(k for k in capacity if k[1] != "pods")


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
    # Per workload that ever waited for nodes while quota allowed it: seconds it waited so.
    placement_waits: tuple[float, ...] = ()

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
                placement_waits=tuple(j.placement_wait for j in jobs if j.placement_wait > 0),
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
    # A node's pod slots are capacity only to the queues that give quota for them.
    asked = {r for q in result.queues.values() for _, r in (*q.quotas, *q.limits)}
    keys = sorted(
        k for k, v in result.capacity.items() if v > 0 and (k[1] != "pods" or "pods" in asked)
    )
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
            "podsPreempted": j.pods_preempted,
            "flavors": dict(sorted(j.flavors.items())),
            "lastPendingReason": j.last_pending_reason,
            "placementWait": _round(j.placement_wait),
            **({"cluster": j.cluster} if j.cluster is not None else {}),
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
            "waitedForNodes": len(q.placement_waits),
            "waitForNodesTotal": _round(sum(q.placement_waits)),
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
        "placement": placement_json(result),
        **({"clusters": clusters_json(result)} if result.clusters else {}),
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


def timeline(
    result: SimResult,
    buckets: Sequence[Bucket] | None = None,
    keys: Callable[[QueueSpec, Mapping[FlavorResource, int]], list[FlavorResource]] = (
        headline_keys
    ),
) -> list[Series]:
    """Per queue and flavor/resource (its headline ones unless `keys` says otherwise, e.g.
    `queue_keys` for every one): usage and fair share over time."""
    chosen = result.timeline if buckets is None else buckets
    out: list[Series] = []
    for name, _ in tree_order(result.queues):
        for key in keys(result.queues[name], result.capacity):
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


# ------------------------------------------------------------------------ placement


def placement_resources(nodes: Sequence[Node]) -> list[str]:
    """The resources whose fragmentation matters: the accelerators nodes offer, else cpu."""
    offered = sorted({r for n in nodes for r, v in n.allocatable.items() if v > 0})
    accelerators = [r for r in offered if is_accelerator(r)]
    if accelerators:
        return accelerators
    return [r for r in offered if r == "cpu"]


@dataclass(frozen=True, slots=True)
class NodeTimeline:
    """One resource on every node that offers it, averaged over equal time buckets.

    `partial_free` is the free amount on nodes where some but not all of it is in use (room
    a whole-node gang cannot use); `whole_free` the amount on nodes where none is in use.
    Only Ready, schedulable nodes count towards the two; every offering node has a row.
    """

    resource: str
    edges: tuple[float, ...]  # bucket boundaries, one more than buckets
    nodes: tuple[str, ...]
    allocatable: tuple[int, ...]
    used: tuple[tuple[float, ...], ...]  # per node, per bucket
    partial_free: tuple[float, ...]  # per bucket
    whole_free: tuple[float, ...]  # per bucket
    avg_partial_free: float  # over the whole run
    avg_whole_free: float
    max_partial_free: int  # the most free on partly used nodes at any instant
    capacity: int  # on Ready, schedulable nodes

    @property
    def times(self) -> tuple[float, ...]:
        """Bucket midpoints."""
        return tuple((a + b) / 2 for a, b in zip(self.edges, self.edges[1:], strict=False))


def _buckets(end: float, buckets: int) -> tuple[int, float]:
    """How many equal buckets cover [0, end] (at most `buckets`, none under a second), and
    their width."""
    count = max(1, min(buckets, math.ceil(end))) if end > 0 else 1
    return count, end / count if end > 0 else 1.0


def _edges(end: float, count: int, width: float) -> tuple[float, ...]:
    return tuple(round(min(i * width, end), _DIGITS) for i in range(count + 1))


class _Steps:
    """Time-weighted integrals of a step function over equal buckets of [0, end]."""

    def __init__(self, buckets: int, width: float) -> None:
        self.acc = [0.0] * buckets
        self.width = width
        self.total = 0.0

    def add(self, value: float, start: float, end: float) -> None:
        if end <= start or not value:
            return
        self.total += value * (end - start)
        last = len(self.acc) - 1
        b = min(int(start / self.width), last)
        while b <= last:
            low, high = b * self.width, (b + 1) * self.width if b < last else math.inf
            overlap = min(end, high) - max(start, low)
            if overlap > 0:
                self.acc[b] += value * overlap
            if end <= high:
                break
            b += 1

    def averages(self, end: float) -> tuple[float, ...]:
        widths = [self.width] * len(self.acc)
        if widths:
            widths[-1] = end - self.width * (len(self.acc) - 1)
        return tuple(
            round(a / w, _DIGITS) if w > 0 else 0.0 for a, w in zip(self.acc, widths, strict=True)
        )


def node_timeline(
    result: SimResult, resource: str, buckets: int = NODE_BUCKETS
) -> NodeTimeline | None:
    """Use of `resource` per node over time, and its fragmentation; None without nodes."""
    if result.nodes is None:
        return None
    nodes = [n for n in result.nodes if n.allocatable.get(resource, 0) > 0]
    if not nodes:
        return None
    end = result.end
    count, width = _buckets(end, buckets)
    alloc = {n.name: n.allocatable[resource] for n in nodes}
    usable = {n.name for n in nodes if n.ready and not n.unschedulable}
    rows = {n.name: _Steps(count, width) for n in nodes}
    partial, whole = _Steps(count, width), _Steps(count, width)
    used = dict.fromkeys(alloc, 0)
    since = dict.fromkeys(alloc, 0.0)

    def split(name: str, amount: int) -> tuple[int, int]:
        if name not in usable:
            return 0, 0
        free = alloc[name] - amount
        if amount <= 0:
            return 0, alloc[name]
        return (free, 0) if free > 0 else (0, 0)

    partial_now = 0
    whole_now = sum(alloc[n] for n in usable)
    max_partial = 0
    changed = 0.0
    for event in _events_of(result.node_events, alloc):
        name, t = event.node, event.at
        amount = event.used.get(resource, 0)
        if amount == used[name]:
            continue
        rows[name].add(used[name], since[name], t)
        since[name] = t
        if t > changed:
            # What held at the end of the previous instant, not the steps within one.
            max_partial = max(max_partial, partial_now)
            partial.add(partial_now, changed, t)
            whole.add(whole_now, changed, t)
            changed = t
        old_partial, old_whole = split(name, used[name])
        new_partial, new_whole = split(name, amount)
        partial_now += new_partial - old_partial
        whole_now += new_whole - old_whole
        used[name] = amount
    max_partial = max(max_partial, partial_now)
    for name in alloc:
        rows[name].add(used[name], since[name], end)
    partial.add(partial_now, changed, end)
    whole.add(whole_now, changed, end)
    return NodeTimeline(
        resource=resource,
        edges=_edges(end, count, width),
        nodes=tuple(n.name for n in nodes),
        allocatable=tuple(alloc[n.name] for n in nodes),
        used=tuple(rows[n.name].averages(end) for n in nodes),
        partial_free=partial.averages(end),
        whole_free=whole.averages(end),
        avg_partial_free=partial.total / end if end > 0 else float(partial_now),
        avg_whole_free=whole.total / end if end > 0 else float(whole_now),
        max_partial_free=max_partial,
        capacity=sum(alloc[n] for n in usable),
    )


def _events_of(events: Iterable[NodeEvent], nodes: Mapping[str, object]) -> Iterable[NodeEvent]:
    return (e for e in events if e.node in nodes)


@dataclass(frozen=True, slots=True)
class LevelFree:
    """How much of a resource one domain of a topology level had free over a run: the
    largest gang that level could still keep in one domain."""

    topology: str
    level: str  # its node label
    resource: str
    domains: int
    largest: int  # the allocatable of the largest domain (Ready, schedulable nodes)
    avg_largest_free: float  # time-weighted over the run
    min_largest_free: int  # at any instant
    edges: tuple[float, ...] = ()  # bucket boundaries, one more than buckets
    largest_free: tuple[float, ...] = ()  # per bucket, time-weighted: the plot over time

    @property
    def times(self) -> tuple[float, ...]:
        """Bucket starts."""
        return self.edges[:-1]


def level_free(
    result: SimResult, resource: str, buckets: int = NODE_BUCKETS
) -> tuple[LevelFree, ...]:
    """Per topology level (but the hostname), the largest free amount of `resource` in one
    domain over time (summed up, and averaged over equal buckets for a plot): fragmentation
    as a gang that must stay in one domain sees it."""
    out: list[LevelFree] = []
    nodes = [
        n
        for n in result.nodes or ()
        if n.allocatable.get(resource, 0) > 0 and n.ready and not n.unschedulable
    ]
    alloc = {n.name: n.allocatable[resource] for n in nodes}
    for name, levels in sorted(result.topologies.items()):
        for depth, label in enumerate(levels):
            if label == HOSTNAME_LABEL:
                continue
            domain_of: dict[str, tuple[str, ...]] = {}
            for n in nodes:
                path = domain_path(n.labels, levels[: depth + 1])
                if path is not None:
                    domain_of[n.name] = path
            if not domain_of:
                continue
            free: dict[tuple[str, ...], int] = {}
            for node, path in domain_of.items():
                free[path] = free.get(path, 0) + alloc[node]
            largest = max(free.values())
            out.append(
                _level_over_time(result, name, label, resource, domain_of, free, largest, buckets)
            )
    return tuple(out)


def _level_over_time(
    result: SimResult,
    topology: str,
    label: str,
    resource: str,
    domain_of: Mapping[str, tuple[str, ...]],
    free: dict[tuple[str, ...], int],
    largest: int,
    buckets: int,
) -> LevelFree:
    used = dict.fromkeys(domain_of, 0)
    now = largest
    least = largest
    end = result.end
    count, width = _buckets(end, buckets)
    steps = _Steps(count, width)
    changed = 0.0
    for event in _events_of(result.node_events, domain_of):
        amount = event.used.get(resource, 0)
        node = event.node
        if amount == used[node]:
            continue
        if event.at > changed:
            # What held at the end of the previous instant, not the steps within one.
            least = min(least, now)
            steps.add(now, changed, event.at)
            changed = event.at
        free[domain_of[node]] -= amount - used[node]
        used[node] = amount
        now = max(free.values())
    least = min(least, now)
    steps.add(now, changed, end)
    return LevelFree(
        topology=topology,
        level=label,
        resource=resource,
        domains=len(free),
        largest=largest,
        avg_largest_free=steps.total / end if end > 0 else float(now),
        min_largest_free=least,
        edges=_edges(end, count, width),
        largest_free=steps.averages(end),
    )


# What the two topology tables of a report show, in the words of every rendering.
LEVELS_NOTE = (
    "the largest free room in one domain of the level over time: what the biggest gang that "
    "must stay in one domain could still get"
)
LANDED_NOTE = (
    "gangs (2 pods or more) on a flavor with a Topology, by the narrowest domain that held "
    "all their pods at their last admission; spread: none did"
)


def landed_columns(levels: Sequence[str]) -> list[str]:
    """The headers of the landed table after Queue and Gangs: "in one rack", ..., spread."""
    return [f"in one {level}" if level != SPREAD else level for level in levels]


@dataclass(frozen=True, slots=True)
class Landed:
    """Where one queue's gangs landed: how many of them one domain at each level held
    (narrowest first; SPREAD: none did)."""

    queue: str
    gangs: int
    by_level: Mapping[str, int]


def landed_by_queue(result: SimResult) -> tuple[tuple[str, ...], tuple[Landed, ...]]:
    """The levels, narrowest first, and per queue with gangs on a flavor with a Topology how
    many landed inside one domain of each (at their last admission): what spreading costs
    a team, next to what waiting for one domain costs it."""
    levels: list[str] = []
    for names in result.topologies.values():
        for label in reversed(names):
            if level_name(label) not in levels:
                levels.append(level_name(label))
    levels.append(SPREAD)
    counts: dict[str, dict[str, int]] = {}
    for job in result.jobs:
        if job.landed is not None:
            per = counts.setdefault(job.cluster_queue, {})
            per[job.landed] = per.get(job.landed, 0) + 1
    rows = tuple(Landed(queue, sum(per.values()), per) for queue, per in sorted(counts.items()))
    return tuple(levels), rows


@dataclass(frozen=True, slots=True)
class PlacementStats:
    """What placement did over a run with nodes."""

    nodes: int
    timelines: tuple[NodeTimeline, ...]
    levels: tuple[LevelFree, ...]  # per topology level and resource
    waited: int  # workloads that waited for nodes while quota allowed them
    wait_total: float  # seconds, summed over those workloads
    landed_levels: tuple[str, ...]  # narrowest first
    landed: tuple[Landed, ...]  # per queue with gangs on a flavor with a Topology


def placement_stats(result: SimResult, buckets: int = NODE_BUCKETS) -> PlacementStats | None:
    """Fragmentation per accelerator and waits for nodes; None in quota-only mode."""
    if result.nodes is None:
        return None
    resources = placement_resources(result.nodes)
    timelines = [node_timeline(result, r, buckets) for r in resources]
    waits = [j.placement_wait for j in result.jobs if j.placement_wait > 0]
    landed_levels, landed = landed_by_queue(result)
    return PlacementStats(
        nodes=len(result.nodes),
        timelines=tuple(t for t in timelines if t is not None),
        levels=tuple(f for r in resources for f in level_free(result, r, buckets)),
        waited=len(waits),
        wait_total=sum(waits),
        landed_levels=landed_levels,
        landed=landed,
    )


def placement_json(result: SimResult) -> dict[str, Any]:
    """The "placement" section of the JSON."""
    stats = placement_stats(result)
    if stats is None:
        return {"mode": "quota-only"}
    out: dict[str, Any] = {
        "mode": "nodes",
        "nodes": stats.nodes,
        "waitedForNodes": stats.waited,
        "waitForNodesTotal": round(stats.wait_total, _DIGITS),
        "fragmentation": {
            t.resource: {
                "capacity": t.capacity,
                "avgFreeOnPartlyUsedNodes": round(t.avg_partial_free, _DIGITS),
                "maxFreeOnPartlyUsedNodes": t.max_partial_free,
                "avgFreeOnEmptyNodes": round(t.avg_whole_free, _DIGITS),
            }
            for t in stats.timelines
        },
    }
    if stats.levels:
        out["topologyLevels"] = [
            {
                "topology": f.topology,
                "level": f.level,
                "resource": f.resource,
                "domains": f.domains,
                "largestDomain": f.largest,
                "avgLargestFree": round(f.avg_largest_free, _DIGITS),
                "minLargestFree": f.min_largest_free,
            }
            for f in stats.levels
        ]
    if stats.landed:
        out["topologyLanded"] = [
            {
                "queue": q.queue,
                "gangs": q.gangs,
                "levels": {lv: q.by_level[lv] for lv in stats.landed_levels if lv in q.by_level},
            }
            for q in stats.landed
        ]
    return out


@dataclass(frozen=True, slots=True)
class ClusterStats:
    """One worker cluster over the run: what it has, what ran there, how much it was used."""

    name: str
    labels: Mapping[str, str]
    nodes: int
    workloads: int  # workloads whose last run was there
    capacity: Mapping[str, int]  # per resource, on Ready, schedulable nodes
    avg_used: Mapping[str, float]  # per resource, time-weighted over [0, end]

    def utilisation(self, resource: str) -> float | None:
        """Average use / capacity of `resource` (None without capacity)."""
        capacity = self.capacity.get(resource, 0)
        return self.avg_used.get(resource, 0.0) / capacity if capacity else None


def _avg_used(
    events: Iterable[NodeEvent], names: set[str], resources: Sequence[str], end: float
) -> dict[str, float]:
    """The time-weighted average of what the pods on `names` request, per resource."""
    used = dict.fromkeys(resources, 0)
    on: dict[str, Mapping[str, int]] = {}
    total = dict.fromkeys(resources, 0.0)
    since = 0.0
    for event in events:
        if event.node not in names:
            continue
        for r in resources:
            total[r] += used[r] * (event.at - since)
        since = event.at
        before = on.get(event.node, {})
        for r in resources:
            used[r] += event.used.get(r, 0) - before.get(r, 0)
        on[event.node] = event.used
    for r in resources:
        total[r] += used[r] * (end - since)
    return {r: (total[r] / end if end > 0 else float(used[r])) for r in resources}


def cluster_stats(result: SimResult) -> list[ClusterStats]:
    """Per worker cluster, by name; empty for a scenario without any."""
    out: list[ClusterStats] = []
    for cluster in result.clusters:
        usable = [n for n in cluster.nodes if n.ready and not n.unschedulable]
        resources = placement_resources(cluster.nodes) if cluster.nodes else ["cpu"]
        capacity = {r: sum(n.allocatable.get(r, 0) for n in usable) for r in resources}
        names = {n.name for n in cluster.nodes}
        out.append(
            ClusterStats(
                name=cluster.name,
                labels=dict(cluster.labels),
                nodes=len(cluster.nodes),
                workloads=sum(1 for j in result.jobs if j.cluster == cluster.name),
                capacity=capacity,
                avg_used=_avg_used(result.node_events, names, resources, result.end),
            )
        )
    return out


def clusters_json(result: SimResult) -> dict[str, Any]:
    """The "clusters" section of the JSON: one entry per worker cluster."""
    return {
        c.name: {
            "labels": dict(sorted(c.labels.items())),
            "nodes": c.nodes,
            "workloads": c.workloads,
            "capacity": dict(c.capacity),
            "avgUsed": {r: round(v, _DIGITS) for r, v in c.avg_used.items()},
            "utilisation": {r: _round(c.utilisation(r)) for r in c.capacity},
        }
        for c in cluster_stats(result)
    }
