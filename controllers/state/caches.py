"""The caches the controller runs on, and the context its reconcilers share.

Every replica runs every cache (so a standby takes over with warm caches); only the leader
acts on them. Jobs are watched only if they carry the queue-name label, and pods only if
they belong to an elastic Job: the controller never holds the rest of the cluster in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from controllers.runtime.events import EventRecorder
from controllers.runtime.informer import Informer, wait_all_synced
from controllers.runtime.resources import (
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    NODE,
    POD,
    PRIORITY_CLASS,
    RESOURCE_FLAVOR,
    WORKLOAD,
    Kube,
    Obj,
)
from controllers.state.workloads import now_utc, owner_job_uid
from quota.api.names import ELASTIC_POD_LABEL, JOB_UID_POD_LABEL, QUEUE_LABEL


def _job_uid_of_pod(pod: Obj) -> Iterable[str]:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    uid = labels.get(JOB_UID_POD_LABEL) or labels.get("controller-uid")
    return [uid] if uid else []


def _job_uid_of_workload(wl: Obj) -> Iterable[str]:
    uid = owner_job_uid(wl)
    return [uid] if uid else []


def _cluster_queue_of_lq(lq: Obj) -> Iterable[str]:
    cq = (lq.get("spec") or {}).get("clusterQueue")
    return [cq] if cq else []


class Recorder(Protocol):
    """The history store's hook (issue 7): told about every decision, never required.
    `make` builds the records and runs on the recorder's thread, off the admission path."""

    def record_later(self, make: Callable[[], Iterable[Any]]) -> None: ...


@dataclass
class Caches:
    """One informer per kind the controller reads."""

    jobs: Informer
    workloads: Informer
    pods: Informer
    cluster_queues: Informer
    local_queues: Informer
    flavors: Informer
    priority_classes: Informer
    nodes: Informer

    @classmethod
    def create(cls, kube: Kube, *, watch_timeout: int = 300) -> Caches:
        def informer(kind: Any, **kwargs: Any) -> Informer:
            return Informer(kube, kind, watch_timeout=watch_timeout, **kwargs)

        return cls(
            jobs=informer(JOB, label_selector=QUEUE_LABEL),
            workloads=informer(WORKLOAD, indexes={"job-uid": _job_uid_of_workload}),
            pods=informer(
                POD,
                label_selector=f"{ELASTIC_POD_LABEL}=true",
                indexes={"job-uid": _job_uid_of_pod},
            ),
            cluster_queues=informer(CLUSTER_QUEUE),
            local_queues=informer(LOCAL_QUEUE, indexes={"cluster-queue": _cluster_queue_of_lq}),
            flavors=informer(RESOURCE_FLAVOR),
            priority_classes=informer(PRIORITY_CLASS),
            nodes=informer(NODE),
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
        ]

    def start(self) -> None:
        for informer in self.all():
            informer.start()

    def stop(self) -> None:
        for informer in self.all():
            informer.stop()

    def wait_synced(self, timeout: float) -> None:
        wait_all_synced(self.all(), timeout)

    def workloads_of_job(self, job_uid: str) -> list[Obj]:
        return self.workloads.by_index("job-uid", job_uid)

    def pods_of_job(self, job_uid: str) -> list[Obj]:
        return self.pods.by_index("job-uid", job_uid)


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

    def record_later(self, make: Callable[[], Iterable[Any]]) -> None:
        """Tell the history store, if one is attached; it must never break a reconcile."""
        if self.recorder is None:
            return
        try:
            self.recorder.record_later(make)
        except Exception:  # the history store is optional; losing a record is not fatal
            logging.getLogger(__name__).exception("history recorder failed")
