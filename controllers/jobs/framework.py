"""The seam between Muster and the workload kinds it queues: what a kind must answer, and
the registry the reconciler and the manager find kinds in.

To plug in a new kind (JobSet, TrainJob, ...), add a module to `controllers/jobs/`:

1. a class that wraps one object of the kind and implements `GenericJob` (read its state,
   suspend it, run it on the assigned flavors, restore it, say what Workload it asks for);
2. an `Integration` naming the kind, its apiVersion, how to wrap an object and which cache
   holds the objects, passed to `register()` when the module is imported;
3. a `Reconciler(ctx, integration)` (from `controllers.jobs.reconciler`) in the manager,
   fed with the keys of that cache. The reconciler, the elastic slices and the gates are
   shared by every kind; nothing of them is copied.

This module imports nothing else from `controllers.jobs`: the reconciler, the slices and
every kind import it, never the other way round. A new kind is also named in
`controllers.state.workloads.OWNER_KINDS` (Workloads owned by it are indexed by its uid),
and, if its pods are not a batch Job's own, its `run_with` labels its pod templates with
`muster.dev/owner-uid` so that its pods are found by that uid too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controllers.runtime import apply
from controllers.runtime.informer import Informer
from controllers.runtime.resources import Kind, Obj
from controllers.state.caches import Caches, Context


class GenericJob(Protocol):
    """One object of a workload kind, wrapped. Mutators change the wrapped dict in place
    (the reconciler hands them a fresh copy inside a conflict-retried update); those that
    return a bool say whether anything changed."""

    @property
    def object(self) -> Obj:
        """The wrapped object, as read from the cache or the apiserver."""
        ...

    def queue_name(self) -> str | None:
        """The LocalQueue it asks for; None means Muster leaves it alone."""
        ...

    def is_suspended(self) -> bool: ...

    def suspend(self) -> bool:
        """Stop it from running."""
        ...

    def hold_pods(self) -> bool:
        """Elastic and never started: make sure its pods are created behind the admission
        gate (the webhook does this at creation; this covers objects created while it was
        down)."""
        ...

    def run_with(self, flavors: Sequence[Mapping[str, Any]], granted: Mapping[str, int]) -> None:
        """Admitted: merge the flavors' node labels and tolerations into its pods, size each
        pod set to the pods `granted` it (pod set name -> count), and unsuspend."""
        ...

    def restore(self) -> bool:
        """Undo `run_with` on the template (not the suspension); False if nothing to undo."""
        ...

    def workload_spec(
        self, priorities: Mapping[str, int], *, global_default: str | None, count: int | None
    ) -> Obj:
        """The Workload spec it asks for, from the object as its user wrote it (`count`
        overrides the elastic pod set's size). Raises ValueError naming the bad field."""
        ...

    def finished(self) -> tuple[str, str] | None:
        """(reason, message) once it has succeeded or failed for good."""
        ...

    def pods_gone(self) -> bool:
        """No pod of it runs or terminates any more, so its template may be restored."""
        ...

    def pod_counts(self) -> dict[str, int]:
        """Pods per pod set it runs at once as it stands now (after any change admission
        made), which a non-elastic object must never raise above what was admitted."""
        ...

    def is_elastic(self) -> bool:
        """Whether it resizes through WorkloadSlices rather than by suspension."""
        ...

    def first_pod_sets(self) -> list[str] | None:
        """For a kind that starts some pod sets only after others (a JobSet's dependsOn or
        InOrder start-up): the pod sets whose pods come first, which the scheduler places
        whole before the rest; None when all come at once."""
        ...

    def elastic_size(self) -> tuple[str, int]:
        """For an elastic object: the pod set that grows and shrinks, and how many pods it
        asks for now."""
        ...


@dataclass(frozen=True)
class Integration:
    """A workload kind as the registry knows it."""

    api_version: str
    kind: Kind
    wrap: Callable[[Obj], GenericJob]
    cache: Callable[[Caches], Informer]
    # For kinds that must read other objects to answer (a TrainJob reads its runtime): makes
    # the `wrap` to use from the caches; None uses `wrap` as it is.
    bind: Callable[[Caches], Callable[[Obj], GenericJob]] | None = None
    # Other kinds it reads through the caches (all objects, watched only with the kind).
    reads: tuple[Kind, ...] = ()

    def wrapper(self, caches: Caches) -> Callable[[Obj], GenericJob]:
        return self.bind(caches) if self.bind is not None else self.wrap

    @property
    def name(self) -> str:
        return f"{self.api_version}/{self.kind.name}"


_registry: dict[str, Integration] = {}


def register(integration: Integration) -> Integration:
    """Make a kind known; registering a second, different integration for it is an error."""
    known = _registry.setdefault(integration.name, integration)
    if known is not integration:
        raise ValueError(f"workload kind {integration.name} is already registered")
    return integration


def integrations() -> list[Integration]:
    """Every registered kind, in registration order."""
    return list(_registry.values())


def owner_of(wl: Mapping[str, Any]) -> tuple[Integration, str] | None:
    """The registered kind and key ("ns/name") of the object a Workload belongs to."""
    meta = wl.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        integration = _registry.get(f"{ref.get('apiVersion')}/{ref.get('kind')}")
        if integration is not None:
            return integration, f"{meta.get('namespace')}/{ref.get('name')}"
    return None


def same_request(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two Workload specs ask for the same thing (queue, priority, pod sets)."""
    keys = ("queueName", "priority", "priorityClassName", "podSets", "sliceName", "replaces")
    return all(a.get(k) == b.get(k) for k in keys)


class Driver(Protocol):
    """What the elastic slices need from the reconciler that calls them: its context and
    the steps they share with plain objects."""

    ctx: Context

    def desired_spec(
        self,
        job: GenericJob,
        *,
        count: int | None = None,
        slice_name: str | None = None,
        replaces: str | None = None,
    ) -> Obj: ...

    def new_workload(self, job: GenericJob, spec: Obj, name: str) -> Obj: ...

    def update_workload_spec(self, wl: Obj, desired: Obj) -> Obj | None: ...

    def update_workload_status(self, wl: Obj, mutate: apply.Mutation) -> Obj | None: ...

    def suspend(self, job: GenericJob) -> Obj | None: ...

    def start(self, job: GenericJob, wl: Obj) -> Obj | None: ...

    def stop(self, job: GenericJob, wl: Obj) -> float | None: ...

    def drive(self, job: GenericJob, wl: Obj, desired: Obj | None) -> float | None: ...
