"""Muster's admission policies on the real apiserver decide exactly what the webhook handlers
decide (`controllers/webhooks/policies.py` against `server.mutate_job` / `validate_job`):
the same Jobs are created suspended, for Muster's scheduler, elastic ones gated; the same
Jobs and edits are refused, with the same words. Every case goes through the apiserver with
server-side dry runs, so nothing is left behind but the Jobs the update cases edit."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from controllers.state.ownergroups import OWNER_KINDS
from controllers.webhooks import decisions, policies
from tests.conftest import ClusterHandle
from tests.unit.test_controller_webhooks import apply_json_patch

pytestmark = pytest.mark.e2e

SUFFIX = f"-parity-{uuid.uuid4().hex[:6]}"
QL = "muster.dev/queue-name"


@pytest.fixture(scope="module")
def registered(cluster: ClusterHandle) -> Iterator[None]:
    """The policies under names of this module's own (a controller of another test may have
    left Muster's behind: the decisions are the same, so both agreeing changes nothing)."""
    docs = copy.deepcopy(policies.policies())
    for doc in docs:
        doc["metadata"]["name"] += SUFFIX
        if "policyName" in doc["spec"]:
            doc["spec"]["policyName"] += SUFFIX
    text = yaml.safe_dump_all(docs)
    cluster.kubectl("apply", "-f", "-", input=text)
    probe = job("probe", "default")
    # The apiserver takes in new policies through a watch: wait until they act.
    cluster.wait_for(
        "the admission policies to act",
        lambda: dry_run_create(cluster, probe)[0].get("spec", {}).get("suspend") is True,
        timeout=60,
    )
    # Each policy is taken in on its own: wait for the last ones too (owners', pods').
    probe_owner = owner(
        "Deployment", "default", {"metadata": {"labels": {"app": "x"}}, "spec": POD_SPEC}
    )
    cluster.wait_for(
        "the owner kinds' policies to act",
        lambda: (
            QL
            in (dry_run_create(cluster, probe_owner)[0].get("spec", {}).get("template", {}))
            .get("metadata", {})
            .get("labels", {})
        ),
        timeout=60,
    )
    probe_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": "default", "labels": {QL: "team"}},
        "spec": POD_SPEC,
    }
    cluster.wait_for(
        "the queued pods' policy to act",
        lambda: bool(dry_run_create(cluster, probe_pod)[0].get("spec", {}).get("schedulingGates")),
        timeout=60,
    )
    try:
        yield
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=text, check=False)


def job(
    name: str,
    namespace: str,
    *,
    queue: str = "team",
    annotations: dict[str, str] | None = None,
    parallelism: int = 3,
    completions: int | None = None,
    template_labels: dict[str, str] | None = None,
    gates: list[str] | None = None,
    scheduler: str | None = None,
    suspend: bool | None = None,
    template_metadata: bool = True,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parallelism": parallelism,
        "template": {
            "metadata": {"labels": dict(template_labels or {})} if template_metadata else {},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "registry.invalid/none"}],
            },
        },
    }
    if completions is not None:
        spec["completions"] = completions
    if suspend is not None:
        spec["suspend"] = suspend
    if gates:
        spec["template"]["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    if scheduler:
        spec["template"]["spec"]["schedulerName"] = scheduler
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"muster.dev/queue-name": queue},
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


