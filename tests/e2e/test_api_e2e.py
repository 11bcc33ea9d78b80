"""The API on a real kube-apiserver: the generated CRDs install, the examples apply,
`kubectl get` shows useful columns, invalid objects are refused with the precise message
(by the apiserver *and* by parse_manifest, so users see the same verdict everywhere), and
every kind survives model -> JSON -> apiserver -> model unchanged."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.api import (
    GROUP,
    KINDS,
    ClusterQueue,
    ManifestError,
    ResourceFlavor,
    parse_manifest,
    set_condition,
    usage_summary,
)
from quota.api.meta import wire
from quota.api.queuetree import check_queue_tree
from tests.unit.test_api_strategies import MANIFESTS

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "api"
CRD_NAMES = [f"{model.crd.plural}.{GROUP}" for model in KINDS.values()]


class Cluster(Protocol):
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> Any: ...

    def get_json(self, *args: str) -> dict[str, Any]: ...


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster with Muster's CRDs installed and established."""
    cluster.kubectl("apply", "-f", str(REPO / "crds"))
    cluster.kubectl("wait", "--for", "condition=Established", "--timeout=60s", "crd", *CRD_NAMES)
    yield cluster


@pytest.fixture(scope="module")
def scratch(api: Cluster) -> Iterator[str]:
    """A namespace for the module's namespaced objects."""
    name = f"api-{uuid.uuid4().hex[:8]}"
    api.kubectl("create", "namespace", name)
    yield name
    api.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


def test_crds_serve_every_kind_with_short_names_and_category(api: Cluster) -> None:
    resources = api.kubectl("api-resources", "--api-group", GROUP, "-o", "wide").stdout
    by_kind = {row[0]: row for row in _rows(resources)[1:]}
    assert set(by_kind) == {m.crd.plural for m in KINDS.values()}
    assert by_kind["clusterqueues"][1] == "cq"
    assert by_kind["localqueues"][1] == "lq"
    assert by_kind["workloads"][1] == "wl"
    assert by_kind["podgroups"][1] == "pg"
    assert by_kind["resourceflavors"][1] == "rf"
    for row in by_kind.values():
        assert row[-1] == "muster"  # CATEGORIES column
    status = api.get_json("crd", "clusterqueues.muster.dev")["status"]
    assert isinstance(status, dict)
    established = [c for c in status["conditions"] if c["type"] == "Established"]
    assert established[0]["status"] == "True"


def test_examples_apply_and_kubectl_get_shows_the_columns(api: Cluster) -> None:
    api.kubectl("apply", "-f", str(EXAMPLES))
    cq = _rows(api.kubectl("get", "cq").stdout)
    assert cq[0] == [
        "NAME",
        "PARENT",
        "PRIORITY",
        "WEIGHT",
        "PENDING",
        "ADMITTED",
        "ACTIVE",
        "USAGE",
        "AGE",
    ]
    rows = {row[0]: row for row in cq[1:]}
    assert rows["team-a"][1:4] == ["vision", "0", "2"]
    assert rows["team-c"][1:4] == ["research", "10", "1"]
    assert rows["research"][1:3] == ["0", "1"]  # a root has an empty PARENT cell

    lq = _rows(api.kubectl("get", "lq", "-n", "team-a").stdout)
    assert lq[0] == ["NAME", "CLUSTERQUEUE", "PENDING", "ADMITTED", "ACTIVE", "AGE"]
    assert lq[1][:2] == ["gpu", "team-a"]

    rf = api.kubectl("get", "rf", "h100").stdout
    assert "NODE-LABELS" in rf and '{"gpu.example.com/model":"h100"}' in rf

    wl = _rows(api.kubectl("get", "wl", "-n", "team-a").stdout)
    assert wl[0] == ["NAME", "QUEUE", "RESERVED-IN", "ADMITTED", "FINISHED", "AGE"]
    assert wl[1][:2] == ["train-llama", "gpu"]

    pg = _rows(api.kubectl("get", "pg", "-n", "team-a").stdout)
    assert pg[0] == ["NAME", "MIN-COUNT", "PRIORITY", "SCHEDULED", "BOUND", "AGE"]
    assert pg[1][:3] == ["train-llama-workers", "2", "100"]

    together = api.kubectl("get", "cq,lq,rf", "-A").stdout
    for header in ("PARENT", "CLUSTERQUEUE", "NODE-LABELS"):
        assert header in together

    # Every example object reads back as the model the example file describes.
    for index, doc in enumerate(yaml.safe_load_all((EXAMPLES / "three-team-gpu.yaml").read_text())):
        if doc["apiVersion"] == "v1":
            continue
        expected = parse_manifest(doc, index)
        ns = ["-n", doc["metadata"]["namespace"]] if "namespace" in doc["metadata"] else []
        kind = f"{type(expected).crd.plural}.{GROUP}"
        live = parse_manifest(api.get_json(kind, expected.name, *ns), index)
        assert live.model_dump(include={"spec"}) == expected.model_dump(include={"spec"})


