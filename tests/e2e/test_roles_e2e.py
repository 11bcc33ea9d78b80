"""Roles for people, proven on the real local cluster (docs/tenancy.md, "Roles for people").

The chart's user roles are rendered with helm and applied; people are ServiceAccounts whose
tokens sit alone in a kubeconfig, and they drive `kubectl muster` and kubectl as a user does:
- a batch user (`edit` + the batch-user role, RoleBindings in one namespace) runs a Job,
  sees their queues and why the Job waits, and is refused stopping a queue, in words;
- the built-in `edit` alone reads Workloads (aggregated into view) and writes no queue;
- a batch admin bound in a namespace the ClusterQueue's namespaceSelector does not admit
  creates a LocalQueue there: it is reported inactive (NamespaceNotSelected) and its Job is
  never admitted, though there is room; that admin cannot stop the queue either;
- a batch admin bound cluster-wide stops and resumes it.

One controller and one team's objects serve every case (module-scoped fixtures).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    flavor,
    get,
    job,
    local_queue,
    token_kubeconfig,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "muster"
HELM = REPO / ".venv" / "bin" / "helm"
VENV_BIN = REPO / ".venv" / "bin"
TEAM_LABEL = "muster-e2e/team"
CLEANUP = "muster-e2e/roles"


def render_roles(release: str, *sets: str) -> list[dict[str, Any]]:
    """The chart's user roles as `helm template` renders them for `release`."""
    argv = [str(HELM), "template", release, str(CHART), "--show-only", "templates/userroles.yaml"]
    for value in sets:
        argv += ["--set", value]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@dataclass(frozen=True)
class Person:
    """A ServiceAccount and a kubeconfig holding only its token, its namespace as context's."""

    name: str
    namespace: str
    kubeconfig: str

    def muster(self, cluster: ClusterHandle, *args: str) -> subprocess.CompletedProcess[str]:
        """`kubectl muster ARGS` run as this person (kubectl finds the plugin on PATH)."""
        path = os.pathsep.join(
            [str(VENV_BIN), os.path.dirname(cluster.kubectl_bin), os.environ["PATH"]]
        )
        env = dict(os.environ, PATH=path, KUBECONFIG=self.kubeconfig)
        plain = ["--color", "never"] if args[0] in ("queues", "explain") else []
        return subprocess.run(
            [cluster.kubectl_bin, "muster", *args, *plain],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
        )

    def kubectl(self, cluster: ClusterHandle, *args: str, input: str | None = None) -> str:
        result = subprocess.run(
            [cluster.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=60,
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)} as {self.name}:\n{result.stderr}"
        return result.stdout


def person(
    cluster: ClusterHandle, namespace: str, name: str, directory: Path, *bindings: str
) -> Person:
    """A ServiceAccount bound to each of `bindings` ("role" for a RoleBinding in its
    namespace, "cluster:role" for a ClusterRoleBinding)."""
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
    subject = f"{namespace}:{name}"
    for binding in bindings:
        scope, _, role = binding.rpartition(":")
        kind, where = ("clusterrolebinding", []) if scope else ("rolebinding", ["-n", namespace])
        bound = f"{namespace}-{name}-{role}"
        cluster.kubectl(
            "create", kind, bound, *where, f"--clusterrole={role}", f"--serviceaccount={subject}"
        )
        if scope:  # the namespace's deletion takes RoleBindings, not these
            cluster.kubectl("label", kind, bound, f"{CLEANUP}=true")
    path = directory / f"{namespace}-{name}.kubeconfig"
    return Person(name, namespace, token_kubeconfig(cluster, namespace, name, path, home=namespace))


