"""The Helm chart on the real local cluster: `helm template` is accepted by the apiserver
(server-side dry run), `helm install` creates every object, and the chart's RBAC is proven
rather than guessed: the controller runs out of cluster with a kubeconfig holding only a
token of the chart's ServiceAccount (TokenRequest) and an admission + placement + elastic
story passes with no request refused, while a request outside the granted verbs is denied.

(kwok fakes the nodes, so the chart's own pods never run a container; the controller under
test is the same `muster controller` the image runs, with the same identity.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from collections.abc import Iterator
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
    crds,  # noqa: F401 - fixture
    create,
    finished,
    flavor,
    gated,
    job,
    live,
    local_queue,
    pods_of,
    token_kubeconfig,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "muster"
HELM = REPO / ".venv" / "bin" / "helm"
RELEASE = "muster"


def helm(cluster: ClusterHandle, *args: str) -> subprocess.CompletedProcess[str]:
    assert HELM.exists(), f"{HELM} is missing: run `make helm` (or `make setup`)"
    env = dict(os.environ, KUBECONFIG=cluster.kubeconfig, HELM_CACHE_HOME="/tmp/helm-cache")
    result = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, env=env, timeout=180
    )
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def release(cluster: ClusterHandle, crds: None) -> Iterator[str]:  # noqa: F811
    """The chart installed into a namespace of its own; uninstalled at the module's end."""
    namespace = unique("muster-chart")
    # The configurations are cluster-wide and owned by the release; a controller an earlier
    # test killed (SIGKILL: no clean-up) may have left its own behind.
    cluster.kubectl(
        "delete",
        "mutatingwebhookconfiguration,validatingwebhookconfiguration",
        "muster-webhooks",
        "--ignore-not-found",
    )
    # And its admission policies (the release owns them too).
    cluster.kubectl(
        "delete",
        "mutatingadmissionpolicy,mutatingadmissionpolicybinding,"
        "validatingadmissionpolicy,validatingadmissionpolicybinding",
        "-l",
        "app.kubernetes.io/part-of=muster",
        "--ignore-not-found",
    )
    helm(cluster, "install", RELEASE, str(CHART), "--namespace", namespace, "--create-namespace")
    try:
        yield namespace
    finally:
        helm(cluster, "uninstall", RELEASE, "--namespace", namespace)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_helm_template_is_accepted_by_the_apiserver(
    cluster: ClusterHandle,
    namespace: str,
) -> None:
    rendered = helm(cluster, "template", RELEASE, str(CHART), "--namespace", namespace).stdout
    # The cluster is shared: a controller started by another test has registered webhook
    # configurations of the same names (by URL), and a release may own the cluster-scoped
    # RBAC. Validate every object as new: cluster-scoped names get this test's suffix.
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    for doc in docs:
        if not doc["metadata"].get("namespace") and doc["kind"] != "CustomResourceDefinition":
            doc["metadata"]["name"] += f"-{namespace}"
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs, sort_keys=False)
    )
    kinds = {line.split("/", 1)[0] for line in result.stdout.splitlines()}
    assert "deployment.apps" in kinds and "clusterrole.rbac.authorization.k8s.io" in kinds
    assert all("(server dry run)" in line for line in result.stdout.splitlines())


def test_helm_install_creates_every_object(cluster: ClusterHandle, release: str) -> None:
    manifest = helm(cluster, "get", "manifest", RELEASE, "--namespace", release).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    assert len(docs) >= 12
    for doc in docs:
        meta = doc["metadata"]
        args = [doc["kind"], meta["name"]]
        if meta.get("namespace"):
            args += ["-n", meta["namespace"]]
        cluster.kubectl("get", *args, "-o", "name")
    for crd in ("clusterqueues", "localqueues", "resourceflavors", "workloads", "podgroups"):
        cluster.kubectl("get", "crd", f"{crd}.muster.dev")


# ---------------------------------------------------------------- RBAC, proven


def bound(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(cluster, namespace, name) if p["spec"].get("nodeName")]


def refused(record: dict[str, Any], namespace: str) -> bool:
    """A request the apiserver refused with 403, about this test's objects. Others are left
    out: on this shared cluster another test's namespace may still be terminating, and a
    namespace being deleted refuses new objects (Events included) whoever asks."""
    # Not the timestamp: "13:02:08.403" is no refusal.
    text = json.dumps({k: v for k, v in record.items() if k != "ts"})
    if "unable to create new content in namespace" in text:
        return False
    about = str(record.get("job") or record.get("workload") or record.get("object") or "")
    if about and f"{namespace}/" not in about:
        return False
    return "forbidden" in text.lower() or re.search(r"(?<![\w.])403(?!\w)", text) is not None


