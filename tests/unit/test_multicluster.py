"""The dispatcher's rules, in memory (the end-to-end test runs them on three real clusters):
a workload goes whole to the worker where it fits, its intent written before the copy; a copy
starts only when the manager says so, and the manager says so here first; a lost worker's
never-started copies go elsewhere and are deleted there later, its started ones stay; a
restarted manager sends nothing twice; what a worker's copy is made of."""

from __future__ import annotations

import base64
import copy
import time
from datetime import timedelta
from typing import Any

from controllers.multicluster import copies
from controllers.multicluster.dispatcher import Dispatcher
from controllers.multicluster.sent import Sent, placement_to_json
from controllers.multicluster.status import worker_status
from controllers.multicluster.workers import Health, Worker, Workers
from controllers.runtime.events import EventRecorder
from controllers.runtime.informer import Informer
from controllers.runtime.resources import (
    CLUSTER_QUEUE,
    JOB,
    NODE,
    POD,
    RESOURCE_FLAVOR,
    SECRET,
    WORKER_CLUSTER,
    WORKLOAD,
)
from controllers.state import workloads as wls
from controllers.state.caches import Caches, Context
from controllers.state.dispatch import awaits_manager, not_dispatchable
from quota.api.names import (
    DISPATCH_ABANDONED_ANNOTATION,
    DISPATCH_MANAGED_BY,
    DISPATCH_PLAN_ANNOTATION,
    DISPATCH_START_ANNOTATION,
    DISPATCH_STARTED_ANNOTATION,
    DISPATCHED_FROM_ANNOTATION,
    DISPATCHED_TO_ANNOTATION,
    JOB_UID_LABEL,
    ORIGIN_UID_LABEL,
    ORIGINAL_SCHEDULING_ANNOTATION,
)
from quota.placement.gang import Placement
from tests.unit.controller_fakes import FakeKube, _error

GPU = "nvidia.com/gpu"
NOW = wls.now_utc()


