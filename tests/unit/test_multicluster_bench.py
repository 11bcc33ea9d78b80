"""The pure parts of bench/multicluster_bench.py: the Job mix, the kubeconfig MultiKueue
accepts, write counting, and what counts as a copy that waited or two copies at once."""

from __future__ import annotations

import base64
from collections import Counter
from pathlib import Path

from bench.multicluster_bench import (
    CopyTrace,
    PodTrace,
    Shape,
    Tracker,
    inline_kubeconfig,
    job_manifest,
    job_mix,
    overlapping,
    percentile,
    request_writes,
    split_writes,
)


def test_the_mix_is_half_single_gpu_a_quarter_8_gpu_a_quarter_gangs_of_2_to_4() -> None:
    shapes = job_mix(500)
    kinds = Counter(s.kind for s in shapes)
    assert kinds == {"1x1": 250, "1x8": 125, "gang": 125}
    assert {s.pods for s in shapes if s.kind == "gang"} == {2, 3, 4}
    assert all(s.gpus == 8 for s in shapes if s.kind == "gang")
    assert job_mix(500) == shapes  # the same Jobs for both systems


def test_a_gang_is_one_job_with_parallelism_equal_to_completions() -> None:
    job = job_manifest(
        "g", Shape(3, 8, 8), "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/multikueue"
    )
    spec = job["spec"]
    assert spec["parallelism"] == spec["completions"] == 3
    assert spec["managedBy"] == "kueue.x-k8s.io/multikueue"
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "lq"}
    requests = spec["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["nvidia.com/gpu"] == "8"
    delay = spec["template"]["metadata"]["annotations"]["pod-complete.stage.kwok.x-k8s.io/delay"]
    assert delay == "8s"


def test_files_named_by_the_kubeconfig_are_carried_inline(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"CA")
    (tmp_path / "admin.crt").write_bytes(b"CERT")
    (tmp_path / "admin.key").write_bytes(b"KEY")
    config = {
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": "https://127.0.0.1:1", "certificate-authority": "ca.crt"},
            }
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "client-certificate": str(tmp_path / "admin.crt"),
                    "client-key": "admin.key",
                },
            }
        ],
    }
    out = inline_kubeconfig(config, tmp_path)
    cluster = out["clusters"][0]["cluster"]
    user = out["users"][0]["user"]
    assert "certificate-authority" not in cluster
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"CA"
    assert base64.b64decode(user["client-certificate-data"]) == b"CERT"
    assert base64.b64decode(user["client-key-data"]) == b"KEY"
    assert set(user) == {"client-certificate-data", "client-key-data"}
    assert config["clusters"][0]["cluster"]["certificate-authority"] == "ca.crt"  # untouched


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([0.0, 10.0], 0.95) == 9.5


def test_writes_are_the_write_verbs_moved_between_two_scrapes() -> None:
    def key(
        verb: str, resource: str, sub: str = "", code: str = "201"
    ) -> tuple[str, tuple[tuple[str, str], ...]]:
        labels = {"verb": verb, "resource": resource, "subresource": sub, "code": code}
        return ("apiserver_request_total", tuple(sorted(labels.items())))

    before = {
        key("POST", "jobs"): 10.0,
        key("PUT", "leases"): 5.0,
        key("GET", "jobs", code="200"): 1.0,
    }
    after = {
        key("POST", "jobs"): 30.0,
        key("PUT", "leases"): 9.0,
        key("GET", "jobs", code="200"): 100.0,  # a read: not counted
        key("PATCH", "jobs", "status", "200"): 7.0,
        key("PATCH", "jobs", "status", "422"): 2.0,  # refused, but still a write request
    }
    writes = request_writes(before, after)
    assert writes == {"POST jobs": 20, "PATCH jobs/status": 9, "PUT leases": 4}
    assert split_writes(writes) == (33, 29)
    assert request_writes(before, after, refused=True) == {"PATCH jobs/status": 2}


def test_a_copy_waited_when_suspended_or_a_pod_unbound_longer_than_the_threshold() -> None:
    quick = CopyTrace(0.0, unsuspended=0.5, pods={"p": PodTrace(0.6, bound=1.0)})
    assert quick.waits(2.0, end=100.0) == []
    held = CopyTrace(0.0, unsuspended=5.0, pods={"p": PodTrace(5.1, bound=5.2)})
    assert held.waits(2.0, end=100.0) == ["suspended"]
    no_room = CopyTrace(
        0.0, unsuspended=0.1, pods={"p": PodTrace(0.2, bound=9.0, unschedulable=True)}
    )
    assert no_room.waits(2.0, end=100.0) == ["unschedulable"]
    gated = CopyTrace(0.0, unsuspended=0.1, pods={"p": PodTrace(0.2, gated=True)})
    assert gated.waits(2.0, end=1.0) == []  # the run ended before 2 s passed
    assert gated.waits(2.0, end=10.0) == ["gated"]
    taken_back = CopyTrace(0.0, deleted=3.0)
    assert taken_back.waits(2.0, end=100.0) == ["suspended"]


