"""The caches the controller runs on, and the context its reconcilers share.

Every replica runs every cache (so a standby takes over with warm caches); only the leader
acts on them. Jobs are watched only if they carry the queue-name label. Pods are watched
twice, for two different questions: `pods` holds the pods of elastic Jobs, finished ones
included (the gates count them), and `node_pods` holds every pod that is not finished,
cluster-wide, Muster's or not, because placement must count every pod that holds room on a
node (a node full of someone else's pods is full).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from controllers.runtime import apply
from controllers.runtime.events import EventRecorder
from controllers.runtime.informer import Informer, wait_all_synced
from controllers.runtime.resources import (
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    NAMESPACE,
    NODE,
    PDB,
    POD,
    POD_GROUP,
    PRIORITY_CLASS,
    RESOURCE_FLAVOR,
    TOPOLOGY,
    WORKLOAD,
    Kind,
    Kube,
    Obj,
    object_key,
)
from controllers.state import workloads as wls
from controllers.state.foreigngroups import group_id_of_pod
from controllers.state.ownergroups import gid_of
from controllers.state.workloads import now_utc, owner_job_key, owner_job_uid
from quota.api.names import (
    ELASTIC_POD_LABEL,
    JOB_UID_POD_LABEL,
    OWNER_UID_POD_LABEL,
    QUEUE_LABEL,
)

# The pods that can hold room on a node: finished ones never do. The apiserver filters, and
# a pod that finishes leaves this watch as a DELETED event, so the cache never holds the
# (often many) finished pods of completed Jobs.
UNFINISHED_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def job_uid_of_pod(pod: Obj) -> Iterable[str]:
    """The ids of what owns the pod: its owner's or Job's uid, and the foreign PodGroup it
    names (if any), so that a Workload finds its pods by either (a TrainJob's pods carry
    both when its runtime also asks for Volcano's PodGroup); or, for a pod queued by its
    owner (`ownergroups`), its group's id."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    uid = (
        labels.get(OWNER_UID_POD_LABEL)
        or labels.get(JOB_UID_POD_LABEL)
        or labels.get("controller-uid")
    )
    if uid:
        return [i for i in (uid, group_id_of_pod(pod)) if i]
    return [i for i in (group_id_of_pod(pod), gid_of(pod)) if i]


def _node_of_pod(pod: Obj) -> Iterable[str]:
    node = (pod.get("spec") or {}).get("nodeName")
    return [node] if node else []


def _scheduler_of_unbound_pod(pod: Obj) -> Iterable[str]:
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return []
    return [spec.get("schedulerName") or "default-scheduler"]


def _owner_of_group(gid: str) -> list[str]:
    """The owner of a group queued by its owner (`ownergroups`): the set a LeaderWorkerSet
    group belongs to, any other group itself; so a change of the owner finds its groups."""
    return [gid.partition("#")[0]] if gid else []


def _owner_of_pod(pod: Obj) -> Iterable[str]:
    return _owner_of_group(gid_of(pod))


def _owner_of_workload(wl: Obj) -> Iterable[str]:
    return _owner_of_group(wls.owner_group_id(wl) or "")


def _job_uid_of_workload(wl: Obj) -> Iterable[str]:
    uid = owner_job_uid(wl)
    return [uid] if uid else []


def _job_key_of_workload(wl: Obj) -> Iterable[str]:
    key = owner_job_key(wl)
    return [key] if key else []


def _cluster_queue_of_lq(lq: Obj) -> Iterable[str]:
    cq = (lq.get("spec") or {}).get("clusterQueue")
    return [cq] if cq else []


class Recorder(Protocol):
    """The history store's hook (issue 7): told about every decision, never required.
    `make` builds the records and runs on the recorder's thread, off the admission path."""

    def record_later(self, make: Callable[[], Iterable[Any]]) -> None: ...


def served(kube: Kube, kind: Kind) -> bool:
    """Whether the apiserver serves an optional kind (its CRD is installed, and this
    identity may list it): only then is it watched."""
    try:
        kube.list_page(kind, limit=1)
    except ApiException as error:
        if error.status in (404, 403):
            return False
        raise
    return True


def extra_key(kind: Kind) -> str:
    """The key of an optional kind's informer in `Caches.extra` (an Integration's name)."""
    return f"{kind.group}/{kind.version}/{kind.name}"