class Registry:
    """The dispatcher's workers, fixed for a test (no kubeconfigs, no probes)."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = {w.name: w for w in workers}
        self.problems: dict[str, str] = {}

    def sync(self, objects: Any) -> None:
        pass

    def get(self, name: str) -> Worker | None:
        return self.workers.get(name)

    def all(self) -> list[Worker]:
        return list(self.workers.values())

    def stop(self) -> None:
        pass


def node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"pool": "gpu"}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", GPU: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def worker(name: str, *gpus_per_node: int) -> Worker:
    w = Worker(name, FakeKube(), timedelta(seconds=10), "v1")
    for i, gpus in enumerate(gpus_per_node):
        w.kube.put(NODE, node(f"{name}-{i}", gpus))
    now = time.time()
    w.health = Health(last_ok=now, since=now)
    return w


class Fleet:
    """A management cluster in memory and its workers."""

    def __init__(self, *workers: Worker) -> None:
        self.kube = FakeKube()
        self.caches = Caches.create(self.kube)
        self.events: list[tuple[str, str]] = []
        recorder = EventRecorder(None, "test")
        recorder.emit = lambda obj, type_, reason, message: self.events.append(  # type: ignore[method-assign]
            (reason, message)
        )
        self.ctx = Context(
            kube=self.kube, caches=self.caches, events=recorder, identity="t", now=lambda: NOW
        )
        self.kube.put(
            RESOURCE_FLAVOR, {"metadata": {"name": "gpu"}, "spec": {"nodeLabels": {"pool": "gpu"}}}
        )
        self.kube.put(
            CLUSTER_QUEUE,
            {
                "metadata": {"name": "fleet"},
                "spec": {
                    "flavors": [{"name": "gpu", "quota": {GPU: "64"}}],
                    "dispatch": {"clusterSelector": {}},
                },
            },
        )
        for w in workers:
            self.kube.put(
                WORKER_CLUSTER,
                {"metadata": {"name": w.name}, "spec": {"kubeconfig": {"name": f"kc-{w.name}"}}},
            )
        self.workers = list(workers)
        self.dispatcher = self.new_dispatcher()
        self.load()

    def new_dispatcher(self) -> Dispatcher:
        d = Dispatcher(self.ctx, Informer(self.kube, WORKER_CLUSTER), "muster-system")
        d.workers = Registry(self.workers)  # type: ignore[assignment]
        return d

    def load(self) -> None:
        """Every cache as the apiservers hold it now (a relist of each)."""
        for informer in (
            self.caches.jobs,
            self.caches.workloads,
            self.caches.cluster_queues,
            self.caches.flavors,
            self.caches.topologies,
            self.dispatcher.clusters,
        ):
            informer._relist()
        for w in self.workers:
            for informer in w.informers():
                informer._relist()

    def step(self) -> None:
        self.load()
        self.dispatcher.dispatch(time.time())
        self.load()

    def submit(self, name: str, pods: int, gpus: int = 8) -> dict[str, Any]:
        """A Job (managedBy Muster) and its Workload, admitted to `fleet` by quota."""
        job = self.kube.put(
            JOB,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": name,
                    "namespace": "ns",
                    "labels": {"muster.dev/queue-name": "lq", "controller-uid": "x"},
                },
                "spec": {
                    "managedBy": DISPATCH_MANAGED_BY,
                    "parallelism": pods,
                    "completions": pods,
                    "selector": {"matchLabels": {"controller-uid": "x"}},
                    "template": {
                        "metadata": {"labels": {"controller-uid": "x"}},
                        "spec": {
                            "containers": [
                                {"name": "c", "resources": {"requests": {GPU: str(gpus)}}}
                            ]
                        },
                    },
                },
            },
        )
        wl = {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "Workload",
            "metadata": {
                "name": f"job-{name}",
                "namespace": "ns",
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "queueName": "lq",
                "podSets": [
                    {
                        "name": "main",
                        "count": pods,
                        "requests": {GPU: str(gpus)},
                    }
                ],
            },
        }
        admission = wls.admission_status("fleet", [("main", pods, {GPU: "gpu"}, {GPU: str(gpus)})])
        assert wls.mark_admitted(wl, admission, "admitted", NOW)
        stored = self.kube.put(WORKLOAD, wl)
        self.load()
        return stored

    def workload(self, name: str) -> dict[str, Any]:
        found = self.kube.get(WORKLOAD, "ns", f"job-{name}")
        assert found is not None
        return found

    def sent(self, name: str) -> Sent:
        return Sent.of(self.workload(name))

    @staticmethod
    def copy_in(w: Worker, name: str) -> dict[str, Any] | None:
        return w.kube.get(JOB, "ns", name)

    @staticmethod
    def admit_there(w: Worker, name: str) -> None:
        """The worker's Muster admits the copy (its Workload holds quota there)."""
        remote = w.kube.get(JOB, "ns", name)
        assert remote is not None
        wl: dict[str, Any] = {
            "metadata": {
                "name": f"job-{name}-remote",
                "namespace": "ns",
                "labels": {JOB_UID_LABEL: remote["metadata"]["uid"]},
            },
            "spec": {"queueName": "lq", "podSets": []},
        }
        admission = wls.admission_status("team", [("main", 1, {GPU: "gpu"}, {GPU: "8"})])
        assert wls.mark_admitted(wl, admission, "admitted", NOW)
        w.kube.put(WORKLOAD, wl)


def test_a_gang_goes_whole_to_the_only_worker_it_fits_and_its_copy_waits_suspended() -> None:
    w1, w2 = worker("w1", 8, 8), worker("w2", 8)
    fleet = Fleet(w1, w2)
    fleet.submit("gang", pods=2)
    fleet.step()
    sent = fleet.sent("gang")
    assert sent.cluster == "w1" and not sent.started
    assert sent.plan is not None and sent.plan.count("main") == 2
    remote = fleet.copy_in(w1, "gang")
    assert remote is not None and fleet.copy_in(w2, "gang") is None
    assert remote["spec"]["suspend"] is True
    assert awaits_manager(remote)
    uid = fleet.kube.get(JOB, "ns", "gang")["metadata"]["uid"]  # type: ignore[index]
    assert remote["metadata"]["labels"][ORIGIN_UID_LABEL] == uid
    assert remote["spec"]["template"]["metadata"]["labels"][ORIGIN_UID_LABEL] == uid
    assert remote["metadata"]["annotations"][DISPATCHED_FROM_ANNOTATION] == "ns/job-gang"
    assert "managedBy" not in remote["spec"] and "selector" not in remote["spec"]
    assert "controller-uid" not in remote["metadata"]["labels"]
    fleet.step()
    assert [v for v, k, _ in w1.kube.writes if k == "Job"] == ["create"], "sent once"


