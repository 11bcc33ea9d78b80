"""The seam between Muster and the workload kinds it queues: what a kind must answer, what it
declares about itself, and the registry everything else derives from.

A kind lives in one module of `controllers/jobs/` (after Kueue's jobframework: one
interface a kind implements, registered by the kind) that holds:

1. a class that wraps one object of the kind and implements `GenericJob` (read its state,
   suspend it, run it on the assigned flavors, restore it, say what Workload it asks for);
   a kind that runs by `spec.suspend` and never resizes starts from `SuspendedObject`;
2. an `Integration` passed to `register()`: its apiVersion and kind (the owner of its
   Workloads), its resource (the rules of Muster's webhooks, admission policies and the
   chart's RBAC), how the apiserver admits it (`Admission`), whether it may be elastic,
   which Workload Events its objects get too (`events`), which cache holds its objects
   and what else it reads (the CRDs that must be served for it to run).

`controllers.jobs.kinds` lists the kind modules (the one line a new kind adds there), and
everything else is derived from the registry: the manager runs one shared `Reconciler`
per kind whose CRDs are served, the webhook configurations and admission policies take
their rules from it, Workload Events reach the owners (`controllers.jobs.ownerevents`),
and the chart's kind rules are generated from it (`controllers.jobs.kinds`). A kind whose
pods are not a batch Job's own labels its pod templates with `muster.dev/owner-uid` in
`run_with`, so that its pods are found by its uid.

This module imports nothing else from `controllers.jobs`: the reconciler, the slices and
every kind import it, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from controllers.runtime import apply
from controllers.runtime.informer import Informer
from controllers.runtime.resources import Kind, Obj
from controllers.state.caches import Caches, Context
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import OWNER_GROUP_ANNOTATION, OWNER_UID_POD_LABEL, QUEUE_LABEL
from quota.model import convert

# The LocalQueue an object without the queue label joins in a managed namespace (Kueue's
# default LocalQueue of `manageJobsWithoutQueueName`).
DEFAULT_LOCAL_QUEUE = "default"


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

    def workload_spec(self, priorities: Mapping[str, int], *, global_default: str | None) -> Obj:
        """The Workload spec it asks for, from the object as its user wrote it. Raises
        ValueError naming the bad field."""
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

    def elastic_sizes(self) -> dict[str, int]:
        """For an elastic object: each pod set that grows and shrinks, and how many pods it
        asks for now."""
        ...

    def pods_selector(self) -> str:
        """The label selector of its pods (a quorum read of them before gates are lifted)."""
        ...


def put_flavors(
    pod_spec: Obj, original: Mapping[str, Any], flavors: Sequence[Mapping[str, Any]]
) -> None:
    """Set a pod spec's nodeSelector and tolerations to the user's `original` ones with the
    assigned flavors' node labels and tolerations merged in (a field stays as it is when
    both are empty). Every kind runs its pods on their flavors this way."""
    selector = dict(original.get("nodeSelector") or {})
    tolerations = list(original.get("tolerations") or [])
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        selector.update(spec.get("nodeLabels") or {})
        for toleration in spec.get("tolerations") or []:
            if toleration not in tolerations:
                tolerations.append(toleration)
    if selector:
        pod_spec["nodeSelector"] = selector
    if tolerations:
        pod_spec["tolerations"] = tolerations


class SuspendedObject:
    """The part of `GenericJob` a kind shares when it runs by its own `spec.suspend` and never
    resizes through WorkloadSlices (JobSet, TrainJob): it subclasses this and adds the rest."""

    def __init__(self, obj: Obj) -> None:
        self._obj = obj

    @property
    def object(self) -> Obj:
        return self._obj

    def queue_name(self) -> str | None:
        return convert.job_queue_name(self._obj)

    def is_suspended(self) -> bool:
        return bool((self._obj.get("spec") or {}).get("suspend"))

    def suspend(self) -> bool:
        if self.is_suspended():
            return False
        self._obj.setdefault("spec", {})["suspend"] = True
        return True

    def hold_pods(self) -> bool:
        return False  # not elastic: suspension holds every pod back

    def is_elastic(self) -> bool:
        return False

    def elastic_sizes(self) -> dict[str, int]:
        raise NotImplementedError(f"a {self._obj.get('kind')} is never elastic")

    def pods_selector(self) -> str:
        return f"{OWNER_UID_POD_LABEL}={self._obj['metadata']['uid']}"


class Admission(Enum):
    """How the apiserver admits a labelled object of a kind, before Muster's reconciler sees
    it (webhooks in `controllers.webhooks`, or the same decisions as admission policies)."""

    # Muster's generic rule: created with `spec.suspend: true` (webhook msuspend.muster.dev,
    # policy muster-suspend); its pods reach Muster's scheduler through the owner label.
    SUSPEND = "suspend"
    # The batch Job's own rules: suspended, schedulerName set, elastic ones gated on
    # creation; updates validated (webhooks mjob/vjob.muster.dev, policies muster-jobs).
    BATCH_JOB = "batch-job"


# The Events about a Workload that the object it belongs to gets too: its eviction (the
# reason its Evicted condition gives) and, as a preemptor, whom it preempts, reclaims from
# or moves. `controllers.jobs.ownerevents` copies them, whoever writes them.
OWNER_EVENTS = frozenset(
    {
        WC.EVICTED_BY_PREEMPTION,
        WC.EVICTED_BY_RECLAIM,
        WC.CLUSTER_QUEUE_STOPPED,
        WC.LOCAL_QUEUE_STOPPED,
        WC.MOVED,
        WC.PREEMPTING,
        WC.RECLAIMING,
        WC.MOVING,
    }
)


@dataclass(frozen=True)
class Integration:
    """A workload kind as the registry knows it: everything about it that Muster's other
    parts derive from."""

    api_version: str
    kind: Kind
    wrap: Callable[[Obj], GenericJob]
    # Where its objects are cached: the manager's informer of the kind (`Caches.extra`,
    # added where its CRD is served) unless a built-in kind names one of the core caches.
    cache: Callable[[Caches], Informer] | None = None
    admission: Admission = Admission.SUSPEND
    # Whether its objects may resize through WorkloadSlices (each says so for itself in
    # `GenericJob.is_elastic`); a kind that never does is resized by eviction.
    elastic: bool = False
    events: frozenset[str] = OWNER_EVENTS
    # For kinds that must read other objects to answer (a TrainJob reads its runtime): makes
    # the `wrap` to use from the caches; None uses `wrap` as it is.
    bind: Callable[[Caches], Callable[[Obj], GenericJob]] | None = None
    # Other kinds it reads through the caches (all objects, watched only with the kind).
    reads: tuple[Kind, ...] = ()
    # Its resource (plural) where `kind` does not say (built-in kinds).
    resource: str = ""
    # For a kind whose reconcile follows its pods (an elastic Job's gates): the key of the
    # object a pod belongs to, if any.
    owner_of_pod: Callable[[Obj], str | None] | None = None

    def wrapper(self, caches: Caches) -> Callable[[Obj], GenericJob]:
        return self.bind(caches) if self.bind is not None else self.wrap

    def informer(self, caches: Caches) -> Informer:
        """The cache of its objects (KeyError: its CRD is not served, so none is kept)."""
        if self.cache is not None:
            return self.cache(caches)
        informer = caches.extra_of(self.kind)
        if informer is None:
            raise KeyError(self.name)
        return informer

    @property
    def name(self) -> str:
        return f"{self.api_version}/{self.kind.name}"

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def plural(self) -> str:
        """Its resource, as the API names it in paths and rules."""
        return self.resource or self.kind.plural

    @property
    def builtin(self) -> bool:
        """Served by every apiserver (no CRD to wait for)."""
        return not self.kind.custom

    def rule(self) -> dict[str, list[str]]:
        """Its resource as a webhook or admission-policy rule names it (no operations)."""
        return {
            "apiGroups": [self.group],
            "apiVersions": [self.api_version.rpartition("/")[2]],
            "resources": [self.plural],
        }


_registry: dict[str, Integration] = {}


def register(integration: Integration) -> Integration:
    """Make a kind known; registering a second, different integration for it is an error."""
    known = _registry.setdefault(integration.name, integration)
    if known is not integration:
        raise ValueError(f"workload kind {integration.name} is already registered")
    return integration


def owner_of(wl: Mapping[str, Any]) -> tuple[Integration, str] | None:
    """The registered kind and key ("ns/name") of the object a Workload belongs to (None for
    a group of pods queued by their owner, controllers/owners)."""
    meta = wl.get("metadata") or {}
    if OWNER_GROUP_ANNOTATION in (meta.get("annotations") or {}):
        return None
    for ref in meta.get("ownerReferences") or []:
        integration = _registry.get(f"{ref.get('apiVersion')}/{ref.get('kind')}")
        if integration is not None:
            return integration, f"{meta.get('namespace')}/{ref.get('name')}"
    return None


def child_of_managed_kind(obj: Mapping[str, Any]) -> bool:
    """Whether the object's controller (owner reference) is of a kind Muster queues (a
    JobSet's Jobs, a TrainJob's JobSet): its owner is queued, and it is not on its own."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(
        ref.get("controller") and f"{ref.get('apiVersion')}/{ref.get('kind')}" in _registry
        for ref in refs
    )


