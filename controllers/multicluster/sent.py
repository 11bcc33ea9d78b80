"""What the management cluster's Workload says of its dispatch, in its annotations: the
worker it was sent to, the placement planned there and when, whether the manager let its copy
start, and the workers whose copies it left behind. The record every step of the dispatcher
writes before it acts (dispatcher.py), and reads back after a restart."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from controllers.runtime.resources import Obj
from quota.api.names import (
    DISPATCH_ABANDONED_ANNOTATION,
    DISPATCH_PLAN_ANNOTATION,
    DISPATCH_STARTED_ANNOTATION,
    DISPATCHED_TO_ANNOTATION,
)
from quota.placement.gang import Placement


@dataclass(frozen=True, slots=True)
class Sent:
    """What the management cluster's Workload says of its dispatch."""

    cluster: str | None
    plan: Placement | None
    at: float
    started: bool
    abandoned: tuple[str, ...]

    @staticmethod
    def of(wl: Mapping[str, Any]) -> Sent:
        annotations = (wl.get("metadata") or {}).get("annotations") or {}
        plan, at = None, 0.0
        text = annotations.get(DISPATCH_PLAN_ANNOTATION)
        if text:
            try:
                plan, at = placement_from_json(text)
            except (ValueError, KeyError, TypeError):
                plan = None
        abandoned = tuple(
            c for c in (annotations.get(DISPATCH_ABANDONED_ANNOTATION) or "").split(",") if c
        )
        return Sent(
            annotations.get(DISPATCHED_TO_ANNOTATION) or None,
            plan,
            at,
            annotations.get(DISPATCH_STARTED_ANNOTATION) == "true",
            abandoned,
        )


def placement_to_json(placement: Placement, at: float) -> str:
    return json.dumps(
        {
            "nodes": {ps: [[n, c] for n, c in pairs] for ps, pairs in placement.nodes.items()},
            "requests": {ps: dict(r) for ps, r in placement.requests.items()},
            "total": placement.total,
            "at": round(at, 3),
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def placement_from_json(text: str) -> tuple[Placement, float]:
    data = json.loads(text)
    nodes = {ps: tuple((str(n), int(c)) for n, c in pairs) for ps, pairs in data["nodes"].items()}
    requests = {ps: {r: int(v) for r, v in req.items()} for ps, req in data["requests"].items()}
    return Placement(nodes, int(data["total"]), requests), float(data.get("at", 0.0))


def annotate(changes: Mapping[str, str | None]) -> Callable[[Obj], bool]:
    def mutate(wl: Obj) -> bool:
        annotations = wl.setdefault("metadata", {}).setdefault("annotations", {})
        changed = False
        for key, value in changes.items():
            if value is None:
                changed |= annotations.pop(key, None) is not None
            elif annotations.get(key) != value:
                annotations[key] = value
                changed = True
        return changed

    return mutate


FORGET = {
    DISPATCHED_TO_ANNOTATION: None,
    DISPATCH_PLAN_ANNOTATION: None,
    DISPATCH_STARTED_ANNOTATION: None,
}


def merged(first: Placement, then: Placement) -> Placement:
    """Both placements as one (a workload's plan after a scale-up)."""
    nodes: dict[str, Counter[str]] = {}
    for placement in (first, then):
        for ps, pairs in placement.nodes.items():
            into = nodes.setdefault(ps, Counter())
            for node, n in pairs:
                into[node] += n
    return Placement(
        {ps: tuple(sorted(c.items())) for ps, c in nodes.items()},
        first.total + then.total,
        {**first.requests, **then.requests},
    )