def test_bin_packing_fills_the_fuller_worker_and_reservations_count_until_pods_bind() -> None:
    w1, w2 = worker("w1", 8, 8), worker("w2", 8, 8)
    fleet = Fleet(w1, w2)
    fleet.submit("a", pods=1)
    fleet.step()
    first = fleet.sent("a").cluster
    fleet.submit("b", pods=1)
    fleet.step()
    # `a`'s pods are not bound yet: its plan holds room, and `b` packs beside it.
    assert fleet.sent("b").cluster == first
    fleet.submit("c", pods=2)
    fleet.step()
    assert fleet.sent("c").cluster not in (None, first), "the gang takes the empty worker"


def test_no_worker_has_room_the_wait_is_explained_once_and_nothing_is_sent() -> None:
    fleet = Fleet(worker("w1", 8))
    fleet.submit("big", pods=2)
    fleet.step()
    fleet.step()
    assert fleet.sent("big").cluster is None
    waits = [m for r, m in fleet.events if r == "WaitingForWorkerCluster"]
    assert len(waits) == 1 and "w1" in waits[0]


def test_a_copy_starts_only_once_admitted_there_and_the_manager_records_it_first() -> None:
    w1 = worker("w1", 8)
    fleet = Fleet(w1)
    fleet.submit("job", pods=1)
    fleet.step()
    fleet.step()
    assert not fleet.sent("job").started, "not admitted there yet: not started"
    order: list[str] = []
    fleet.kube.before_write = lambda verb, kind, name: order.append(f"here {kind.name}")
    w1.kube.before_write = lambda verb, kind, name: order.append(f"there {kind.name}")  # type: ignore[attr-defined]
    fleet.admit_there(w1, "job")
    order.clear()
    fleet.step()
    assert fleet.sent("job").started
    remote = fleet.copy_in(w1, "job")
    assert remote is not None and not awaits_manager(remote)
    assert remote["metadata"]["annotations"][DISPATCH_START_ANNOTATION] == "true"
    assert order.index("here Workload") < order.index("there Job")


def test_the_jobs_status_here_mirrors_its_copy() -> None:
    w1 = worker("w1", 8)
    fleet = Fleet(w1)
    fleet.submit("job", pods=1)
    fleet.step()
    fleet.admit_there(w1, "job")
    fleet.step()
    status = {
        "active": 1,
        "startTime": "2026-11-28T00:00:00Z",
        "conditions": [{"type": "Suspended", "status": "False"}],
    }
    w1.kube.patch(JOB, "ns", "job", {"status": status}, status=True)
    fleet.step()
    local = fleet.kube.get(JOB, "ns", "job")
    assert local is not None and local["status"]["active"] == 1
    assert local["status"]["conditions"] == status["conditions"]


def test_a_copy_that_finished_finishes_the_job_here_without_the_workers_pod_uids() -> None:
    """The copy's uncountedTerminatedPods name pods there; a merge patch of that map only adds
    keys, so mirroring it left a finished Job here that the apiserver refuses."""
    running = {
        "active": 1,
        "startTime": "2026-11-28T00:00:00Z",
        "uncountedTerminatedPods": {"succeeded": ["uid-there"]},
    }
    done = {
        "succeeded": 1,
        "startTime": "2026-11-28T00:00:00Z",
        "completionTime": "2026-11-28T00:00:05Z",
        "uncountedTerminatedPods": {},
        "conditions": [{"type": "Complete", "status": "True"}],
    }
    stale = {"status": {"active": 1, "uncountedTerminatedPods": {"succeeded": ["uid-there"]}}}
    first = copies.mirrored_status({"status": running}, {})
    assert first is not None and first["active"] == 1
    assert first["uncountedTerminatedPods"] is None
    patch = copies.mirrored_status({"status": done}, stale)
    assert patch is not None and patch["uncountedTerminatedPods"] is None
    assert patch["conditions"] == done["conditions"] and patch["succeeded"] == 1
    mirrored = {"status": {k: v for k, v in patch.items() if v is not None}}
    assert copies.mirrored_status({"status": done}, mirrored) is None


