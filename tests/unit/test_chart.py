"""The Helm chart: lint-clean, CRDs identical to what `muster crds` generates, webhook
configurations identical to what the controller registers, every controller argument one
`muster controller` accepts, values checked by the schema, a pod that runs as non-root
with a read-only root filesystem and probes that mean what they say."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers.cli.controller import controller
from controllers.cli.crds import generated_files
from controllers.jobs.kinds import KINDS
from controllers.manager.namespaces import parse_selector
from controllers.webhooks import policies
from controllers.webhooks.configurations import configurations

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "muster"
HELM = REPO / ".venv" / "bin" / "helm"
POSTGRESQL = ("history.database.type=postgresql", "history.database.postgresql.existingSecret=pg")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM.exists(), f"{HELM} is missing: run `make helm` (or `make setup`)"
    return subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, check=check, timeout=120
    )


def render(*sets: str, namespace: str = "muster-system") -> list[dict[str, Any]]:
    argv = ["template", "muster", str(CHART), "--namespace", namespace]
    for s in sets:
        argv += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*argv).stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def test_helm_lint_is_clean() -> None:
    result = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout, result.stdout + result.stderr


def test_chart_crds_never_drift_from_the_models(tmp_path: Path) -> None:
    # charts/muster/files/crds links to crds/ (what `muster crds` writes); the packaged chart,
    # what an operator installs, must carry exactly the generated files and no third party's.
    assert (CHART / "files" / "crds").resolve() == (REPO / "crds").resolve()
    assert not (CHART / "crds").exists(), "helm would install crds/ once and never upgrade it"
    helm("package", str(CHART), "--destination", str(tmp_path))
    with tarfile.open(next(tmp_path.glob("muster-*.tgz"))) as package:
        packaged = {
            m.name.removeprefix("muster/files/crds/"): package.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in package.getmembers()
            if m.isfile() and m.name.startswith("muster/files/crds/")
        }
    assert packaged == generated_files(), "the chart's CRDs differ from `muster crds`; run it"


def test_crds_are_rendered_so_upgrade_changes_them_and_kept_on_uninstall() -> None:
    generated = {
        doc["metadata"]["name"]: doc
        for doc in (yaml.safe_load(text) for text in generated_files().values())
    }
    rendered = [d for d in render() if d["kind"] == "CustomResourceDefinition"]
    assert sorted(d["metadata"]["name"] for d in rendered) == sorted(generated)
    for crd in rendered:
        meta = crd["metadata"]
        # Deleting a CRD deletes every object of its kind: `helm uninstall` must leave it.
        assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}
        assert meta.pop("labels")["app.kubernetes.io/managed-by"] == "Helm"
        # Otherwise exactly the generated CRD, types included (JSON tells 1 from 1.0).
        want = generated[meta["name"]]
        assert json.dumps(crd, sort_keys=True) == json.dumps(want, sort_keys=True)


POLICY_KINDS = {
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


@pytest.mark.parametrize("mode", ["policies", "webhooks"])
def test_webhook_configurations_are_the_ones_the_controller_registers(mode: str) -> None:
    docs = render(f"webhook.jobAdmission={mode}")
    service = ("muster-system", "muster-webhook", 443)
    mutating, validating = configurations(b"CA", service=service, policies=mode == "policies")
    wanted = [c for c in (mutating, validating) if c is not None]
    for want in wanted:
        got = one(docs, want["kind"], "muster-webhooks")
        for hook in want["webhooks"]:
            assert base64.b64decode(hook["clientConfig"].pop("caBundle")) == b"CA"
        # The chart leaves caBundle to the leader, which issues and rotates the CA.
        assert got["webhooks"] == want["webhooks"]
    rendered_kinds = {d["kind"] for d in docs}
    assert ("MutatingWebhookConfiguration" in rendered_kinds) == (mode == "webhooks")
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--job-admission={mode}" in args


@pytest.mark.parametrize("scheduler", ["muster-scheduler", "other-scheduler", ""])
def test_admission_policies_are_the_ones_the_controller_registers(scheduler: str) -> None:
    docs = render("webhook.jobAdmission=policies", f"schedulerName={scheduler}")
    got = [d for d in docs if d["kind"] in POLICY_KINDS]
    for doc in got:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "muster"
    want = policies.policies(scheduler)
    # Helm orders objects by kind; compare them by kind and name.
    assert sorted((d["kind"], d["metadata"]["name"], json.dumps(d["spec"])) for d in got) == sorted(
        (d["kind"], d["metadata"]["name"], json.dumps(d["spec"])) for d in want
    )
    assert not [d for d in render("webhook.jobAdmission=webhooks") if d["kind"] in POLICY_KINDS]


MANAGED = {
    "matchLabels": {"muster.dev/managed": "true"},
    "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["a", "b"]},
        {"key": "legacy", "operator": "DoesNotExist"},
    ],
}


def render_managed(*sets: str, selector: object = MANAGED) -> list[dict[str, Any]]:
    argv = ["template", "muster", str(CHART), "--namespace", "muster-system"]
    argv += ["--set-json", f"managedNamespaceSelector={json.dumps(selector)}"]
    for s in sets:
        argv += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*argv).stdout) if d]


def test_managed_namespaces_get_the_controllers_policies_bound_to_the_selector() -> None:
    docs = render_managed("webhook.jobAdmission=policies")
    got = [d for d in docs if d["kind"] in POLICY_KINDS]
    # Muster's username is the chart's ServiceAccount's, the one the controller runs as.
    managed = policies.Managed(MANAGED, "system:serviceaccount:muster-system:muster")
    want = policies.policies("muster-scheduler", managed)
    assert sorted(
        (d["kind"], d["metadata"]["name"], json.dumps(d["spec"], sort_keys=True)) for d in got
    ) == sorted(
        (d["kind"], d["metadata"]["name"], json.dumps(d["spec"], sort_keys=True)) for d in want
    )
    bindings = [
        d for d in got if d["kind"].endswith("Binding") and "managed" in d["spec"]["policyName"]
    ]
    assert len(bindings) == 5
    assert all(b["spec"]["matchResources"]["namespaceSelector"] == MANAGED for b in bindings)
    # The controller is told the same selector, and may watch Namespaces (which it does with
    # or without one: a ClusterQueue's namespaceSelector reads their labels too).
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    context = controller.make_context("controller", list(args[1:]))
    flag = context.params["managed_namespace_selector"]
    assert parse_selector(flag) == MANAGED
    rules = one(docs, "ClusterRole", "muster")["rules"]
    assert {
        "apiGroups": [""],
        "resources": ["namespaces"],
        "verbs": ["get", "list", "watch"],
    } in rules


@pytest.mark.parametrize("selector", [None, {}, {"matchLabels": {}}])
def test_no_managed_namespace_selector_manages_none(selector: object) -> None:
    docs = render_managed("webhook.jobAdmission=policies", selector=selector)
    names = {d["metadata"]["name"] for d in docs if d["kind"] in POLICY_KINDS}
    assert names == {d["metadata"]["name"] for d in policies.policies()}
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--managed-namespace-selector")]


def test_managed_namespaces_get_the_controllers_webhooks_without_policies() -> None:
    docs = render_managed("webhook.jobAdmission=webhooks")
    service = ("muster-system", "muster-webhook", 443)
    managed = policies.Managed(MANAGED, "system:serviceaccount:muster-system:muster")
    for want in configurations(b"CA", service=service, policies=False, managed=managed):
        assert want is not None
        got = one(docs, want["kind"], "muster-webhooks")
        for hook in want["webhooks"]:
            hook["clientConfig"].pop("caBundle")
        assert got["webhooks"] == want["webhooks"]


def test_auto_picks_policies_where_the_cluster_serves_them() -> None:
    def kinds(*argv: str) -> set[str]:
        out = helm("template", "muster", str(CHART), "-n", "muster-system", *argv).stdout
        return {d["kind"] for d in yaml.safe_load_all(out) if d}

    served = kinds("--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
    assert "MutatingAdmissionPolicy" in served and "MutatingWebhookConfiguration" not in served


def test_the_charts_policies_are_generated_from_the_controllers() -> None:
    assert (CHART / "templates" / "policies.yaml").read_text() == policies.chart_template(), (
        "run `python -m controllers.webhooks.policies > charts/muster/templates/policies.yaml`"
    )


def test_every_controller_argument_is_one_muster_controller_accepts() -> None:
    for sets in (
        (),
        POSTGRESQL,
        ("history.enabled=false", "features.webhooks=false", "schedulerName="),
    ):
        deployment = one(render(*sets), "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][0] == "controller"
        # Raises click's UsageError on an unknown flag or a value the CLI refuses.
        context = controller.make_context("controller", list(container["args"][1:]))
        assert context.params["namespace"] == "muster-system"


def test_sqlite_history_runs_one_replica_postgresql_two_with_a_disruption_budget() -> None:
    docs = render()
    assert one(docs, "Deployment")["spec"]["replicas"] == 1
    assert one(docs, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    one(docs, "PersistentVolumeClaim")
    docs = render(
        "history.database.type=postgresql", "history.database.postgresql.existingSecret=pg"
    )
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    url = next(e for e in env if e["name"] == "MUSTER_DATABASE_URL")
    assert url["valueFrom"]["secretKeyRef"] == {"name": "pg", "key": "url"}
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, None),  # the default: the cluster's default class, or a volume without one
        ("", ""),  # no class, even where a default exists: a PersistentVolume you prepared
        ("local-disk", "local-disk"),
    ],
)
def test_the_history_claim_asks_for_the_class_given(value: str | None, want: str | None) -> None:
    sets = () if value is None else (f"history.database.sqlite.storageClassName={value}",)
    claim = one(render(*sets), "PersistentVolumeClaim")
    assert claim["spec"].get("storageClassName", None) == want
    assert ("storageClassName" in claim["spec"]) == (want is not None)
    # Kept on uninstall: the history outlives the release.
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_pod_is_non_root_read_only_with_probes_on_the_metrics_port() -> None:
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["resources"]["requests"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/tmp", "/var/lib/muster/spool", "/var/lib/muster/history"} <= mounts
    affinity = pod["affinity"]["podAntiAffinity"]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("replicaCount=two",), "/replicaCount"),
        (("history.database.type=mysql",), "/history/database/type"),
        (("imagee.tag=1",), "additional properties 'imagee' not allowed"),
        (("schedulerName=Not_A_Name",), "/schedulerName"),
        (("managedNamespaceSelector.matchLabel.team=a",), "/managedNamespaceSelector"),
        (("history.database.type=postgresql",), "history.database.postgresql.existingSecret"),
    ],
)
def test_bad_values_are_refused_naming_the_field(sets: tuple[str, ...], message: str) -> None:
    argv = ["template", "muster", str(CHART)]
    for s in sets:
        argv += ["--set", s]
    result = helm(*argv, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_service_monitor_and_dashboard() -> None:
    docs = render("metrics.serviceMonitor.enabled=true")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    metrics_service = one(docs, "Service", "muster-metrics")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= metrics_service["metadata"]["labels"].items()
    dashboard = one(docs, "ConfigMap", "muster-dashboard")
    panels = json.loads(dashboard["data"]["muster.json"])["panels"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for name in ("muster_pending_workloads", "muster_admission_wait_time_seconds_bucket"):
        assert name in exprs


def test_every_metric_the_dashboard_plots_is_one_muster_exports() -> None:
    from prometheus_client import REGISTRY

    from controllers.metrics import definitions  # noqa: F401 - registers the metrics
    from controllers.metrics.collector import Sources, StateCollector
    from controllers.state.caches import Caches
    from tests.unit.controller_fakes import FakeKube

    exported = {m.name for m in REGISTRY.collect()}
    history = (0, 0, True)
    state = StateCollector(Sources(Caches.create(FakeKube()), lambda: True, lambda: history))
    exported |= {m.name for m in state.collect()}
    dashboard = json.loads((CHART / "dashboards" / "muster.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    plotted = {
        re.sub(r"_(bucket|count|sum|total)$", "", n) for n in re.findall(r"muster_\w+", exprs)
    }
    assert plotted and plotted <= exported, plotted - exported


def test_cert_manager_issues_the_webhook_certificate_when_asked() -> None:
    assert not [d for d in render() if d["kind"] in ("Certificate", "Issuer")]
    docs = render("webhook.certificates=certManager")
    certificate = one(docs, "Certificate")
    assert certificate["spec"]["secretName"] == "muster-webhook-tls"
    assert "muster-webhook.muster-system.svc" in certificate["spec"]["dnsNames"]
    assert one(docs, "Issuer")["spec"] == {"selfSigned": {}}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = one(docs, kind)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == "muster-system/muster-webhook"
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--webhook-certs=external" in args
    context = controller.make_context("controller", list(args[1:]))
    assert context.params["webhook_certs"] == "external"


# ------------------------------------------------------------ roles for people


def _rules_of(docs: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    """The rules the apiserver aggregates into a role selecting `label`."""
    return [
        rule
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"].get("labels", {}).get(label) == "true"
        for rule in d.get("rules") or []
    ]


def _grants(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
    )


def test_batch_user_and_batch_admin_roles_aggregate_what_each_may_do() -> None:
    docs = render()
    for role, label in (
        ("muster-batch-user", "rbac.muster.dev/batch-user"),
        ("muster-batch-admin", "rbac.muster.dev/batch-admin"),
    ):
        selectors = one(docs, "ClusterRole", role)["aggregationRule"]["clusterRoleSelectors"]
        assert selectors == [{"matchLabels": {label: "true"}}]
    user = _rules_of(docs, "rbac.muster.dev/batch-user")
    admin = _rules_of(docs, "rbac.muster.dev/batch-admin")
    # A batch user reads why work waits and runs Jobs of every kind Muster queues...
    for resource in ("localqueues", "workloads", "workloads/status", "podgroups"):
        assert _grants(user, "muster.dev", resource, "list")
    assert _grants(user, "", "events", "list")
    for kind in KINDS:
        [group], [resource] = kind.rule()["apiGroups"], kind.rule()["resources"]
        assert _grants(user, group, resource, "create"), f"batch-user cannot create {resource}"
    # ...and writes no queue, no Workload (the controller's), nothing cluster-scoped.
    for resource in ("localqueues", "clusterqueues", "resourceflavors", "workloads"):
        for verb in ("create", "patch", "delete"):
            assert not _grants(user, "muster.dev", resource, verb), (resource, verb)
    assert not _grants(user, "muster.dev", "clusterqueues", "get")
    # A batch admin manages LocalQueues, and (bound cluster-wide) stops ClusterQueues.
    assert _grants(admin, "muster.dev", "localqueues", "create")
    assert _grants(admin, "muster.dev", "clusterqueues", "patch")


def test_the_builtin_roles_get_reads_of_musters_namespaced_objects_and_no_writes() -> None:
    docs = render()
    view = _rules_of(docs, "rbac.authorization.k8s.io/aggregate-to-view")
    assert _grants(view, "muster.dev", "workloads", "get")
    assert _grants(view, "muster.dev", "localqueues", "list")
    for label in ("aggregate-to-view", "aggregate-to-edit", "aggregate-to-admin"):
        rules = _rules_of(docs, f"rbac.authorization.k8s.io/{label}")
        assert not any(set(r["verbs"]) - {"get", "list", "watch"} for r in rules), label
        assert not _grants(rules, "muster.dev", "clusterqueues", "get"), label


def test_queue_readers_are_bound_only_when_named() -> None:
    assert not [
        d
        for d in render()
        if d["kind"] == "ClusterRoleBinding" and "queue-reader" in d["metadata"]["name"]
    ]
    docs = render("userRoles.queueReaderGroups={system:authenticated,ml-team}")
    binding = one(docs, "ClusterRoleBinding", "muster-queue-reader")
    assert binding["roleRef"]["name"] == "muster-queue-reader"
    assert [s["name"] for s in binding["subjects"]] == ["system:authenticated", "ml-team"]
    reader = one(docs, "ClusterRole", "muster-queue-reader")["rules"]
    assert _grants(reader, "muster.dev", "clusterqueues", "list")
    # The Topologies flavors name: `kubectl muster topology` reads them (nodes and pods stay
    # the cluster admins' to grant).
    assert _grants(reader, "muster.dev", "topologies", "list")
    assert not _grants(reader, "", "pods", "list")
    assert not any(set(r["verbs"]) - {"get", "list", "watch"} for r in reader)


def test_user_roles_can_be_left_out() -> None:
    docs = render("userRoles.create=false")
    assert not [d for d in docs if "batch" in d["metadata"]["name"]]
    result = helm(
        "template", "muster", str(CHART), "--set", "userRoles.queueReaderGroups=x", check=False
    )
    assert result.returncode != 0 and "/userRoles/queueReaderGroups" in result.stderr
