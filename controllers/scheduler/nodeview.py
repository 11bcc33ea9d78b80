"""The node view one scheduler pass places on: every node, every pod bound to one (Muster's or
not), the pods this loop bound that the watch has not shown yet, and the room planned for
admitted groups that are not bound yet and the room held for pending preemptors while their
victims leave (both held by placeholder pods, by the same rules the admission cycle reserves
with).

Parsing is cached by resourceVersion, so a pass converts only the Nodes and Pods that
changed since the last one. A Node or Pod that cannot be parsed is left out with one warning
per version: a malformed node cannot be chosen, and nothing else is lost because of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from controllers.runtime.resources import Obj, object_key
from controllers.scheduler import pods as p
from controllers.scheduler.groups import Group
from controllers.scheduler.versions import ByVersion
from controllers.state import workloads as wls
from controllers.state.caches import Caches
from quota.api.quantity import QuantityError, parse_quantity
from quota.model.nodeconvert import bound_pod_from_manifest, node_from_manifest
from quota.model.snapshot import Assignment, Hold, PodSet, Workload
from quota.placement import BoundPod, Node, NodeView
from quota.placement.reservations import held_pods, planned_pods

log = logging.getLogger(__name__)

T = TypeVar("T")

# A bind the watch has not confirmed within this long is forgotten (the pod's room is then
# counted only if the cache shows it bound). Only a watch stalled that long could make it
# matter; the informer relists long before.
ASSUMED_TTL = 300.0


@dataclass(frozen=True)
class Assumed:
    """A pod this loop bound, until the watch shows it bound (or gone)."""

    uid: str
    node: str
    requests: Mapping[str, int]
    at: float


class Parsed:
    """Nodes and bound pods converted for placement, cached by resourceVersion."""

    def __init__(self) -> None:
        self._nodes = ByVersion(node_from_manifest, "node")
        self._pods = ByVersion(bound_pod_from_manifest, "pod")

    def nodes(self, objects: Iterable[Obj]) -> list[Node]:
        return list(self._nodes.convert(objects).values())

    def pods(self, objects: Iterable[Obj]) -> dict[str, BoundPod]:
        return self._pods.convert(objects)


def build_view(
    caches: Caches,
    parsed: Parsed,
    assumed: dict[str, Assumed],
    groups: Iterable[Group],
    hold_timeout_s: float = 300.0,
) -> tuple[NodeView, dict[str, list[BoundPod]]]:
    """The view, and the placeholder pods holding each group's planned room.

    Every bound pod of a group's Job is marked with the group's Workload, so that only the
    unbound rest of its plan is held (`quota.placement.reservations.planned_pods`, which the
    admission cycle reserves with too). Groups placed whole once hold no plan any more: their
    pods hold their own room. `assumed` is pruned of binds the watch has caught up with (or
    whose pod is gone).
    """
    nodes = parsed.nodes(caches.nodes.objects())
    bound = parsed.pods(caches.bound_pods())
    now = time.monotonic()
    for key, bind in list(assumed.items()):
        current = caches.node_pods.get(key)
        if (
            current is None
            or p.uid_of(current) != bind.uid
            or p.node_of(current)
            or now - bind.at > ASSUMED_TTL
        ):
            del assumed[key]
            continue
        bound[key] = BoundPod(key=key, node=bind.node, requests=bind.requests)
    planning: list[Workload] = []
    for group in groups:
        for pod in caches.live_pods_of_job(group.pods_key):
            key = p.key_of(pod)
            if key in bound:
                bound[key] = replace(bound[key], workload=group.key)
        if not group.scheduled and group.plan.get(group.pod_set):
            planning.append(_planned(group))
    holds: dict[str, list[BoundPod]] = {}
    for placeholder in planned_pods(planning, bound.values()):
        holds.setdefault(str(placeholder.workload), []).append(placeholder)
    pods = list(bound.values())
    for held in holds.values():
        pods.extend(held)
    # A group re-placed here must not land in room held for a preemptor either.
    pods.extend(held_pods(nominees(caches.workloads.objects()), time.time(), hold_timeout_s))
    return NodeView(nodes, pods), holds


def nominees(workloads: Iterable[Obj]) -> list[Workload]:
    """Pending Workloads with room held on nodes (`status.nomination`), as the reservation
    rule reads them: per-pod requests from the totals the nomination was written with."""
    out: list[Workload] = []
    for raw in workloads:
        nomination = wls.nomination(raw)
        if not nomination or (wls.has_quota(raw) and not wls.is_evicted(raw)):
            continue
        since = wls.parse_time(nomination.get("since"))
        if since is None:
            continue
        sets: list[PodSet] = []
        assignments: list[Assignment] = []
        try:
            for a in nomination.get("podSetAssignments") or []:
                count = int(a.get("count") or 0)
                if count <= 0:
                    continue
                per_pod = {
                    r: parse_quantity(str(v), r) // count
                    for r, v in (a.get("resourceUsage") or {}).items()
                }
                nodes = tuple((str(n["name"]), int(n["count"])) for n in a.get("nodes") or [])
                sets.append(PodSet(str(a["name"]), count, per_pod))
                assignments.append(Assignment(str(a["name"]), count, {}, nodes))
        except (KeyError, TypeError, ValueError, QuantityError) as error:
            log.warning(
                "nomination left out of placement",
                extra={"workload": object_key(raw), "error": str(error)},
            )
            continue
        hold = Hold(tuple(assignments), since.timestamp())
        out.append(Workload(object_key(raw), "", 0, 0.0, tuple(sets), hold=hold))
    return out


def _planned(group: Group) -> Workload:
    """The group as the reservation rule reads it: its pod sets, its admission, its plan."""
    sets = group.pod_sets or ((group.pod_set, group.admitted, group.per_pod),)
    return Workload(
        key=group.key,
        queue=group.cluster_queue,
        priority=group.priority,
        arrival=0.0,
        pod_sets=tuple(PodSet(name, count, dict(per_pod)) for name, count, per_pod in sets),
        admission=tuple(
            Assignment(name, count, {}, group.plan.get(name, ())) for name, count, _ in sets
        ),
    )
