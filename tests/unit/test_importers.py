"""`muster import kueue|kai|volcano`: the mapping of each source's fields, edge values,
refusals of malformed input, and the real command whose output `muster fairshare` reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from quota.importers import ImportInputError, ImportResult, import_documents

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "imports"
GIB = 2**30


def run_import(source: str, *docs: dict[str, Any]) -> ImportResult:
    return import_documents(source, [("in.yaml", list(docs))])


def by_kind(result: ImportResult, kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: dict(m) for m in result.manifests if m["kind"] == kind}


def reasons(result: ImportResult) -> list[str]:
    return [f"{u.path}: {u.reason}" for u in result.unmapped]


def kueue(kind: str, name: str, spec: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": kind}
    doc["metadata"] = {"name": name, **extra.pop("metadata", {})}
    if spec is not None:
        doc["spec"] = spec
    doc.update(extra)
    return doc


def cq(name: str, resources: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return kueue(
        "ClusterQueue",
        name,
        {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": [r["name"] for r in resources],
                    "flavors": [{"name": "default", "resources": resources}],
                }
            ],
            **spec,
        },
    )


FLAVOR = kueue("ResourceFlavor", "default")


def kai_queue(name: str, parent: str | None = None, **resources: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": resources}
    if parent:
        spec["parentQueue"] = parent
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
    }


def volcano_queue(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
    }


# ------------------------------------------------------------------------------- Kueue


def test_kueue_cohort_pools_member_quota_and_borrowing_limit_becomes_limit() -> None:
    result = run_import(
        "kueue",
        FLAVOR,
        cq("a", [{"name": "cpu", "nominalQuota": 6, "borrowingLimit": 4}], cohort="pool"),
        cq("b", [{"name": "cpu", "nominalQuota": "2"}], cohort="pool"),
        cq("alone", [{"name": "cpu", "nominalQuota": 3}]),
    )
    queues = by_kind(result, "ClusterQueue")
    a, b, pool, alone = (queues[n]["spec"] for n in ("a", "b", "pool", "alone"))
    assert a["parent"] == "pool" and a["flavors"] == [
        {"name": "default", "quota": {"cpu": "6"}, "limit": {"cpu": "10"}}
    ]
    assert not b["flavors"][0].get("limit")  # borrows without bound in its cohort
    # The implicit cohort holds what its members pool, and a root cohort lends no more.
    assert pool["flavors"] == [{"name": "default", "quota": {"cpu": "8"}, "limit": {"cpu": "8"}}]
    # Without a cohort a Kueue queue cannot borrow: its limit is its quota.
    assert alone["flavors"][0]["limit"] == {"cpu": "3"}
    assert "parent" not in alone
    # Parents come before their children, for kubectl apply.
    names = [m["metadata"]["name"] for m in result.manifests if m["kind"] == "ClusterQueue"]
    assert names.index("pool") < names.index("a")


def test_kueue_cohort_tree_named_like_a_queue_is_renamed_and_reported() -> None:
    result = run_import(
        "kueue",
        FLAVOR,
        kueue("Cohort", "root", {}),
        kueue("Cohort", "team", {"parentName": "root", "fairSharing": {"weight": "3"}}),
        cq("team", [{"name": "cpu", "nominalQuota": 2}], cohort="team"),
    )
    queues = by_kind(result, "ClusterQueue")
    assert queues["team"]["spec"]["parent"] == "team-cohort"
    assert queues["team-cohort"]["spec"]["parent"] == "root"
    assert queues["team-cohort"]["spec"]["overQuotaWeight"] == 3
    assert queues["root"]["spec"]["flavors"][0]["quota"] == {"cpu": "2"}
    assert any("imported as 'team-cohort'" in r for r in reasons(result))


def test_kueue_preemption_policies_weights_and_unmapped_fields() -> None:
    result = run_import(
        "kueue",
        FLAVOR,
        cq(
            "a",
            [
                {"name": "cpu", "nominalQuota": 1, "lendingLimit": 0},
                {"name": "pods", "nominalQuota": 10},
            ],
            cohort="c",
            preemption={
                "withinClusterQueue": "LowerOrNewerEqualPriority",
                "borrowWithinCohort": {"policy": "LowerPriority"},
            },
            fairSharing={"weight": "0.25"},
            stopPolicy="Hold",
            admissionChecks=["prov"],
        ),
        cq("b", [{"name": "cpu", "nominalQuota": 1}], cohort="c", fairSharing={"weight": 0}),
    )
    queues = by_kind(result, "ClusterQueue")
    a = queues["a"]["spec"]
    # Kueue's default reclaimWithinCohort is Never (Muster's is Any): said explicitly; every
    # Kueue workload is preemptible, whatever its priority.
    assert a["preemption"] == {
        "withinQueue": "LowerOrNewerEqualPriority",
        "reclaim": "Never",
        "preemptibleBelowPriority": 2**31 - 1,
    }
    assert a["stopPolicy"] == "Hold"
    assert a["flavors"][0]["quota"] == {"cpu": "1"}  # pods is not a quota in Muster
    # Fractional weights: all scaled by the same power of ten; zero stays zero.
    assert a["overQuotaWeight"] == 25 and queues["c"]["spec"]["overQuotaWeight"] == 100
    assert queues["b"]["spec"]["overQuotaWeight"] == 0
    paths = {u.path for u in result.unmapped}
    assert "spec.resourceGroups[0].flavors[0].resources[0].lendingLimit" in paths
    assert "spec.resourceGroups[0].flavors[0].resources[1]" in paths
    assert {"spec.preemption.borrowWithinCohort", "spec.admissionChecks"} <= paths


def test_kueue_zero_quota_and_workloads_with_priority_classes() -> None:
    result = run_import(
        "kueue",
        FLAVOR,
        cq("a", [{"name": "cpu", "nominalQuota": 0}]),
        kueue("LocalQueue", "lq", {"clusterQueue": "a"}, metadata={"namespace": "ns"}),
        kueue("WorkloadPriorityClass", "urgent", value=500),
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "j",
                "namespace": "ns",
                "labels": {
                    "kueue.x-k8s.io/queue-name": "lq",
                    "kueue.x-k8s.io/priority-class": "urgent",
                },
                "annotations": {"muster.dev/run-for": "90s", "muster.dev/submit-at": "1m"},
            },
            "spec": {
                "parallelism": 3,
                "template": {
                    "spec": {
                        "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]
                    }
                },
            },
        },
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "unqueued"}, "spec": {}},
    )
    assert by_kind(result, "ClusterQueue")["a"]["spec"]["flavors"][0] == {
        "name": "default",
        "quota": {"cpu": "0"},
        "limit": {"cpu": "0"},
    }
    assert by_kind(result, "PriorityClass")["urgent"]["value"] == 500
    (work,) = result.workloads
    spec = work.manifest["spec"]
    assert (spec["queueName"], spec["priority"], spec["priorityClassName"]) == ("lq", 500, "urgent")
    assert spec["podSets"][0]["count"] == 3 and spec["podSets"][0]["requests"] == {"cpu": "500m"}
    assert (work.submit_at, work.run_for) == (60.0, 90.0)
    assert any("names no Kueue queue" in r for r in reasons(result))


def test_kueue_v1beta2_priority_class_ref_and_queued_pod_groups() -> None:
    def pod(name: str, gpus: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "ns",
                "labels": {
                    "kueue.x-k8s.io/queue-name": "lq",
                    "kueue.x-k8s.io/pod-group-name": "group",
                },
                "annotations": {"kueue.x-k8s.io/pod-group-total-count": "3"},
            },
            "spec": {
                "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": gpus}}}]
            },
        }

    v1beta2 = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {
            "queueName": "lq",
            "priorityClassRef": {
                "group": "kueue.x-k8s.io",
                "kind": "WorkloadPriorityClass",
                "name": "urgent",
            },
            "podSets": [{"name": "main", "count": 2, "template": {"spec": {"containers": []}}}],
        },
    }
    result = run_import(
        "kueue",
        FLAVOR,
        {
            **cq("a", [{"name": "nvidia.com/gpu", "nominalQuota": 4}]),
            "apiVersion": "kueue.x-k8s.io/v1beta2",
        },
        kueue("LocalQueue", "lq", {"clusterQueue": "a"}, metadata={"namespace": "ns"}),
        kueue("WorkloadPriorityClass", "urgent", value=7),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}},
        v1beta2,
        pod("p0", "1"),
        pod("p1", "1"),
        pod("p2", "2"),
    )
    work = {w.manifest["metadata"]["name"]: w.manifest["spec"] for w in result.workloads}
    assert (work["w"]["priority"], work["w"]["priorityClassName"]) == (7, "urgent")
    # The pods of one group are one workload, a pod set per distinct pod spec.
    assert [(s["count"], s["requests"]) for s in work["group"]["podSets"]] == [
        (2, {"nvidia.com/gpu": "1"}),
        (1, {"nvidia.com/gpu": "2"}),
    ]
    assert not result.unmapped or all("Namespace" not in str(u) for u in result.unmapped)


def test_empty_files_import_nothing() -> None:
    assert import_documents("kueue", [("empty.yaml", [None])]).manifests == ()
    assert import_documents("volcano", [("empty.yaml", [])]).manifests == ()


# ---------------------------------------------------------------------------------- KAI


def test_kai_units_unlimited_values_and_one_weight_per_queue() -> None:
    result = run_import(
        "kai",
        kai_queue(
            "dept",
            gpu={"quota": 8, "limit": -1, "overQuotaWeight": 2},
            cpu={"quota": 2500, "limit": 4000, "overQuotaWeight": 1},
            memory={"quota": -1, "limit": -1, "overQuotaWeight": 2},
        ),
        kai_queue("team", "dept", gpu={"quota": 1.5, "limit": 0, "overQuotaWeight": 0}),
    )
    queues = by_kind(result, "ClusterQueue")
    dept = queues["dept"]["spec"]
    assert dept["priority"] == 100  # KAI's default
    assert dept["overQuotaWeight"] == 2  # the gpu weight
    assert dept["flavors"] == [
        {
            "name": "default",
            "quota": {"nvidia.com/gpu": "8", "cpu": "2500m", "memory": "0"},
            "limit": {"cpu": "4"},
        }
    ]
    team = queues["team"]["spec"]
    assert team["parent"] == "dept" and team["overQuotaWeight"] == 0
    # 1.5 GPUs rounds toward zero; an unset or zero limit allows no more than the quota.
    assert team["flavors"][0]["quota"]["nvidia.com/gpu"] == "1"
    assert team["flavors"][0]["limit"] == {"nvidia.com/gpu": "1", "cpu": "0", "memory": "0"}
    text = reasons(result)
    assert any("spec.resources.cpu.overQuotaWeight" in r for r in text)
    assert any("spec.resources.memory.quota: -1" in r for r in text)
    assert any("fraction" in r for r in text)
    assert by_kind(result, "ResourceFlavor")["default"]["spec"].get("nodeLabels", {}) == {}


def test_kai_work_for_a_parent_queue_is_left_out_and_leaves_get_local_queues() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "x", "labels": {"kai.scheduler/queue": "dept"}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }
    leaf_pod = {
        **pod,
        "metadata": {**pod["metadata"], "name": "q", "labels": {"runai/queue": "team"}},
    }
    result = run_import("kai", kai_queue("dept"), kai_queue("team", "dept"), pod, leaf_pod)
    assert [w.manifest["metadata"]["name"] for w in result.workloads] == ["q"]
    assert by_kind(result, "LocalQueue")["team"]["spec"]["clusterQueue"] == "team"
    assert any("has child queues" in r for r in reasons(result))


# ------------------------------------------------------------------------------ Volcano


def test_volcano_deserved_guarantee_capability_weight_and_root() -> None:
    result = run_import(
        "volcano",
        volcano_queue("a", parent="root", weight=4, deserved={"cpu": "8"}, capability={"cpu": 16}),
        volcano_queue("b", guarantee={"resource": {"memory": "4Gi"}}, reclaimable=False),
        volcano_queue("c", parent="a"),
    )
    queues = by_kind(result, "ClusterQueue")
    a, b, c = (queues[n]["spec"] for n in "abc")
    assert "parent" not in a  # the implicit root queue is Muster's top
    assert a["overQuotaWeight"] == 4 and b["overQuotaWeight"] == 1  # Volcano's default
    assert a["flavors"][0]["quota"] == {"cpu": "8", "memory": "0"}
    assert a["flavors"][0]["limit"] == {"cpu": "16"}
    assert b["flavors"][0]["quota"] == {"cpu": "0", "memory": "4Gi"}
    assert c["parent"] == "a"
    paths = {u.path for u in result.unmapped}
    assert {"spec.guarantee.resource", "spec.reclaimable"} <= paths


def test_volcano_dequeue_strategy_and_closed_queue() -> None:
    closed = volcano_queue("a", dequeueStrategy="fifo")
    closed["status"] = {"state": "Closed"}
    result = run_import("volcano", closed, volcano_queue("b", priority=5))
    queues = by_kind(result, "ClusterQueue")
    assert queues["a"]["spec"]["queueingStrategy"] == "StrictFIFO"
    assert queues["a"]["spec"]["stopPolicy"] == "Hold"
    assert queues["b"]["spec"]["queueingStrategy"] == "BestEffortFIFO"
    assert (queues["b"]["spec"]["stopPolicy"], queues["b"]["spec"]["priority"]) == ("None", 5)


def test_volcano_job_tasks_become_pod_sets() -> None:
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ml"},
        "spec": {
            "queue": "a",
            "tasks": [
                {
                    "name": "ps",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]
                        }
                    },
                },
                {
                    "name": "worker",
                    "replicas": 4,
                    "minAvailable": 2,
                    "template": {
                        "spec": {
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]
                        }
                    },
                },
            ],
        },
    }
    result = run_import("volcano", volcano_queue("a"), job)
    (work,) = result.workloads
    sets = work.manifest["spec"]["podSets"]
    assert [(s["name"], s["count"], s.get("minCount")) for s in sets] == [
        ("ps", 1, None),
        ("worker", 4, 2),
    ]
    assert by_kind(result, "LocalQueue")["a"]["metadata"]["namespace"] == "ml"


# ---------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    ("source", "docs", "needles"),
    [
        (
            "kueue",
            [{"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"}}],
            ["document 0 (Queue q)", "apiVersion", "muster import kai"],
        ),
        (
            "kai",
            [{"kind": "Queue", "metadata": {"name": "q"}}],
            ["apiVersion", "required field is missing"],
        ),
        (
            "kai",
            [kai_queue("q", "missing")],
            ["(Queue q)", "spec.parentQueue", "'missing' is not defined"],
        ),
        ("kai", [kai_queue("a", "b"), kai_queue("b", "a")], ["spec.parentQueue", "cycle"]),
        (
            "kai",
            [kai_queue("q", gpu={"quota": "lots"})],
            ["spec.resources.gpu.quota", "must be a number"],
        ),
        (
            "kai",
            [kai_queue("q", gpu={"limit": -3})],
            ["spec.resources.gpu.limit", "-1 or at least 0"],
        ),
        ("volcano", [volcano_queue("q", weight=0)], ["spec.weight", "between 1 and 65535"]),
        ("volcano", [volcano_queue("q", priority=-1)], ["spec.priority", "between 0 and"]),
        ("volcano", [volcano_queue("q", capability={"cpu": "1x"})], ["spec.capability[cpu]"]),
        (
            "volcano",
            [volcano_queue("q", deserved={"cpu": 4}, capability={"cpu": 2})],
            ["spec.capability[cpu]", "guarantee <= deserved <= capability"],
        ),
        ("volcano", [volcano_queue("Bad_Name")], ["metadata.name", "not a valid name"]),
        (
            "kueue",
            [FLAVOR, cq("a", [{"name": "cpu"}])],
            ["(ClusterQueue a)", "nominalQuota", "required"],
        ),
        (
            "kueue",
            [
                FLAVOR,
                kueue("Cohort", "x", {"parentName": "y"}),
                kueue("Cohort", "y", {"parentName": "x"}),
            ],
            ["cycle"],
        ),
        (
            "kueue",
            [cq("a", [{"name": "cpu", "nominalQuota": 1}])],
            ["ResourceFlavor 'default' is not in the files"],
        ),
        ("kueue", ["just a string"], ["document 0", "expected a mapping"]),
        (
            "kueue",
            [
                FLAVOR,
                kueue(
                    "Cohort",
                    "c",
                    {
                        "resourceGroups": [
                            {
                                "coveredResources": ["cpu"],
                                "flavors": [
                                    {
                                        "name": "gone",
                                        "resources": [{"name": "cpu", "nominalQuota": 1}],
                                    }
                                ],
                            }
                        ]
                    },
                ),
            ],
            ["(Cohort c)", "ResourceFlavor 'gone' is not in the files"],
        ),
    ],
)
def test_malformed_input_is_refused_naming_file_object_field_and_rule(
    source: str, docs: list[Any], needles: list[str]
) -> None:
    with pytest.raises(ImportInputError) as error:
        import_documents(source, [("bad.yaml", docs)])
    message = str(error.value)
    assert message.startswith("bad.yaml: document")
    for needle in needles:
        assert needle in message, (needle, message)


def test_errors_in_a_grouped_pod_name_the_pod_and_duplicate_names_are_refused() -> None:
    def pod(name: str, cpu: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "x", "annotations": {"pod-group-name": "g"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        }

    group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "x"},
        "spec": {"queue": "q"},
    }
    with pytest.raises(ImportInputError) as error:
        import_documents(
            "kai", [("f.yaml", [kai_queue("q"), group, pod("a", "1"), pod("b", "lots")])]
        )
    assert "document 3 (Pod x/b)" in str(error.value) and "cpu" in str(error.value)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "g", "namespace": "x", "labels": {"kai.scheduler/queue": "q"}},
        "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}},
    }
    with pytest.raises(ImportInputError, match="workload x/g is already imported"):
        import_documents("kai", [("f.yaml", [kai_queue("q"), group, pod("a", "1"), job])])
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n"},
        "status": {"allocatable": {"cpu": "1"}},
    }
    with pytest.raises(ImportInputError, match=r"document 2 \(Node n\): metadata\.name"):
        import_documents("kai", [("f.yaml", [kai_queue("q"), node, node])])


def test_a_chain_deeper_than_the_tree_allows_is_refused() -> None:
    docs = [kai_queue("q0")] + [kai_queue(f"q{i}", f"q{i - 1}") for i in range(1, 40)]
    with pytest.raises(ImportInputError, match="levels deep"):
        import_documents("kai", [("deep.yaml", docs)])


# ------------------------------------------------------------------- the real command


def muster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controllers.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# Fair shares worked out by hand in docs/import.md from the examples' quotas, weights,
# limits, node capacity and pending work.
EXPECTED = {
    "kueue": (
        "default-flavor/cpu",
        {"org": 12000, "research": 11000, "team-a": 7000, "team-b": 4000, "team-c": 1000},
    ),
    "kai": ("default/nvidia.com/gpu", {"research": 12, "vision": 6, "nlp": 6, "production": 4}),
    "volcano": ("default/nvidia.com/gpu", {"ai": 12, "training": 9, "inference": 3, "batch": 4}),
}


@pytest.mark.parametrize("source", sorted(EXPECTED))
def test_imported_examples_give_the_hand_computed_fair_shares(source: str, tmp_path: Path) -> None:
    files = sorted(str(p) for p in (EXAMPLES / source).glob("*.yaml"))
    imported = muster("import", source, *files, "-o", str(tmp_path))
    assert imported.returncode == 0, imported.stderr
    assert "Not mapped" in imported.stderr and "Traceback" not in imported.stderr
    applied = list(yaml.safe_load_all((tmp_path / "queues.yaml").read_text()))
    assert {d["kind"] for d in applied} <= {
        "PriorityClass",
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
    }
    shares = muster("fairshare", str(tmp_path / "cluster.yaml"), "-o", "json")
    assert shares.returncode == 0, shares.stderr
    queues = json.loads(shares.stdout)["queues"]
    key, expected = EXPECTED[source]
    assert {name: queues[name][key]["fairShare"] for name in expected} == expected


def test_simulate_prints_the_waits_and_bad_input_exits_1(tmp_path: Path) -> None:
    files = sorted(str(p) for p in (EXAMPLES / "volcano").glob("*.yaml"))
    simulated = muster("import", "volcano", *files, "--simulate", "--run-for", "20m")
    assert simulated.returncode == 0, simulated.stderr
    for queue in ("training", "inference", "batch"):
        assert queue in simulated.stdout
    assert "makespan" in simulated.stdout + simulated.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\n"
        "metadata: {name: q}\nspec: {weight: -2}\n"
    )
    refused = muster("import", "volcano", str(bad))
    assert refused.returncode == 1
    assert f"{bad}: document 0 (Queue q): spec.weight" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_cluster_scoped_object_with_a_stray_namespace_is_still_imported_once() -> None:
    """Queues are cluster-scoped: a namespace written on one is not read, whatever it is;
    the same Queue twice is refused all the same."""
    stray = {**kai_queue("a"), "metadata": {"name": "a", "namespace": []}}
    assert "a" in by_kind(run_import("kai", stray), "ClusterQueue")
    with pytest.raises(ImportInputError, match="Queue defined twice"):
        run_import("kai", stray, kai_queue("a"), {**kai_queue("a"), "metadata": {"name": "a"}})
