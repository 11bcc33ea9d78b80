"""Which worker cluster an admitted gang is sent to: one where the whole gang fits now.

A gang is never split across clusters and never sent to two: each available worker is asked
with `place_gang` for every pod set of it at once, on the worker's nodes less its bound pods
and the room promised to gangs sent there before (`workers.worker_view`). Among the
workers where it fits, the fullest wins (bin-packing, as BinPack does among nodes): the one
with the least free room left, after placing it, of the gang's scarcest resource on the
nodes the gang may use there, ties by name. Small gangs then fill clusters already in use,
and big gangs still find whole empty clusters. The queue's placement strategy decides where
the pods go inside the chosen cluster; the choice of cluster is always bin-packing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from quota.dispatch.gang import NO_TOPOLOGIES, admitted_gang
from quota.dispatch.workers import WorkerState, worker_view
from quota.model.resources import format_amount
from quota.model.snapshot import Flavor, Workload
from quota.placement.candidates import candidates
from quota.placement.framework import Profile
from quota.placement.gang import GangRequest, Placement, Unplaceable, place_gang
from quota.placement.nodes import PODS, NodeView, demand_of
from quota.placement.profiles import PROFILES, STRATEGIES, Strategy
from quota.placement.scoring import scarcity_order

NO_WORKERS = "no worker cluster matches the queue's clusterSelector"
# Bounds on a NoCluster reason: one cluster's words, clusters named per reason, the whole.
_REASON_CHARS = 300
_NAMES = 6
_TOTAL_CHARS = 1500


@dataclass(frozen=True, slots=True)
class Dispatched:
    """Send the gang to `cluster`, its pods on the nodes of `placement`.

    `resource` is the gang's scarcest resource, the one clusters were compared on, and
    `left` how much of it the chosen cluster's usable nodes have free once the gang is there.
    """

    cluster: str
    placement: Placement
    reason: str
    resource: str = ""
    left: int = 0


@dataclass(frozen=True, slots=True)
class NoCluster:
    """No worker cluster can take the whole gang now, and why.

    `clusters` is each worker and why it does not fit, by name. `never` is set when no
    worker could take it even with every pod there gone and every one of them answers:
    only new clusters or nodes can help, not waiting for room.
    """

    reason: str
    clusters: tuple[tuple[str, str], ...] = ()
    never: bool = False


@dataclass(frozen=True, slots=True)
class _Fit:
    """A worker where the gang fits: its placement there and the room left after it."""

    name: str
    placement: Placement
    before: Mapping[str, int]  # free on the nodes the gang may use, per resource
    left: Mapping[str, int]  # the same once the gang is placed


def choose_cluster(
    workload: Workload,
    flavors: Mapping[str, Flavor],
    workers: Iterable[WorkerState],
    strategy: Strategy | Profile = "BinPack",
    topologies: Mapping[str, tuple[str, ...]] = NO_TOPOLOGIES,
) -> Dispatched | NoCluster:
    """The one worker cluster to send the admitted `workload` to, whole, or why none fits.

    `workers` are the clusters its queue's clusterSelector picks; `strategy` is the queue's
    placementStrategy (how pods go to nodes inside a cluster); `topologies` maps a Topology
    name to its levels' node labels, widest first, for flavors that name one.
    """
    profile = _profile(strategy)
    gang = admitted_gang(workload, flavors, topologies)
    ordered = sorted(workers, key=lambda w: w.name)
    names = [w.name for w in ordered]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"worker cluster {twice[0]} is listed twice")
    if not ordered:
        return NoCluster(NO_WORKERS, (), True)
    fits: list[_Fit] = []
    failed: list[tuple[str, str, bool]] = []  # (worker, why, never)
    for worker in ordered:
        if not worker.available:
            failed.append((worker.name, worker.why or "unavailable", False))
            continue
        if gang is None:
            # Nothing to place: the first worker that answers takes it.
            empty = Placement({}, 0, {})
            return Dispatched(
                worker.name,
                empty,
                f"sent to worker cluster {worker.name}: "
                "it has no pods to place, and the cluster answers",
            )
        try:
            view = worker_view(worker, frozenset({workload.key}))
        except ValueError as error:
            failed.append((worker.name, f"its nodes and pods cannot be read: {error}", False))
            continue
        found = place_gang(view, gang, profile)
        if isinstance(found, Unplaceable):
            failed.append((worker.name, found.reason, found.never))
            continue
        fits.append(_fit(worker.name, view, gang, found, profile))
    clusters = tuple((name, why) for name, why, _ in failed)
    if gang is None or not fits:
        pods = gang.count if gang is not None else 0
        never = all(n for _, _, n in failed)
        return NoCluster(_no_cluster_reason(pods, failed), clusters, never)
    lead = _scarcest(gang, fits)
    ranked = sorted(fits, key=lambda f: (f.left.get(lead, 0), f.name))
    best = ranked[0]
    reason = _dispatched_reason(gang, lead, ranked, failed)
    return Dispatched(best.name, best.placement, reason, lead, best.left.get(lead, 0))


def _profile(strategy: Strategy | Profile) -> Profile:
    if isinstance(strategy, Profile):
        return strategy
    if strategy not in PROFILES:
        known = ", ".join(STRATEGIES)
        raise ValueError(f"unknown placement strategy {strategy!r} (one of {known})")
    return PROFILES[strategy]


def _fit(
    name: str, view: NodeView, gang: GangRequest, placement: Placement, profile: Profile
) -> _Fit:
    """The room on the nodes the gang may use there (its flavors' nodes that pass the
    filters), before and after placing it; an overcommitted node counts as none."""
    usable: set[str] = set()
    for ps in gang.pod_sets:
        cands = candidates(view, ps.shape, profile.filters)
        for share in cands.shares:
            usable.update(s.name for s in share.group.states if s.name not in share.skip)
        usable.update(s.name for s in cands.nodes)
    usage = placement.usage()
    before: dict[str, int] = {}
    left: dict[str, int] = {}
    for node in usable:
        free = view.free(node)
        taken = usage.get(node, {})
        for r, v in free.items():
            before[r] = before.get(r, 0) + max(0, v)
            left[r] = left.get(r, 0) + max(0, v - taken.get(r, 0))
    return _Fit(name, placement, before, left)


def _scarcest(gang: GangRequest, fits: list[_Fit]) -> str:
    """The gang's scarcest resource over the workers where it fits: the least free there
    per amount the gang asks (GPUs, on GPU clusters), one for all so they compare alike."""
    wanted: dict[str, int] = {}
    for ps in gang.pod_sets:
        for r, v in demand_of(ps.shape.requests):
            wanted[r] = wanted.get(r, 0) + v * ps.count
    asked = tuple(sorted((r, v) for r, v in wanted.items() if v > 0))
    return scarcity_order(asked, lambda r: sum(f.before.get(r, 0) for f in fits))[0]


def _amount(resource: str, amount: int) -> str:
    if resource == PODS:
        return f"{amount:,} pod slot{'' if amount == 1 else 's'}"
    return f"{format_amount(resource, amount)} {resource}"


def _pods(n: int) -> str:
    return f"{n:,} pod" if n == 1 else f"{n:,} pods"


def _dispatched_reason(
    gang: GangRequest, lead: str, ranked: list[_Fit], failed: list[tuple[str, str, bool]]
) -> str:
    best = ranked[0]
    left = _amount(lead, best.left.get(lead, 0))
    head = (
        f"sent to worker cluster {best.name}: the whole gang of {_pods(gang.count)} fits there "
        f"and leaves {left} free on the nodes it may use"
    )
    if len(ranked) == 1:
        where = "the only worker cluster where it fits"
        if failed:
            others = "other" if len(failed) == 1 else "others"
            where += f" ({len(failed)} {others} cannot take it now)"
        return f"{head}, {where}"
    runner = ranked[1]
    return (
        f"{head}, the fullest of the {len(ranked)} worker clusters where it fits "
        f"(next: {runner.name}, which would leave {_amount(lead, runner.left.get(lead, 0))})"
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _named(names: list[str]) -> str:
    if len(names) <= _NAMES:
        return ", ".join(names)
    return f"{', '.join(names[:_NAMES])} and {len(names) - _NAMES} more"


def _no_cluster_reason(pods: int, failed: list[tuple[str, str, bool]]) -> str:
    """Every worker and why it cannot take the gang, workers with the same reason together,
    the shortest reasons first, within a bounded length."""
    by_reason: dict[str, list[str]] = {}
    for name, why, _ in failed:
        by_reason.setdefault(_clip(why, _REASON_CHARS), []).append(name)
    what = f"the whole gang of {_pods(pods)}" if pods else "the workload"
    text = f"no worker cluster can take {what} now"
    entries = sorted(by_reason.items(), key=lambda item: (len(item[0]), item[0]))
    parts: list[str] = []
    used = len(text)
    unsaid: list[str] = []
    for why, names in entries:
        part = f"{_named(names)}: {why}"
        if parts and used + len(part) + 2 > _TOTAL_CHARS:
            unsaid.extend(names)
            continue
        parts.append(part)
        used += len(part) + 2
    if unsaid:
        parts.append(f"{_named(sorted(unsaid))}: longer reasons, left out here")
    return f"{text}: {'; '.join(parts)}"
