"""Where one group's waiting pods go, decided on the pass's node view.

The group is placed whole or not at all (`quota.placement.place_gang`). Nodes are tried in
order of preference, each time for the whole group: the nodes its admission was planned on
(the plan the admission decided with, while it still fits), then the nodes already running
the Job's pods (an elastic scale-up lands next to its running pods), then any node. The
reason a group waits is always the last, widest attempt's: the one that speaks of every
node.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

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


def pod_sets(group: Group) -> tuple[list[tuple[str, PodShape, list[Obj]]], str | None]:
    """The waiting pods as pod sets of identical pods: (name, shape, pods); or an error
    naming the pod and field when a pod's spec cannot be read."""
    by_key: dict[str, list[Obj]] = {}
    for pod in group.waiting:
        by_key.setdefault(p.shape_key(pod), []).append(pod)
    out: list[tuple[str, PodShape, list[Obj]]] = []
    for i, members in enumerate(by_key.values()):
        first = members[0]
        try:
            shape = pod_shape_from_spec(p.spec_of(first), subject=f"Pod {p.key_of(first)}")
        except ManifestError as error:
            return [], describe(error)
        name = group.pod_set if i == 0 else f"{group.pod_set}-{i + 1}"
        out.append((name, on_labels(shape, group.node_labels), members))
    return out, None


def on_labels(shape: PodShape, labels: Mapping[str, str]) -> PodShape:
    """`shape` restricted to nodes carrying `labels` (a requirement added to every term)."""
    if not labels:
        return shape
    extra = tuple(Requirement(k, "In", (v,)) for k, v in sorted(labels.items()))
    terms = shape.affinity or (SelectorTerm(()),)
    return replace(shape, affinity=tuple(SelectorTerm((*t.requirements, *extra)) for t in terms))


def _request(
    sets: list[tuple[str, PodShape, list[Obj]]], only: Collection[str] | None
) -> GangRequest:
    return GangRequest(
        tuple(
            PodSetRequest(name, len(members), shape if only is None else pinned(shape, only))
            for name, shape, members in sets
        )
    )


def decide(
    view: NodeView,
    group: Group,
    strategy: Strategy = "BinPack",
    *,
    planned: Mapping[str, int] | None = None,
) -> Decision:
    """Place the group's waiting pods on the view, or say why they wait.

    `planned` is node -> pods the admission planned and not yet bound there; those nodes
    are tried first. The view is left as it was: the caller assumes a placement it keeps.
    """
    sets, error = pod_sets(group)
    if error is not None:
        return Decision(group, reason=f"cannot read the pods: {error}", error=True)
    if not sets:
        return Decision(group, reason="no pod waits")
    preferences: list[tuple[str, Collection[str]]] = []
    if planned:
        preferences.append(("planned nodes", [n for n in planned if n in view]))
    running = [n for n in group.bound_on() if n in view]
    if running and strategy == "BinPack":  # Spread wants the pods apart, not together
        preferences.append(("nodes running the Job's pods", running))
    for label, nodes in preferences:
        if not nodes:
            continue
        found = place_gang(view, _request(sets, nodes), strategy)
        if isinstance(found, Placement):
            return _decision(group, sets, found, label)
    found = place_gang(view, _request(sets, None), strategy)
    if isinstance(found, Unplaceable):
        return Decision(group, reason=found.reason, never=found.never)
    return _decision(group, sets, found, "")


def _decision(
    group: Group, sets: list[tuple[str, PodShape, list[Obj]]], placement: Placement, label: str
) -> Decision:
    binds: list[tuple[Obj, str]] = []
    for name, _, members in sets:
        binds.extend(zip(members, placement.pod_nodes(name), strict=True))
    return Decision(group, placement, tuple(binds), label)


def nodes_text(counts: Mapping[str, int], limit: int = 8) -> str:
    """ "n-0 (8), n-1 (8)" (counts shown when above one), the first `limit` by pods."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = [name if n == 1 else f"{name} ({n})" for name, n in ranked[:limit]]
    more = f" and {len(ranked) - limit} more" if len(ranked) > limit else ""
    return ", ".join(shown) + more