def queue_of(obj: Mapping[str, Any], *, managed: bool) -> str | None:
    """The LocalQueue an object of an integrated kind is in, or None when Muster leaves it
    alone: its queue label; without one, in a `managed` namespace, `DEFAULT_LOCAL_QUEUE`.
    Never for an object that belongs to an object of a kind Muster queues, labelled or not
    (a RayJob's RayCluster carries the RayJob's labels): its owner is queued, not it. The
    one rule for the reconciler, the webhooks (`controllers.webhooks.decisions`) and the
    admission policies' CEL (`controllers.webhooks.policies`, which say the same with the
    binding's namespace selector standing for `managed`)."""
    if child_of_managed_kind(obj):
        return None
    label = convert.job_queue_name(obj)
    if label:
        return label
    return DEFAULT_LOCAL_QUEUE if managed else None


def in_queue(obj: Obj, queue: str) -> Obj:
    """A view of the object labelled with the queue it is in (a shallow copy: do not
    mutate), so that what reads the label (the Workload spec) reads that queue."""
    meta = dict(obj.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), QUEUE_LABEL: queue}
    return {**obj, "metadata": meta}


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
        slice_name: str | None = None,
        replaces: str | None = None,
    ) -> Obj: ...

    def new_workload(self, job: GenericJob, spec: Obj, name: str) -> Obj: ...

    def update_workload_spec(self, wl: Obj, desired: Obj) -> Obj | None: ...

    def update_workload(
        self, wl: Obj, mutate: apply.Mutation, *, status: bool = False
    ) -> Obj | None: ...

    def suspend(self, job: GenericJob) -> Obj | None: ...

    def start(self, job: GenericJob, wl: Obj) -> Obj | None: ...

    def stop(self, job: GenericJob, wl: Obj) -> float | None: ...

    def drive(self, job: GenericJob, wl: Obj, desired: Obj | None) -> float | None: ...
