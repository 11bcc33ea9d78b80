"""Events about a Workload that the object it belongs to gets too, of every kind.

A person looks at their JobSet or TrainJob, not at Muster's Workload: its eviction (by
preemption, reclaim, a stopped queue, consolidation) and, as a preemptor, whom it preempts
must be told there, as for a batch Job. Whoever emits such an Event on a Workload (the
admission loop's writes, mostly), the recorder of the controller process copies it to the
owner when the owner's kind takes Events of that reason (`Integration.events`; a foreign
PodGroup takes `framework.OWNER_EVENTS`). The owner is named from the Workload's owner
reference, so no cache is read and an owner of any kind is found the same way.

A copy the emitter also writes on the owner itself (the batch Job's, from the admission
loop) is the same (object, reason, message), which the recorder drops as a repeat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controllers.jobs.framework import OWNER_EVENTS
from controllers.jobs.kinds import named
from controllers.runtime.events import EventRecorder
from controllers.state.foreigngroups import foreign_owner
from controllers.state.workloads import owner_group_id, owner_reference


def owner_to_tell(wl: Mapping[str, Any], reason: str) -> dict[str, Any] | None:
    """The object (as an Event names it) that gets an Event of `reason` emitted on the
    Workload `wl`, or None: a registered kind that takes it, a foreign PodGroup, or the
    owner of a group queued by its pods (controllers/owners)."""
    if wl.get("kind") != "Workload":
        return None
    ref = owner_reference(wl)
    events = None
    if ref is not None and owner_group_id(wl) is not None:
        events = OWNER_EVENTS  # a group queued by its pods: its owner hears what a Job would
    elif ref is not None:
        integration = named(f"{ref.get('apiVersion')}/{ref.get('kind')}")
        events = integration.events if integration is not None else None
    else:
        ref = foreign_owner(wl)
        events = OWNER_EVENTS if ref is not None else None
    if ref is None or events is None or reason not in events:
        return None
    return {
        "apiVersion": ref.get("apiVersion"),
        "kind": ref.get("kind"),
        "metadata": {
            "name": ref.get("name"),
            "namespace": (wl.get("metadata") or {}).get("namespace"),
            "uid": ref.get("uid"),
        },
    }


class OwnerEventRecorder(EventRecorder):
    """The controller's Event recorder: Workload Events of the reasons an owner takes are
    recorded on the owner too."""

    def emit(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        super().emit(obj, type_, reason, message)
        owner = owner_to_tell(obj, reason)
        if owner is not None:
            super().emit(owner, type_, reason, message)
