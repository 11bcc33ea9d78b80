"""Where one group's waiting pods go, decided on the pass's node view.

The group is placed whole or not at all (`quota.placement.place_gang`). Nodes are tried in
order of preference, each time for the whole group: the nodes its admission was planned on
(the plan the admission decided with, while it still fits), then the rest of the planned
domain for pod sets that keep to one (a topology request: `topology.py`), then the nodes
already running the Job's pods (an elastic scale-up lands next to its running pods), then
any node. Every attempt keeps each pod set in a domain as it asks, and a pod set that must
keep to one domain and has pods bound stays in theirs. The reason a group waits is always
the last, widest attempt's: the one that speaks of every node.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from controllers.jobs.jobset import REPLICATED_JOB_LABEL
from controllers.scheduler import pods as p
from controllers.scheduler.groups import Group
from controllers.scheduler.versions import describe
from quota.api import ManifestError
from quota.api.names import POD_SET_POD_LABEL
from quota.model.nodeconvert import pod_shape_from_spec
from quota.model.nodes import NAME_FIELD
from quota.placement import (
    GangRequest,
    NodeView,
    Placement,
    PodSetRequest,
    PodShape,
    Requirement,
    SelectorTerm,
    Strategy,
    Unplaceable,
    place_gang,
)
from quota.placement.topology import DomainRequest, domain_of, level_name

Obj = dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """A group's placement (pod -> node for every waiting pod) or why it waits."""

    group: Group
    placement: Placement | None = None
    binds: tuple[tuple[Obj, str], ...] = ()  # (pod, node), in binding order
    reason: str = ""  # why it waits, or which nodes were preferred
    never: bool = False  # no node could ever take it (only new nodes can help)
    error: bool = False  # the group's own objects are at fault, not the nodes
    # Each placed pod set that keeps to a Topology's domains: its request, its pods' nodes.
    domains: tuple[tuple[DomainRequest, tuple[str, ...]], ...] = ()

    @property
    def placed(self) -> bool:
        return self.placement is not None


def pinned(shape: PodShape, nodes: Collection[str]) -> PodShape:
    """`shape` restricted to `nodes` (a metadata.name requirement added to every term)."""
    only = Requirement(NAME_FIELD, "In", tuple(sorted(nodes)), field=True)
    terms = shape.affinity or (SelectorTerm(()),)
    return replace(shape, affinity=tuple(SelectorTerm((*t.requirements, only)) for t in terms))


# A pod set of identical waiting pods: (name, shape, pods, the domains they keep to, the
# Workload's pod set they belong to).
PodSet = tuple[str, PodShape, list[Obj], DomainRequest | None, str]


def pod_sets(group: Group, view: NodeView) -> tuple[list[PodSet], str | None]:
    """The waiting pods as pod sets of identical pods; or an error naming the pod and field
    when a pod's spec cannot be read.

    A pod set that keeps to one domain of a level (a required topology request) and has
    pods bound already is kept in their domain: its pods are one gang, and those bound
    will not move."""
    by_key: dict[tuple[str, str], list[Obj]] = {}
    for pod in group.waiting:
        by_key.setdefault((_pod_set_of(pod, group), p.shape_key(pod)), []).append(pod)
    out: list[PodSet] = []
    for i, ((set_name, _), members) in enumerate(by_key.items()):
        first = members[0]
        try:
            shape = pod_shape_from_spec(p.spec_of(first), subject=f"Pod {p.key_of(first)}")
        except ManifestError as error:
            return [], describe(error)
        name = group.pod_set if i == 0 else f"{group.pod_set}-{i + 1}"
        domain = group.domains.get(set_name)
        shape = on_labels(shape, group.node_labels)
        if domain is not None and domain.required and domain.level is not None:
            bound = [q for q in group.bound if _pod_set_of(q, group) == set_name]
            shape = on_labels(shape, domain_of(view, [p.node_of(q) for q in bound], domain))
        out.append((name, shape, members, domain, set_name))
    return out, None


def _pod_set_of(pod: Obj, group: Group) -> str:
    """The Workload pod set a pod belongs to: the only one, or the one its labels name
    (Muster's pod-set label, else the JobSet replicated job of a JobSet or TrainJob)."""
    if len(group.pod_sets) > 1:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        for key in (POD_SET_POD_LABEL, REPLICATED_JOB_LABEL):
            named = str(labels.get(key))
            if any(named == name for name, _, _ in group.pod_sets):
                return named
    return group.pod_set


def on_labels(shape: PodShape, labels: Mapping[str, str]) -> PodShape:
    """`shape` restricted to nodes carrying `labels` (a requirement added to every term)."""
    if not labels:
        return shape
    extra = tuple(Requirement(k, "In", (v,)) for k, v in sorted(labels.items()))
    terms = shape.affinity or (SelectorTerm(()),)
    return replace(shape, affinity=tuple(SelectorTerm((*t.requirements, *extra)) for t in terms))