def refused_plainly(result: subprocess.CompletedProcess[str]) -> str:
    """The one-line refusal of a command RBAC stopped: exit 1, no traceback."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "HTTP 403" in result.stderr, result.stderr
    return " ".join(result.stderr.split())


@pytest.fixture(scope="module")
def roles(cluster: ClusterHandle, crds: None) -> Iterator[str]:  # noqa: F811
    """The chart's user roles, applied under a release name of this module's own."""
    release = unique("muster-roles")
    apply(cluster, *render_roles(release))
    try:
        yield release
    finally:
        cluster.kubectl(
            "delete", "clusterrole,clusterrolebinding", "-l",
            f"app.kubernetes.io/instance={release}", "--ignore-not-found",
        )  # fmt: skip


@pytest.fixture(scope="module")
def team(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811
    roles: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """A team's namespace admitted by its ClusterQueue's namespaceSelector (4 cpu of quota),
    a batch user there who runs one Job (2 cpu, admitted) and one that waits (4 cpu more)."""
    home = tmp_path_factory.mktemp("people")
    namespace, elsewhere = unique("roles"), unique("roles-other")
    for ns in (namespace, elsewhere):
        cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("label", "namespace", namespace, f"{TEAM_LABEL}={namespace}")
    pool = unique("roles")
    nodes = cluster.nodes(1, cpu="8", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(
            cq,
            [{"name": pool, "quota": {"cpu": "4"}, "limit": {"cpu": "4"}}],
            namespaceSelector={"matchLabels": {TEAM_LABEL: namespace}},
        ),
        local_queue("team", namespace, cq),
    )
    user = person(cluster, namespace, "alice", home, "edit", f"{roles}-batch-user")
    cluster.wait_for(
        "the batch-user role aggregated",
        lambda: bool(get(cluster, "clusterrole", f"{roles}-batch-user").get("rules")),
        timeout=30,
    )
    user.kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                job("runs", namespace, "team", parallelism=2, cpu="1"),
                job("waits", namespace, "team", parallelism=4, cpu="1"),
            ]
        ),
    )
    cluster.wait_for(
        "one Job admitted, the other waiting with a reason",
        lambda: (
            any(admitted(w) for w in workloads_of(cluster, namespace, "runs"))
            and bool(workloads_of(cluster, namespace, "waits"))
            and bool(
                condition(workloads_of(cluster, namespace, "waits")[0], "QuotaReserved").get(
                    "message"
                )
            )
        ),
        timeout=60,
    )
    try:
        yield {
            "namespace": namespace,
            "elsewhere": elsewhere,
            "cq": cq,
            "user": user,
            "home": home,
            "roles": roles,
        }
    finally:
        for ns in (namespace, elsewhere):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)
        cluster.kubectl(
            "delete", "clusterrolebinding", "-l", f"{CLEANUP}=true", "--ignore-not-found"
        )


def test_a_batch_user_sees_their_queue_and_why_the_tree_is_hidden(
    cluster: ClusterHandle, team: dict[str, Any]
) -> None:
    result = team["user"].muster(cluster, "queues")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert f"LocalQueues in namespace {team['namespace']}" in out
    assert f"team -> ClusterQueue {team['cq']} active admitted 1 pending 1" in out
    assert "cpu: 2 used" in out
    assert "ClusterQueues are not readable with your rights" in out
    assert "userRoles.queueReaderGroups" in out and "Traceback" not in result.stderr


def test_the_charts_queue_readers_see_the_whole_tree(
    cluster: ClusterHandle, team: dict[str, Any]
) -> None:
    # The chart's value names a group; every ServiceAccount of the team's namespace is one.
    group = f"system:serviceaccounts:{team['namespace']}"
    readers = [
        d
        for d in render_roles(team["roles"], f"userRoles.queueReaderGroups={{{group}}}")
        if d["kind"] == "ClusterRoleBinding"
    ]
    assert [s["name"] for s in readers[0]["subjects"]] == [group]
    apply(cluster, *readers)
    try:

        def tree() -> str:
            result = team["user"].muster(cluster, "queues")
            assert result.returncode == 0, result.stderr
            return result.stdout

        # RBAC's caches take the new binding in within a second or two.
        cluster.wait_for(
            "the whole tree", lambda: tree().splitlines()[0].strip() == "ClusterQueues", 30
        )
        out = tree()
        assert team["cq"] in out and "not readable" not in out
        assert "cpu: 2 / 4 used (limit 4)" in out
        assert f"{team['namespace']}/team (pending 1)" in out
    finally:
        cluster.kubectl("delete", "clusterrolebinding", readers[0]["metadata"]["name"])


def test_a_batch_user_is_told_why_their_job_waits(
    cluster: ClusterHandle, team: dict[str, Any]
) -> None:
    ns = team["namespace"]
    reason = condition(workloads_of(cluster, ns, "waits")[0], "QuotaReserved")["message"]
    result = team["user"].muster(cluster, "explain", "waits")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert f"Job {ns}/waits" in out and "waiting for quota" in out
    assert reason.split(";")[0][:40] in out
    assert "placement: placed once admitted" in out and "timeline" in out
    # Another team's namespace: refused, naming the right it takes.
    words = refused_plainly(team["user"].muster(cluster, "explain", "waits", "-n", "default"))
    assert "explaining waits needs the right to read Jobs and Workloads in namespace default" in (
        words
    )


def test_a_batch_user_cannot_stop_or_resume_a_queue_and_is_told_who_can(
    cluster: ClusterHandle, team: dict[str, Any]
) -> None:
    cq = team["cq"]
    for args, verb in (
        (("stop", cq), "stopping"),
        (("stop", cq, "--drain"), "stopping"),
        (("resume", cq), "resuming"),
    ):
        words = refused_plainly(team["user"].muster(cluster, *args))
        assert f"{verb} ClusterQueue {cq} needs the right to get and patch ClusterQueues" in words
        assert "batch-admin role, bound with a ClusterRoleBinding" in words
    assert get(cluster, "clusterqueue", cq)["spec"].get("stopPolicy", "None") == "None"
    # what-if needs the whole cluster: refused in words too.
    words = refused_plainly(team["user"].muster(cluster, "what-if", "--set", f"{cq}.quota.cpu=8"))
    assert "what-if simulates the whole cluster" in words


def test_the_builtin_edit_role_reads_musters_objects_and_writes_no_queue(
    cluster: ClusterHandle, team: dict[str, Any]
) -> None:
    ns = team["namespace"]
    editor = person(cluster, ns, "dave", team["home"], "edit")
    as_dave = f"--as=system:serviceaccount:{ns}:dave"
    for verb, resource, answer in (
        ("list", "workloads.muster.dev", "yes"),
        ("get", "localqueues.muster.dev", "yes"),
        ("list", "podgroups.muster.dev", "yes"),
        ("create", "localqueues.muster.dev", "no"),
        ("patch", "workloads.muster.dev", "no"),
    ):
        result = cluster.kubectl("auth", "can-i", verb, resource, "-n", ns, as_dave, check=False)
        assert result.stdout.strip() == answer, (verb, resource, result.stdout)
    result = editor.muster(cluster, "explain", "waits")
    assert result.returncode == 0 and "waiting for quota" in result.stdout, result.stderr


def test_a_local_queue_outside_the_namespace_selector_is_inactive_and_admits_nothing(
    cluster: ClusterHandle, team: dict[str, Any]
) -> None:
    ns, cq = team["elsewhere"], team["cq"]
    admin = person(cluster, ns, "bob", team["home"], f"{team['roles']}-batch-admin")
    # A batch admin bound in the namespace may create its LocalQueue and run a Job there (1
    # cpu: the queue has 2 cpu free)...
    admin.kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all([local_queue("borrow", ns, cq), job("sneaks", ns, "borrow")]),
    )

    def lq_active() -> dict[str, Any]:
        return condition(get(cluster, "localqueue", "borrow", "-n", ns), "Active")

    cluster.wait_for("the LocalQueue's Active condition", lambda: bool(lq_active()), timeout=30)
    active = lq_active()
    assert active["status"] == "False" and active["reason"] == "NamespaceNotSelected", active
    assert f"namespace {ns!r} does not match the namespaceSelector" in active["message"]

    # ...whose Job an admission cycle decides not to admit, saying why, though it fits.
    def why_not() -> str:
        found = workloads_of(cluster, ns, "sneaks")
        return str(condition(found[0], "QuotaReserved").get("message") or "") if found else ""

    cluster.wait_for("the Workload's reason", lambda: "is inactive" in why_not(), timeout=30)
    assert f"LocalQueue borrow is inactive: namespace {ns!r} does not match" in why_not()
    assert not any(admitted(w) for w in workloads_of(cluster, ns, "sneaks"))
    result = admin.muster(cluster, "explain", "sneaks")
    assert result.returncode == 0, result.stderr
    assert "LocalQueue borrow is inactive" in " ".join(result.stdout.split())
    # The admin meets the rule through `kubectl muster queues` too, and cannot stop the
    # ClusterQueue: a RoleBinding grants nothing cluster-scoped.
    out = " ".join(admin.muster(cluster, "queues").stdout.split())
    assert f"borrow -> ClusterQueue {cq} inactive (NamespaceNotSelected)" in out
    words = refused_plainly(admin.muster(cluster, "stop", cq))
    assert f"stopping ClusterQueue {cq} needs the right" in words


def test_a_cluster_wide_batch_admin_stops_and_resumes_the_queue(
    cluster: ClusterHandle, team: dict[str, Any]
) -> None:
    cq = team["cq"]
    admin = person(
        cluster, team["elsewhere"], "carol", team["home"], f"cluster:{team['roles']}-batch-admin"
    )
    stopped = admin.muster(cluster, "stop", cq)
    assert stopped.returncode == 0, stopped.stderr
    assert f"clusterqueue/{cq} stopped (Hold; was None)" in stopped.stdout
    cluster.wait_for(
        "the queue reported Stopped",
        lambda: condition(get(cluster, "clusterqueue", cq), "Active").get("reason") == "Stopped",
        timeout=30,
    )
    resumed = admin.muster(cluster, "resume", cq)
    assert resumed.returncode == 0 and "resumed (was Hold)" in resumed.stdout, resumed.stderr
