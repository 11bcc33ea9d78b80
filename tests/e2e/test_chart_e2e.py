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
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers.cli.crds import generated_files
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


def shell_env(cluster: ClusterHandle) -> dict[str, str]:
    """helm and kubectl on PATH, bound to the cluster, as a user's shell would have them."""
    path = os.pathsep.join([str(HELM.parent), os.path.dirname(cluster.kubectl_bin)])
    return dict(
        os.environ,
        KUBECONFIG=cluster.kubeconfig,
        HELM_CACHE_HOME="/tmp/helm-cache",
        PATH=f"{path}{os.pathsep}{os.environ['PATH']}",
    )


def helm(
    cluster: ClusterHandle, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    assert HELM.exists(), f"{HELM} is missing: run `make helm` (or `make setup`)"
    result = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, env=shell_env(cluster), timeout=180
    )
    assert result.returncode == 0 or not check, f"helm {' '.join(args)}:\n{result.stderr}"
    return result


def remove_leftovers(cluster: ClusterHandle) -> None:
    """The configurations are cluster-wide and owned by the release; a controller an earlier
    test killed (SIGKILL: no clean-up) may have left its own behind."""
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


@pytest.fixture(scope="module")
def release(cluster: ClusterHandle, crds: None) -> Iterator[str]:  # noqa: F811
    """The chart installed into a namespace of its own; uninstalled at the module's end."""
    namespace = unique("muster-chart")
    remove_leftovers(cluster)
    # The session's CRDs were applied by kubectl (the `crds` fixture) or kept by an earlier
    # release's uninstall: this release takes them over (docs/deploy.md).
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        "--create-namespace",
        "--take-ownership",
        "--set",
        "workerKubeconfigSecrets={gpu-east-kubeconfig}",
    )
    try:
        yield namespace
    finally:
        helm(cluster, "uninstall", RELEASE, "--namespace", namespace)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


MOVE_OVER = "### A release installed before the CRDs were templates"
OWNERSHIP = (
    "app.kubernetes.io/managed-by",
    "meta.helm.sh/release-name",
    "meta.helm.sh/release-namespace",
)


def move_over_block(release: str, namespace: str) -> str:
    """docs/deploy.md's recipe, literally, but for this release and namespace."""
    text = (REPO / "docs" / "deploy.md").read_text()
    section = text.split(MOVE_OVER, 1)[1].split("\n#", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    first, rest = block.split("\n", 1)
    assert first == "release=muster namespace=muster-system", first
    return f"set -euo pipefail\nrelease={release} namespace={namespace}\n{rest}"


def older_layout(tmp_path: Path) -> Path:
    """The chart as it was before its CRDs were templates: the generated files in crds/ (helm
    creates them at the first install, or skips them if they exist, and never upgrades them)."""
    chart = tmp_path / "muster"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("files"))
    (chart / "templates" / "crds.yaml").unlink()
    (chart / "crds").mkdir()
    for name, text in generated_files().items():
        (chart / "crds" / name).write_text(text)
    return chart


def muster_crds(cluster: ClusterHandle) -> dict[str, dict[str, Any]]:
    items = cluster.get_json("crd")["items"]
    assert isinstance(items, list)
    return {c["metadata"]["name"]: c for c in items if c["spec"]["group"] == "muster.dev"}


def test_a_release_of_the_older_layout_moves_over_and_uninstall_keeps_crds_and_objects(
    cluster: ClusterHandle,
    crds: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Runs before the module's `release` (file order): one release at a time owns the
    # cluster-wide objects.
    namespace = unique("muster-move")
    remove_leftovers(cluster)
    # As a release of the older layout leaves them: CRDs no release owns, at an older schema
    # (a printer column the chart's Workload CRD has is missing).
    for name in muster_crds(cluster):
        cluster.kubectl("label", "crd", name, f"{OWNERSHIP[0]}-", check=False)
        cluster.kubectl("annotate", "crd", name, *(f"{k}-" for k in OWNERSHIP[1:]), check=False)
        cluster.kubectl("annotate", "crd", name, "helm.sh/resource-policy-", check=False)
    column = muster_crds(cluster)["workloads.muster.dev"]["spec"]["versions"][0][
        "additionalPrinterColumns"
    ][0]
    cluster.kubectl(
        "patch",
        "crd",
        "workloads.muster.dev",
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/spec/versions/0/additionalPrinterColumns/0"}]',
    )
    helm(
        cluster,
        "install",
        RELEASE,
        str(older_layout(tmp_path)),
        "-n",
        namespace,
        "--create-namespace",
    )
    try:
        refused = helm(cluster, "upgrade", RELEASE, str(CHART), "-n", namespace, check=False)
        assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr
        moved = subprocess.run(
            ["bash", "-c", move_over_block(RELEASE, namespace)],
            cwd=REPO,
            env=shell_env(cluster),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert moved.returncode == 0, moved.stdout[-2000:] + moved.stderr[-3000:]
        for name, crd in muster_crds(cluster).items():
            meta = crd["metadata"]
            assert meta["labels"][OWNERSHIP[0]] == "Helm", name
            assert meta["annotations"][OWNERSHIP[1]] == RELEASE, name
            assert meta["annotations"]["helm.sh/resource-policy"] == "keep", name
        workloads = muster_crds(cluster)["workloads.muster.dev"]["spec"]["versions"][0]
        assert column in workloads["additionalPrinterColumns"], "the upgrade left the old schema"
        manifest = helm(cluster, "get", "manifest", RELEASE, "-n", namespace).stdout
        owned = [d for d in yaml.safe_load_all(manifest) if d]
        assert sum(d["kind"] == "CustomResourceDefinition" for d in owned) == len(generated_files())
        kept = unique("kept")
        apply(cluster, cq_manifest(kept, []))
    finally:
        gone = helm(cluster, "uninstall", RELEASE, "-n", namespace)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    # Uninstalled: the CRDs and the objects of their kinds stay.
    assert "kept due to the resource policy" in gone.stdout + gone.stderr
    assert set(muster_crds(cluster)) == {
        yaml.safe_load(text)["metadata"]["name"] for text in generated_files().values()
    }
    cluster.kubectl("get", "clusterqueue", kept)
    cluster.kubectl("delete", "clusterqueue", kept)


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
    # A WorkerCluster's kubeconfig, listed in workerKubeconfigSecrets: readable by name only.
    can = as_muster.kubectl("auth", "can-i", "get", "secret/gpu-east-kubeconfig", "-n", release)
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