def _request(
    sets: list[PodSet], view: NodeView, only: Collection[str] | None, widen: bool
) -> GangRequest:
    """The gang of `sets`, on the nodes `only` when given; `widen`: instead, each pod set
    that keeps to a domain on the domain holding those nodes, the others anywhere."""
    out = []
    for name, shape, members, domain, _ in sets:
        if only is not None:
            if not widen:
                shape = pinned(shape, only)
            elif domain is not None and domain.level is not None:
                shape = on_labels(shape, domain_of(view, only, domain))
        out.append(PodSetRequest(name, len(members), shape, domain=domain))
    return GangRequest(tuple(out))


def decide(
    view: NodeView,
    group: Group,
    strategy: Strategy = "BinPack",
    *,
    planned: Mapping[str, int] | None = None,
) -> Decision:
    """Place the group's waiting pods on the view, or say why they wait.

    `planned` is node -> pods the admission planned and not yet bound there; those nodes
    are tried first, then (for pod sets that keep to a domain) the rest of the planned
    domain. The view is left as it was: the caller assumes a placement it keeps.
    """
    if group.topology_refused is not None:
        return Decision(group, reason=group.topology_refused)
    sets, error = pod_sets(group, view)
    if error is not None:
        return Decision(group, reason=f"cannot read the pods: {error}", error=True)
    if not sets:
        return Decision(group, reason="no pod waits")
    preferences: list[tuple[str, Collection[str], bool]] = []
    if planned:
        plan = [n for n in planned if n in view]
        preferences.append(("planned nodes", plan, False))
        if any(domain is not None and domain.level is not None for _, _, _, domain, _ in sets):
            preferences.append(("the planned domain", plan, True))
    running = [n for n in group.bound_on() if n in view]
    if running and strategy == "BinPack":  # Spread wants the pods apart, not together
        preferences.append(("nodes running the Job's pods", running, False))
    for label, nodes, widen in preferences:
        if not nodes:
            continue
        found = place_gang(view, _request(sets, view, nodes, widen), strategy)
        if isinstance(found, Placement):
            return _decision(group, sets, found, label)
    found = place_gang(view, _request(sets, view, None, False), strategy)
    if isinstance(found, Placement):
        found = _in_one_domain(view, sets, found, strategy)
    if isinstance(found, Unplaceable):
        return Decision(group, reason=found.reason, never=found.never)
    return _decision(group, sets, found, "")


def _in_one_domain(
    view: NodeView, sets: list[PodSet], found: Placement, strategy: Strategy
) -> Placement | Unplaceable:
    """`found`, or, where the pods of one Workload pod set that requires one domain came in
    several shapes (a PodGroup's leader and workers) and were placed apart, the first
    placement with each such pod set's shapes pinned together in one domain, the domains
    `found` used tried first."""
    for owner in sorted({o for _, _, _, d, o in sets if d is not None and d.required}):
        mine = [s for s in sets if s[4] == owner]
        domain = mine[0][3]
        if len(mine) < 2 or domain is None or domain.level is None:
            continue
        label = domain.levels[domain.level]
        used = {view.node(n).labels.get(label) for s in mine for n, _ in found.nodes[s[0]]}
        if len(used) == 1:
            continue
        values = {view.node(n).labels.get(label) for n in view} - {None}
        for value in sorted(values, key=lambda v: (v not in used, v)):
            assert value is not None
            pinned_sets = [
                (n, on_labels(sh, {label: value}) if o == owner else sh, m, d, o)
                for n, sh, m, d, o in sets
            ]
            again = place_gang(view, _request(pinned_sets, view, None, False), strategy)
            if isinstance(again, Placement):
                found, sets = again, pinned_sets
                break
        else:
            return Unplaceable(
                f"no {level_name(label)} can hold every pod of pod set {owner} together"
            )
    return found


def _decision(group: Group, sets: list[PodSet], placement: Placement, label: str) -> Decision:
    binds: list[tuple[Obj, str]] = []
    for name, _, members, _, _ in sets:
        binds.extend(zip(members, placement.pod_nodes(name), strict=True))
    # Per Workload pod set keeping to domains (its pods may come in several shapes).
    kept: dict[str, tuple[DomainRequest, list[str]]] = {}
    for name, _, _, domain, owner in sets:
        if domain is not None:
            kept.setdefault(owner, (domain, []))[1].extend(placement.pod_nodes(name))
    domains = tuple((domain, tuple(nodes)) for domain, nodes in kept.values())
    return Decision(group, placement, tuple(binds), label, domains=domains)


def nodes_text(counts: Mapping[str, int], limit: int = 8) -> str:
    """ "n-0 (8), n-1 (8)" (counts shown when above one), the first `limit` by pods."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = [name if n == 1 else f"{name} ({n})" for name, n in ranked[:limit]]
    more = f" and {len(ranked) - limit} more" if len(ranked) > limit else ""
    return ", ".join(shown) + more