def test_status_shows_in_the_columns(api: Cluster) -> None:
    api.kubectl("apply", "-f", str(EXAMPLES))
    live = parse_manifest(api.get_json("cq", "team-a"), 0)
    assert isinstance(live, ClusterQueue)
    summary = usage_summary(live.spec, {"h100": {"nvidia.com/gpu": 6, "cpu": 40_000}})
    conditions = set_condition(
        [], "Active", "True", "Ready", "can admit workloads", now=datetime.now(UTC)
    )
    status = live.status.model_copy(
        update={
            "pending_workloads": 3,
            "admitted_workloads": 2,
            "usage_summary": summary,
            "conditions": conditions,
        }
    )
    patch = json.dumps({"status": wire(status)})
    api.kubectl("patch", "cq", "team-a", "--subresource=status", "--type=merge", "-p", patch)
    row = api.kubectl("get", "cq", "team-a", "--no-headers").stdout
    assert row.split()[:7] == ["team-a", "vision", "0", "2", "3", "2", "True"]
    assert "h100: gpu 6/16 cpu 40/384 memory 0/3Ti; a100: gpu 0/4" in row


def _cq(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def _namespaced(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": f"bad-{uuid.uuid4().hex[:6]}"},
        "spec": spec,
    }


INVALID = {
    "quota-above-limit": (
        _cq(
            "bad-quota",
            {
                "flavors": [
                    {
                        "name": "h100",
                        "quota": {"nvidia.com/gpu": 9},
                        "limit": {"nvidia.com/gpu": "8"},
                    }
                ]
            },
        ),
        "spec.flavors[0].quota: Invalid value: quota must not exceed limit in flavor h100: "
        "nvidia.com/gpu",
        "quota must not exceed limit in flavor h100: nvidia.com/gpu (quota 9 > limit 8)",
    ),
    "quota-above-limit-in-other-units": (
        _cq(
            "bad-units",
            {"flavors": [{"name": "cpu-pool", "quota": {"cpu": "2"}, "limit": {"cpu": "1500m"}}]},
        ),
        "quota must not exceed limit in flavor cpu-pool: cpu",
        "cpu (quota 2 > limit 1500m)",
    ),
    "negative-quantity": (
        _cq("bad-negative", {"flavors": [{"name": "h100", "quota": {"cpu": "-1"}}]}),
        'spec.flavors[0].quota[cpu]: Invalid value: "-1": must not be negative',
        "spec.flavors[0].quota[cpu]: '-1' must not be negative",
    ),
    "negative-integer-quantity": (
        _cq("bad-negative-int", {"flavors": [{"name": "h100", "quota": {"memory": -5}}]}),
        "spec.flavors[0].quota[memory]: Invalid value: -5: must not be negative",
        "spec.flavors[0].quota[memory]: '-5' must not be negative",
    ),
    "malformed-quantity": (
        _cq("bad-malformed", {"flavors": [{"name": "h100", "quota": {"memory": "64GB"}}]}),
        'spec.flavors[0].quota[memory]: Invalid value: "64GB": must be a Kubernetes quantity',
        "spec.flavors[0].quota[memory]: '64GB' is not a Kubernetes quantity",
    ),
    "fractional-gpu": (
        _cq("bad-fraction", {"flavors": [{"name": "h100", "quota": {"nvidia.com/gpu": "1.5"}}]}),
        "spec.flavors[0].quota: Invalid value: nvidia.com/gpu is counted in whole units, "
        "so fractions are not allowed",
        "nvidia.com/gpu is counted in whole units, so fractions are not allowed",
    ),
    "unknown-enum-value": (
        _cq("bad-enum", {"queueingStrategy": "Fastest"}),
        'spec.queueingStrategy: Unsupported value: "Fastest": supported values: '
        '"StrictFIFO", "BestEffortFIFO"',
        "spec.queueingStrategy: Input should be 'StrictFIFO' or 'BestEffortFIFO' (got 'Fastest')",
    ),
    "unknown-preemption-policy": (
        _cq("bad-reclaim", {"preemption": {"reclaim": "Always"}}),
        'spec.preemption.reclaim: Unsupported value: "Always"',
        "spec.preemption.reclaim: Input should be 'Never', 'LowerPriority' or 'Any'",
    ),
    "self-parent": (
        _cq("bad-self", {"parent": "bad-self"}),
        "spec.parent: Invalid value: a ClusterQueue cannot be its own parent",
        "spec.parent: a ClusterQueue cannot be its own parent",
    ),
    "negative-weight": (
        _cq("bad-weight", {"overQuotaWeight": -1}),
        "spec.overQuotaWeight: Invalid value: -1: spec.overQuotaWeight in body should be "
        "greater than or equal to 0",
        "spec.overQuotaWeight: Input should be greater than or equal to 0 (got -1)",
    ),
    "duplicate-flavor": (
        _cq("bad-dup", {"flavors": [{"name": "h100"}, {"name": "h100"}]}),
        'spec.flavors[1]: Duplicate value: {"name":"h100"}',
        "spec: flavors: each flavor may appear once: h100",
    ),
    "min-count-above-count": (
        _namespaced("Workload", {"queueName": "gpu", "podSets": [{"count": 2, "minCount": 3}]}),
        "spec.podSets[0].minCount: Invalid value: minCount must not exceed count",
        "spec.podSets[0]: minCount must not exceed count (pod set main: minCount 3 > count 2)",
    ),
    "replaces-without-slice": (
        _namespaced("Workload", {"queueName": "q", "replaces": "w1", "podSets": [{"count": 1}]}),
        "spec.replaces: Invalid value: replaces requires sliceName",
        "replaces requires sliceName",
    ),
    "gang-and-basic": (
        _namespaced("PodGroup", {"schedulingPolicy": {"basic": {}, "gang": {"minCount": 2}}}),
        "spec.schedulingPolicy: Invalid value: exactly one of basic or gang must be set",
        "spec.schedulingPolicy: exactly one of basic or gang must be set",
    ),
    "gang-min-count-zero": (
        _namespaced("PodGroup", {"schedulingPolicy": {"gang": {"minCount": 0}}}),
        "spec.schedulingPolicy.gang.minCount: Invalid value: 0: "
        "spec.schedulingPolicy.gang.minCount in body should be greater than or equal to 1",
        "spec.schedulingPolicy.gang.minCount: Input should be greater than or equal to 1",
    ),
    "local-queue-without-cluster-queue": (
        _namespaced("LocalQueue", {}),
        "spec.clusterQueue: Required value",
        "spec.clusterQueue: required field is missing",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_apiserver_and_parse_manifest_refuse_invalid_objects(
    api: Cluster, scratch: str, case: str
) -> None:
    doc, apiserver_says, muster_says = INVALID[case]
    doc = json.loads(json.dumps(doc))
    if doc["kind"] in ("Workload", "PodGroup", "LocalQueue"):
        doc["metadata"]["namespace"] = scratch
    result = api.kubectl("create", "-f", "-", input=json.dumps(doc), check=False)
    assert result.returncode != 0, f"the apiserver accepted {case}"
    assert apiserver_says in result.stderr
    with pytest.raises(ManifestError) as error:
        parse_manifest(doc, 0)
    assert muster_says in str(error.value)


def test_cycle_and_missing_parent_become_inactive_conditions(api: Cluster) -> None:
    """The schema cannot see across objects, so the apiserver accepts a cycle and a dangling
    parent; check_queue_tree over the live objects turns them into Active=False conditions
    (the queue reconciler runs this same function and writes the same conditions)."""
    tag = uuid.uuid4().hex[:6]
    a, b, orphan, child = (f"{n}-{tag}" for n in ("cyc-a", "cyc-b", "orphan", "child"))
    objects = [
        _cq(a, {"parent": b}),
        _cq(b, {"parent": a}),
        _cq(orphan, {"parent": f"missing-{tag}"}),
        _cq(child, {"parent": orphan}),
    ]
    api.kubectl("create", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
    try:
        live = api.get_json("cq")["items"]
        queues = [parse_manifest(item, i) for i, item in enumerate(live)]
        flavors = [parse_manifest(i, 0) for i in api.get_json("rf")["items"]]
        tree = check_queue_tree(
            [q for q in queues if isinstance(q, ClusterQueue)],
            [f for f in flavors if isinstance(f, ResourceFlavor)],
        )
        now = datetime.now(UTC)
        for name in (a, b, orphan, child):
            state = tree.cluster_queues[name]
            conditions = set_condition([], "Active", "False", state.reason, state.message, now=now)
            patch = {"status": {"conditions": [wire(c) for c in conditions]}}
            api.kubectl(
                "patch",
                "cq",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps(patch),
            )
        reasons = {}
        for name in (a, b, orphan, child):
            got = parse_manifest(api.get_json("cq", name), 0)
            assert isinstance(got, ClusterQueue)
            (condition,) = got.status.conditions
            assert condition.status == "False"
            reasons[name] = (condition.reason, condition.message)
        assert reasons[a][0] == reasons[b][0] == "Cycle"
        assert f"({a} -> {b} -> {a})" in reasons[a][1]
        assert reasons[orphan][0] == "ParentNotFound"
        assert f"'missing-{tag}', which does not exist" in reasons[orphan][1]
        assert reasons[child][0] == "AncestorInactive"
        row = api.kubectl("get", "cq", a, "--no-headers").stdout.split()
        assert row[:2] == [a, b] and "False" in row
    finally:
        api.kubectl("delete", "cq", a, b, orphan, child, "--wait=false", check=False)


def _round_trip(api: Cluster, namespace: str, manifest: dict[str, Any]) -> None:
    manifest = json.loads(json.dumps(manifest))
    manifest["metadata"]["name"] = f"rt-{uuid.uuid4().hex[:10]}"
    model = parse_manifest(manifest, 0)
    namespaced = type(model).crd.scope == "Namespaced"
    where = ["-n", namespace] if namespaced else []
    if namespaced:
        manifest["metadata"]["namespace"] = namespace
        model = parse_manifest(manifest, 0)
    doc = model.to_manifest()
    status = doc.pop("status", None)
    resource = f"{type(model).crd.plural}.{GROUP}"
    api.kubectl("create", "-f", "-", input=json.dumps(doc))
    try:
        if status:
            api.kubectl(
                "patch",
                resource,
                model.name,
                *where,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": status}),
            )
        back = parse_manifest(api.get_json(resource, model.name, *where), 0)
        assert type(back) is type(model)
        # Everything but the server-owned metadata (uid, resourceVersion, ...) is unchanged.
        assert back.model_dump(exclude={"metadata"}) == model.model_dump(exclude={"metadata"})
        assert back == model.model_copy(update={"metadata": back.metadata})
        assert back.metadata.labels == model.metadata.labels
        assert back.metadata.annotations == model.metadata.annotations
    finally:
        api.kubectl("delete", resource, model.name, *where, "--wait=false", check=False)


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_model_to_apiserver_and_back_is_lossless(
    api: Cluster, scratch: str, kind: str, data: st.DataObject
) -> None:
    manifest = data.draw(MANIFESTS[kind](), label=kind)
    _round_trip(api, scratch, manifest)