def dry_run_create(cluster: ClusterHandle, obj: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(the object as the apiserver would store it, {} if refused; the refusal)."""
    result = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj), check=False
    )
    if result.returncode != 0:
        return {}, result.stderr
    return json.loads(result.stdout), ""


def json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The webhook's JSON patch applied to a copy of `doc`."""
    return apply_json_patch(copy.deepcopy(doc), ops)


def what_muster_sets(obj: dict[str, Any]) -> dict[str, Any]:
    """The fields Muster's admission decides on."""
    spec = obj["spec"]
    pod = spec["template"]["spec"]
    labels = (spec["template"].get("metadata") or {}).get("labels") or {}
    return {
        "suspend": bool(spec.get("suspend")),
        "scheduler": pod.get("schedulerName") or "default-scheduler",
        "gates": [g["name"] for g in pod.get("schedulingGates") or []],
        "elastic pod label": labels.get("muster.dev/elastic-job"),
    }


CREATE_CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "elastic": {"annotations": {"muster.dev/elastic-job": "true"}},
    "elastic, capitalised": {"annotations": {"muster.dev/elastic-job": "True"}},
    "elastic, own labels and gate": {
        "annotations": {"muster.dev/elastic-job": "true"},
        "template_labels": {"app": "x"},
        "gates": ["example.com/other"],
    },
    "elastic, template without metadata": {
        "annotations": {"muster.dev/elastic-job": "true"},
        "template_metadata": False,
    },
    "elastic, gate already there": {
        "annotations": {"muster.dev/elastic-job": "true"},
        "gates": ["muster.dev/admission", "example.com/other"],
    },
    "elastic annotation false": {"annotations": {"muster.dev/elastic-job": "false"}},
    "own scheduler": {"scheduler": "my-scheduler"},
    "default scheduler named": {"scheduler": "default-scheduler"},
    "already suspended": {"suspend": True},
    "explicitly running": {"suspend": False},
    "empty queue name": {"queue": ""},
    "partial admission": {"annotations": {"muster.dev/min-parallelism": "2"}},
    "elastic and partial": {
        "annotations": {"muster.dev/elastic-job": "true", "muster.dev/min-parallelism": "2"}
    },
    "min-parallelism zero": {"annotations": {"muster.dev/min-parallelism": "0"}},
    "min-parallelism above parallelism": {"annotations": {"muster.dev/min-parallelism": "4"}},
    "min-parallelism not a number": {"annotations": {"muster.dev/min-parallelism": "two"}},
    "min-parallelism superscript": {"annotations": {"muster.dev/min-parallelism": "\u00b2"}},
    "min-parallelism huge": {"annotations": {"muster.dev/min-parallelism": "9" * 30}},
}


@pytest.mark.parametrize("case", list(CREATE_CASES))
def test_creation_is_decided_as_the_webhook_decides(
    cluster: ClusterHandle, namespace: str, registered: None, case: str
) -> None:
    obj = job(f"c-{uuid.uuid4().hex[:6]}", namespace, **CREATE_CASES[case])
    stored, refusal = dry_run_create(cluster, obj)
    reason = decisions.validate_job(obj, None)
    if reason is not None:
        assert not stored, f"{case}: the apiserver accepted what the webhook refuses: {reason}"
        assert reason in refusal, f"{case}: different words:\n{reason}\n{refusal}"
        return
    assert stored, f"{case}: the apiserver refused what the webhook accepts: {refusal}"
    # The apiserver defaults before admission; the webhook sees the defaulted object too.
    defaulted = copy.deepcopy(obj)
    defaulted["spec"]["template"]["spec"].setdefault("schedulerName", "default-scheduler")
    expected = json_patch(defaulted, decisions.mutate_job(defaulted))
    assert what_muster_sets(stored) == what_muster_sets(expected), case