def test_two_copies_at_once_means_spans_in_two_workers_that_meet() -> None:
    assert not overlapping({"a": [(0.0, 5.0)]})
    assert not overlapping({"a": [(0.0, 5.0)], "b": [(5.0, None)]})  # one after the other
    assert overlapping({"a": [(0.0, 5.0)], "b": [(4.0, 6.0)]})
    assert overlapping({"a": [(0.0, None)], "b": [(100.0, None)]})
    assert not overlapping({"a": [(0.0, 1.0), (0.5, 2.0)]})  # the same worker twice


def test_workload_copies_are_told_apart_by_job_label_owner_or_multikueue_name() -> None:
    tracker = Tracker({"j-0001": Shape(1, 1, 4), "j-0002": Shape(1, 1, 4)})
    muster = {"metadata": {"name": "job-j-0001-abcde", "labels": {"muster.dev/job-name": "j-0001"}}}
    kueue = {"metadata": {"name": "job-j-0002-1f2e3"}}
    tracker.on_worker_workload("worker-a", "ADDED", muster, 1.0)
    tracker.on_worker_workload("worker-b", "ADDED", kueue, 1.0)
    tracker.on_worker_workload("worker-a", "ADDED", kueue, 1.5)
    tracker.on_worker_workload("worker-a", "DELETED", kueue, 2.0)
    tracker.on_worker_workload("worker-a", "ADDED", {"metadata": {"name": "other"}}, 1.0)
    assert tracker.workloads == {
        ("worker-a", "j-0001"): [[1.0, None]],
        ("worker-b", "j-0002"): [[1.0, None]],
        ("worker-a", "j-0002"): [[1.5, 2.0]],
    }
    summary = tracker.summary(0.0, 10.0, 2.0)
    assert summary["workload_copies_in_two_workers"] == 1


def _pod(name: str, job: str, phase: str, node: str | None) -> dict[str, object]:
    spec = {"nodeName": node} if node else {}
    return {
        "metadata": {"name": name, "labels": {"batch.kubernetes.io/job-name": job}},
        "spec": spec,
        "status": {"phase": phase},
    }


def test_a_gang_runs_in_its_worker_once_all_its_pods_run_there() -> None:
    tracker = Tracker({"g": Shape(2, 8, 8)})
    tracker.on_manager_job("ADDED", {"metadata": {"name": "g"}}, 0.0)
    copy = {"metadata": {"name": "g", "uid": "u1"}, "spec": {"suspend": False}}
    tracker.on_worker_job("worker-a", "ADDED", copy, 1.0)
    tracker.on_worker_pod("worker-a", "ADDED", _pod("g-1", "g", "Pending", None), 1.5)
    tracker.on_worker_pod("worker-a", "MODIFIED", _pod("g-1", "g", "Running", "n1"), 4.0)
    summary = tracker.summary(0.0, 10.0, 2.0)
    assert summary["ran_in_worker"] == 0  # one pod of two
    tracker.on_worker_pod("worker-a", "ADDED", _pod("g-2", "g", "Running", "n2"), 5.0)
    summary = tracker.summary(0.0, 10.0, 2.0)
    assert summary["ran_in_worker"] == 1
    assert summary["p50_to_running_in_worker_s"] == 5.0
    assert summary["waited_in_worker"] == 1  # g-1 waited 2.5 s unbound; g-2 was first seen bound
    assert summary["waited_for_nodes"] == 1 and summary["held_suspended"] == 0
    assert summary["ran_in"] == {"worker-a": 1}


def test_a_copy_held_suspended_is_counted_apart_from_one_whose_pods_waited_for_nodes() -> None:
    tracker = Tracker({"held": Shape(1, 1, 4), "starved": Shape(1, 8, 6)})
    for name in ("held", "starved"):
        tracker.on_manager_job("ADDED", {"metadata": {"name": name}}, 0.0)
    held = {"metadata": {"name": "held", "uid": "u1"}, "spec": {"suspend": True}}
    tracker.on_worker_job("worker-a", "ADDED", held, 1.0)
    tracker.on_worker_job("worker-a", "MODIFIED", {**held, "spec": {"suspend": False}}, 6.0)
    starved = {"metadata": {"name": "starved", "uid": "u2"}, "spec": {"suspend": False}}
    tracker.on_worker_job("worker-b", "ADDED", starved, 1.0)
    pending = _pod("s-1", "starved", "Pending", None)
    pending["status"]["conditions"] = [  # type: ignore[index]
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    ]
    tracker.on_worker_pod("worker-b", "ADDED", pending, 1.5)
    summary = tracker.summary(0.0, 10.0, 2.0)
    assert summary["waited_in_worker"] == 2
    assert summary["waited_for_nodes"] == 1
    assert summary["held_suspended"] == 1
    assert summary["waited_reasons"] == {"suspended": 1, "unschedulable": 1}
