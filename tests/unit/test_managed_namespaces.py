"""Managed namespaces without a cluster: the selector flag, the one rule for the queue an
object is in, and what the webhooks decide there (the admission policies say the same, on the
real apiserver: tests/e2e/test_tenancy_e2e.py compares the words)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controllers.jobs import kinds  # noqa: F401  (registers every kind)
from controllers.jobs.batchjob import BATCH_JOB
from controllers.jobs.framework import DEFAULT_LOCAL_QUEUE, queue_of
from controllers.jobs.reconciler import Reconciler
from controllers.manager.namespaces import parse_selector
from controllers.runtime.resources import JOB
from controllers.state.budgets import selects
from controllers.webhooks import configurations, decisions, policies, reviews
from tests.unit.test_controller_jobs import Harness, job_dict
from tests.unit.test_controller_webhooks import apply_json_patch

MUSTER = "system:serviceaccount:muster-system:muster"
ALICE = "system:serviceaccount:team:alice"
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
FLAVOR = {"metadata": {"name": "h100"}, "spec": {"nodeTaints": [TAINT]}}


def job(labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "team", "labels": labels or {}, **meta},
        "spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "m"}]}}},
    }


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {"containers": [{"name": "m"}], **spec},
    }


JOBSET_OWNER = {
    "apiVersion": "jobset.x-k8s.io/v1alpha2",
    "kind": "JobSet",
    "name": "js",
    "uid": "u",
    "controller": True,
}


# ------------------------------------------------------------------ the selector


@pytest.mark.parametrize(
    ("text", "selector"),
    [
        ("", None),
        ("  ", None),
        ("muster.dev/managed=true", {"matchLabels": {"muster.dev/managed": "true"}}),
        ("team==a", {"matchLabels": {"team": "a"}}),
        (
            "tier in (a, b),env!=dev",
            {
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["a", "b"]},
                    {"key": "env", "operator": "NotIn", "values": ["dev"]},
                ]
            },
        ),
        (
            "batch,!legacy,zone notin (x)",
            {
                "matchExpressions": [
                    {"key": "batch", "operator": "Exists"},
                    {"key": "legacy", "operator": "DoesNotExist"},
                    {"key": "zone", "operator": "NotIn", "values": ["x"]},
                ]
            },
        ),
    ],
)
def test_the_flag_reads_kubectls_selector_syntax(text: str, selector: object) -> None:
    assert parse_selector(text) == selector


@pytest.mark.parametrize("text", ["a in (b", "a=b,", "Bad Key=x", "a=not valid", "a in ()"])
def test_a_malformed_selector_is_refused_naming_the_term(text: str) -> None:
    with pytest.raises(ValueError, match="is not a label selector term"):
        parse_selector(text)


def test_the_selector_picks_namespaces_as_the_apiserver_does() -> None:
    selector = parse_selector("muster.dev/managed=true,!legacy")
    assert selects(selector, {"muster.dev/managed": "true"})
    assert not selects(selector, {"muster.dev/managed": "true", "legacy": ""})
    assert not selects(selector, {})


# ------------------------------------------------------------ the queue an object is in


def test_the_queue_is_the_label_else_default_in_a_managed_namespace() -> None:
    assert queue_of(job({"muster.dev/queue-name": "gpu"}), managed=False) == "gpu"
    assert queue_of(job({"muster.dev/queue-name": "gpu"}), managed=True) == "gpu"
    assert queue_of(job(), managed=False) is None
    assert queue_of(job(), managed=True) == DEFAULT_LOCAL_QUEUE == "default"
    # An empty label is no label.
    assert queue_of(job({"muster.dev/queue-name": ""}), managed=True) == "default"


def test_children_of_an_object_muster_queues_are_not_queued_on_their_own() -> None:
    child = job(ownerReferences=[JOBSET_OWNER])
    assert queue_of(child, managed=True) is None
    # Owned, but not by its controller, or by a kind Muster does not queue: queued.
    assert queue_of(job(ownerReferences=[{**JOBSET_OWNER, "controller": False}]), managed=True)
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "name": "c", "controller": True}
    assert queue_of(job(ownerReferences=[cron]), managed=True) == "default"


def test_managed_creation_suspends_unlabelled_jobs_for_musters_scheduler() -> None:
    plain = job()
    assert decisions.mutate_job(plain) == []  # not managed: as before
    created = apply_json_patch(copy.deepcopy(plain), decisions.mutate_job(plain, managed=True))
    assert created["spec"]["suspend"] is True
    assert created["spec"]["template"]["spec"]["schedulerName"] == "muster-scheduler"
    assert decisions.mutate_job(job(ownerReferences=[JOBSET_OWNER]), managed=True) == []
    jobset = {"kind": "JobSet", "metadata": {"name": "js"}, "spec": {}}
    assert decisions.mutate_suspend(jobset) == []
    assert decisions.mutate_suspend(jobset, managed=True) == [
        {"op": "add", "path": "/spec/suspend", "value": True}
    ]


# ------------------------------------------------------------------ the refusals


def test_only_muster_unsuspends_a_managed_workload() -> None:
    old = job({"muster.dev/queue-name": "gpu"})
    old["spec"]["suspend"] = True
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = False
    said = decisions.refuse_start(new, old, ALICE, MUSTER)
    assert said == (
        f"Job team/train: spec.suspend cannot be set to false by {ALICE}: Muster manages "
        "every workload in this namespace (managedNamespaceSelector), and only Muster starts "
        "a workload, once it is admitted under quota in LocalQueue gpu"
    )
    assert decisions.refuse_start(new, old, MUSTER, MUSTER) is None
    # Other edits of a suspended or running workload are not this rule's business.
    assert decisions.refuse_start(old, old, ALICE, MUSTER) is None
    assert decisions.refuse_start(new, new, ALICE, MUSTER) is None
    # A JobSet's Job is started by the JobSet's controller.
    child_old = job(ownerReferences=[JOBSET_OWNER])
    child_old["spec"]["suspend"] = True
    child_new = copy.deepcopy(child_old)
    child_new["spec"]["suspend"] = False
    assert decisions.refuse_start(child_new, child_old, "jobset-controller", MUSTER) is None


def test_no_pod_is_created_on_a_node_by_name_except_a_kubelets_mirror_pod() -> None:
    pinned = pod(nodeName="gpu-0")
    said = decisions.refuse_pod(pinned, None, ALICE, ["system:authenticated"], MUSTER)
    assert said is not None and said.startswith("Pod team/p: spec.nodeName (gpu-0) cannot be set")
    assert decisions.refuse_pod(pinned, None, "system:node:gpu-0", ["system:nodes"], MUSTER) is None
    assert decisions.refuse_pod(pod(), None, ALICE, [], MUSTER) is None


def test_only_muster_lifts_the_admission_gate() -> None:
    gated = pod(schedulingGates=[{"name": "muster.dev/admission"}])
    ungated = pod()
    said = decisions.refuse_pod(ungated, gated, ALICE, [], MUSTER)
    assert said is not None
    assert "spec.schedulingGates: gate muster.dev/admission cannot be removed by" in said
    assert decisions.refuse_pod(ungated, gated, MUSTER, [], MUSTER) is None
    # Someone else's gate is theirs to lift.
    other = pod(schedulingGates=[{"name": "example.com/gate"}])
    assert decisions.refuse_pod(ungated, other, ALICE, [], MUSTER) is None


def test_only_the_job_controller_labels_a_pod_as_a_jobs() -> None:
    forged = pod(schedulerName="muster-scheduler")
    forged["metadata"]["labels"] = {"muster.dev/owner-uid": "uid-of-an-admitted-jobset"}
    said = decisions.refuse_pod(forged, None, ALICE, [], MUSTER)
    assert said is not None and "metadata.labels[muster.dev/owner-uid] cannot be set" in said
    job_controller = decisions.JOB_CONTROLLERS[0]
    assert decisions.refuse_pod(forged, None, job_controller, [], MUSTER) is None


@pytest.mark.parametrize(
    ("toleration", "tolerates"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}, True),
        ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # every taint
        ({"key": "nvidia.com/gpu", "operator": "Gt", "value": "0"}, True),  # refused, not compared
        ({"key": "nvidia.com/gpu", "value": "absent"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_a_pod_tolerating_a_flavors_taint_is_refused(
    toleration: dict[str, str], tolerates: bool
) -> None:
    tolerant = pod(tolerations=[toleration])
    said = decisions.refuse_toleration(
        tolerant, None, FLAVOR, scheduler_name="muster-scheduler", user=ALICE
    )
    assert (said is not None) == tolerates
    if said is not None:
        assert said.startswith(
            "Pod team/p: spec.tolerations tolerate the taint nvidia.com/gpu of ResourceFlavor h100"
        )


def test_pods_musters_scheduler_places_may_tolerate_a_flavors_taint() -> None:
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    placed = pod(tolerations=toleration, schedulerName="muster-scheduler")
    assert (
        decisions.refuse_toleration(
            placed, None, FLAVOR, scheduler_name="muster-scheduler", user=ALICE
        )
        is None
    )
    # With Muster's scheduler off, the Job controller's pods (of Jobs only Muster starts).
    plain = pod(tolerations=toleration)
    job_controller = decisions.JOB_CONTROLLERS[0]
    assert (
        decisions.refuse_toleration(plain, None, FLAVOR, scheduler_name="", user=job_controller)
        is None
    )
    assert decisions.refuse_toleration(plain, None, FLAVOR, scheduler_name="", user=ALICE)
    # An update that adds the toleration is checked too; one that leaves it is not.
    assert decisions.refuse_toleration(plain, pod(), FLAVOR, scheduler_name="x", user=ALICE)
    assert decisions.refuse_toleration(plain, plain, FLAVOR, scheduler_name="x", user=ALICE) is None


# ----------------------------------------------------- the webhooks, where no policies


def review(obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "request": {
            "uid": "1",
            "namespace": "team",
            "object": obj,
            "oldObject": old,
            "userInfo": {"username": ALICE, "groups": ["system:authenticated"]},
        }
    }


def test_the_managed_webhooks_route_to_the_same_decisions() -> None:
    handlers = reviews.WebhookHandlers(controller_user=MUSTER)
    handlers.flavors = [FLAVOR]
    tolerant = pod(tolerations=[{"operator": "Exists"}])
    del tolerant["metadata"]["namespace"]  # a new pod may not carry it: the request does
    answer = handlers.handle(reviews.VALIDATE_MANAGED_PATH, review(tolerant))["response"]
    assert not answer["allowed"]
    assert answer["status"]["message"].startswith("Pod team/p: spec.tolerations tolerate")
    answer = handlers.handle(reviews.VALIDATE_MANAGED_PATH, review(pod()))["response"]
    assert answer["allowed"]
    answer = handlers.handle(reviews.MUTATE_MANAGED_JOB_PATH, review(job()))["response"]
    assert answer["allowed"] and "patch" in answer
    answer = handlers.handle(reviews.MUTATE_JOB_PATH, review(job()))["response"]
    assert "patch" not in answer  # the labelled-Job webhook leaves unlabelled ones alone


def test_managed_webhooks_and_policies_exist_only_with_a_selector() -> None:
    selector = {"matchLabels": {"muster.dev/managed": "true"}}
    managed = policies.Managed(selector, MUSTER)
    plain = policies.policies()
    with_managed = policies.policies(managed=managed)
    added = [d for d in with_managed if d not in plain]
    assert {d["metadata"]["name"] for d in added} == {
        policies.MANAGED_JOBS_POLICY,
        policies.MANAGED_SUSPEND_POLICY,
        policies.MANAGED_START_POLICY,
        policies.MANAGED_PODS_POLICY,
        policies.MANAGED_FLAVORS_POLICY,
        # The probe answers with another version, so a controller waits for these too.
        policies.PROBE_POLICY,
    }
    assert policies.probe_answer("s", managed=True) != policies.probe_answer("s")
    assert with_managed[-1]["metadata"]["name"] == policies.PROBE_POLICY  # still last
    for doc in added:
        if doc["kind"].endswith("Binding"):
            assert doc["spec"]["matchResources"] == {"namespaceSelector": selector}
    mutating, validating = configurations.configurations(
        b"CA", url_base="https://h:1", policies=False, managed=managed
    )
    assert mutating is not None
    hooks = {h["name"]: h for h in mutating["webhooks"] + validating["webhooks"]}
    for name in ("mjob-managed.muster.dev", "msuspend-managed.muster.dev", "vmanaged.muster.dev"):
        ns = hooks[name]["namespaceSelector"]
        assert ns["matchLabels"] == selector["matchLabels"]
        assert {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system"],
        } in ns["matchExpressions"]
    plain_mutating, _ = configurations.configurations(b"CA", url_base="https://h:1", policies=False)
    assert plain_mutating is not None
    assert not [h for h in plain_mutating["webhooks"] if "managed" in h["name"]]


# ------------------------------------------------------------------ the reconciler


def test_the_reconciler_queues_an_unlabelled_job_of_a_managed_namespace_in_default() -> None:
    h = Harness()
    unlabelled = job_dict(suspend=False)
    del unlabelled["metadata"]["labels"]
    h.put(JOB, unlabelled)
    h.reconcile()
    assert not h.workloads() and h.job()["spec"]["suspend"] is False  # not managed: as before
    h.reconciler = Reconciler(h.ctx, BATCH_JOB, managed=lambda namespace: namespace == "ns")
    h.reconcile()
    [wl] = h.workloads()
    assert wl["spec"]["queueName"] == "default"
    assert h.job()["spec"]["suspend"] is True
    assert "labels" not in h.job()["metadata"]  # the user's object keeps its labels
