"""The kubectl plugin's pure parts: the queue tree, a Workload's state in words, the
what-if change syntax and the export of a running Job, and what a user refused by RBAC is
told (tests/e2e/test_roles_e2e.py runs the same refusals against the apiserver)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
from kubernetes.client.exceptions import ApiException
from rich.console import Console

from controllers.plugin.explain import placement_of, state_of
from controllers.plugin.kube import Forbidden, api_error
from controllers.plugin.queues import local_queue_tree, queue_tree, unreadable_queues
from controllers.plugin.stop import refusal
from controllers.plugin.whatif import _job_doc, apply_change
from quota.api.names import QUEUE_LABEL


def render(tree: Any) -> str:
    console = Console(width=200, no_color=True, force_terminal=False)
    with console.capture() as out:
        console.print(tree)
    return out.get()


def cq(name: str, parent: str | None = None, **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"flavors": [{"name": "h100", "quota": {"nvidia.com/gpu": 8}}]}
    if parent:
        spec["parent"] = parent
    return {"metadata": {"name": name}, "spec": spec, "status": status}


def test_the_tree_nests_children_and_shows_usage_quota_fair_share_and_counts() -> None:
    text = render(
        queue_tree(
            [
                cq(
                    "team-a",
                    "org",
                    usage={"h100": {"nvidia.com/gpu": "10"}},
                    pendingWorkloads=2,
                    conditions=[{"type": "Active", "status": "True"}],
                    fairShare={"h100": {"nvidia.com/gpu": "6"}},
                ),
                cq("org", conditions=[{"type": "Active", "status": "False", "reason": "Stopped"}]),
            ],
            [
                {
                    "metadata": {"name": "q", "namespace": "ns"},
                    "spec": {"clusterQueue": "team-a"},
                    "status": {"pendingWorkloads": 2},
                }
            ],
        )
    )
    lines = text.splitlines()
    org = next(i for i, line in enumerate(lines) if "org" in line and "inactive (Stopped)" in line)
    team = next(i for i, line in enumerate(lines) if "team-a" in line)
    assert org < team and "pending 2" in lines[team]
    assert "h100 nvidia.com/gpu: 10 / 8 used, fair share 6" in text
    assert "local queues: ns/q (pending 2)" in text


def test_a_cycle_or_a_missing_parent_still_shows_every_queue() -> None:
    text = render(queue_tree([cq("a", "b"), cq("b", "a"), cq("c", "gone")], []))
    assert all(name in text for name in ("a  ", "b  ", "c  "))


def cond(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def test_state_in_words() -> None:
    waiting = {"status": {"conditions": [cond("QuotaReserved", "False", "Pending", "no room")]}}
    assert state_of(waiting) == ("waiting for quota", "Pending: no room")
    assert state_of({})[0] == "waiting"
    admitted = {
        "status": {
            "admission": {
                "clusterQueue": "q",
                "podSetAssignments": [
                    {"name": "main", "count": 2, "nodes": [{"name": "n1", "count": 2}]}
                ],
            },
            "conditions": [cond("QuotaReserved", "True"), cond("Admitted", "True", "Admitted")],
        }
    }
    assert state_of(admitted)[0] == "admitted"
    assert placement_of(None, admitted) == "planned: 2 on n1"
    group = {
        "status": {
            "conditions": [
                cond("PodGroupInitiallyScheduled", "False", "Unschedulable", "no node fits")
            ]
        }
    }
    assert placement_of(group, admitted) == "Unschedulable: no node fits"


def docs() -> list[dict[str, Any]]:
    return [
        {
            "kind": "ClusterQueue",
            "metadata": {"name": "team-a"},
            "spec": {
                "flavors": [
                    {"name": "h100", "quota": {"nvidia.com/gpu": 8}},
                    {"name": "a100", "quota": {"nvidia.com/gpu": 4}},
                    {"name": "cpu", "quota": {"cpu": 64}},
                ]
            },
        }
    ]


def test_a_change_names_queue_flavor_field_and_resource() -> None:
    d = docs()
    apply_change(d, "team-a.h100.quota.nvidia.com/gpu=16")
    apply_change(d, "team-a.quota.cpu=128")
    apply_change(d, "team-a.a100.limit.nvidia.com/gpu=6")
    flavors = {f["name"]: f for f in d[0]["spec"]["flavors"]}
    assert flavors["h100"]["quota"]["nvidia.com/gpu"] == "16"
    assert flavors["cpu"]["quota"]["cpu"] == "128"
    assert flavors["a100"]["limit"] == {"nvidia.com/gpu": "6"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("team-a.quota.nvidia.com/gpu=16", "2 flavors that could be meant"),
        ("team-b.quota.cpu=1", "no ClusterQueue 'team-b'"),
        ("team-a.v100.quota.cpu=1", "has no flavor 'v100' (it has h100, a100, cpu)"),
        ("team-a=16", "expected QUEUE[.FLAVOR].quota.RESOURCE=AMOUNT"),
    ],
)
def test_a_bad_change_says_what_is_wrong(change: str, message: str) -> None:
    with pytest.raises(click.BadParameter) as raised:
        apply_change(docs(), change)
    assert message in raised.value.message


def test_a_running_job_is_exported_with_what_is_left_of_its_runtime() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    job = {
        "metadata": {
            "name": "train",
            "namespace": "ns",
            "labels": {"muster.dev/queue-name": "q"},
            "annotations": {"muster.dev/run-for": "2h"},
        },
        "spec": {
            "parallelism": 2,
            "suspend": False,
            "template": {"spec": {"containers": [{"name": "c"}], "nodeName": "n1"}},
        },
        "status": {"startTime": "2026-01-01T11:30:00Z"},
    }
    doc = _job_doc(job, 3600, now)
    assert doc["metadata"]["annotations"]["muster.dev/run-for"] == "5400s"
    assert doc["metadata"]["annotations"]["muster.dev/submit-at"] == "0s"
    assert "nodeName" not in doc["spec"]["template"]["spec"]
    job["spec"]["suspend"] = True
    del job["metadata"]["annotations"]
    waiting = _job_doc(job, 3600, now)["metadata"]["annotations"]
    assert waiting == {"muster.dev/run-for": "3600s", "muster.dev/submit-at": "1s"}


def test_what_if_leaves_out_a_queue_the_model_refuses_and_what_depends_on_it() -> None:
    from controllers.plugin.whatif import _leave_out_invalid

    def cq(name: str, cpu: str, parent: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"flavors": [{"name": "f", "quota": {"cpu": cpu}}]}
        if parent:
            spec["parent"] = parent
        return {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": spec,
        }

    def lq(namespace: str, cluster_queue: str) -> dict[str, Any]:
        return {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "LocalQueue",
            "metadata": {"name": "q", "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        }

    def job(namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j", "namespace": namespace, "labels": {QUEUE_LABEL: "q"}},
        }

    flavor = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "ResourceFlavor",
        "metadata": {"name": "f"},
    }
    docs = [
        flavor,
        cq("bad", "2000500u"),
        cq("child", "1", parent="bad"),
        cq("good", "2"),
        lq("a", "bad"),
        lq("b", "good"),
        job("a"),
        job("b"),
    ]
    skipped: list[str] = []
    kept = _leave_out_invalid(docs, skipped)
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in kept]
    assert names == [
        ("ResourceFlavor", None, "f"),
        ("ClusterQueue", None, "good"),
        ("LocalQueue", "b", "q"),
        ("Job", "b", "j"),
    ]
    assert any("ClusterQueue bad" in s and "not exact" in s for s in skipped), skipped
    assert any(
        x.startswith("ClusterQueue child: spec.parent names ClusterQueue 'bad'") for x in skipped
    ), skipped
    assert "Job a/j: its LocalQueue q does not exist or was left out" in skipped


def test_what_if_leaves_out_what_the_controller_would_hold_inactive() -> None:
    from controllers.plugin.whatif import _leave_out_invalid

    def doc(kind: str, name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
        api = "v1" if kind == "Node" else "muster.dev/v1alpha1"
        return {"apiVersion": api, "kind": kind, "metadata": {"name": name, **meta}, "spec": spec}

    docs = [
        doc("Node", "n1", {}, labels={"pool": "cpu"}),
        doc("ResourceFlavor", "cpu", {"nodeLabels": {"pool": "cpu"}}),
        doc("ResourceFlavor", "gone", {"nodeLabels": {"pool": "h100"}}),
        doc("ClusterQueue", "orphan", {"parent": "missing", "flavors": []}),
        doc("ClusterQueue", "both", {"flavors": [{"name": "cpu"}, {"name": "gone"}]}),
        doc("LocalQueue", "q", {"clusterQueue": "nowhere"}, namespace="ns"),
    ]
    skipped: list[str] = []
    kept = _leave_out_invalid(docs, skipped)
    assert [d["metadata"]["name"] for d in kept] == ["n1", "cpu", "both"]
    assert [f["name"] for f in kept[2]["spec"]["flavors"]] == ["cpu"]
    assert "ResourceFlavor gone: no node carries its labels (no capacity)" in skipped
    assert any(
        x.startswith("ClusterQueue orphan: spec.parent names ClusterQueue 'missing'")
        for x in skipped
    ), skipped
    assert "LocalQueue ns/q: its ClusterQueue nowhere does not exist or was left out" in skipped


SAID = (
    'clusterqueues.muster.dev "team-a" is forbidden: User "system:serviceaccount:ml:alice" '
    'cannot get resource "clusterqueues" in API group "muster.dev" at the cluster scope'
)


def test_a_403_is_a_refusal_a_command_can_tell_apart() -> None:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "message": SAID})
    refused = api_error(error, "reading ClusterQueue team-a")
    assert isinstance(refused, Forbidden) and refused.said == SAID
    assert refused.message == f"reading ClusterQueue team-a: {SAID} (HTTP 403)"
    other = api_error(ApiException(status=500, reason="Internal Server Error"), "listing")
    assert not isinstance(other, Forbidden)


@pytest.mark.parametrize(("policy", "verb"), [("Hold", "stopping"), ("None", "resuming")])
def test_a_refused_stop_names_the_queue_the_right_and_who_has_it(policy: Any, verb: str) -> None:
    words = refusal("team-a", policy, f"reading ClusterQueue team-a: {SAID} (HTTP 403)")
    assert words.startswith(f"{verb} ClusterQueue team-a needs the right to get and patch")
    assert "batch-admin role, bound with a ClusterRoleBinding" in words
    assert words.endswith(f"ask one of them. reading ClusterQueue team-a: {SAID} (HTTP 403)")


def test_local_queues_alone_show_their_cluster_queue_state_counts_and_usage() -> None:
    lqs = [
        {
            "metadata": {"name": "team", "namespace": "ml"},
            "spec": {"clusterQueue": "team-a"},
            "status": {
                "pendingWorkloads": 1,
                "admittedWorkloads": 2,
                "usage": {"h100": {"nvidia.com/gpu": "8"}},
                "conditions": [{"type": "Active", "status": "True", "reason": "Ready"}],
            },
        },
        {
            "metadata": {"name": "borrowed", "namespace": "ml"},
            "spec": {"clusterQueue": "team-b"},
            "status": {
                "conditions": [
                    {"type": "Active", "status": "False", "reason": "NamespaceNotSelected"}
                ]
            },
        },
    ]
    text = render(local_queue_tree(lqs, "ml"))
    assert "LocalQueues in namespace ml" in text
    assert "team  -> ClusterQueue team-a  active  admitted 2  pending 1" in text
    assert "h100 nvidia.com/gpu: 8 used" in text
    assert "borrowed  -> ClusterQueue team-b  inactive (NamespaceNotSelected)" in text
    assert "ml/team" in render(local_queue_tree(lqs, None))


def test_unreadable_queues_say_what_is_left_out_and_which_role_shows_it() -> None:
    words = unreadable_queues(SAID)
    assert "ClusterQueues are not readable with your rights" in words
    assert "queue-reader role" in words and "userRoles.queueReaderGroups" in words
    assert words.endswith(SAID)


def test_explain_names_a_history_store_it_cannot_read_and_still_answers(tmp_path: Path) -> None:
    """The plugin's history lines use the words every other reader of the store uses."""
    from controllers.plugin.main import _history_reader

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database")
    said = _history_reader(f"sqlite:///{junk}")("ns", "train")
    assert said == (
        f"history store at sqlite:///{junk} is not an SQLite database, or is damaged: "
        "file is not a database"
    )
    assert junk.read_bytes() == b"not a database"
