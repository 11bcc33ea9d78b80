"""The API models: what a manifest means, what it defaults to, and the error a user gets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from quota.api import (
    ClusterQueue,
    ClusterQueueStatus,
    ManifestError,
    PodGroup,
    Workload,
    format_resource_list,
    parse_manifest,
    set_condition,
    usage_summary,
)
from quota.api.meta import LabelSelector, format_duration, parse_duration


def manifest(kind: str, spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", **metadata},
        "spec": spec,
    }


def rejection(doc: dict[str, Any], index: int = 0) -> str:
    with pytest.raises(ManifestError) as error:
        parse_manifest(doc, index)
    return str(error.value)


GPU_QUEUE = {
    "parent": "org",
    "flavors": [
        {"name": "h100", "quota": {"nvidia.com/gpu": 8, "cpu": "64", "memory": "512Gi"}},
        {"name": "a100", "quota": {"nvidia.com/gpu": "4"}, "limit": {"nvidia.com/gpu": 8}},
    ],
}


def test_cluster_queue_quantities_are_base_units_and_defaults_are_filled() -> None:
    cq = parse_manifest(manifest("ClusterQueue", GPU_QUEUE, name="team-a"), 0)
    assert isinstance(cq, ClusterQueue)
    h100 = cq.spec.flavors[0]
    assert h100.quota == {"nvidia.com/gpu": 8, "cpu": 64_000, "memory": 512 * 1024**3}
    assert h100.limit == {}
    assert cq.spec.flavor("a100") is not None
    assert cq.spec.flavor("b200") is None
    assert (cq.spec.priority, cq.spec.over_quota_weight) == (0, 1)
    assert cq.spec.queueing_strategy == "BestEffortFIFO"
    assert (cq.spec.preemption.within_queue, cq.spec.preemption.reclaim) == ("Never", "Any")
    assert cq.spec.stop_policy == "None"
    assert cq.spec.namespace_selector is None


def test_manifest_is_written_back_in_kubernetes_form() -> None:
    cq = parse_manifest(manifest("ClusterQueue", GPU_QUEUE, name="team-a"), 0)
    out = cq.to_manifest()
    assert list(out)[:3] == ["apiVersion", "kind", "metadata"]
    assert out["metadata"] == {"name": "team-a"}
    assert out["spec"]["flavors"][0]["quota"] == {
        "nvidia.com/gpu": "8",
        "cpu": "64",
        "memory": "512Gi",
    }
    assert out["spec"]["overQuotaWeight"] == 1
    assert "status" not in out  # an untouched status is not written


def test_unknown_metadata_fields_are_kept() -> None:
    doc = manifest("ResourceFlavor", {}, managedFields=[{"manager": "kubectl"}], uid="u1")
    rf = parse_manifest(doc, 0)
    assert rf.to_manifest()["metadata"] == {
        "name": "x",
        "uid": "u1",
        "managedFields": [{"manager": "kubectl"}],
    }


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            manifest(
                "ClusterQueue",
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
            "document 0 (ClusterQueue x): spec.flavors[0]: quota must not exceed limit in "
            "flavor h100: nvidia.com/gpu (quota 9 > limit 8)",
        ),
        (
            manifest("ClusterQueue", {"flavors": [{"name": "h100", "quota": {"cpu": "-1"}}]}),
            "document 0 (ClusterQueue x): spec.flavors[0].quota[cpu]: '-1' must not be negative",
        ),
        (
            manifest(
                "ClusterQueue", {"flavors": [{"name": "h", "quota": {"nvidia.com/gpu": 0.5}}]}
            ),
            "document 0 (ClusterQueue x): spec.flavors[0].quota[nvidia.com/gpu]: '0.5' is not "
            "exact: nvidia.com/gpu is counted in whole units, so fractions are not allowed",
        ),
        (
            manifest("ClusterQueue", {"queueingStrategy": "Fastest"}),
            "document 0 (ClusterQueue x): spec.queueingStrategy: Input should be 'StrictFIFO' "
            "or 'BestEffortFIFO' (got 'Fastest')",
        ),
        (
            manifest("ClusterQueue", {"parent": "x"}),
            "document 0 (ClusterQueue x): spec.parent: a ClusterQueue cannot be its own parent",
        ),
        (
            manifest(
                "Workload",
                {"queueName": "q", "podSets": [{"count": 2, "minCount": 3}]},
                namespace="ns",
            ),
            "document 0 (Workload ns/x): spec.podSets[0]: minCount must not exceed count "
            "(pod set main: minCount 3 > count 2)",
        ),
        (
            manifest("ClusterQueue", {"overQuotaWeight": -1}),
            "document 0 (ClusterQueue x): spec.overQuotaWeight: Input should be greater than "
            "or equal to 0 (got -1)",
        ),
        (
            manifest("ClusterQueue", {"parnet": "org"}),
            "document 0 (ClusterQueue x): spec.parnet: unknown field",
        ),
        (
            manifest("LocalQueue", {}, namespace="ns"),
            "document 0 (LocalQueue ns/x): spec.clusterQueue: required field is missing",
        ),
        (
            manifest(
                "PodGroup",
                {"schedulingPolicy": {"basic": {}, "gang": {"minCount": 2}}},
                namespace="ns",
            ),
            "document 0 (PodGroup ns/x): spec.schedulingPolicy: exactly one of basic or gang "
            "must be set",
        ),
        (
            manifest("ClusterQueue", {"parent": "Not_A_Name"}),
            "document 0 (ClusterQueue x): spec.parent: 'Not_A_Name' is not a valid name",
        ),
        (
            manifest("ClusterQueue", {"flavors": [{"name": "a"}, {"name": "a"}]}),
            "document 0 (ClusterQueue x): spec: flavors: each flavor may appear once: a",
        ),
        (
            manifest("ResourceFlavor", {}, namespace="ns"),
            "document 0 (ResourceFlavor ns/x): ResourceFlavor is cluster-scoped: "
            "metadata.namespace must not be set",
        ),
    ],
)
def test_invalid_manifests_are_rejected_with_object_field_and_rule(
    doc: dict[str, Any], expected: str
) -> None:
    assert rejection(doc).startswith(expected)


def test_every_problem_is_listed_and_the_index_is_named() -> None:
    doc = manifest("ClusterQueue", {"priority": "high", "stopPolicy": "Pause"}, name="cq-7")
    message = rejection(doc, index=7)
    assert message.startswith("document 7 (ClusterQueue cq-7): \n")
    assert "spec.priority: Input should be a valid integer" in message
    assert (
        "spec.stopPolicy: Input should be 'None', 'Hold' or 'HoldAndDrain' (got 'Pause')" in message
    )


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
            "document 3 (Namespace a): apiVersion: apiVersion 'v1' is not a Muster API",
        ),
        (
            {"apiVersion": "muster.dev/v1", "kind": "ClusterQueue"},
            "document 3 (ClusterQueue): apiVersion: unsupported apiVersion 'muster.dev/v1'",
        ),
        (
            {"apiVersion": "muster.dev/v1alpha1", "kind": "Cohort", "metadata": {"name": "c"}},
            "document 3 (Cohort c): kind: unknown kind 'Cohort' (one of ResourceFlavor, ",
        ),
        (["not", "a", "mapping"], "document 3 (document): expected a mapping"),
    ],
)
def test_foreign_kinds_are_errors(doc: Any, expected: str) -> None:
    assert rejection(doc, index=3).startswith(expected)


def test_manifest_error_keeps_structured_problems() -> None:
    with pytest.raises(ManifestError) as error:
        parse_manifest(manifest("ClusterQueue", {"priority": "x", "weight": 1}), 2)
    assert error.value.index == 2
    assert error.value.subject == "ClusterQueue x"
    assert [path for path, _ in error.value.problems] == ["spec.priority", "spec.weight"]


def test_workload_pod_sets_and_totals() -> None:
    wl = parse_manifest(
        manifest(
            "Workload",
            {
                "queueName": "gpu",
                "podSets": [
                    {"name": "launcher", "count": 1, "requests": {"cpu": "500m"}},
                    {
                        "name": "workers",
                        "count": 4,
                        "minCount": 2,
                        "requests": {"nvidia.com/gpu": 8, "memory": "64Gi"},
                    },
                ],
            },
            namespace="team-a",
        ),
        0,
    )
    assert isinstance(wl, Workload)
    workers = wl.spec.pod_sets[1]
    assert workers.total() == {"nvidia.com/gpu": 32, "memory": 256 * 1024**3}
    assert workers.total(2) == {"nvidia.com/gpu": 16, "memory": 128 * 1024**3}
    assert wl.spec.pod_sets[0].total() == {"cpu": 500}
    assert wl.spec.priority is None


def test_duplicate_pod_set_names_are_rejected() -> None:
    doc = manifest(
        "Workload", {"queueName": "q", "podSets": [{"count": 1}, {"count": 2}]}, namespace="n"
    )
    assert "pod set names must be unique: main" in rejection(doc)


def test_slice_fields() -> None:
    doc = manifest(
        "Workload",
        {"queueName": "q", "podSets": [{"count": 1}], "replaces": "job-abc12"},
        namespace="n",
    )
    assert "replaces requires sliceName" in rejection(doc)
    doc["spec"]["sliceName"] = "job"
    wl = parse_manifest(doc, 0)
    assert isinstance(wl, Workload)
    assert (wl.spec.slice_name, wl.spec.replaces) == ("job", "job-abc12")


def test_pod_group_mirrors_the_native_api_and_defaults_to_single_disruption() -> None:
    pg = parse_manifest(
        manifest("PodGroup", {"schedulingPolicy": {"gang": {"minCount": 4}}}, namespace="n"), 0
    )
    assert isinstance(pg, PodGroup)
    assert pg.spec.scheduling_policy.gang is not None
    assert pg.spec.scheduling_policy.gang.min_count == 4
    assert pg.to_manifest()["spec"]["disruptionMode"] == {"single": {}}
    doc = manifest(
        "PodGroup", {"schedulingPolicy": {"basic": {}}, "disruptionMode": {}}, namespace="n"
    )
    assert "exactly one of single or all must be set" in rejection(doc)


def test_durations_are_go_durations() -> None:
    doc = manifest(
        "ClusterQueue", {"preemption": {"preemptMinRuntime": "1h30m", "reclaimMinRuntime": "90s"}}
    )
    cq = parse_manifest(doc, 0)
    assert isinstance(cq, ClusterQueue)
    assert cq.spec.preemption.preempt_min_runtime == timedelta(minutes=90)
    assert cq.to_manifest()["spec"]["preemption"]["reclaimMinRuntime"] == "1m30s"
    doc["spec"]["preemption"]["reclaimMinRuntime"] = "ten minutes"
    assert "'ten minutes' is not a duration" in rejection(doc)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0),
        ("0s", 0),
        ("90s", 90),
        ("1h", 3600),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("500ms", 0.5),
        ("2m3s", 123),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)
    assert parse_duration(format_duration(parse_duration(text))) == parse_duration(text)


@pytest.mark.parametrize("text", ["", "h", "1", "-1s", "1d", "1h 30m", "1.5.5s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_set_condition_keeps_transition_time_while_status_holds() -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    t1 = t0 + timedelta(minutes=5)
    first = set_condition([], "Active", "False", "Cycle", "a -> b -> a", now=t0)
    same = set_condition(first, "Active", "False", "ParentNotFound", "gone", now=t1)
    assert len(same) == 1
    assert (same[0].reason, same[0].last_transition_time) == ("ParentNotFound", t0)
    flipped = set_condition(same, "Active", "True", "Ready", "ok", now=t1)
    assert (flipped[0].status, flipped[0].last_transition_time) == ("True", t1)


def test_usage_summary_lists_usage_against_quota() -> None:
    cq = parse_manifest(manifest("ClusterQueue", GPU_QUEUE, name="team-a"), 0)
    assert isinstance(cq, ClusterQueue)
    usage = {"h100": {"nvidia.com/gpu": 6, "cpu": 40_000}, "spot": {"cpu": 500}}
    assert usage_summary(cq.spec, usage) == (
        "h100: gpu 6/8 cpu 40/64 memory 0/512Gi; a100: gpu 0/4; spot: cpu 500m/0"
    )


def test_status_built_from_base_units_stays_exact() -> None:
    amounts = {"cpu": 1500, "memory": 3 * 1024**3, "nvidia.com/gpu": 2}
    status = ClusterQueueStatus.model_validate({"usage": {"h100": format_resource_list(amounts)}})
    assert status.usage == {"h100": amounts}
    # A Python dump holds quantity strings, so it validates back to the same amounts.
    assert ClusterQueueStatus.model_validate(status.model_dump()) == status


def test_label_selector_matching() -> None:
    selector = LabelSelector.model_validate(
        {
            "matchLabels": {"team": "a"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gold", "silver"]},
                {"key": "frozen", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector.matches({"team": "a", "tier": "gold"})
    assert not selector.matches({"team": "a", "tier": "bronze"})
    assert not selector.matches({"team": "a", "tier": "gold", "frozen": "yes"})
    assert not selector.matches({"team": "b", "tier": "gold"})
    assert LabelSelector().matches({})
    with pytest.raises(ValueError, match="operator In needs at least one value"):
        LabelSelector.model_validate({"matchExpressions": [{"key": "k", "operator": "In"}]})
