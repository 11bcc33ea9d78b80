"""Events about a Workload that its owner gets too, of every kind: an eviction or a
preemption told on the Workload reaches the JobSet, TrainJob, Job or foreign PodGroup it
belongs to (written through the recorder into an in-memory apiserver)."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.jobs.ownerevents import OwnerEventRecorder
from controllers.runtime.resources import EVENT
from controllers.state import workloads as wls
from tests.unit.controller_fakes import FakeKube

OWNERS = [
    ("batch/v1", "Job"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
    ("scheduling.volcano.sh/v1beta1", "PodGroup"),
    ("scheduling.k8s.io/v1beta1", "PodGroup"),
]


def owned_workload(api_version: str, kind: str) -> dict[str, Any]:
    owner = {"metadata": {"name": "train", "namespace": "ns", "uid": "owner-uid"}}
    if kind != "PodGroup":
        wl = wls.new_workload("wl-train", "ns", owner, {}, (api_version, kind))
    else:  # as the PodGroup intake writes it
        wl = {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "Workload",
            "metadata": {
                "name": "podgroup-train",
                "namespace": "ns",
                "ownerReferences": [
                    {"apiVersion": api_version, "kind": kind, "name": "train", "uid": "owner-uid"}
                ],
            },
        }
    wl["metadata"]["uid"] = "wl-uid"
    return wl


def told(kube: FakeKube) -> list[tuple[str, str, str, str]]:
    """(kind, name, reason, message) of every Event written."""
    events, _ = kube.list(EVENT)
    return sorted(
        (e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"], e["message"])
        for e in events
    )


def recorder(kube: FakeKube) -> OwnerEventRecorder:
    events = OwnerEventRecorder(kube, "test", burst=0)
    events.start()
    return events


@pytest.mark.parametrize(("api_version", "kind"), OWNERS)
def test_an_eviction_and_a_preemption_told_on_a_workload_reach_its_owner(
    api_version: str, kind: str
) -> None:
    kube = FakeKube()
    events = recorder(kube)
    wl = owned_workload(api_version, kind)
    events.emit(wl, "Warning", "Preempted", "preempted by ns/urgent")
    events.emit(wl, "Normal", "Preempting", "preempting 1 workload (ns/low)")
    events.emit(wl, "Normal", "Admitted", "admitted by ClusterQueue cq")
    events.stop()
    name = wl["metadata"]["name"]
    assert told(kube) == sorted(
        [
            ("Workload", name, "Preempted", "preempted by ns/urgent"),
            ("Workload", name, "Preempting", "preempting 1 workload (ns/low)"),
            ("Workload", name, "Admitted", "admitted by ClusterQueue cq"),
            (kind, "train", "Preempted", "preempted by ns/urgent"),
            (kind, "train", "Preempting", "preempting 1 workload (ns/low)"),
        ]
    )
    events_, _ = kube.list(EVENT)
    on_owner = [e["involvedObject"] for e in events_ if e["involvedObject"]["kind"] == kind]
    assert {(o["apiVersion"], o["uid"]) for o in on_owner} == {(api_version, "owner-uid")}


def test_the_owners_copy_and_the_emitters_own_are_one_event() -> None:
    # The admission loop also tells a batch Job itself: the copy is the same Event, written
    # once.
    kube = FakeKube()
    events = recorder(kube)
    wl = owned_workload("batch/v1", "Job")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ns", "uid": "owner-uid"},
    }
    events.emit(wl, "Warning", "Reclaimed", "reclaimed by cq-b")
    events.emit(job, "Warning", "Reclaimed", "reclaimed by cq-b")
    events.stop()
    assert [k for k, *_ in told(kube)] == ["Job", "Workload"]


def test_only_workloads_are_copied_to_their_owner() -> None:
    # A Job owned by a JobSet (the JobSet controller's child) is no Workload of Muster's.
    kube = FakeKube()
    events = recorder(kube)
    child = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train-workers-0",
            "namespace": "ns",
            "uid": "child",
            "ownerReferences": [
                {
                    "apiVersion": "jobset.x-k8s.io/v1alpha2",
                    "kind": "JobSet",
                    "name": "train",
                    "uid": "js",
                }
            ],
        },
    }
    events.emit(child, "Warning", "Preempted", "preempted")
    events.stop()
    assert [k for k, *_ in told(kube)] == ["Job"]