class _NamespaceLabels(Mapping[str, Mapping[str, str]]):
    """The namespaces' labels read from the cache as they are asked for: an admission
    cycle asks for its LocalQueues' namespaces only, so nothing is copied per cycle."""

    def __init__(self, namespaces: Informer) -> None:
        self._namespaces = namespaces

    def __getitem__(self, name: str) -> Mapping[str, str]:
        found = self._namespaces.get(name)
        if found is None:
            raise KeyError(name)
        return (found.get("metadata") or {}).get("labels") or {}

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, _ in self._namespaces.items()])

    def __len__(self) -> int:
        return len(self._namespaces.objects())


@dataclass
class Caches:
    """One informer per kind the controller reads.

    - `pods`: pods of elastic Jobs (label `muster.dev/elastic-job=true`), finished ones
      included; index `job-uid`. The scheduling gates are lifted from these.
    - `node_pods`: every pod in the cluster that is not Succeeded or Failed, whoever owns it
      and whichever scheduler places it. Bound pods (spec.nodeName set) hold room on their
      node: count each with `quota.model.nodeconvert.bound_pod_from_manifest` (which also
      skips finished and unbound ones). Indexes: `node` (node name -> the pods bound to it),
      `job-uid` (a Job's uid -> its unfinished pods, bound or not) and `unbound-scheduler`
      (schedulerName -> pods not bound yet). Read it through `bound_pods()`,
      `pods_on_node()`, `live_pods_of_job()` and `unbound_pods()`.
    - `pod_groups`: Muster's PodGroups, one per admitted Workload that Muster's scheduler
      places, named after the Workload.
    - `budgets`: PodDisruptionBudgets, which preemption respects best effort.
    - `namespaces`: every Namespace, for its labels: a ClusterQueue's namespaceSelector
      decides which namespaces' LocalQueues may feed it (`namespace_labels()`).
    - `topologies`: Muster's Topologies, the levels a flavor's nodes nest in.
    """

    jobs: Informer
    workloads: Informer
    pods: Informer
    cluster_queues: Informer
    local_queues: Informer
    flavors: Informer
    priority_classes: Informer
    nodes: Informer
    node_pods: Informer
    pod_groups: Informer
    budgets: Informer
    namespaces: Informer
    topologies: Informer
    # Informers of optional kinds, by `extra_key` ("group/version/Kind"): the integrated
    # workload kinds beyond batch Jobs and what they read (JobSet, TrainJob, training
    # runtimes), added by the manager only when the apiserver serves their CRDs.
    extra: dict[str, Informer] = field(default_factory=dict)

    def add_extra(self, informer: Informer) -> Informer:
        self.extra[extra_key(informer.kind)] = informer
        return informer

    def extra_of(self, kind: Kind) -> Informer | None:
        """The informer of an optional kind, if the manager added one."""
        return self.extra.get(extra_key(kind))

    @classmethod
    def create(cls, kube: Kube, *, watch_timeout: int = 300) -> Caches:
        def informer(kind: Any, **kwargs: Any) -> Informer:
            return Informer(kube, kind, watch_timeout=watch_timeout, **kwargs)

        return cls(
            jobs=informer(JOB, label_selector=QUEUE_LABEL),
            workloads=informer(
                WORKLOAD,
                indexes={
                    "job-uid": _job_uid_of_workload,
                    "job-key": _job_key_of_workload,
                    "owner": _owner_of_workload,
                },
            ),
            pods=informer(
                POD,
                label_selector=f"{ELASTIC_POD_LABEL}=true",
                indexes={"job-uid": job_uid_of_pod},
            ),
            cluster_queues=informer(CLUSTER_QUEUE),
            local_queues=informer(LOCAL_QUEUE, indexes={"cluster-queue": _cluster_queue_of_lq}),
            flavors=informer(RESOURCE_FLAVOR),
            priority_classes=informer(PRIORITY_CLASS),
            nodes=informer(NODE),
            node_pods=informer(
                POD,
                name="node-pods",
                field_selector=UNFINISHED_PODS,
                indexes={
                    "node": _node_of_pod,
                    "job-uid": job_uid_of_pod,
                    "owner": _owner_of_pod,
                    "unbound-scheduler": _scheduler_of_unbound_pod,
                },
            ),
            pod_groups=informer(POD_GROUP),
            budgets=informer(PDB),
            namespaces=informer(NAMESPACE),
            topologies=informer(TOPOLOGY),
        )

    def all(self) -> list[Informer]:
        return [
            self.jobs,
            self.workloads,
            self.pods,
            self.cluster_queues,
            self.local_queues,
            self.flavors,
            self.priority_classes,
            self.nodes,
            self.node_pods,
            self.pod_groups,
            self.budgets,
            self.namespaces,
            self.topologies,
            *self.extra.values(),
        ]

    def start(self) -> None:
        for informer in self.all():
            informer.start()

    def stop(self) -> None:
        for informer in self.all():
            informer.stop()

    def wait_synced(self, timeout: float) -> None:
        wait_all_synced(self.all(), timeout)

    def namespace_labels(self) -> Mapping[str, Mapping[str, str]]:
        """Each namespace's labels, as `quota.api.queuetree.check_queue_tree` takes them."""
        return _NamespaceLabels(self.namespaces)

    def workloads_of_job(self, job_uid: str) -> list[Obj]:
        return self.workloads.by_index("job-uid", job_uid)

    def workloads_of_job_key(self, key: str) -> list[Obj]:
        """Workloads owned by any Job ever named `key` ("ns/name"), including one deleted
        or no longer in the Jobs cache."""
        return self.workloads.by_index("job-key", key)

    def pods_of_job(self, job_uid: str) -> list[Obj]:
        """The elastic pods of a Job, finished ones included (for the gates)."""
        return self.pods.by_index("job-uid", job_uid)

    def live_pods_of_job(self, job_uid: str) -> list[Obj]:
        """Every unfinished pod of a Job, elastic or not, bound or not."""
        return self.node_pods.by_index("job-uid", job_uid)

    def pods_on_node(self, node: str) -> list[Obj]:
        """The unfinished pods bound to `node` (terminating ones included: they still hold
        their room until they are gone)."""
        return self.node_pods.by_index("node", node)

    def bound_pods(self) -> list[Obj]:
        """Every unfinished pod bound to a node, cluster-wide."""
        return [p for p in self.node_pods.objects() if (p.get("spec") or {}).get("nodeName")]

    def unbound_pods(self, scheduler_name: str) -> list[Obj]:
        """Unfinished pods not bound yet whose spec.schedulerName is `scheduler_name`."""
        return self.node_pods.by_index("unbound-scheduler", scheduler_name)


