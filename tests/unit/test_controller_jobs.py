"""Job integration without a cluster: what a Job asks for, how its template is changed and
restored, how gates are counted, and the Job reconciler against an in-memory apiserver."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from controllers.jobs import batchjob as jobs
from controllers.jobs import gates
from controllers.jobs.batchjob import BATCH_JOB
from controllers.jobs.reconciler import Reconciler
from controllers.runtime.events import EventRecorder
from controllers.runtime.resources import JOB, POD, RESOURCE_FLAVOR, WORKLOAD, Kube
from controllers.state import workloads as wls
from controllers.state.caches import Caches, Context
from quota.api import ManifestError
from quota.api.names import (
    ADMISSION_GATE,
    LAST_CHECKPOINT_ANNOTATION,
    ORIGINAL_SCHEDULING_ANNOTATION,
)
from quota.model.convert import last_checkpoint
from tests.unit.controller_fakes import FakeKube

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def job_dict(
    name: str = "train",
    *,
    parallelism: int | None = 2,
    completions: int | None = None,
    cpu: str = "1",
    elastic: bool = False,
    annotations: dict[str, str] | None = None,
    suspend: bool = True,
    priority_class: str | None = None,
) -> dict[str, Any]:
    notes = dict(annotations or {})
    if elastic:
        notes["muster.dev/elastic-job"] = "true"
    spec: dict[str, Any] = {
        "suspend": suspend,
        "template": {
            "metadata": {},
            "spec": {
                "nodeSelector": {"disk": "ssd"},
                **({"priorityClassName": priority_class} if priority_class else {}),
                "containers": [
                    {"name": "main", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}
                ],
            },
        },
    }
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "labels": {"muster.dev/queue-name": "team"},
            "annotations": notes,
        },
        "spec": spec,
    }


# ------------------------------------------------------------- what a Job asks


def test_workload_spec_takes_pods_from_parallelism_and_completions() -> None:
    spec = jobs.workload_spec(
        job_dict(parallelism=8, completions=3, priority_class="high"), {"high": 100}
    )
    [pod_set] = spec["podSets"]
    assert pod_set["count"] == 3
    assert pod_set["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert pod_set["template"]["nodeSelector"] == {"disk": "ssd"}
    assert spec["priority"] == 100 and spec["priorityClassName"] == "high"
    assert spec["queueName"] == "team"
    assert jobs.workload_spec(job_dict(parallelism=None), {})["podSets"][0]["count"] == 1


def test_min_parallelism_becomes_min_count_but_not_for_elastic_jobs() -> None:
    partial = job_dict(parallelism=6, annotations={"muster.dev/min-parallelism": "2"})
    assert jobs.workload_spec(partial, {})["podSets"][0]["minCount"] == 2
    elastic = job_dict(parallelism=6, elastic=True)
    assert "minCount" not in jobs.workload_spec(elastic, {})["podSets"][0]


def test_a_job_the_quota_cannot_count_is_refused_naming_its_field() -> None:
    with pytest.raises(ManifestError, match=r"spec\.template\.spec\.containers\[0\]"):
        jobs.workload_spec(job_dict(cpu="0.0001"), {})


def test_the_workload_asks_for_what_the_user_wrote_not_what_admission_merged_in() -> None:
    job = job_dict(parallelism=6)
    flavor = {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"pool": "h100"}}}
    before = jobs.workload_spec(job, {})
    jobs.inject_flavors(job, [flavor], admitted_pods=4)
    assert jobs.workload_spec(job, {}) == before


def test_flavor_injection_is_undone_exactly_by_restore() -> None:
    job = job_dict(parallelism=6)
    job["spec"]["template"]["spec"]["tolerations"] = [{"key": "x", "operator": "Exists"}]
    before = copy.deepcopy(job)
    flavor = {
        "metadata": {"name": "h100"},
        "spec": {
            "nodeLabels": {"pool": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    jobs.inject_flavors(job, [flavor], admitted_pods=4)
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"disk": "ssd", "pool": "h100"}
    assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in pod_spec["tolerations"]
    assert job["spec"]["parallelism"] == 4, "partial admission runs the admitted pods"
    assert jobs.pod_count(job) == 6, "the Job still asks for what the user wrote"
    assert jobs.restore_template(job) is True
    assert job == before
    assert jobs.restore_template(job) is False


def test_workload_names_are_deterministic_per_job_uid_and_generation() -> None:
    a = wls.workload_name("train", "uid-1")
    assert a == wls.workload_name("train", "uid-1")
    assert a != wls.workload_name("train", "uid-2")
    assert wls.workload_name("train", "uid-1", 3) not in (a, wls.workload_name("train", "uid-1", 4))
    assert len(wls.workload_name("x" * 300, "uid")) <= 253


# ------------------------------------------------------------------ gates


def pod(name: str, *, gated: bool, phase: str = "Pending", created: str = "00") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "creationTimestamp": f"2026-01-01T00:00:{created}Z",
            "labels": {
                "batch.kubernetes.io/controller-uid": "uid-train",
                "batch.kubernetes.io/job-name": "train",
            },
        },
        "spec": {"schedulingGates": [{"name": ADMISSION_GATE}] if gated else []},
        "status": {"phase": phase},
    }


def test_gates_are_lifted_oldest_first_never_past_the_admitted_count() -> None:
    pods = [
        pod("run-1", gated=False, phase="Running"),
        pod("run-2", gated=False, phase="Running"),
        pod("done", gated=False, phase="Succeeded"),  # finished pods hold nothing
        pod("new-b", gated=True, created="09"),
        pod("new-a", gated=True, created="05"),
        pod("new-c", gated=True, created="10"),
    ]
    chosen = gates.pods_to_ungate(pods, allowed=4)
    assert [p["metadata"]["name"] for p in chosen] == ["new-a", "new-b"]
    assert gates.pods_to_ungate(pods, allowed=2) == []
    assert gates.pods_to_ungate(pods, allowed=1) == [], "over the count: lift nothing"


# ------------------------------------------------------- the reconciler, in memory


class Harness:
    """A Job reconciler over FakeKube, with caches fed from what it stores."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        self.caches = Caches.create(self.kube)
        self.ctx = Context(
            kube=self.kube,
            caches=self.caches,
            events=EventRecorder(None, "test"),
            identity="test",
            now=lambda: NOW,
        )
        self.reconciler = Reconciler(self.ctx, BATCH_JOB)
        self.put(
            RESOURCE_FLAVOR,
            {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"pool": "h100"}}},
        )

    def cache_for(self, kind: Any) -> Any:
        return {
            "Job": self.caches.jobs,
            "Workload": self.caches.workloads,
            "Pod": self.caches.pods,
            "ResourceFlavor": self.caches.flavors,
        }[kind.name]

    def put(self, kind: Any, obj: dict[str, Any]) -> dict[str, Any]:
        stored = self.kube.put(kind, obj)
        self.cache_for(kind).write_through(stored)
        return stored

    def patch(
        self, kind: Any, ns: str | None, name: str, patch: dict[str, Any], status: bool = False
    ) -> dict[str, Any]:
        written = self.kube.patch(kind, ns, name, patch, status=status)
        self.cache_for(kind).write_through(written)
        return written

    def reconcile(self, name: str = "train") -> float | None:
        return self.reconciler.reconcile(f"ns/{name}")

    def job(self, name: str = "train") -> dict[str, Any]:
        found = self.kube.get(JOB, "ns", name)
        assert found is not None
        return found

    def workloads(self) -> list[dict[str, Any]]:
        return sorted(self.kube.list(WORKLOAD)[0], key=lambda w: w["metadata"]["name"])

    def admit(self, wl: dict[str, Any], count: int) -> dict[str, Any]:
        w = copy.deepcopy(wl)
        admission = wls.admission_status("cq", [("main", count, {"cpu": "h100"}, {"cpu": "1"})])
        assert wls.mark_admitted(w, admission, "admitted to queue cq", NOW)
        return self.patch(
            WORKLOAD, "ns", w["metadata"]["name"], {"status": w["status"]}, status=True
        )