def test_a_lost_workers_unstarted_copy_goes_elsewhere_and_is_deleted_there_later() -> None:
    w1, w2 = worker("w1", 8), worker("w2", 8)
    fleet = Fleet(w1, w2)
    fleet.submit("job", pods=1)
    fleet.step()
    first = fleet.sent("job").cluster
    lost, other = (w1, w2) if first == "w1" else (w2, w1)
    now = time.time()
    lost.health = Health(last_ok=now - 5, since=now - 60, error="timed out")
    fleet.step()
    assert fleet.sent("job").cluster == first, "silent for 5s, lostAfter 10s: still there"
    lost.health = Health(last_ok=now - 30, since=now - 60, error="timed out")
    fleet.step()
    fleet.step()
    sent = fleet.sent("job")
    assert sent.cluster == other.name and sent.abandoned == (lost.name,)
    assert fleet.copy_in(other, "job") is not None
    assert fleet.copy_in(lost, "job") is not None, "unreachable: deleted once it answers"
    lost.health = Health(last_ok=time.time(), since=now - 60)
    fleet.step()
    fleet.step()
    assert fleet.copy_in(lost, "job") is None
    assert fleet.sent("job").abandoned == ()
    annotations = fleet.workload("job")["metadata"]["annotations"]
    assert DISPATCH_ABANDONED_ANNOTATION not in annotations


def test_a_lost_workers_started_copy_is_left_alone() -> None:
    w1, w2 = worker("w1", 8), worker("w2", 8)
    fleet = Fleet(w1, w2)
    fleet.submit("job", pods=1)
    fleet.step()
    first = fleet.sent("job").cluster
    lost, other = (w1, w2) if first == "w1" else (w2, w1)
    fleet.admit_there(lost, "job")
    fleet.step()
    assert fleet.sent("job").started
    now = time.time()
    lost.health = Health(last_ok=now - 300, since=now - 600, error="timed out")
    fleet.step()
    fleet.step()
    assert fleet.sent("job").cluster == lost.name
    assert fleet.copy_in(other, "job") is None


def test_a_restarted_manager_sends_nothing_twice() -> None:
    w1 = worker("w1", 8)
    fleet = Fleet(w1)
    fleet.submit("job", pods=1)
    fleet.step()
    fleet.dispatcher = fleet.new_dispatcher()  # a new process: nothing in memory
    fleet.step()
    fleet.step()
    assert [v for v, k, _ in w1.kube.writes if k == "Job"] == ["create"]


def test_a_crash_between_intent_and_copy_is_completed_once() -> None:
    w1 = worker("w1", 8)
    fleet = Fleet(w1)
    wl = fleet.submit("job", pods=1)
    # The intent was written, then the process died before creating the copy.
    written = copy.deepcopy(wl)
    plan = Placement({"main": (("w1-0", 1),)}, 1, {"main": {GPU: 8}})
    written["metadata"].setdefault("annotations", {}).update(
        {
            DISPATCHED_TO_ANNOTATION: "w1",
            DISPATCH_PLAN_ANNOTATION: placement_to_json(plan, time.time()),
        }
    )
    fleet.kube.put(WORKLOAD, written)
    fleet.dispatcher = fleet.new_dispatcher()
    fleet.step()
    fleet.step()
    assert fleet.copy_in(w1, "job") is not None
    assert [v for v, k, _ in w1.kube.writes if k == "Job"] == ["create"]


def test_a_deleted_job_here_takes_its_copy_with_it() -> None:
    w1 = worker("w1", 8)
    fleet = Fleet(w1)
    fleet.submit("job", pods=1)
    fleet.step()
    fleet.kube.delete(WORKLOAD, "ns", "job-job")
    fleet.kube.delete(JOB, "ns", "job")
    fleet.step()
    assert fleet.copy_in(w1, "job") is None


