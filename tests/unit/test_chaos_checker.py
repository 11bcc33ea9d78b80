"""The chaos run's checker catches what it is there to catch: over-admission (a), a Job
running without an admitted Workload (b), an elastic Job ungated past its admission (c), at
the instant it observes them, and transitions the apiserver showed (e), from objects as the
apiserver serves them; and it does not judge a Job that changed while it read the Workloads.
A checker that could not report a violation would make the chaos run vacuous."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from controllers.runtime.resources import CLUSTER_QUEUE, JOB, POD, WORKLOAD
from tests.unit.controller_fakes import FakeKube

NS = "chaos"


def _load_chaos() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"
    spec = importlib.util.spec_from_file_location("bench_chaos", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_chaos"] = module
    spec.loader.exec_module(module)
    return module


chaos = _load_chaos()


def cq(name: str, cpu: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"flavors": [{"name": "pool", "quota": {"cpu": cpu}, "limit": {"cpu": cpu}}]},
    }


def workload(name: str, job: str, cpu: str, count: int, *, admitted: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": []}
    if admitted:
        status["conditions"].append({"type": "QuotaReserved", "status": "True"})
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {
                    "name": "main",
                    "count": count,
                    "flavors": {"cpu": "pool"},
                    "resourceUsage": {"cpu": cpu},
                }
            ],
        }
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {"muster.dev/job-name": job},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"queueName": "lq"},
        "status": status,
    }


def job(name: str, *, suspend: bool, elastic: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "labels": {"muster.dev/queue-name": "lq"},
    }
    if elastic:
        meta["annotations"] = {"muster.dev/elastic-job": "true"}
    return {"metadata": meta, "spec": {"suspend": suspend}, "status": {}}


def pod(name: str, job_name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"batch.kubernetes.io/job-name": job_name},
        },
        "spec": {},
        "status": {"phase": "Running"},
    }


@pytest.fixture
def kube() -> FakeKube:
    k = FakeKube()
    k.put(CLUSTER_QUEUE, cq("cq", "4"))
    return k


def test_usage_over_a_queue_limit_or_a_flavor_capacity_is_a_violation(kube: FakeKube) -> None:
    kube.put(WORKLOAD, workload("w1", "j1", "3", 3))
    kube.put(WORKLOAD, workload("w2", "j2", "2", 2))
    checker = chaos.Checker(kube, NS, {"pool": 4000})
    checker.poll()
    assert checker.violations["a"] == 2, checker.examples  # the queue's limit and the flavor's


def test_a_job_running_without_admission_is_a_violation_at_once(kube: FakeKube) -> None:
    kube.put(JOB, job("j1", suspend=False))
    kube.put(WORKLOAD, workload("w1", "j1", "1", 1, admitted=False))
    checker = chaos.Checker(kube, NS, {"pool": 4000})
    checker.poll()
    assert checker.violations["b"] == 1, checker.examples
    checker.poll()
    assert checker.violations["b"] == 1, "one violation while it lasts, not one per poll"


def test_a_job_that_changes_while_the_workloads_are_read_is_judged_at_the_next_poll(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read before the Workloads: suspended, waiting. Admitted and unsuspended in between, and
    # the Workload read shows it not admitted yet: not a violation, only not judged.
    kube.put(JOB, job("j1", suspend=True))
    kube.put(WORKLOAD, workload("w1", "j1", "1", 1, admitted=False))
    real_list = kube.list
    reads: list[str] = []

    def list_then_admit(kind: Any, *args: Any, **kwargs: Any) -> Any:
        result = real_list(kind, *args, **kwargs)
        reads.append(kind.name)
        if kind is WORKLOAD and reads.count("Workload") == 1:
            kube.put(WORKLOAD, workload("w1", "j1", "1", 1))
            kube.put(JOB, job("j1", suspend=False))
        return result

    monkeypatch.setattr(kube, "list", list_then_admit)
    checker = chaos.Checker(kube, NS, {"pool": 4000})
    checker.poll()
    assert not checker.violations and checker.inconclusive == 1, checker.examples
    checker.poll()  # now all reads agree: admitted and running
    assert not checker.violations, checker.examples


def test_an_elastic_job_with_more_ungated_pods_than_admitted_is_a_violation(
    kube: FakeKube,
) -> None:
    kube.put(JOB, job("e1", suspend=False, elastic=True))
    kube.put(WORKLOAD, workload("w1", "e1", "2", 2))
    for i in range(3):
        kube.put(POD, pod(f"e1-{i}", "e1"))
    checker = chaos.Checker(kube, NS, {"pool": 4000})
    checker.poll()
    assert checker.violations["c"] == 1, checker.examples
    assert not checker.violations["b"]


def test_transitions_the_apiserver_shows_are_expected_in_the_store(kube: FakeKube) -> None:
    kube.put(WORKLOAD, workload("w1", "j1", "1", 1))
    checker = chaos.Checker(kube, NS, {"pool": 4000})
    checker.poll()
    kinds = {kind for (_uid, kind, _seq) in checker.expected}
    assert {"created", "admitted"} <= kinds
