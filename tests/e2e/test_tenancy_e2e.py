"""Managed namespaces, end to end, as a namespace user: a ServiceAccount with the built-in
`edit` ClusterRole bound in its namespaces, acting with nothing but its token (minted as the
README's chart walkthrough mints one), against a controller run with
`--managed-namespace-selector` and its admission policies on the real apiserver.

In a managed namespace an unlabelled Job waits, saying what to do, while the namespace has
no LocalQueue `default`, and joins it when there is one, never running beyond its quota; a
pod that tolerates a flavor's taint or names its node is refused; the user can neither
unsuspend a Job nor lift the admission gate from a pod. In a namespace not selected,
everything is as it was. One cluster, one controller and one user for all the cases.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers.localcluster.kubectl import kubectl
from controllers.webhooks import decisions
from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    crds,  # noqa: F401
    flavor,
    gated,
    job,
    live,
    local_queue,
    pods_of,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

GATE = "muster.dev/admission"


@dataclass
class Tenancy:
    """The shared setting: three namespaces, one flavor on tainted nodes, one user."""

    cluster: ClusterHandle
    controller: Controller
    team: str  # managed, with LocalQueue default
    lonely: str  # managed, without LocalQueue default
    open: str  # not managed
    flavor: str
    taint: dict[str, str]
    kubeconfig: str  # the user's: a ServiceAccount token, nothing else

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.team}:alice"

    def as_user(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return kubectl(self.cluster.kubectl_bin, self.kubeconfig, *args, input=input, check=False)

    def create(self, doc: dict[str, Any], *, dry_run: bool = False) -> tuple[dict[str, Any], str]:
        """`kubectl create` as the user: (the stored object, {} if refused; the refusal)."""
        argv = ["create", "-f", "-", "-o", "json", *(["--dry-run=server"] if dry_run else [])]
        result = self.as_user(*argv, input=yaml.safe_dump(doc))
        if result.returncode != 0:
            return {}, result.stderr
        return json.loads(result.stdout), ""


def user_kubeconfig(cluster: ClusterHandle, namespace: str, name: str, path: Path) -> str:
    """A kubeconfig holding nothing but a token of ServiceAccount `name` (TokenRequest)."""
    token = cluster.kubectl(
        "create", "token", name, "--namespace", namespace, "--duration", "1h"
    ).stdout.strip()
    server = yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [
            {"name": name, "context": {"cluster": "local", "user": name, "namespace": namespace}}
        ],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture(scope="module")
def tenancy(
    cluster: ClusterHandle,
    crds: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Tenancy]:
    mark = unique("tenancy")
    selector = f"muster-e2e/tenancy={mark}"
    team, lonely, open_ = unique("team"), unique("lonely"), unique("open")
    namespaces = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"muster-e2e/tenancy": mark} if managed else {}},
        }
        for ns, managed in ((team, True), (lonely, True), (open_, False))
    ]
    # The user: `edit` in all three namespaces, through a ServiceAccount of the first.
    account = {"apiVersion": "v1", "kind": "ServiceAccount"}
    edit = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"}
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "alice-edit", "namespace": ns},
            "roleRef": edit,
            "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": team}],
        }
        for ns in (team, lonely, open_)
    ]
    # GPU nodes, tainted, and the flavor that names the taint and adds its toleration.
    taint = {"key": "muster-e2e/tenancy", "value": mark, "effect": "NoSchedule"}
    cluster.nodes(
        1, cpu="8", memory="64Gi", gpu=8, labels={"muster-e2e/pool": mark}, taints=[taint]
    )
    cq = unique("cq")
    # One apply, in this order (kubectl creates the namespaces first).
    apply(
        cluster,
        *namespaces,
        {**account, "metadata": {"name": "alice", "namespace": team}},
        *bindings,
        flavor(mark, mark, nodeTaints=[taint], tolerations=[{**taint, "operator": "Equal"}]),
        cq_manifest(cq, [{"name": mark, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}]),
        local_queue("default", team, cq),
        cq_manifest(cq + "-open", [{"name": mark, "quota": {"cpu": "2"}, "limit": {"cpu": "2"}}]),
        local_queue("labelled", open_, cq + "-open"),
    )
    directory = tmp_path_factory.mktemp("tenancy")
    ctl = Controller(
        cluster, directory, "ctl-" + mark, "--managed-namespace-selector", selector
    ).start()
    try:
        ctl.wait_leading()
        yield Tenancy(
            cluster,
            ctl,
            team,
            lonely,
            open_,
            mark,
            taint,
            user_kubeconfig(cluster, team, "alice", directory / "alice"),
        )
    finally:
        ctl.stop()
        cluster.kubectl("delete", "namespace", team, lonely, open_, "--wait=false", check=False)


def pod(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
            ],
            **spec,
        },
    }


def pending_reason(cluster: ClusterHandle, namespace: str, name: str) -> str:
    found = workloads_of(cluster, namespace, name)
    return str(condition(found[0], "QuotaReserved").get("message") or "") if found else ""


def test_an_unlabelled_job_waits_saying_what_to_do_without_a_default_queue(
    tenancy: Tenancy,
) -> None:
    created, refusal = tenancy.create(job("unqueued", tenancy.lonely, None))
    assert not refusal, refusal
    assert created["spec"]["suspend"] is True  # by the managed namespace's policy
    assert created["spec"]["template"]["spec"]["schedulerName"] == "muster-scheduler"
    tenancy.cluster.wait_for(
        "the Workload to say why it waits",
        lambda: (
            "ask an admin to create LocalQueue default"
            in pending_reason(tenancy.cluster, tenancy.lonely, "unqueued")
        ),
    )
    [wl] = workloads_of(tenancy.cluster, tenancy.lonely, "unqueued")
    assert wl["spec"]["queueName"] == "default"
    reason = pending_reason(tenancy.cluster, tenancy.lonely, "unqueued")
    assert f"LocalQueue default does not exist in namespace {tenancy.lonely}" in reason
    assert "muster.dev/queue-name" in reason
    assert not pods_of(tenancy.cluster, tenancy.lonely, "unqueued")


def test_unlabelled_jobs_join_the_default_queue_and_never_run_beyond_its_quota(
    tenancy: Tenancy,
) -> None:
    cluster, team = tenancy.cluster, tenancy.team
    _, refusal = tenancy.create(job("first", team, None, parallelism=2))
    assert not refusal, refusal
    cluster.wait_for(
        "the first Job to run on the flavor's nodes",
        lambda: len([p for p in pods_of(cluster, team, "first") if p["spec"].get("nodeName")]) == 2,
    )
    [wl] = workloads_of(cluster, team, "first")
    assert admitted(wl) and wl["spec"]["queueName"] == "default"
    # 2 of 4 cpu used: a Job asking for 3 more waits for quota, and none of its pods exists.
    _, refusal = tenancy.create(job("second", team, None, parallelism=3))
    assert not refusal, refusal
    cluster.wait_for(
        "the second Job to wait for quota",
        lambda: "cpu" in pending_reason(cluster, team, "second"),
    )
    assert not pods_of(cluster, team, "second")
    # Starting it by hand is Muster's alone.
    result = tenancy.as_user(
        "patch", "job", "second", "-n", team, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    assert result.returncode != 0
    # The policy's words are the webhook's (`decisions.refuse_start`).
    second = job("second", team, None, parallelism=3)
    said = decisions.refuse_start(
        second | {"spec": {**second["spec"], "suspend": False}},
        second | {"spec": {**second["spec"], "suspend": True}},
        tenancy.user,
        "muster",
    )
    assert said is not None and said in result.stderr, result.stderr
    assert f"Job {team}/second: spec.suspend cannot be set to false by {tenancy.user}" in said
    assert "LocalQueue default" in said
    assert not pods_of(cluster, team, "second")
    assert not admitted(workloads_of(cluster, team, "second")[0])


def test_pods_reach_a_flavors_nodes_only_through_admission(tenancy: Tenancy) -> None:
    team, toleration = tenancy.team, {**tenancy.taint, "operator": "Equal"}
    flavor = {"metadata": {"name": tenancy.flavor}, "spec": {"nodeTaints": [tenancy.taint]}}
    tolerant = pod("tolerant", team, tolerations=[toleration])
    _, refusal = tenancy.create(tolerant)
    # The policy's words are the webhook's (`decisions.refuse_toleration`).
    said = decisions.refuse_toleration(
        tolerant, None, flavor, scheduler_name="muster-scheduler", user=tenancy.user
    )
    assert said is not None and said in refusal, refusal
    assert f"Pod {team}/tolerant: spec.tolerations tolerate the taint " in said
    assert f"of ResourceFlavor {tenancy.flavor}" in said
    # An empty-key Exists tolerates every taint: refused too.
    _, refusal = tenancy.create(pod("tolerates-all", team, tolerations=[{"operator": "Exists"}]))
    assert "spec.tolerations tolerate the taint" in refusal, refusal
    nodes = tenancy.cluster.get_json("nodes", "-l", f"muster-e2e/pool={tenancy.flavor}")
    node = nodes["items"][0]["metadata"]["name"]  # type: ignore[index]
    pinned = pod("pinned", team, nodeName=node)
    _, refusal = tenancy.create(pinned)
    said = decisions.refuse_pod(pinned, None, tenancy.user, [], "muster")
    assert said is not None and said in refusal, refusal
    assert f"Pod {team}/pinned: spec.nodeName ({node}) cannot be set" in said
    # A pod that says it is a Job's would take an admitted pod's place: the Job controller's.
    forged = pod("forged", team, schedulerName="muster-scheduler")
    forged["metadata"]["labels"] = {"batch.kubernetes.io/controller-uid": "any-jobs-uid"}
    _, refusal = tenancy.create(forged)
    said = decisions.refuse_pod(forged, None, tenancy.user, [], "muster")
    assert said is not None and said in refusal, refusal
    assert "metadata.labels[batch.kubernetes.io/controller-uid] cannot be set" in said
    # Muster's scheduler may be named: it binds only the pods of admitted workloads.
    allowed, refusal = tenancy.create(
        pod("muster-placed", team, tolerations=[toleration], schedulerName="muster-scheduler"),
        dry_run=True,
    )
    assert allowed and not refusal, refusal
    # A pod that tolerates nothing of a flavor's is none of Muster's business.
    allowed, refusal = tenancy.create(pod("plain", team), dry_run=True)
    assert allowed and not refusal, refusal


def test_lifting_the_admission_gate_by_hand_is_refused_and_binds_nothing(
    tenancy: Tenancy,
) -> None:
    cluster, team = tenancy.cluster, tenancy.team
    _, refusal = tenancy.create(job("elastic", team, None, elastic=True))
    assert not refusal, refusal
    cluster.wait_for(
        "the elastic Job's pod to be bound",
        lambda: any(p["spec"].get("nodeName") for p in pods_of(cluster, team, "elastic")),
    )
    # Grown past the queue's quota (4 cpu): the new pods are created behind the gate.
    result = tenancy.as_user(
        "patch", "job", "elastic", "-n", team, "--type=merge", "-p", '{"spec":{"parallelism":6}}'
    )
    assert result.returncode == 0, result.stderr
    cluster.wait_for(
        "gated pods",
        lambda: len([p for p in live(pods_of(cluster, team, "elastic")) if gated(p)]) == 5,
    )
    waiting = next(p for p in pods_of(cluster, team, "elastic") if gated(p))
    name = waiting["metadata"]["name"]
    result = tenancy.as_user(
        "patch", "pod", name, "-n", team, "--type=json",
        "-p", '[{"op":"remove","path":"/spec/schedulingGates"}]',
    )  # fmt: skip
    assert result.returncode != 0
    ungated = waiting | {"spec": {**waiting["spec"], "schedulingGates": []}}
    said = decisions.refuse_pod(ungated, waiting, tenancy.user, [], "muster")
    assert said is not None and said in result.stderr, result.stderr
    assert f"Pod {team}/{name}: spec.schedulingGates: gate {GATE} cannot be removed by" in said
    pods = live(pods_of(cluster, team, "elastic"))
    assert len([p for p in pods if p["spec"].get("nodeName")]) == 1
    assert len([p for p in pods if gated(p)]) == 5


def test_a_namespace_not_selected_behaves_as_before(tenancy: Tenancy) -> None:
    cluster, open_ = tenancy.cluster, tenancy.open
    # Unlabelled: not Muster's. Not suspended, no Workload, kube-scheduler places it.
    created, refusal = tenancy.create(job("plain", open_, None))
    assert not refusal, refusal
    assert not created["spec"].get("suspend")
    assert created["spec"]["template"]["spec"].get("schedulerName") in (None, "default-scheduler")
    # Labelled: queued as ever.
    labelled, refusal = tenancy.create(job("queued", open_, "labelled"))
    assert not refusal and labelled["spec"]["suspend"] is True, refusal
    # Pods with a flavor's toleration or a node's name are not refused here.
    toleration = {**tenancy.taint, "operator": "Equal"}
    for extra in ({"tolerations": [toleration]}, {"nodeName": "anywhere"}):
        allowed, refusal = tenancy.create(pod("free", open_, **extra), dry_run=True)
        assert allowed and not refusal, refusal
    cluster.wait_for(
        "the labelled Job to be admitted",
        lambda: any(admitted(w) for w in workloads_of(cluster, open_, "queued")),
    )
    assert not workloads_of(cluster, open_, "plain")
    # Here nothing refuses lifting a gate by hand, and Muster's scheduler still binds no
    # more pods than admitted: an elastic Job grown past its queue's quota (2 cpu, 1 used).
    _, refusal = tenancy.create(job("elastic", open_, "labelled", elastic=True))
    assert not refusal, refusal
    cluster.wait_for(
        "the elastic Job's pod to be bound",
        lambda: any(p["spec"].get("nodeName") for p in pods_of(cluster, open_, "elastic")),
    )
    cluster.kubectl(
        "patch", "job", "elastic", "-n", open_, "--type=merge", "-p", '{"spec":{"parallelism":4}}'
    )
    cluster.wait_for(
        "gated pods",
        lambda: len([p for p in live(pods_of(cluster, open_, "elastic")) if gated(p)]) == 3,
    )
    name = next(p for p in pods_of(cluster, open_, "elastic") if gated(p))["metadata"]["name"]
    result = tenancy.as_user(
        "patch", "pod", name, "-n", open_, "--type=json",
        "-p", '[{"op":"remove","path":"/spec/schedulingGates"}]',
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    time.sleep(3)  # several scheduler passes (each at most 2 s apart)
    pods = live(pods_of(cluster, open_, "elastic"))
    assert [p["spec"].get("nodeName") for p in pods if p["metadata"]["name"] == name] == [None]
    assert len([p for p in pods if p["spec"].get("nodeName")]) == 1