def test_a_new_job_gets_one_owned_workload_and_stays_suspended() -> None:
    h = Harness()
    h.put(JOB, job_dict(suspend=False))  # created while the webhook was unavailable
    h.reconcile()
    assert h.job()["spec"]["suspend"] is True
    [wl] = h.workloads()
    assert wl["metadata"]["name"] == wls.workload_name("train", "uid-train")
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "uid-train"
    assert wl["spec"]["podSets"][0]["count"] == 2
    h.reconcile()
    assert len(h.workloads()) == 1, "reconciling again creates nothing more"


def test_admission_starts_the_job_on_its_flavor_and_eviction_stops_and_requeues_it() -> None:
    h = Harness()
    h.put(JOB, job_dict())
    h.reconcile()
    [wl] = h.workloads()
    h.admit(wl, 2)
    h.reconcile()
    job = h.job()
    assert job["spec"]["suspend"] is False
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"disk": "ssd", "pool": "h100"}

    # Preempted: the Job is suspended first; the quota stays until its pods are gone.
    [wl] = h.workloads()
    evicted = copy.deepcopy(wl)
    assert wls.mark_evicted(evicted, "Preempted", "preempted by ns/urgent", NOW)
    h.patch(WORKLOAD, "ns", wl["metadata"]["name"], {"status": evicted["status"]}, status=True)
    h.patch(
        JOB,
        "ns",
        "train",
        {"status": {"active": 2, "startTime": "2026-01-01T11:00:00Z"}},
        status=True,
    )
    h.reconcile()
    assert h.job()["spec"]["suspend"] is True
    assert wls.has_quota(h.workloads()[0]), "quota held while pods still run"
    h.reconcile()
    assert wls.has_quota(h.workloads()[0])

    # The Job controller stopped the pods and reset startTime: template back, quota back.
    h.patch(JOB, "ns", "train", {"status": {"active": 0, "startTime": None}}, status=True)
    delay = h.reconcile()
    job = h.job()
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert ORIGINAL_SCHEDULING_ANNOTATION not in job["metadata"]["annotations"]
    [wl] = h.workloads()
    assert not wls.has_quota(wl)
    assert wl["status"]["requeueState"]["count"] == 1
    assert delay is not None and 0 < delay <= 1


