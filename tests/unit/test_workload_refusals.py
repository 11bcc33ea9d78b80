"""Refuse what cannot be right (issue 24, item 5): a workload naming a PriorityClass that does
not exist waits with a reason naming it, in the controller, `muster admit` and the simulator
alike, and is decided once the class exists; an admission that assigns no pod set is refused
as malformed, in files and by the CRD schema, and one already stored is not counted."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from controllers.main import main
from controllers.runtime.resources import PRIORITY_CLASS, WORKLOAD
from controllers.state import workloads as wls
from quota.api.names import QUEUE_LABEL
from quota.model.convert import job_to_workload_model, priority_wait, workload_priority
from tests.unit.test_controller_admission import Harness

REPO = Path(__file__).resolve().parents[2]


def test_the_rule_a_priority_given_stands_a_missing_class_waits_an_existing_one_is_read() -> None:
    classes = {"batch": 100}
    assert priority_wait(None, "vip", classes) == (
        "waits for PriorityClass 'vip', which does not exist (named by spec.priorityClassName): "
        "create it, or name a class that exists"
    )
    # Resolved when the workload was made (as a pod's priority is): it stands.
    assert priority_wait(7, "vip", classes) is None and workload_priority(7, "vip", classes) == 7
    assert priority_wait(None, "batch", classes) is None
    assert workload_priority(None, "batch", classes) == 100
    assert priority_wait(None, None, classes) is None and workload_priority(None, None, {}) == 0


def test_a_job_naming_a_missing_class_becomes_a_workload_that_names_it_and_waits() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns", "labels": {QUEUE_LABEL: "q"}},
        "spec": {"template": {"spec": {"priorityClassName": "vip", "containers": []}}},
    }
    wl = job_to_workload_model(job, {"batch": 100})
    assert (wl.spec.priority, wl.spec.priority_class_name) == (None, "vip")
    assert priority_wait(wl.spec.priority, wl.spec.priority_class_name, {"batch": 100})
    assert job_to_workload_model(job, {"vip": 5}).spec.priority == 5


def _priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def test_the_controller_keeps_it_waiting_with_the_reason_until_the_class_is_created() -> None:
    h = Harness(cpu_quota="4")
    h.workload("low", 3, priority=1, created=1)
    wl = h.workload("vip", 3, created=2)
    named = copy.deepcopy(wl)
    named["spec"].pop("priority")
    named["spec"]["priorityClassName"] = "urgent"
    h.put(WORKLOAD, named)

    result = h.cycle()
    assert [a.workload for a in result.admit] == ["ns/low"]
    h.loop.pending_writer.flush_due()
    waiting = wls.condition(h.get("vip"), "QuotaReserved")
    assert waiting is not None and waiting["reason"] == "Inadmissible"
    assert "waits for PriorityClass 'urgent', which does not exist" in waiting["message"]

    # Created later: the next cycle decides it, at the class's value (high enough to preempt
    # the running workload in a queue that preempts by priority).
    stored = h.kube.put(PRIORITY_CLASS, _priority_class("urgent", 1000))
    h.caches.priority_classes.write_through(stored)
    view = h.loop.views.build()
    assert not any(key == "ns/vip" for key, _, _ in view.blocked)
    (pending,) = [w for w in view.snapshot.pending if w.key == "ns/vip"]
    assert pending.priority == 1000


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _first(docs: list[dict[str, Any]], admitted: bool) -> dict[str, Any]:
    return next(
        d
        for d in docs
        if d["kind"] == "Workload" and bool((d.get("status") or {}).get("admission")) == admitted
    )


def _admit(tmp_path: Path, docs: list[dict[str, Any]], *args: str) -> Any:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return CliRunner().invoke(main, ["admit", "--now", "2026-01-01T00:00:00Z", *args, str(path)])


def test_muster_admit_reports_the_wait_and_decides_it_once_the_file_holds_the_class(
    tmp_path: Path,
) -> None:
    docs = _documents(REPO / "examples" / "fairshare.yaml")
    wl = _first(docs, admitted=False)
    key = f"{wl['metadata']['namespace']}/{wl['metadata']['name']}"
    wl["spec"].pop("priority", None)
    wl["spec"]["priorityClassName"] = "urgent"

    result = _admit(tmp_path, docs, "-o", "json")
    assert result.exit_code == 0, result.output
    (pending,) = [p for p in json.loads(result.output)["pending"] if p["workload"] == key]
    assert pending["reason"].startswith("waits for PriorityClass 'urgent', which does not exist")
    table = _admit(tmp_path, docs)
    assert "waits for PriorityClass" in table.output and key in table.output

    docs.append(_priority_class("urgent", 10**6))
    decided = json.loads(_admit(tmp_path, docs, "-o", "json").output)
    assert all(
        p["workload"] != key or "PriorityClass" not in p["reason"] for p in decided["pending"]
    )
    # Decided as if it carried the class's value itself.
    wl["spec"]["priority"] = 10**6
    del wl["spec"]["priorityClassName"]
    docs.pop()
    assert json.loads(_admit(tmp_path, docs, "-o", "json").output) == decided


SCENARIO = REPO / "examples" / "elastic.yaml"


def _simulate(tmp_path: Path, text: str, *args: str) -> Any:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return CliRunner().invoke(main, ["simulate", "--no-history", *args, str(path)])


def test_the_simulator_keeps_a_job_and_generated_workloads_waiting_with_the_reason(
    tmp_path: Path,
) -> None:
    text = SCENARIO.read_text().replace(
        "      restartPolicy: Never", "      restartPolicy: Never\n      priorityClassName: vip"
    )
    text = text.replace("    pods: 4\n", "    pods: 4\n    priorityClassName: gold\n")
    result = _simulate(tmp_path, text, "-o", "json")
    assert result.exit_code == 0, result.output
    workloads = json.loads(result.stdout)["workloads"]
    assert len(workloads) == 9
    for w in workloads:
        assert w["admittedAt"] is None, w["name"]
        name = "vip" if w["name"] == "team-a/train-elastic" else "gold"
        assert w["lastPendingReason"].startswith(f"waits for PriorityClass '{name}'")
    table = _simulate(tmp_path, text)
    assert "never decided: team-a/train-elastic: waits for PriorityClass 'vip'" in table.output
    assert (
        "never decided: team-b/batch-job-1, team-b/batch-job-2, team-b/batch-job-3 and 5 more"
        in (table.output)
    )

    # With the classes in the file, each runs at its class's value.
    classes = "\n---\n".join(
        yaml.safe_dump(_priority_class(n, v)) for n, v in (("vip", 1000), ("gold", 10))
    )
    decided = json.loads(_simulate(tmp_path, text + "\n---\n" + classes, "-o", "json").stdout)
    priorities = {w["name"]: w["priority"] for w in decided["workloads"]}
    assert priorities["team-a/train-elastic"] == 1000
    assert {v for k, v in priorities.items() if k.startswith("team-b/")} == {10}
    assert all(w["admittedAt"] is not None for w in decided["workloads"])


def test_an_admission_that_assigns_no_pod_set_is_refused_in_a_file(tmp_path: Path) -> None:
    docs = _documents(REPO / "examples" / "fairshare.yaml")
    wl = _first(docs, admitted=True)
    wl["status"]["admission"]["podSetAssignments"] = []
    result = _admit(tmp_path, docs)
    assert result.exit_code == 1
    assert f"Workload {wl['metadata']['namespace']}/{wl['metadata']['name']}" in result.output
    assert "status.admission.podSetAssignments: List should have at least 1 item" in result.output


def test_the_crd_schema_refuses_an_admission_without_pod_sets() -> None:
    crd = yaml.safe_load((REPO / "crds" / "muster.dev_workloads.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    admission = schema["properties"]["status"]["properties"]["admission"]
    assert "podSetAssignments" in admission["required"]
    assert admission["properties"]["podSetAssignments"]["minItems"] == 1


@pytest.mark.parametrize("finished", [False, True])
def test_a_stored_admission_without_pod_sets_is_not_counted_and_nothing_else_is_lost(
    finished: bool,
) -> None:
    h = Harness(cpu_quota="4")
    for name in ("running", "broken"):
        h.workload(name, 2, created=1 if name == "running" else 2)
    assert {a.workload for a in h.cycle().admit} == {"ns/running", "ns/broken"}
    # Stored before the schema refused it (an older CRD): its admission assigns no pod set.
    broken = h.get("broken")
    broken["status"]["admission"]["podSetAssignments"] = []
    if finished:
        wls.set_condition(broken, "Finished", "True", "Succeeded", "done", h.ctx.now())
    h.put(WORKLOAD, broken)
    h.workload("next", 2, created=3)

    view = h.loop.views.build()
    assert [w.key for w in view.snapshot.admitted] == ["ns/running"]
    blocked = {key: message for key, _, message in view.blocked}
    if finished:
        assert "ns/broken" not in blocked
    else:
        assert "status.admission.podSetAssignments" in blocked["ns/broken"]
    # Its 2 cpus are not counted: the next workload takes them.
    assert [a.workload for a in h.cycle().admit] == ["ns/next"]
    assert wls.has_quota(h.get("running"))
