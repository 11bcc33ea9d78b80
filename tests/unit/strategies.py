"""Hypothesis strategies for random queue trees, workloads and snapshots, and small builders.

Reusable by any test of the quota core: `queue_trees()` draws a tree of ClusterQueues,
`snapshots()` a whole cycle input, and `apply_cycle()` plays a cycle's decisions forward the
way the shell would (admit, evict victims back to pending), so multi-cycle properties can be
checked without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hypothesis import strategies as st

from quota.model.decisions import CycleResult
from quota.model.snapshot import (
    Assignment,
    FlavorQuota,
    PodSet,
    QueueSpec,
    Snapshot,
    Workload,
    queue_tree,
)

GPU = "nvidia.com/gpu"
CPU = "cpu"


# -- builders for table tests -------------------------------------------------------------


def queue(
    name: str,
    parent: str | None = None,
    quota: int = 0,
    limit: int | None = None,
    flavor: str = "h100",
    resource: str = GPU,
    **fields: object,
) -> QueueSpec:
    """A queue with quota (and optionally a limit) of one resource in one flavor."""
    limits = {resource: limit} if limit is not None else {}
    return QueueSpec(
        name, parent, flavors=(FlavorQuota(flavor, {resource: quota}, limits),), **fields
    )  # type: ignore[arg-type]


def workload(
    key: str,
    queue_name: str,
    gpus: int = 1,
    count: int = 1,
    priority: int = 0,
    arrival: float = 0.0,
    flavor: str | None = None,
    admitted_at: float | None = None,
    resource: str = GPU,
    **fields: object,
) -> Workload:
    """A one-pod-set workload asking `gpus` per pod; admitted on `flavor` when given."""
    admission = (Assignment("main", count, {resource: flavor}),) if flavor else None
    return Workload(
        key,
        queue_name,
        priority,
        arrival,
        (PodSet("main", count, {resource: gpus}),),
        admission=admission,
        admitted_at=(admitted_at if admitted_at is not None else 0.0) if flavor else None,
        **fields,  # type: ignore[arg-type]
    )


def queues_of(*specs: QueueSpec) -> dict[str, QueueSpec]:
    """Index queue specs by name."""
    return {spec.name: spec for spec in specs}


# -- strategies ---------------------------------------------------------------------------


@st.composite
def tree_shapes(
    draw: st.DrawFn, max_queues: int = 10, max_depth: int = 3, min_queues: int = 1
) -> dict[str, str | None]:
    """Queue name -> parent name (None for roots), at most `max_depth` levels."""
    n = draw(st.integers(min_value=min_queues, max_value=max_queues))
    parents: dict[str, str | None] = {}
    depth: dict[str, int] = {}
    for i in range(n):
        name = f"q{i}"
        options = [p for p in parents if depth[p] < max_depth - 1]
        parent = draw(st.one_of(st.none(), st.sampled_from(options))) if options else None
        parents[name] = parent
        depth[name] = 0 if parent is None else depth[parent] + 1
    return parents


@st.composite
def queue_trees(
    draw: st.DrawFn,
    flavors: Sequence[str] = ("h100",),
    resources: Sequence[str] = (GPU,),
    max_queues: int = 10,
    well_formed: bool = False,
    policies: bool = False,
    min_queues: int = 1,
) -> dict[str, QueueSpec]:
    """A random tree of queues with quotas, limits, weights and priorities; weight 0 and
    zero quotas are drawn too, and with `min_queues=0` an empty tree.

    `well_formed` makes every parent guarantee at least the sum of its children's quotas.
    `policies` draws preemption and reclaim policies too (otherwise Never).
    """
    parents = draw(tree_shapes(max_queues=max_queues, min_queues=min_queues))
    children: dict[str, list[str]] = {name: [] for name in parents}
    for name, parent in parents.items():
        if parent is not None:
            children[parent].append(name)
    quotas: dict[str, dict[tuple[str, str], int]] = {}
    # Children first (higher index = drawn later = never a parent of an earlier queue).
    for name in sorted(parents, key=lambda n: -int(n[1:])):
        amounts: dict[tuple[str, str], int] = {}
        for f in flavors:
            for r in resources:
                floor = sum(quotas[c][(f, r)] for c in children[name]) if well_formed else 0
                amounts[(f, r)] = floor + draw(st.integers(min_value=0, max_value=6))
        quotas[name] = amounts
    specs: dict[str, QueueSpec] = {}
    for name, parent in parents.items():
        flavor_quotas = []
        for f in flavors:
            quota = {r: quotas[name][(f, r)] for r in resources}
            limit: dict[str, int] = {}
            for r in resources:
                if draw(st.booleans()):
                    limit[r] = quota[r] + draw(st.integers(min_value=0, max_value=8))
            flavor_quotas.append(FlavorQuota(f, quota, limit))
        specs[name] = QueueSpec(
            name=name,
            parent=parent,
            priority=draw(st.integers(min_value=0, max_value=2)),
            over_quota_weight=draw(st.sampled_from((0.0, 0.5, 1.0, 1.0, 2.0, 3.0))),
            flavors=tuple(flavor_quotas),
            queueing_strategy=draw(st.sampled_from(("BestEffortFIFO", "StrictFIFO"))),
            within_queue=(
                draw(st.sampled_from(("Never", "LowerPriority", "LowerOrNewerEqualPriority")))
                if policies
                else "Never"
            ),
            reclaim=draw(st.sampled_from(("Never", "LowerPriority", "Any")))
            if policies
            else "Never",
        )
    return specs


@st.composite
def pending_workloads(
    draw: st.DrawFn,
    queues: Mapping[str, QueueSpec],
    resources: Sequence[str] = (GPU,),
    max_workloads: int = 12,
    partial: bool = True,
) -> tuple[Workload, ...]:
    """Pending one-pod-set workloads spread over the leaves of `queues`."""
    tree = queue_tree(queues)
    leaves = sorted(name for name in queues if tree.is_leaf(name))
    n = draw(st.integers(min_value=0, max_value=max_workloads if leaves else 0))
    out = []
    for i in range(n):
        count = draw(st.integers(min_value=1, max_value=3))
        min_count = draw(st.one_of(st.none(), st.integers(1, count))) if partial else None
        per_pod = {r: draw(st.integers(min_value=1, max_value=4)) for r in resources}
        out.append(
            Workload(
                key=f"ns/w{i}",
                queue=draw(st.sampled_from(leaves)),
                priority=draw(st.integers(min_value=0, max_value=2)),
                arrival=float(i),
                pod_sets=(PodSet("main", count, per_pod, min_count=min_count),),
            )
        )
    return tuple(out)


@st.composite
def snapshots(
    draw: st.DrawFn,
    flavors: Sequence[str] = ("h100",),
    resources: Sequence[str] = (GPU,),
    with_capacity: bool | None = None,
    well_formed: bool = False,
    policies: bool = False,
    max_workloads: int = 12,
    min_queues: int = 1,
) -> Snapshot:
    """A snapshot with a random tree (empty with `min_queues=0`), optional node capacity,
    and pending workloads."""
    queues = draw(
        queue_trees(
            flavors=flavors,
            resources=resources,
            well_formed=well_formed,
            policies=policies,
            min_queues=min_queues,
        )
    )
    if with_capacity is None:
        with_capacity = draw(st.booleans())
    capacity = None
    if with_capacity:
        capacity = {
            (f, r): draw(st.integers(min_value=0, max_value=30)) for f in flavors for r in resources
        }
    pending = draw(pending_workloads(queues, resources, max_workloads))
    return Snapshot(now=1_000.0, queues=queues, flavors={}, capacity=capacity, pending=pending)


# -- playing decisions forward ------------------------------------------------------------


def apply_cycle(snapshot: Snapshot, result: CycleResult, now: float | None = None) -> Snapshot:
    """The next snapshot as the shell would leave it: admitted workloads admitted, victims and
    drained workloads evicted back to pending (same arrival), replaced slices retired."""
    now = snapshot.now if now is None else now
    admits = {a.workload: a for a in result.admit}
    evicted = {v.workload for p in result.preempt for v in p.victims} | {
        v.workload for v in result.drain
    }
    admitted: list[Workload] = []
    pending: list[Workload] = []
    replaced = set()
    for w in snapshot.pending:
        a = admits.get(w.key)
        if a is None:
            pending.append(w)
            continue
        # Usage comes from the assignment counts, so a partial admission holds what it got.
        admitted.append(replace(w, admission=a.assignments, admitted_at=now, replaces=None))
        if w.replaces is not None:
            replaced.add(w.replaces)
    for w in snapshot.admitted:
        if w.key in replaced:
            continue
        if w.key in evicted:
            pending.append(replace(w, admission=None, admitted_at=None, evicting=False))
        else:
            admitted.append(w)
    return replace(snapshot, now=now, admitted=tuple(admitted), pending=tuple(pending))