def test_an_evicted_workload_is_taken_back_and_sent_again_when_admitted_again() -> None:
    w1 = worker("w1", 8)
    fleet = Fleet(w1)
    fleet.submit("job", pods=1)
    fleet.step()
    wl = fleet.workload("job")
    assert wls.mark_evicted(wl, "Preempted", "preempted", NOW)
    fleet.kube.put(WORKLOAD, wl)
    fleet.step()
    assert fleet.copy_in(w1, "job") is None
    fleet.step()
    assert fleet.sent("job").cluster is None
    assert DISPATCH_STARTED_ANNOTATION not in (fleet.workload("job")["metadata"]["annotations"])


def test_a_copy_is_the_users_job_without_muster_s_flavor_merge() -> None:
    job = {
        "metadata": {
            "name": "j",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "9",
            "labels": {"muster.dev/queue-name": "lq", "batch.kubernetes.io/job-name": "j"},
            "annotations": {
                ORIGINAL_SCHEDULING_ANNOTATION: '{"nodeSelector": {"mine": "yes"}}',
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                DISPATCH_START_ANNOTATION: "true",
            },
        },
        "spec": {
            "managedBy": DISPATCH_MANAGED_BY,
            "suspend": False,
            "template": {"spec": {"nodeSelector": {"mine": "yes", "pool": "gpu"}}},
        },
        "status": {"active": 3},
    }
    made = copies.job_copy(job, "ns/job-j", "wl-uid")
    assert made["spec"]["template"]["spec"]["nodeSelector"] == {"mine": "yes"}
    assert made["spec"]["suspend"] is True and "status" not in made
    assert set(made["metadata"]) == {"name", "namespace", "labels", "annotations"}
    assert made["metadata"]["labels"] == {"muster.dev/queue-name": "lq", ORIGIN_UID_LABEL: "wl-uid"}
    assert DISPATCH_START_ANNOTATION not in made["metadata"]["annotations"], "never pre-started"
    assert job["spec"]["template"]["spec"]["nodeSelector"]["pool"] == "gpu", "original untouched"


def test_a_job_without_managed_by_or_of_another_kind_is_refused_with_what_to_do() -> None:
    fleet = Fleet(worker("w1", 8))
    wl = fleet.submit("job", pods=1)
    assert not_dispatchable(wl, fleet.caches.jobs, "fleet") is None
    job = fleet.kube.get(JOB, "ns", "job")
    assert job is not None
    del job["spec"]["managedBy"]
    fleet.kube.put(JOB, job)
    fleet.load()
    refusal = not_dispatchable(wl, fleet.caches.jobs, "fleet")
    assert refusal is not None and f"spec.managedBy: {DISPATCH_MANAGED_BY}" in refusal
    job["spec"]["managedBy"] = DISPATCH_MANAGED_BY
    job["metadata"]["annotations"] = {"muster.dev/elastic-job": "true"}
    fleet.kube.put(JOB, job)
    fleet.load()
    assert not_dispatchable(wl, fleet.caches.jobs, "fleet") is None, "elastic Jobs are sent"
    pod_group = copy.deepcopy(wl)
    pod_group["metadata"]["ownerReferences"][0].update(
        apiVersion="jobset.x-k8s.io/v1alpha2", kind="JobSet"
    )
    refusal = not_dispatchable(pod_group, fleet.caches.jobs, "fleet")
    assert refusal is not None and "only batch Jobs" in refusal


def test_the_capacity_of_the_workers_is_shared_out_by_flavor() -> None:
    fleet = Fleet(worker("w1", 8, 8), worker("w2", 4))
    flavors = fleet.dispatcher._flavors()
    assert fleet.dispatcher.capacity(flavors)[("gpu", GPU)] == 20


def test_pods_of_a_sent_workload_count_as_its_own_there() -> None:
    w1 = worker("w1", 8)
    fleet = Fleet(w1)
    fleet.submit("job", pods=1)
    fleet.step()
    uid = fleet.kube.get(JOB, "ns", "job")["metadata"]["uid"]  # type: ignore[index]
    w1.kube.put(
        POD,
        {
            "metadata": {"name": "job-x", "namespace": "ns", "labels": {ORIGIN_UID_LABEL: uid}},
            "spec": {
                "nodeName": "w1-0",
                "containers": [{"name": "c", "resources": {"requests": {GPU: "8"}}}],
            },
            "status": {"phase": "Running"},
        },
    )
    fleet.load()
    mine = {"ns/job-job": fleet.workload("job")}
    state = fleet.dispatcher._state(w1, mine, {uid: "ns/job-job"}, time.time())
    (pod,) = state.pods
    assert pod.workload == "ns/job-job"
    # Its plan and its bound pod are one and the same 8 GPUs: a second 8 fits nowhere.
    fleet.submit("more", pods=1)
    fleet.step()
    assert fleet.sent("more").cluster is None