def test_a_finished_job_finishes_its_workload_which_releases_quota() -> None:
    h = Harness()
    h.put(JOB, job_dict())
    h.reconcile()
    h.admit(h.workloads()[0], 2)
    complete = {"conditions": [{"type": "Complete", "status": "True"}]}
    h.patch(JOB, "ns", "train", {"status": complete}, status=True)
    h.reconcile()
    [wl] = h.workloads()
    assert (wls.condition(wl, "Finished") or {}).get("reason") == "Succeeded"
    assert not wls.has_quota(wl)


def test_elastic_scale_up_creates_one_replacing_slice_and_resizes_it_in_place() -> None:
    h = Harness()
    h.put(JOB, job_dict(elastic=True))
    h.reconcile()
    [first] = h.workloads()
    h.admit(first, 2)
    h.reconcile()  # starts the Job

    h.patch(JOB, "ns", "train", {"spec": {"parallelism": 5}})
    h.reconcile()
    slices = [w for w in h.workloads() if w["metadata"]["name"] != first["metadata"]["name"]]
    [grow] = slices
    assert grow["spec"]["replaces"] == first["metadata"]["name"]
    assert grow["spec"]["podSets"][0]["count"] == 5
    assert grow["spec"]["sliceName"] == first["spec"]["sliceName"]

    # Another scale event while it waits: still one pending slice, now for 8.
    h.patch(JOB, "ns", "train", {"spec": {"parallelism": 8}})
    h.reconcile()
    active = [w for w in h.workloads() if not wls.is_finished(w)]
    assert len(active) == 2
    assert sorted(w["spec"]["podSets"][0]["count"] for w in active) == [2, 8]


