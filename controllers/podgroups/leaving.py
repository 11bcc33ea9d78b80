"""A deleted Workload of a group whose pods exist apart from Muster (a foreign PodGroup's, a
group queued by its owner): held by its finalizer, and so counting its quota, until no pod
of the group is bound any more; then let go."""

from __future__ import annotations

from controllers.runtime.resources import Obj
from controllers.scheduler import pods as p
from controllers.state import workloads as wls
from controllers.state.caches import Context

# Requeue while a leaving group's pods still hold room: a bound pod that finishes leaves the
# pod watch without an event to the group's key.
RETRY_SECONDS = 1.0


def settle_leaving(ctx: Context, workloads: list[Obj], pods: list[Obj], what: str) -> float | None:
    """Release each deleted Workload of `workloads` whose group (`pods`) has no bound pod;
    returns when to look again if one still waits."""
    retry = None
    for wl in workloads:
        if not wls.is_deleting(wl) or not wls.holds_finalizer(wl):
            continue
        if wls.has_quota(wl) and not wls.is_finished(wl) and any(p.node_of(x) for x in pods):
            retry = RETRY_SECONDS
            continue
        ctx.release_workload(wl, what)
    return retry