@dataclass
class Context:
    """What every reconciler is given: the API, the caches, Events, who we are, a clock."""

    kube: Kube
    caches: Caches
    events: EventRecorder
    identity: str
    now: Callable[[], datetime] = now_utc
    recorder: Recorder | None = None
    # Called when something the admission loop decides from has changed.
    poke_admission: Callable[[], None] = field(default=lambda: None)

    def update_workload(
        self, wl: Obj, mutate: apply.Mutation, *, status: bool = False
    ) -> Obj | None:
        """Change a Workload from the version read (its status with `status`), written
        through to the cache."""
        return apply.update(
            self.kube,
            WORKLOAD,
            object_key(wl),
            mutate,
            cache=self.caches.workloads,
            current=wl,
            status=status,
        )

    def release_workload(self, wl: Obj, what: str) -> None:
        """Take the resource-in-use finalizer off a leaving Workload whose pods are gone: it is
        deleted at once, and its quota with it.

        Not written through to the cache: a write-through racing the watch's DELETED event
        would bring it back into the cache, holding its quota there."""
        key = object_key(wl)
        apply.update(self.kube, WORKLOAD, key, lambda w: wls.set_finalizer(w, False), current=wl)
        logging.getLogger(__name__).info(f"{what} released", extra={"workload": key})
        self.poke_admission()

    def record_later(self, make: Callable[[], Iterable[Any]]) -> None:
        """Tell the history store, if one is attached; it must never break a reconcile."""
        if self.recorder is None:
            return
        try:
            self.recorder.record_later(make)
        except Exception:  # the history store is optional; losing a record is not fatal
            logging.getLogger(__name__).exception("history recorder failed")