def _scale_up(fleet: Fleet, name: str, pods: int) -> dict[str, Any]:
    """What the manager's Job reconciler and admission do for a scale-up: a slice for the
    full new size that replaces the admitted one, admitted by quota."""
    before = fleet.workload(name)
    wl = copy.deepcopy(before)
    wl["metadata"] = {
        "name": f"job-{name}-up",
        "namespace": "ns",
        "ownerReferences": before["metadata"]["ownerReferences"],
    }
    wl["spec"]["replaces"] = before["metadata"]["name"]
    wl["spec"]["sliceName"] = f"job-{name}"
    wl["spec"]["podSets"][0]["count"] = pods
    wl.pop("status", None)
    admission = wls.admission_status("fleet", [("main", pods, {GPU: "gpu"}, {GPU: "8"})])
    assert wls.mark_admitted(wl, admission, "admitted", NOW)
    stored = fleet.kube.put(WORKLOAD, wl)
    fleet.load()
    return stored


def _elastic(fleet: Fleet, w: Worker, name: str) -> None:
    """The copy is elastic (its Job's annotation), started and running there."""
    job = fleet.kube.get(JOB, "ns", name)
    assert job is not None
    job["metadata"]["annotations"] = {"muster.dev/elastic-job": "true"}
    fleet.kube.put(JOB, job)
    fleet.load()
    fleet.step()
    fleet.admit_there(w, name)
    fleet.step()
    assert fleet.sent(name).started


def test_a_scale_up_goes_to_the_same_worker_and_resizes_the_copy_there() -> None:
    w1, w2 = worker("w1", 8, 8), worker("w2", 8, 8, 8)
    fleet = Fleet(w1, w2)
    fleet.submit("elastic", pods=1)
    _elastic(fleet, w1, "elastic")
    assert fleet.sent("elastic").cluster == "w1"
    _scale_up(fleet, "elastic", 2)
    fleet.step()
    fleet.step()
    grown = Sent.of(fleet.kube.get(WORKLOAD, "ns", "job-elastic-up"))  # type: ignore[arg-type]
    assert grown.cluster == "w1" and grown.started, "sticky: never the emptier w2"
    assert grown.plan is not None and grown.plan.count("main") == 2
    remote = fleet.copy_in(w1, "elastic")
    assert remote is not None and remote["spec"]["parallelism"] == 2
    assert fleet.copy_in(w2, "elastic") is None
    assert [v for v, k, _ in w1.kube.writes if k == "Job"].count("create") == 1


def test_a_scale_up_that_its_worker_cannot_hold_waits_and_is_never_split() -> None:
    w1, w2 = worker("w1", 8), worker("w2", 8, 8)
    fleet = Fleet(w1, w2)
    fleet.submit("elastic", pods=1)
    _elastic(fleet, w1, "elastic")
    _scale_up(fleet, "elastic", 2)
    fleet.step()
    grown = fleet.kube.get(WORKLOAD, "ns", "job-elastic-up")
    assert grown is not None and Sent.of(grown).cluster is None
    assert any("scale-up waits for room in worker cluster w1" in m for _, m in fleet.events)
    remote = fleet.copy_in(w1, "elastic")
    assert remote is not None and remote["spec"].get("parallelism") == 1
    assert fleet.copy_in(w2, "elastic") is None


def test_a_replaced_slice_keeps_its_copy_and_a_scale_down_resizes_in_place() -> None:
    w1 = worker("w1", 8, 8, 8)
    fleet = Fleet(w1)
    fleet.submit("elastic", pods=2)
    _elastic(fleet, w1, "elastic")
    _scale_up(fleet, "elastic", 3)
    fleet.step()
    old = fleet.workload("elastic")
    assert wls.mark_finished(old, "WorkloadSliceReplaced", "replaced", NOW)
    fleet.kube.put(WORKLOAD, old)
    fleet.step()
    remote = fleet.copy_in(w1, "elastic")
    assert remote is not None and remote["spec"]["parallelism"] == 3, "not deleted, grown"
    # Scale-down: the admitted slice is resized in place here; the copy follows.
    grown = fleet.kube.get(WORKLOAD, "ns", "job-elastic-up")
    assert grown is not None
    grown["status"]["admission"]["podSetAssignments"][0]["count"] = 1
    grown["spec"]["podSets"][0]["count"] = 1
    fleet.kube.put(WORKLOAD, grown)
    fleet.step()
    remote = fleet.copy_in(w1, "elastic")
    assert remote is not None and remote["spec"]["parallelism"] == 1


