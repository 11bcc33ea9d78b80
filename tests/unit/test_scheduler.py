"""The scheduler loop's decisions against an in-memory apiserver: whole groups bound or none,
bin-packing, every bound pod counted, plans preferred and reserved, failures re-placed
without binding anything twice, and only while leading."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from controllers.runtime.events import EventRecorder
from controllers.runtime.resources import JOB, NODE, POD, POD_GROUP, WORKLOAD
from controllers.scheduler.loop import SchedulerLoop
from controllers.state.caches import Caches, Context
from quota.api.names import SCHEDULER_NAME
from tests.unit.controller_fakes import FakeKube

NOW = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
RESERVED = "2026-01-01T12:00:00Z"
GPU = "nvidia.com/gpu"
_names = itertools.count()


class Events(EventRecorder):
    """Keeps every Event emitted, in order."""

    def __init__(self) -> None:
        super().__init__(None, "test")
        self.seen: list[tuple[str, str, str, str]] = []  # kind/name, type, reason, message

    def emit(self, obj: Any, type_: str, reason: str, message: str) -> None:
        self.seen.append((f"{obj['kind']}/{obj['metadata']['name']}", type_, reason, message))


class Records:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def record_later(self, make: Callable[[], Iterable[Any]]) -> None:
        self.records.extend(make())


class Binder:
    """Binds in the fake apiserver; `watch=False` leaves the cache behind (a lagging watch)."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, ApiException] = {}
        self.watch = True

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.calls.append((name, node))
        if name in self.fail:
            raise self.fail.pop(name)
        pod = self.h.kube.get(POD, namespace, name)
        if pod is None:
            raise ApiException(status=404, reason="NotFound")
        if pod["spec"].get("nodeName"):
            raise ApiException(status=409, reason="Conflict")
        written = self.h.kube.patch(POD, namespace, name, {"spec": {"nodeName": node}})
        if self.watch:
            self.h.caches.node_pods.write_through(written)


class Harness:
    def __init__(self, leader: bool = True) -> None:
        self.kube = FakeKube()
        self.caches = Caches.create(self.kube)
        self.events = Events()
        self.records = Records()
        self.ctx = Context(
            kube=self.kube,
            caches=self.caches,
            events=self.events,
            identity="test",
            now=lambda: NOW,
            recorder=self.records,
        )
        self.binder = Binder(self)
        self.leader = leader
        self.loop = self.new_loop()

    def new_loop(self) -> SchedulerLoop:
        loop = SchedulerLoop(self.ctx, binder=self.binder, bind_workers=2, status_interval=0)
        loop._is_leader = lambda: self.leader
        return loop

    def put(self, kind: Any, obj: dict[str, Any]) -> dict[str, Any]:
        stored = self.kube.put(kind, obj)
        cache = {
            "Node": self.caches.nodes,
            "Pod": self.caches.node_pods,
            "Job": self.caches.jobs,
            "Workload": self.caches.workloads,
            "PodGroup": self.caches.pod_groups,
        }[kind.name]
        cache.write_through(stored)
        return stored

    def nodes(self, count: int, gpu: int = 8, prefix: str = "n") -> list[str]:
        names = [f"{prefix}-{i}" for i in range(count)]
        for name in names:
            room = {"cpu": "64", "memory": "256Gi", "pods": "110", GPU: str(gpu)}
            self.put(
                NODE,
                {
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                    "status": {
                        "allocatable": room,
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                },
            )
        return names

    def pod(
        self,
        name: str,
        job_uid: str = "",
        *,
        gpu: int = 1,
        node: str = "",
        gated: bool = False,
        scheduler: str = SCHEDULER_NAME,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "schedulerName": scheduler,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", GPU: str(gpu)}}}],
        }
        if node:
            spec["nodeName"] = node
        if gated:
            spec["schedulingGates"] = [{"name": "muster.dev/admission"}]
        labels = {"batch.kubernetes.io/controller-uid": job_uid} if job_uid else {}
        return self.put(
            POD,
            {
                "metadata": {
                    "name": name,
                    "namespace": "ns",
                    "labels": labels,
                    "creationTimestamp": f"2026-01-01T12:00:{next(_names) % 60:02d}Z",
                },
                "spec": spec,
                "status": {"phase": "Running" if node else "Pending"},
            },
        )

    def job(
        self,
        name: str,
        count: int,
        *,
        gpu: int = 1,
        pods: int | None = None,
        plan: dict[str, int] | None = None,
        priority: int = 0,
        gated: int = 0,
    ) -> str:
        """An admitted Job: its Job, its Workload and `pods` (default `count`) pods."""
        uid = f"uid-{name}"
        self.put(
            JOB,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "spec": {"template": {"spec": {"schedulerName": SCHEDULER_NAME}}},
            },
        )
        assignment: dict[str, Any] = {"name": "main", "count": count}
        if plan:
            assignment["nodes"] = [{"name": n, "count": c} for n, c in plan.items()]
        conditions = [
            {"type": t, "status": "True", "reason": t, "lastTransitionTime": RESERVED}
            for t in ("QuotaReserved", "Admitted")
        ]
        self.put(
            WORKLOAD,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "Workload",
                "metadata": {
                    "name": f"job-{name}",
                    "namespace": "ns",
                    "uid": f"wl-{name}",
                    "ownerReferences": [
                        {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}
                    ],
                },
                "spec": {
                    "queueName": "team",
                    "priority": priority,
                    "podSets": [
                        {"name": "main", "count": count, "requests": {"cpu": "1", GPU: str(gpu)}}
                    ],
                },
                "status": {
                    "admission": {"clusterQueue": "cq", "podSetAssignments": [assignment]},
                    "conditions": conditions,
                },
            },
        )
        for i in range(count if pods is None else pods):
            self.pod(f"{name}-{i}", uid, gpu=gpu)
        for i in range(gated):
            self.pod(f"{name}-gated-{i}", uid, gpu=gpu, gated=True)
        return uid

    def run(self) -> None:
        self.loop.schedule_once()
        self.loop.publisher.writer.flush_due()

    def placement(self, job: str) -> dict[str, int]:
        """Node -> pods of `job` bound there, as the apiserver has them."""
        out: dict[str, int] = {}
        for pod in self.kube.list(POD)[0]:
            if pod["metadata"]["name"].startswith(f"{job}-") and pod["spec"].get("nodeName"):
                node = pod["spec"]["nodeName"]
                out[node] = out.get(node, 0) + 1
        return out

    def pod_group(self, job: str) -> dict[str, Any]:
        found = self.kube.get(POD_GROUP, "ns", f"job-{job}")
        assert found is not None, f"no PodGroup for job {job}"
        return found