def test_elastic_scale_down_shrinks_the_admitted_slice_and_drops_the_pending_one() -> None:
    h = Harness()
    h.put(JOB, job_dict(elastic=True, parallelism=5))
    h.reconcile()
    [first] = h.workloads()
    h.admit(first, 5)
    h.reconcile()
    h.patch(JOB, "ns", "train", {"spec": {"parallelism": 9}})
    h.reconcile()
    assert len(h.workloads()) == 2
    h.patch(JOB, "ns", "train", {"spec": {"parallelism": 3}})
    h.reconcile()
    [wl] = h.workloads()
    assert wl["metadata"]["name"] == first["metadata"]["name"]
    assert wl["spec"]["podSets"][0]["count"] == 3
    assert wl["status"]["admission"]["podSetAssignments"][0]["count"] == 3
    assert wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]["cpu"] == "3"
    assert wls.admitted_count(wl) == 3


def test_admitted_replacement_retires_the_old_slice_and_gates_follow_the_new_count() -> None:
    h = Harness()
    h.put(JOB, job_dict(elastic=True, parallelism=2))
    h.reconcile()
    [first] = h.workloads()
    h.admit(first, 2)
    h.reconcile()
    h.patch(JOB, "ns", "train", {"spec": {"parallelism": 4}})
    h.reconcile()
    grow = next(w for w in h.workloads() if w["metadata"]["name"] != first["metadata"]["name"])
    for p in (
        pod("run-1", gated=False, phase="Running"),
        pod("run-2", gated=False, phase="Running"),
        pod("new-1", gated=True, created="01"),
        pod("new-2", gated=True, created="02"),
    ):
        h.put(POD, p)
    h.reconcile()
    assert sum(1 for p in h.kube.list(POD)[0] if gates.is_gated(p)) == 2, "not admitted yet"

    h.admit(grow, 4)
    h.reconcile()
    old = next(w for w in h.workloads() if w["metadata"]["name"] == first["metadata"]["name"])
    assert (wls.condition(old, "Finished") or {}).get("reason") == "WorkloadSliceReplaced"
    assert [p["metadata"]["name"] for p in h.kube.list(POD)[0] if gates.is_gated(p)] == []
    # A third gated pod (say, a replacement) stays gated: 4 are admitted and 4 ungated.
    h.put(POD, pod("extra", gated=True, created="03"))
    h.reconcile()
    assert [p["metadata"]["name"] for p in h.kube.list(POD)[0] if gates.is_gated(p)] == ["extra"]


def test_elastic_scale_down_keeps_quota_for_ungated_pods_until_they_are_gone() -> None:
    h = Harness()
    h.put(JOB, job_dict(elastic=True, parallelism=4))
    h.reconcile()
    [first] = h.workloads()
    h.admit(first, 4)
    h.reconcile()
    for i in range(4):
        h.put(POD, pod(f"run-{i}", gated=False, phase="Running"))
    # 4 -> 2: the Job controller has not deleted the two extra pods yet (and may never, if
    # parallelism rises again first), so the admission still covers all four.
    h.patch(JOB, "ns", "train", {"spec": {"parallelism": 2}})
    assert h.reconcile() is not None, "requeued while pods beyond parallelism hold capacity"
    [wl] = h.workloads()
    assert wls.admitted_count(wl) == 4
    # One pod goes: quota follows it down; then the next one, down to parallelism.
    for name, left in (("run-3", 3), ("run-2", 2)):
        gone = h.kube.get(POD, "ns", name)
        assert gone is not None
        h.kube.delete(POD, "ns", name)
        h.caches.pods.forget(f"ns/{name}")
        h.reconcile()
        [wl] = h.workloads()
        assert wls.admitted_count(wl) == left
        assert wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]["cpu"] == str(
            left
        )
    assert h.reconcile() is None