class Recorded:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    def record_later(self, make: Any) -> None:
        self.rows.extend(make())


def test_every_dispatch_is_recorded_in_the_history_with_its_worker() -> None:
    w1, w2 = worker("w1", 8), worker("w2", 8)
    fleet = Fleet(w1, w2)
    recorded = Recorded()
    fleet.ctx.recorder = recorded
    fleet.submit("job", pods=1)
    fleet.step()
    first = fleet.sent("job").cluster
    lost = w1 if first == "w1" else w2
    now = time.time()
    lost.health = Health(last_ok=now - 30, since=now - 60, error="timed out")
    fleet.step()
    fleet.step()
    rows = [(r.kind.value, r.actor, r.name) for r in recorded.rows]
    second = "w2" if first == "w1" else "w1"
    assert rows == [("dispatched", first, "job-job"), ("dispatched", second, "job-job")]
    assert len({r.key() for r in recorded.rows}) == 2
    assert all(second in r.reason or first in r.reason for r in recorded.rows)


def test_a_copy_that_cannot_be_created_is_explained_and_planned_again_elsewhere() -> None:
    w1, w2 = worker("w1", 8), worker("w2", 8, 8)
    fleet = Fleet(w1, w2)

    def refuse(verb: str, kind: Any, name: str) -> None:
        if verb == "create":
            raise _error(404, 'namespaces "ns" not found')

    w1.kube.before_write = refuse  # type: ignore[attr-defined]
    fleet.submit("job", pods=1)
    fleet.step()
    assert fleet.sent("job").cluster == "w1", "the fullest that fits"
    assert any("cannot be created in worker cluster w1" in m for _, m in fleet.events)
    # A minute on, it is taken back and sent to w2.
    wl = fleet.workload("job")
    plan = Sent.of(wl).plan
    assert plan is not None
    wl["metadata"]["annotations"][DISPATCH_PLAN_ANNOTATION] = placement_to_json(
        plan, time.time() - 120
    )
    fleet.kube.put(WORKLOAD, wl)
    fleet.step()
    fleet.step()
    assert fleet.sent("job").cluster == "w2"
    assert fleet.copy_in(w2, "job") is not None


def test_a_workers_status_says_its_health_capacity_usage_and_what_was_sent() -> None:
    w1 = worker("w1", 8, 8)
    fleet = Fleet(w1)
    fleet.submit("job", pods=1)
    fleet.step()
    fleet.dispatcher.write_status(time.time())
    status = fleet.kube.get(WORKER_CLUSTER, None, "w1")["status"]  # type: ignore[index]
    assert status["nodes"] == 2 and status["capacity"][GPU] == "16"
    assert status["dispatched"] == 1 and status["usage"] == {}
    (active,) = status["conditions"]
    assert (active["status"], active["reason"]) == ("True", "Connected")
    writes = len(fleet.kube.writes)
    fleet.load()
    fleet.dispatcher.write_status(time.time())
    assert len(fleet.kube.writes) == writes, "nothing new: not written again"
    now = time.time()
    w1.health = Health(last_ok=now - 30, since=now - 60, error="timed out")
    fleet.load()
    fleet.dispatcher.write_status(now)
    status = fleet.kube.get(WORKER_CLUSTER, None, "w1")["status"]  # type: ignore[index]
    (active,) = status["conditions"]
    assert (active["status"], active["reason"]) == ("False", "Lost")
    assert "timed out" in active["message"]


