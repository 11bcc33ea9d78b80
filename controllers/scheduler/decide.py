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

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from controllers.jobs.jobset import REPLICATED_JOB_LABEL
from controllers.scheduler import pods as p
from controllers.scheduler.groups import Group
from controllers.scheduler.nodeview import describe
from quota.api import ManifestError
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
from quota.placement.topology import DomainRequest

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

    @property
    def placed(self) -> bool:
        return self.placement is not None


def pinned(shape: PodShape, nodes: Collection[str]) -> PodShape:
    """`shape` restricted to `nodes` (a metadata.name requirement added to every term)."""
    only = Requirement(NAME_FIELD, "In", tuple(sorted(nodes)), field=True)
    terms = shape.affinity or (SelectorTerm(()),)
    return replace(shape, affinity=tuple(SelectorTerm((*t.requirements, only)) for t in terms))


# A pod set of identical waiting pods: (name, shape, pods, the domains they keep to).
PodSet = tuple[str, PodShape, list[Obj], DomainRequest | None]


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
            shape = on_labels(shape, _domain_of(view, [p.node_of(q) for q in bound], domain))
        out.append((name, shape, members, domain))
    return out, None


def _pod_set_of(pod: Obj, group: Group) -> str:
    """The Workload pod set a pod belongs to: the only one, or the JobSet replicated job
    (JobSet, TrainJob) it names."""
    if len(group.pod_sets) > 1:
        named = str(((pod.get("metadata") or {}).get("labels") or {}).get(REPLICATED_JOB_LABEL))
        if any(named == name for name, _, _ in group.pod_sets):
            return named
    return group.pod_set


def _domain_of(view: NodeView, nodes: Collection[str], domain: DomainRequest) -> dict[str, str]:
    """The label of the domain at the request's level holding most of `nodes` (empty when
    none of them is in the view)."""
    assert domain.level is not None
    label = domain.levels[domain.level]
    values = Counter(
        view.node(n).labels.get(label) for n in nodes if n in view and view.node(n).labels
    )
    values.pop(None, None)
    if not values:
        return {}
    value = max(values.items(), key=lambda kv: (kv[1], kv[0]))[0]
    assert value is not None
    return {label: value}


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
    for name, shape, members, domain in sets:
        if only is not None:
            if not widen:
                shape = pinned(shape, only)
            elif domain is not None and domain.level is not None:
                shape = on_labels(shape, _domain_of(view, only, domain))
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
        if any(domain is not None and domain.level is not None for *_, domain in sets):
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
    if isinstance(found, Unplaceable):
        return Decision(group, reason=found.reason, never=found.never)
    return _decision(group, sets, found, "")


def _decision(group: Group, sets: list[PodSet], placement: Placement, label: str) -> Decision:
    binds: list[tuple[Obj, str]] = []
    for name, _, members, _ in sets:
        binds.extend(zip(members, placement.pod_nodes(name), strict=True))
    return Decision(group, placement, tuple(binds), label)


def nodes_text(counts: Mapping[str, int], limit: int = 8) -> str:
    """ "n-0 (8), n-1 (8)" (counts shown when above one), the first `limit` by pods."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = [name if n == 1 else f"{name} ({n})" for name, n in ranked[:limit]]
    more = f" and {len(ranked) - limit} more" if len(ranked) > limit else ""
    return ", ".join(shown) + more
