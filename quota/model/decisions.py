"""What one admission cycle decided, as plain data the shell can act on and print.

Every pending workload of the snapshot appears exactly once, in `admit` or in `pending`;
a workload that is waiting for victims to go appears in `pending` and as the preemptor of one
entry in `preempt`. Every reason is a sentence a person can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from quota.model.snapshot import Assignment, Hold

# Moved: restarted on other nodes to defragment (consolidation), with room held for it there.
VictimKind = Literal["Preempted", "Reclaimed", "Moved"]


@dataclass(frozen=True, slots=True)
class Admit:
    """Admit `workload` with these flavors and pod counts."""

    workload: str
    queue: str
    assignments: tuple[Assignment, ...]
    borrowing: bool  # uses quota beyond the guarantee of its queue or an ancestor
    reason: str


@dataclass(frozen=True, slots=True)
class Victim:
    """An admitted workload to evict, and why."""

    workload: str
    queue: str
    kind: VictimKind
    reason: str
    hold: Hold | None = None  # Moved: where its pods go
    # Single-pod disruption: ((pod set, pods it loses), ...); None: the whole workload.
    pods: tuple[tuple[str, int], ...] | None = None
    # Which pods ("namespace/name") those are, when chosen on nodes (empty: its controller
    # chooses).
    pod_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Preempt:
    """Evict `victims` so that `preemptor` fits in a later cycle."""

    preemptor: str
    victims: tuple[Victim, ...]


@dataclass(frozen=True, slots=True)
class Pending:
    """`workload` stays pending this cycle, and why."""

    workload: str
    queue: str
    reason: str
    # Room held on nodes for it while victims leave (None: nothing held, or a hold released).
    hold: Hold | None = None


@dataclass(frozen=True, slots=True)
class CycleResult:
    """All decisions of one cycle, in the order they were taken."""

    admit: tuple[Admit, ...] = ()
    preempt: tuple[Preempt, ...] = ()
    pending: tuple[Pending, ...] = ()
    # Admitted workloads of queues with stopPolicy HoldAndDrain, to evict.
    drain: tuple[Victim, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for `muster admit --output json` and the history store)."""
        return {
            "admit": [
                {
                    "workload": a.workload,
                    "queue": a.queue,
                    "borrowing": a.borrowing,
                    "reason": a.reason,
                    "podSets": [
                        {"name": s.pod_set, "count": s.count, "flavors": dict(s.flavors)}
                        for s in a.assignments
                    ],
                }
                for a in self.admit
            ],
            "preempt": [
                {
                    "preemptor": p.preemptor,
                    "victims": [_victim(v) for v in p.victims],
                }
                for p in self.preempt
            ],
            "pending": [_pending(p) for p in self.pending],
            "drain": [_victim(v) for v in self.drain],
        }


def _pending(p: Pending) -> dict[str, Any]:
    out: dict[str, Any] = {"workload": p.workload, "queue": p.queue, "reason": p.reason}
    if p.hold is not None:
        out["hold"] = {
            "nodes": {a.pod_set: dict(a.nodes) for a in p.hold.assignments},
            "victims": list(p.hold.victims),
        }
    return out


def _victim(v: Victim) -> dict[str, str]:
    return {"workload": v.workload, "queue": v.queue, "kind": v.kind, "reason": v.reason}