def test_a_bad_kubeconfig_secret_is_named_with_what_is_wrong_and_shown_in_the_status() -> None:
    kube = FakeKube()
    registry = Workers(kube, "muster-system")
    clusters = [
        {"metadata": {"name": name}, "spec": {"kubeconfig": {"name": f"kc-{name}"}}}
        for name in ("gone", "nokey", "garbage", "empty")
    ]
    clusters.append({"metadata": {"name": "typo"}, "spec": {"kubeconfg": {"name": "x"}}})

    def secret(name: str, data: dict[str, str]) -> None:
        kube.put(SECRET, {"metadata": {"name": name, "namespace": "muster-system"}, "data": data})

    secret("kc-nokey", {"config": base64.b64encode(b"apiVersion: v1").decode()})
    secret("kc-garbage", {"kubeconfig": base64.b64encode(b"- just\n- a list").decode()})
    secret("kc-empty", {"kubeconfig": base64.b64encode(b"apiVersion: v1\nkind: Config").decode()})
    registry.sync(clusters)
    assert registry.all() == []
    problems = registry.problems
    assert problems["gone"] == "Secret muster-system/kc-gone does not exist"
    assert problems["nokey"] == "Secret muster-system/kc-nokey has no key kubeconfig"
    assert "not a kubeconfig (not a mapping)" in problems["garbage"]
    assert problems["empty"].startswith("Secret muster-system/kc-empty, key kubeconfig:")
    assert "kubeconfig" in problems["typo"] and "Field required" in problems["typo"]
    status = worker_status(None, problems["gone"], 0, time.time())
    (active,) = status["conditions"]
    assert (active["status"], active["reason"]) == ("False", "BadKubeconfig")
    assert "kc-gone does not exist" in active["message"]


def test_a_workload_that_fits_nowhere_is_tried_again_only_when_room_may_have_freed() -> None:
    w1 = worker("w1", 8)
    fleet = Fleet(w1)
    fleet.submit("big", pods=2)
    fleet.step()
    assert fleet.sent("big").cluster is None
    tries: list[str] = []
    choose = fleet.dispatcher._choose

    def counted(key: str, *rest: Any) -> Any:
        tries.append(key)
        return choose(key, *rest)

    fleet.dispatcher._choose = counted  # type: ignore[method-assign]
    fleet.step()
    fleet.step()
    assert tries == [], "nothing changed: not placed again"
    w1.kube.put(NODE, node("w1-1", 8))
    w1._changed("ADDED", None, None)  # what the node watch does
    fleet.step()
    assert tries == ["ns/job-big"]
    assert fleet.sent("big").cluster == "w1"


def test_a_refused_status_is_tried_again_only_once_the_copy_changes() -> None:
    w1 = worker("w1", 8)
    fleet = Fleet(w1)
    fleet.submit("job", pods=1)
    fleet.step()
    fleet.admit_there(w1, "job")
    fleet.step()
    tries: list[str] = []

    def refuse(verb: str, kind: Any, name: str) -> None:
        if kind is JOB and verb == "patch":
            tries.append(name)
            raise _error(422, "Job.batch is invalid")

    fleet.kube.before_write = refuse  # type: ignore[attr-defined]
    w1.kube.patch(JOB, "ns", "job", {"status": {"active": 1}}, status=True)
    fleet.step()
    fleet.step()
    fleet.step()
    assert len(tries) == 1, "one try per version of the copy, not one per pass"
    w1.kube.patch(JOB, "ns", "job", {"status": {"active": 1, "ready": 1}}, status=True)
    fleet.step()
    assert len(tries) == 2
    fleet.kube.before_write = None  # type: ignore[attr-defined]
    w1.kube.patch(JOB, "ns", "job", {"status": {"active": 1, "ready": 1, "failed": 0}}, status=True)
    fleet.step()
    local = fleet.kube.get(JOB, "ns", "job")
    assert local is not None and local["status"]["ready"] == 1


def test_a_cluster_without_dispatching_queues_or_workers_reads_no_workload() -> None:
    fleet = Fleet()
    fleet.submit("job", pods=1)  # its queue dispatches; without it, nothing is read

    class Untouchable(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise AssertionError("a pass with nothing to dispatch walked the Workloads")

    fleet.dispatcher._dispatching_queues = lambda: {}  # type: ignore[method-assign]
    fleet.dispatcher.ctx.caches.workloads.items = Untouchable().items  # type: ignore[method-assign]
    fleet.step()