def test_the_chart_rbac_suffices_for_admission_placement_and_elastic_and_denies_the_rest(
    cluster: ClusterHandle, release: str, namespace: str, tmp_path: Path
) -> None:
    as_muster = dataclasses.replace(
        cluster, kubeconfig=token_kubeconfig(cluster, release, RELEASE, tmp_path / "kubeconfig")
    )
    # Outside the granted verbs: refused by the apiserver.
    denied = as_muster.kubectl("get", "secrets", "-n", "kube-system", check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr
    for question in (
        ("create", "namespaces"),
        ("update", "nodes"),
        # Pods it may delete (an evicted foreign PodGroup has nothing to suspend), not make.
        ("create", "pods", "--all-namespaces"),
        ("update", "jobs", "--all-namespaces"),
        ("get", "secret/another-secret", "-n", release),
        ("patch", "lease/another-lease", "-n", release),
    ):
        can = as_muster.kubectl("auth", "can-i", *question, check=False)
        assert can.stdout.strip() == "no", question
    # ...and what it needs, it may do (the same question, so "no" above means something).
    can = as_muster.kubectl("auth", "can-i", "patch", "lease/muster-controller", "-n", release)
    assert can.stdout.strip() == "yes"

    pool = unique("chart")
    nodes = cluster.nodes(2, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "6"}}]),
        local_queue("team", namespace, cq),
    )
    ctl = Controller(
        as_muster,
        tmp_path,
        unique("chart-sa"),
        "--namespace",
        release,
        "--lease-name",
        "muster-controller",
    ).start()
    try:
        ctl.wait_leading()
        # Admission and placement: a gang of 2 admitted and bound by Muster's scheduler.
        created = create(cluster, job("plain", namespace, "team", parallelism=2, cpu="1"))
        assert created["spec"]["suspend"] is True
        cluster.wait_for(
            "2 pods bound by Muster",
            lambda: len(bound(cluster, namespace, "plain")) == 2,
            timeout=90,
        )
        for pod in pods_of(cluster, namespace, "plain"):
            assert pod["spec"]["schedulerName"] == "muster-scheduler"
            assert pod["spec"]["nodeName"] in nodes
        groups = cluster.kubectl("get", "podgroups.muster.dev", "-n", namespace, "-o", "name")
        assert groups.stdout.strip(), "the scheduler loop wrote no PodGroup"
        # Elastic: 1 -> 3 pods within quota, a new slice, every pod ungated.
        apply(cluster, job("el", namespace, "team", parallelism=1, cpu="1", elastic=True))
        cluster.wait_for(
            "the elastic Job's first pod ungated",
            lambda: [not gated(p) for p in live(pods_of(cluster, namespace, "el"))] == [True],
            timeout=90,
        )
        cluster.kubectl("patch", "job", "el", "-n", namespace, "-p", '{"spec":{"parallelism":3}}')
        cluster.wait_for(
            "3 ungated pods under a new slice",
            lambda: sum(1 for p in live(pods_of(cluster, namespace, "el")) if not gated(p)) == 3,
            timeout=90,
        )
        # Two slices (created within the same second, so not ordered by time): the new one
        # admitted, the one it replaced retired.
        cluster.wait_for(
            "one live admitted slice of two",
            lambda: (
                [
                    admitted(w) and not finished(w) for w in workloads_of(cluster, namespace, "el")
                ].count(True)
                == 1
                and len(workloads_of(cluster, namespace, "el")) == 2
            ),
            timeout=30,
        )
        # Over quota (6 cpu: 2 + 3 in use): waits, with the engine's reason.
        apply(cluster, job("big", namespace, "team", parallelism=4, cpu="1"))
        cluster.wait_for(
            "the big Job's Workload to say why it waits",
            lambda: bool(
                [w for w in workloads_of(cluster, namespace, "big")]
                and condition(workloads_of(cluster, namespace, "big")[0], "QuotaReserved").get(
                    "message"
                )
            ),
            timeout=60,
        )
        assert ctl.leading()
        denied = as_muster.kubectl("delete", "job", "plain", "-n", namespace, check=False)
        assert denied.returncode != 0 and "Forbidden" in denied.stderr
        refusals = [r for r in ctl.logs() if refused(r, namespace)]
        assert not refusals, refusals[:5]
    finally:
        ctl.stop()
        cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)