def condition(obj: dict[str, Any]) -> dict[str, Any]:
    [found] = [c for c in obj["status"]["conditions"] if c["type"] == "PodGroupInitiallyScheduled"]
    return dict(found)


def test_sixteen_one_gpu_pods_are_bin_packed_onto_two_of_four_nodes() -> None:
    h = Harness()
    h.nodes(4)
    h.job("train", 16)
    h.run()
    assert sorted(h.placement("train").values()) == [8, 8]
    assert len(h.binder.calls) == 16


def test_no_pod_is_bound_until_the_whole_gang_exists() -> None:
    h = Harness()
    h.nodes(4)
    uid = h.job("train", 16, pods=10)
    h.run()
    assert h.binder.calls == []
    waiting = condition(h.pod_group("train"))
    assert (waiting["status"], waiting["reason"]) == ("False", "WaitingForPods")
    assert "10 of 16" in waiting["message"]
    for i in range(10, 16):
        h.pod(f"train-{i}", uid)
    h.run()
    assert sum(h.placement("train").values()) == 16


def test_pods_muster_does_not_manage_are_counted() -> None:
    h = Harness()
    h.nodes(2)
    # Bound by kube-scheduler, not Muster's: n-0 is full.
    h.pod("foreign", gpu=8, node="n-0", scheduler="default-scheduler")
    h.job("train", 8)
    h.run()
    assert h.placement("train") == {"n-1": 8}


def test_a_group_that_never_fits_waits_with_a_reason_and_blocks_no_other() -> None:
    h = Harness()
    h.nodes(2)
    h.job("huge", 2, gpu=9, priority=100)  # more important, and first in line
    h.job("small", 2)
    h.run()
    h.run()
    assert h.placement("huge") == {}
    assert sum(h.placement("small").values()) == 2
    waits = condition(h.pod_group("huge"))
    assert (waits["status"], waits["reason"]) == ("False", "Unschedulable")
    assert GPU in waits["message"] and "9" in waits["message"], waits
    # Told once, not once per pass.
    failed = [e for e in h.events.seen if e[2] == "FailedPlacement"]
    assert len(failed) == 2  # the Workload and the Job
    assert failed[0][0] == "Workload/job-huge" and failed[1][0] == "Job/huge"
    unplaced = [r for r in h.records.records if r.name == "job-huge"]
    assert len(unplaced) == 1 and unplaced[0].assignments == {}
    assert unplaced[0].reason.startswith("cannot place: ")


def test_two_groups_in_one_pass_never_take_the_same_room() -> None:
    h = Harness()
    h.nodes(1)
    h.job("first", 6, priority=10)
    h.job("second", 6)
    h.run()
    assert h.placement("first") == {"n-0": 6}
    assert h.placement("second") == {}
    assert condition(h.pod_group("second"))["reason"] == "Unschedulable"


