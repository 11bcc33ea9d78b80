"""Elastic workloads as slices: how a scale event changes what a workload holds.

- Scale-up: a new slice for the full new size names the admitted slice it replaces. Once the
  new slice is admitted the old one stops counting against quota (its pods continue under
  the new slice) and is retired.
- Scale-down: the admitted slice shrinks in place and its extra quota is free at once.

Slices are named by key only, so the rules hold for the engine's workloads, the controller's
Workload objects and the simulator's slices alike.
"""

from __future__ import annotations

from collections.abc import Container


def superseded_slice(key: str, replaces: str | None, admitted: Container[str]) -> str | None:
    """The slice that admitting slice `key` retires: the one it `replaces`, if that one is
    admitted (never the slice itself)."""
    if replaces is None or replaces == key or replaces not in admitted:
        return None
    return replaces


def slice_replaced_message(new_slice: str, pods: int | None = None) -> str:
    """Why a slice was retired, naming its successor (and its size, when known)."""
    size = f" ({pods} pods)" if pods is not None else ""
    return (
        f"replaced by slice {new_slice}{size} after scale-up; its pods continue under the new slice"
    )


def pods_after_scale_down(admitted: int, requested: int) -> int:
    """Pods a slice keeps when asked for `requested` while `admitted` were granted: a
    scale-down never grows an admission, and it takes effect at once."""
    return min(admitted, requested)