def merge(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386: what `kubectl patch --type merge` makes of `doc`."""
    out = copy.deepcopy(doc)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


UPDATE_CASES: dict[str, tuple[bool, dict[str, Any], dict[str, Any]]] = {
    # name: (running, how the Job was made, the edit)
    "queue changed while running": (True, {}, {"metadata": {"labels": {QL: "other"}}}),
    "queue label removed while running": (True, {}, {"metadata": {"labels": {QL: None}}}),
    "queue changed while suspended": (False, {}, {"metadata": {"labels": {QL: "other"}}}),
    "queue label removed while suspended": (False, {}, {"metadata": {"labels": {QL: None}}}),
    "elastic annotation added": (
        False,
        {},
        {"metadata": {"annotations": {"muster.dev/elastic-job": "true"}}},
    ),
    "elastic annotation removed": (
        True,
        {"annotations": {"muster.dev/elastic-job": "true"}},
        {"metadata": {"annotations": {"muster.dev/elastic-job": None}}},
    ),
    "grown while running": (True, {}, {"spec": {"parallelism": 5}}),
    "grown past completions while running": (
        True,
        {"completions": 3},
        {"spec": {"parallelism": 5}},
    ),
    "shrunk while running": (True, {}, {"spec": {"parallelism": 2}}),
    "grown while suspended": (False, {}, {"spec": {"parallelism": 5}}),
    "elastic grown while running": (
        True,
        {"annotations": {"muster.dev/elastic-job": "true"}},
        {"spec": {"parallelism": 6}},
    ),
    "partial admission made invalid": (
        False,
        {"annotations": {"muster.dev/min-parallelism": "2"}},
        {"spec": {"parallelism": 1}},
    ),
    "unrelated label while running": (True, {}, {"metadata": {"labels": {"team": "a"}}}),
}


@pytest.mark.parametrize("case", list(UPDATE_CASES))
def test_edits_are_decided_as_the_webhook_decides(
    cluster: ClusterHandle, namespace: str, registered: None, case: str
) -> None:
    running, shape, edit = UPDATE_CASES[case]
    name = f"u-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "-f", "-", input=json.dumps(job(name, namespace, **shape)))
    if running:
        cluster.kubectl(
            "patch", "job", name, "-n", namespace, "--type", "merge", "-p",
            json.dumps({"spec": {"suspend": False}}),
        )  # fmt: skip
    old = cluster.get_json("job", name, "-n", namespace)
    result = cluster.kubectl(
        "patch", "job", name, "-n", namespace, "--dry-run=server", "--type", "merge", "-p",
        json.dumps(edit), check=False,
    )  # fmt: skip
    reason = decisions.validate_job(merge(old, edit), old)
    if reason is None:
        assert result.returncode == 0, f"{case}: refused by the apiserver: {result.stderr}"
    else:
        assert result.returncode != 0, f"{case}: the apiserver allowed: {reason}"
        assert reason in result.stderr, f"{case}: different words:\n{reason}\n{result.stderr}"


def test_pods_of_admitted_jobsets_and_trainjobs_go_to_musters_scheduler(
    cluster: ClusterHandle, namespace: str, registered: None
) -> None:
    def pod(labels: dict[str, str], scheduler: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.invalid/none"}]}
        if scheduler:
            spec["schedulerName"] = scheduler
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"p-{uuid.uuid4().hex[:6]}",
                "namespace": namespace,
                "labels": labels,
            },
            "spec": spec,
        }

    owned = {"muster.dev/owner-uid": "1234"}
    for labels, scheduler in ((owned, None), (owned, "mine"), ({"app": "x"}, None)):
        obj = pod(labels, scheduler)
        stored, refusal = dry_run_create(cluster, obj)
        assert stored, refusal
        defaulted = copy.deepcopy(obj)
        defaulted["spec"].setdefault("schedulerName", "default-scheduler")
        want = json_patch(defaulted, decisions.mutate_pod(defaulted) if labels == owned else [])
        assert stored["spec"]["schedulerName"] == want["spec"]["schedulerName"]


def owner(kind: str, namespace: str, template: dict[str, Any], queue: str = "team") -> Any:
    """A Deployment or StatefulSet with the queue label and this pod template."""
    spec: dict[str, Any] = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "x"}},
        "template": template,
    }
    if kind == "StatefulSet":
        spec["serviceName"] = "x"
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": f"o-{uuid.uuid4().hex[:6]}",
            "namespace": namespace,
            "labels": {QL: queue} if queue else {},
        },
        "spec": spec,
    }


POD_SPEC = {"containers": [{"name": "c", "image": "registry.invalid/none"}]}
OWNER_TEMPLATES = {
    "template labels": {"metadata": {"labels": {"app": "x", QL: "other"}}, "spec": POD_SPEC},
    "template with its own labels": {"metadata": {"labels": {"app": "x"}}, "spec": POD_SPEC},
}


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet"])
@pytest.mark.parametrize("case", [*OWNER_TEMPLATES, "no queue"])
def test_owner_kinds_carry_their_queue_into_their_templates_as_the_webhook_does(
    cluster: ClusterHandle, namespace: str, registered: None, kind: str, case: str
) -> None:
    template = OWNER_TEMPLATES.get(case) or OWNER_TEMPLATES["template with its own labels"]
    obj = owner(
        kind, namespace, copy.deepcopy(template), queue="" if case == "no queue" else "team"
    )
    stored, refusal = dry_run_create(cluster, obj)
    assert stored, refusal
    owner_kind = next(k for k in OWNER_KINDS if k.resource == kind.lower() + "s")
    want = json_patch(obj, decisions.mutate_owner(obj, owner_kind))
    got_labels = stored["spec"]["template"]["metadata"].get("labels") or {}
    assert got_labels == want["spec"]["template"]["metadata"].get("labels"), case
    assert got_labels.get(QL) == (
        "team" if case != "no queue" else template["metadata"]["labels"].get(QL)
    )


QUEUED_POD_CASES: dict[str, dict[str, Any]] = {
    "labelled": {"labels": {QL: "team"}},
    "labelled, a gate of its own": {"labels": {QL: "team"}, "gates": ["example.com/x"]},
    "labelled, gate already there": {"labels": {QL: "team"}, "gates": ["muster.dev/admission"]},
    "labelled, own scheduler": {"labels": {QL: "team"}, "scheduler": "mine"},
    "labelled, a JobSet's (owner uid)": {"labels": {QL: "team", "muster.dev/owner-uid": "1"}},
    "labelled, a Job's": {"labels": {QL: "team", "batch.kubernetes.io/controller-uid": "1"}},
    "labelled, a Volcano group's": {
        "labels": {QL: "team"},
        "annotations": {"scheduling.k8s.io/group-name": "g"},
    },
    "unlabelled": {"labels": {"app": "x"}},
}


@pytest.mark.parametrize("case", list(QUEUED_POD_CASES))
def test_pods_queued_by_their_owner_are_gated_as_the_webhook_gates_them(
    cluster: ClusterHandle, namespace: str, registered: None, case: str
) -> None:
    given = QUEUED_POD_CASES[case]
    spec: dict[str, Any] = copy.deepcopy(POD_SPEC)
    if given.get("scheduler"):
        spec["schedulerName"] = given["scheduler"]
    if given.get("gates"):
        spec["schedulingGates"] = [{"name": g} for g in given["gates"]]
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p-{uuid.uuid4().hex[:6]}",
            "namespace": namespace,
            "labels": given["labels"],
            "annotations": given.get("annotations") or {},
        },
        "spec": spec,
    }
    stored, refusal = dry_run_create(cluster, obj)
    assert stored, refusal
    defaulted = copy.deepcopy(obj)
    defaulted["spec"].setdefault("schedulerName", "default-scheduler")
    # Both paths: the queued pod's own rule, and the pod rule of owners queued by their uid.
    want = json_patch(defaulted, decisions.mutate_queued_pod(defaulted))
    want = json_patch(
        want, decisions.mutate_pod(want) if "muster.dev/owner-uid" in given["labels"] else []
    )
    assert stored["spec"]["schedulerName"] == want["spec"]["schedulerName"], case
    gates = [g["name"] for g in stored["spec"].get("schedulingGates") or []]
    assert gates == [g["name"] for g in want["spec"].get("schedulingGates") or []], case