def test_planned_nodes_are_used_while_they_fit_and_replaced_when_they_do_not() -> None:
    h = Harness()
    h.nodes(4)
    # Bin-packing alone would take n-0 (first by name among equals); the plan says n-3.
    h.job("planned", 4, plan={"n-3": 4})
    h.run()
    assert h.placement("planned") == {"n-3": 4}
    # A plan gone stale (n-2 filled since by someone else) is placed again, whole: on the
    # fullest node that still fits (n-3, half used by the first group).
    h.pod("foreign", gpu=8, node="n-2", scheduler="default-scheduler")
    h.job("stale", 4, plan={"n-2": 4})
    h.run()
    assert h.placement("stale") == {"n-3": 4}


def test_room_planned_for_another_admitted_group_is_held_for_it() -> None:
    h = Harness()
    h.nodes(2)
    h.job("planned", 8, pods=0, plan={"n-0": 8})  # admitted, its pods not created yet
    h.job("other", 8)
    h.run()
    assert h.placement("other") == {"n-1": 8}


def test_an_elastic_scale_up_lands_next_to_the_running_pods() -> None:
    h = Harness()
    h.nodes(3)
    h.pod("foreign", gpu=4, node="n-0", scheduler="default-scheduler")  # n-0 is the fullest
    uid = h.job("grow", 5, pods=0, gated=2)
    h.pod("grow-0", uid, node="n-2")
    h.pod("grow-1", uid, node="n-2")
    for i in range(2, 5):
        h.pod(f"grow-{i}", uid)
    h.run()
    assert h.placement("grow") == {"n-2": 5}
    # Gated pods are never bound.
    assert not [c for c in h.binder.calls if "gated" in c[0]]


def test_failed_bindings_are_placed_again_and_nothing_is_bound_twice() -> None:
    h = Harness()
    h.nodes(2)
    h.job("train", 8)
    h.binder.fail["train-3"] = ApiException(status=500, reason="InternalError")
    h.binder.fail["train-5"] = ApiException(status=500, reason="InternalError")
    h.run()
    assert sum(h.placement("train").values()) == 6
    error = condition(h.pod_group("train"))
    assert (error["status"], error["reason"]) == ("False", "SchedulerError")
    assert "binding failed for 2 of 8 pods" in error["message"]
    h.binder.calls.clear()
    h.run()
    assert sorted(name for name, _ in h.binder.calls) == ["train-3", "train-5"]
    assert h.placement("train") == {"n-0": 8}
    assert condition(h.pod_group("train"))["status"] == "True"


def test_a_pod_already_bound_counts_as_done() -> None:
    h = Harness()
    h.nodes(1)
    h.job("train", 2)
    # Bound behind the cache's back (a previous leader, a moment before it died).
    h.kube.patch(POD, "ns", "train-0", {"spec": {"nodeName": "n-0"}})
    h.run()
    assert h.placement("train") == {"n-0": 2}
    assert condition(h.pod_group("train"))["status"] == "True"


def test_binds_the_watch_has_not_shown_yet_still_hold_their_room() -> None:
    h = Harness()
    h.nodes(1)
    h.binder.watch = False
    h.job("first", 6)
    h.run()
    h.job("second", 6)
    h.run()
    assert h.placement("first") == {"n-0": 6}
    assert h.placement("second") == {}


def test_a_restarted_loop_binds_only_the_pods_left() -> None:
    h = Harness()
    h.nodes(2)
    uid = h.job("train", 8, pods=0)
    for i in range(8):
        h.pod(f"train-{i}", uid, node="n-1" if i < 5 else "")
    h.loop = h.new_loop()  # no memory of the earlier process
    h.run()
    assert sorted(name for name, _ in h.binder.calls) == ["train-5", "train-6", "train-7"]
    assert h.placement("train") == {"n-1": 8}


def test_nothing_is_bound_without_leadership() -> None:
    h = Harness(leader=False)
    h.nodes(1)
    h.job("train", 2)
    h.run()
    assert h.binder.calls == []


def test_replacement_pods_of_a_scheduled_group_are_placed_as_they_come() -> None:
    h = Harness()
    h.nodes(1)
    uid = h.job("train", 4)
    h.run()
    assert condition(h.pod_group("train"))["status"] == "True"
    # Two pods finished (they leave the cache); the Job made one more for its last completion.
    for name in ("train-0", "train-1"):
        h.caches.node_pods.forget(f"ns/{name}")
    h.pod("train-4", uid)
    h.run()
    assert ("train-4", "n-0") in h.binder.calls


def test_an_admission_never_binds_more_pods_than_it_grants() -> None:
    h = Harness()
    h.nodes(1)
    h.job("train", 2, pods=3)
    h.run()
    assert sum(h.placement("train").values()) == 2


def test_pods_of_other_schedulers_are_left_alone() -> None:
    h = Harness()
    h.nodes(1)
    uid = h.job("theirs", 1, pods=0)
    h.pod("theirs-0", uid, scheduler="default-scheduler")
    h.run()
    assert h.binder.calls == []
