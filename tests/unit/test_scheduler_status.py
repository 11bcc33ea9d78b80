"""What the scheduler loop tells people and how it is wired: the PodGroup per Workload, the
Events and history records of a placement, the webhook that hands pods to Muster's
scheduler, the pod cache's indexes, and the command line."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from controllers.cli.controller import controller, scheduler_name_option
from controllers.runtime.resources import POD, WORKLOAD
from controllers.scheduler.decide import nodes_text, pinned
from controllers.webhooks import decisions, reviews
from quota.api import PodGroup
from quota.api.names import SCHEDULER_NAME
from quota.placement import PodShape
from tests.unit.test_scheduler import GPU, Harness, condition


def test_each_admitted_workload_gets_a_pod_group_it_owns_mirroring_the_real_api() -> None:
    h = Harness()
    h.nodes(2)
    h.job("train", 4, priority=7)
    h.run()
    pg = h.pod_group("train")
    PodGroup.model_validate(pg)  # the API model accepts what was written
    assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
    assert pg["spec"]["disruptionMode"] == {"single": {}}
    assert pg["spec"]["priority"] == 7
    assert pg["spec"]["workloadRef"] == {"workloadName": "job-train", "templateName": "main"}
    [owner] = pg["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Workload", "job-train", "wl-train")
    done = condition(pg)
    assert (done["status"], done["reason"]) == ("True", "Scheduled")
    assert done["message"].startswith("4 of 4 pods bound")


def test_a_placement_is_told_on_the_workload_and_the_job_and_recorded() -> None:
    h = Harness()
    h.nodes(4)
    h.job("train", 16)
    h.run()
    placed = [e for e in h.events.seen if e[2] == "Placed"]
    assert [e[0] for e in placed] == ["Workload/job-train", "Job/train"]
    assert placed[0][3] == "placed 16 pods on n-0 (8), n-1 (8)"
    [record] = h.records.records
    assert record.name == "job-train" and record.cluster_queue == "cq"
    assert dict(record.assignments) == {"n-0": 8, "n-1": 8}
    # Time to place, from the QuotaReserved transition (12:00:00) to the clock (12:00:30).
    assert "30 s after admission" in record.reason


def test_a_pod_group_scheduled_in_an_earlier_admission_waits_for_the_whole_gang_again() -> None:
    h = Harness()
    h.nodes(1)
    uid = h.job("train", 4)
    h.run()
    assert condition(h.pod_group("train"))["status"] == "True"
    # Evicted and admitted again later: pods gone, the Workload's reservation is newer.
    for i in range(4):
        h.kube.delete(POD, "ns", f"train-{i}")
        h.caches.node_pods.forget(f"ns/train-{i}")
    wl = h.kube.get(WORKLOAD, "ns", "job-train")
    assert wl is not None
    for c in wl["status"]["conditions"]:
        c["lastTransitionTime"] = "2026-01-01T13:00:00Z"
    h.caches.workloads.write_through(h.kube.put(WORKLOAD, wl))
    h.loop = h.new_loop()
    h.pod("train-new-0", uid)
    h.binder.calls.clear()
    h.run()
    assert h.binder.calls == []  # 1 of 4: the gang waits
    assert condition(h.pod_group("train"))["reason"] == "WaitingForPods"


def test_a_pod_whose_spec_cannot_be_read_is_a_scheduler_error_naming_the_field() -> None:
    h = Harness()
    h.nodes(1)
    uid = h.job("bad", 1, pods=0)
    pod = h.pod("bad-0", uid)
    pod["spec"]["containers"][0]["resources"]["requests"][GPU] = "lots"
    h.caches.node_pods.write_through(
        {**pod, "metadata": {**pod["metadata"], "resourceVersion": "999"}}
    )
    h.run()
    error = condition(h.pod_group("bad"))
    assert error["reason"] == "SchedulerError"
    assert "Pod ns/bad-0: spec.containers[0]" in error["message"]
    assert "'lots' is not a Kubernetes quantity" in error["message"]


def test_pinning_keeps_the_pods_own_affinity_terms() -> None:
    shape = pinned(PodShape(requests={"cpu": 1000}), ["b", "a"])
    [term] = shape.affinity
    [only] = term.requirements
    assert (only.key, only.operator, only.values, only.field) == (
        "metadata.name",
        "In",
        ("a", "b"),
        True,
    )
    assert nodes_text({"a": 1, "b": 3}) == "b (3), a"


# ---------------------------------------------------------------- webhook


def _job(**template_spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "labels": {"muster.dev/queue-name": "q"}},
        "spec": {"template": {"spec": {"containers": [{"name": "c"}], **template_spec}}},
    }


def _scheduler_op(ops: list[dict[str, Any]]) -> Any:
    found = [o for o in ops if o["path"] == "/spec/template/spec/schedulerName"]
    return found[0]["value"] if found else None


def test_the_webhook_hands_the_pods_of_queued_jobs_to_musters_scheduler() -> None:
    assert _scheduler_op(decisions.mutate_job(_job())) == SCHEDULER_NAME
    assert _scheduler_op(decisions.mutate_job(_job(schedulerName="default-scheduler"))) == (
        SCHEDULER_NAME
    )
    elastic = _job()
    elastic["metadata"]["annotations"] = {"muster.dev/elastic-job": "true"}
    assert _scheduler_op(decisions.mutate_job(elastic)) == SCHEDULER_NAME
    # A scheduler the user named is theirs; an empty name turns Muster's scheduler off.
    assert _scheduler_op(decisions.mutate_job(_job(schedulerName="volcano"))) is None
    assert _scheduler_op(decisions.mutate_job(_job(), "")) is None
    handlers = reviews.WebhookHandlers(scheduler_name="other-name")
    review = {"request": {"uid": "u", "operation": "CREATE", "object": _job()}}
    assert handlers.handle(reviews.MUTATE_JOB_PATH, review)["response"]["patch"]


# ----------------------------------------------------------------- caches


def test_the_pod_cache_indexes_pods_by_node_job_and_scheduler() -> None:
    h = Harness()
    h.pod("a", "job-1", node="n-0")
    h.pod("b", "job-1")
    h.pod("c", scheduler="default-scheduler")
    assert [p["metadata"]["name"] for p in h.caches.pods_on_node("n-0")] == ["a"]
    assert [p["metadata"]["name"] for p in h.caches.bound_pods()] == ["a"]
    assert {p["metadata"]["name"] for p in h.caches.live_pods_of_job("job-1")} == {"a", "b"}
    assert [p["metadata"]["name"] for p in h.caches.unbound_pods(SCHEDULER_NAME)] == ["b"]
    assert [p["metadata"]["name"] for p in h.caches.unbound_pods("default-scheduler")] == ["c"]


# -------------------------------------------------------------- command line


def test_a_bad_scheduler_name_is_refused_naming_the_flag() -> None:
    assert scheduler_name_option(" muster-scheduler ") == "muster-scheduler"
    assert scheduler_name_option("") == ""
    result = CliRunner().invoke(controller, ["--scheduler-name", "Not_A_Name"])
    assert result.exit_code == 2
    assert "--scheduler-name 'Not_A_Name'" in result.output
    assert "DNS subdomain" in result.output


@pytest.mark.parametrize("flag", ["--bind-workers=0", "--bind-qps=-1"])
def test_bad_scheduler_flags_are_refused(flag: str) -> None:
    result = CliRunner().invoke(controller, [flag])
    assert result.exit_code == 2, result.output