def test_a_slice_admitted_while_being_deleted_stays_visible_and_retires_the_old_one() -> None:
    h = Harness()
    h.put(JOB, job_dict(elastic=True, parallelism=2))
    h.reconcile()
    [first] = h.workloads()
    h.admit(first, 2)
    h.reconcile()
    h.patch(JOB, "ns", "train", {"spec": {"parallelism": 4}})
    h.reconcile()
    grow = next(w for w in h.workloads() if w["metadata"]["name"] != first["metadata"]["name"])
    # The admission loop admits the slice, but the Job reconciler still sees it pending when
    # parallelism drops back and tries to delete it: the delete fails (admitted meanwhile).
    admitted = copy.deepcopy(grow)
    admission = wls.admission_status("cq", [("main", 4, {"cpu": "h100"}, {"cpu": "4"})])
    assert wls.mark_admitted(admitted, admission, "admitted", NOW)
    h.kube.patch(
        WORKLOAD, "ns", grow["metadata"]["name"], {"status": admitted["status"]}, status=True
    )
    h.patch(JOB, "ns", "train", {"spec": {"parallelism": 2}})
    h.reconcile()
    assert h.caches.workloads.get(f"ns/{grow['metadata']['name']}") is not None, (
        "a failed delete must not drop the slice from the cache"
    )
    # The watch then brings the admitted version: the old slice is retired.
    fresh = h.kube.get(WORKLOAD, "ns", grow["metadata"]["name"])
    assert fresh is not None
    h.caches.workloads.write_through(fresh)
    h.reconcile()
    active = [w for w in h.workloads() if not wls.is_finished(w)]
    assert [w["metadata"]["name"] for w in active] == [grow["metadata"]["name"]]
    assert wls.admitted_count(active[0]) == 2


def test_original_scheduling_annotation_is_json_the_user_can_read() -> None:
    job = job_dict()
    jobs.inject_flavors(job, [])
    saved = json.loads(job["metadata"]["annotations"][ORIGINAL_SCHEDULING_ANNOTATION])
    assert saved == {"nodeSelector": {"disk": "ssd"}, "tolerations": []}


def test_kube_type_is_what_the_harness_fakes() -> None:
    # The reconciler only uses the Kube methods FakeKube provides.
    used = {"get", "list", "create", "patch", "delete"}
    assert used <= set(dir(Kube)) and used <= set(dir(FakeKube))


def test_a_running_job_grown_past_its_admission_is_evicted_and_requeued_at_the_new_size() -> None:
    # The webhook refuses this; here it happened anyway (webhook configuration removed).
    h = Harness()
    h.put(JOB, job_dict())
    h.reconcile()
    h.admit(h.workloads()[0], 2)
    h.reconcile()
    assert h.job()["spec"]["suspend"] is False
    h.patch(JOB, "ns", "train", {"spec": {"parallelism": 40, "completions": 40}})
    h.patch(JOB, "ns", "train", {"status": {"active": 40, "startTime": NOW.isoformat()}}, True)
    h.reconcile()
    [wl] = h.workloads()
    evicted = wls.condition(wl, "Evicted") or {}
    assert evicted.get("reason") == "JobResized" and "40 pods" in evicted["message"]
    assert h.job()["spec"]["suspend"] is True
    assert wls.has_quota(wl), "held until the 40 pods are gone"

    h.patch(JOB, "ns", "train", {"status": {"active": 0, "startTime": None}}, status=True)
    h.reconcile()
    h.reconcile()
    [wl] = h.workloads()
    assert not wls.has_quota(wl)
    assert wl["spec"]["podSets"][0]["count"] == 40, "queued again at the size it asks for"


def test_the_jobs_checkpoint_time_follows_it_to_its_workload_while_it_runs() -> None:
    h = Harness()
    job = job_dict()
    job["metadata"]["annotations"] = {LAST_CHECKPOINT_ANNOTATION: "2026-01-01T11:00:00Z"}
    h.put(JOB, job)
    h.reconcile()
    [wl] = h.workloads()
    assert wl["metadata"]["annotations"][LAST_CHECKPOINT_ANNOTATION] == "2026-01-01T11:00:00Z"
    h.admit(wl, 2)
    h.reconcile()
    # The running job saves its work again: the victim order reads the new time.
    later = {"metadata": {"annotations": {LAST_CHECKPOINT_ANNOTATION: "2026-01-01T11:30:00Z"}}}
    h.patch(JOB, "ns", "train", later)
    h.reconcile()
    [wl] = h.workloads()
    annotations = wl["metadata"]["annotations"]
    assert last_checkpoint(annotations) == datetime(2026, 1, 1, 11, 30, tzinfo=UTC).timestamp()
    assert wls.has_quota(wl)
