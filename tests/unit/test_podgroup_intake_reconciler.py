"""The PodGroup intake reconciler over an in-memory apiserver: a Volcano group's Workload is
created once, the group is told each stage in Volcano's terms, an evicted group's bound pods
are deleted before its quota is released, a placed group whose pods are gone is Finished,
and a deleted Workload keeps its finalizer while a pod of its group is bound. (The
end-to-end tests show the same against the real apiserver.)"""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime
from typing import Any

from controllers.podgroups.intake import PodGroupIntake
from controllers.podgroups.kinds import VOLCANO_KIND
from controllers.runtime.events import EventRecorder
from controllers.runtime.informer import Informer
from controllers.runtime.resources import JOB, LOCAL_QUEUE, POD, POD_GROUP, WORKLOAD, Kind, Obj
from controllers.state import workloads as wls
from controllers.state.caches import Caches, Context
from controllers.state.foreigngroups import group_id
from quota.api.conditions import WorkloadConditions as WC
from tests.unit.controller_fakes import FakeKube

NOW = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
GID = group_id("scheduling.volcano.sh", "ns", "g")


class VolcanoKube(FakeKube):
    """FakeKube serves every kind with a status subresource; Volcano's PodGroup CRD has
    none, so there a write of the main resource carries its status."""

    def patch(
        self, kind: Kind, namespace: str | None, name: str, patch: Obj, *, status: bool = False
    ) -> Obj:
        if kind is VOLCANO_KIND and not status:
            assert set(patch) <= {"status", "metadata"}, "the intake writes only status there"
            status = True
        return super().patch(kind, namespace, name, patch, status=status)


class Harness:
    def __init__(self) -> None:
        self.kube = VolcanoKube()
        self.caches = Caches.create(self.kube)
        self.ctx = Context(
            kube=self.kube,
            caches=self.caches,
            events=EventRecorder(None, "test"),
            identity="test",
            now=lambda: NOW,
        )
        self.intake = PodGroupIntake(
            self.ctx, self.kube, "muster-scheduler", lambda: True, threading.Event()
        )
        self.volcano = Informer(self.kube, VOLCANO_KIND)
        self.intake.informers["scheduling.volcano.sh"] = self.volcano
        self.put(
            LOCAL_QUEUE,
            {"metadata": {"name": "team", "namespace": "ns"}, "spec": {"clusterQueue": "gpu"}},
        )
        self.put(
            VOLCANO_KIND,
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "PodGroup",
                "metadata": {"name": "g", "namespace": "ns", "uid": "pg-uid"},
                "spec": {"minMember": 2, "queue": "gpu"},
            },
        )
        for i in range(2):
            self.put(POD, pod(f"p{i}"))

    def cache(self, kind: Any) -> Informer:
        if kind is VOLCANO_KIND:
            return self.volcano
        return {
            "Workload": self.caches.workloads,
            "Pod": self.caches.node_pods,
            "LocalQueue": self.caches.local_queues,
            "PodGroup": self.caches.pod_groups,
            "Job": self.caches.jobs,
        }[kind.name]

    def put(self, kind: Any, obj: dict[str, Any]) -> dict[str, Any]:
        stored = self.kube.put(kind, obj)
        self.cache(kind).write_through(stored)
        return stored

    def sync(self, kind: Any) -> None:
        """Feed the cache what the fake apiserver holds now (the watch, in short)."""
        items, _ = self.kube.list(kind)
        cache = self.cache(kind)
        names = {f"{o['metadata'].get('namespace')}/{o['metadata']['name']}" for o in items}
        for key in cache.list_keys():
            if key not in names:
                cache.forget(key)
        for obj in items:
            cache.write_through(obj)

    def reconcile(self) -> float | None:
        return self.intake.reconcile(GID)

    def workload(self) -> dict[str, Any]:
        (wl,) = self.kube.list(WORKLOAD)[0]
        return wl

    def podgroup(self) -> dict[str, Any]:
        found = self.kube.get(VOLCANO_KIND, "ns", "g")
        assert found is not None
        return found

    def write_workload_status(self, mutate: Any) -> dict[str, Any]:
        w = copy.deepcopy(self.workload())
        assert mutate(w)
        written = self.kube.patch(
            WORKLOAD, "ns", w["metadata"]["name"], {"status": w["status"]}, status=True
        )
        self.caches.workloads.write_through(written)
        return written

    def bind_all(self) -> None:
        for i in range(2):
            written = self.kube.patch(POD, "ns", f"p{i}", {"spec": {"nodeName": "n1"}})
            self.caches.node_pods.write_through(written)

    def placed(self) -> None:
        """What the scheduler loop writes once the gang is bound: Muster's own PodGroup."""
        wl = self.workload()
        pg: dict[str, Any] = {"metadata": {"name": wl["metadata"]["name"], "namespace": "ns"}}
        wls.set_condition(pg, "PodGroupInitiallyScheduled", "True", "Scheduled", "2 of 2", NOW)
        self.put(POD_GROUP, pg)


def pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "annotations": {"scheduling.k8s.io/group-name": "g"},
        },
        "spec": {
            "schedulerName": "muster-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Pending"},
    }


def admit(wl: dict[str, Any]) -> bool:
    admission = wls.admission_status("gpu", [("main", 2, {"cpu": "default"}, {"cpu": "2"})])
    return wls.mark_admitted(wl, admission, "admitted to queue gpu", NOW)


def cond(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return wls.condition(obj, type_) or {}


def test_one_workload_owned_by_the_group_and_the_group_told_each_stage() -> None:
    h = Harness()
    h.reconcile()
    h.reconcile()
    wl = h.workload()  # exactly one, however often reconciled
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "pg-uid"
    assert wl["spec"]["queueName"] == "team" and wl["spec"]["podSets"][0]["count"] == 2
    assert h.podgroup()["status"]["phase"] == "Pending"

    h.write_workload_status(admit)
    h.reconcile()
    assert h.podgroup()["status"]["phase"] == "Inqueue"

    h.bind_all()
    h.placed()
    h.sync(VOLCANO_KIND)
    h.reconcile()
    status = h.podgroup()["status"]
    assert (status["phase"], status["running"]) == ("Running", 2)
    assert cond(h.podgroup(), "Scheduled")["status"] == "True"

    # Its pods finish (they leave the watch of unfinished pods): Finished, quota released.
    for i in range(2):
        h.kube.delete(POD, "ns", f"p{i}")
    h.sync(POD)
    h.sync(VOLCANO_KIND)
    h.reconcile()
    assert wls.is_finished(h.workload())
    assert cond(h.workload(), WC.FINISHED)["reason"] == WC.SUCCEEDED
    h.sync(VOLCANO_KIND)
    h.caches.workloads.write_through(h.workload())
    h.reconcile()
    assert h.podgroup()["status"]["phase"] == "Completed"


def test_evicted_group_loses_its_bound_pods_before_its_quota() -> None:
    h = Harness()
    h.reconcile()
    h.write_workload_status(admit)
    h.bind_all()
    h.placed()
    h.write_workload_status(
        lambda w: wls.mark_evicted(w, WC.EVICTED_BY_PREEMPTION, "preempted by x", NOW)
    )
    h.sync(VOLCANO_KIND)
    assert h.reconcile() is not None  # comes back to see the pods go
    assert h.kube.list(POD)[0] == [], "its bound pods are deleted"
    assert wls.has_quota(h.workload()), "quota held until they are gone"

    h.sync(POD)
    h.sync(VOLCANO_KIND)
    h.reconcile()
    wl = h.workload()
    assert not wls.has_quota(wl)
    assert cond(wl, wls.REQUEUED)["status"] == "False"
    assert h.podgroup()["status"]["phase"] == "Pending"


def test_a_deleted_workload_keeps_its_finalizer_while_a_pod_is_bound() -> None:
    h = Harness()
    h.reconcile()
    h.write_workload_status(admit)
    h.bind_all()
    wl = copy.deepcopy(h.workload())
    wl["metadata"]["deletionTimestamp"] = "2026-11-24T03:00:00Z"  # garbage collection
    h.caches.workloads.write_through(h.kube.put(WORKLOAD, wl))
    assert h.reconcile() is not None
    assert wls.holds_finalizer(h.workload())

    for i in range(2):
        h.kube.delete(POD, "ns", f"p{i}")
    h.sync(POD)
    h.reconcile()
    assert not wls.holds_finalizer(h.workload())


def test_a_group_whose_pods_name_another_scheduler_is_left_alone() -> None:
    h = Harness()
    for i in range(2):
        written = h.kube.patch(POD, "ns", f"p{i}", {"spec": {"schedulerName": "volcano"}})
        h.caches.node_pods.write_through(written)
    h.reconcile()
    assert h.kube.list(WORKLOAD)[0] == []
    assert "status" not in h.podgroup()


def test_a_group_whose_owner_muster_queues_itself_gets_no_second_workload() -> None:
    h = Harness()
    h.put(
        JOB,
        {
            "metadata": {
                "name": "train",
                "namespace": "ns",
                "uid": "job-uid",
                "labels": {"muster.dev/queue-name": "team"},
            },
            "spec": {},
        },
    )
    pg = copy.deepcopy(h.podgroup())
    pg["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "train",
            "uid": "job-uid",
            "controller": True,
        }
    ]
    h.put(VOLCANO_KIND, pg)
    h.reconcile()
    assert h.kube.list(WORKLOAD)[0] == [], "the Job's own Workload admits these pods"
