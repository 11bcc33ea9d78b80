"""Hypothesis strategies for valid objects of every Muster kind, and the property that a
model survives the trip through its manifest (model -> JSON -> model) unchanged.

The end-to-end round trip through the real apiserver (tests/e2e/test_api_e2e.py) reuses
these strategies.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.api import (
    KINDS,
    ClusterQueue,
    LocalQueue,
    MusterObject,
    PodGroup,
    ResourceFlavor,
    Workload,
    parse_manifest,
)
from quota.api.meta import format_duration
from quota.api.quantity import format_quantity

# --- building blocks --------------------------------------------------------------------

dns_labels = st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
resource_names = st.sampled_from(
    ["cpu", "memory", "nvidia.com/gpu", "pods", "ephemeral-storage", "example.com/fpga"]
)
amounts = st.integers(min_value=0, max_value=10**12)
words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=40)
reasons = st.from_regex(r"[A-Z][A-Za-z0-9]{0,15}", fullmatch=True)
times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


level_labels = st.sampled_from(
    ["example.com/block", "example.com/rack", "topology.kubernetes.io/zone", "nvlink-domain"]
)


def resource_lists(max_size: int = 4) -> st.SearchStrategy[dict[str, str]]:
    """A resource list as a manifest writes it (canonical quantity strings)."""
    return st.dictionaries(resource_names, amounts, max_size=max_size).map(
        lambda d: {r: format_quantity(a, r) for r, a in d.items()}
    )


def flavor_resources() -> st.SearchStrategy[dict[str, dict[str, str]]]:
    return st.dictionaries(dns_labels, resource_lists(3), max_size=3)


@st.composite
def conditions(draw: st.DrawFn, types: list[str]) -> list[dict[str, Any]]:
    chosen = draw(st.lists(st.sampled_from(types), unique=True, max_size=len(types)))
    return [
        {
            "type": t,
            "status": draw(st.sampled_from(["True", "False", "Unknown"])),
            "reason": draw(reasons),
            "message": draw(words),
            "lastTransitionTime": draw(times).isoformat().replace("+00:00", "Z"),
            **({"observedGeneration": g} if (g := draw(st.none() | st.integers(0, 99))) else {}),
        }
        for t in chosen
    ]


tolerations = st.fixed_dictionaries(
    {"key": dns_labels},
    optional={
        "operator": st.sampled_from(["Exists", "Equal"]),
        "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        "tolerationSeconds": st.integers(0, 3600),
    },
)
taints = st.fixed_dictionaries(
    {"key": dns_labels, "effect": st.sampled_from(["NoSchedule", "NoExecute"])},
    optional={"value": dns_labels},
)
labels = st.dictionaries(dns_labels, dns_labels, max_size=3)
json_leaves = st.booleans() | st.integers(-1000, 1000) | dns_labels
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(dns_labels, inner, max_size=3),
    max_leaves=6,
)


def metadata(name: str, namespace: str | None) -> st.SearchStrategy[dict[str, Any]]:
    base: dict[str, Any] = {"name": st.just(name)}
    if namespace:
        base["namespace"] = st.just(namespace)
    return st.fixed_dictionaries(base, optional={"labels": labels, "annotations": labels})


# --- one strategy per kind --------------------------------------------------------------


@st.composite
def resource_flavors(draw: st.DrawFn, namespace: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "ResourceFlavor",
        "metadata": draw(metadata(draw(dns_labels), None)),
        "spec": draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "nodeLabels": labels,
                    "nodeTaints": st.lists(taints, max_size=2),
                    "tolerations": st.lists(tolerations, max_size=2),
                    "topologyName": dns_labels,
                },
            )
        ),
    }


@st.composite
def topologies(draw: st.DrawFn, namespace: str | None = None) -> dict[str, Any]:
    """Unique levels, widest first; the hostname, when present, last."""
    levels = draw(st.lists(level_labels, unique=True, max_size=3))
    if not levels or draw(st.booleans()):
        levels.append("kubernetes.io/hostname")
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Topology",
        "metadata": draw(metadata(draw(dns_labels), None)),
        "spec": {"levels": [{"nodeLabel": label} for label in levels]},
    }


@st.composite
def flavor_quotas(draw: st.DrawFn, name: str) -> dict[str, Any]:
    quota = draw(st.dictionaries(resource_names, amounts, max_size=4))
    limit = {r: a + draw(st.integers(0, 10**6)) for r, a in quota.items() if draw(st.booleans())}
    limit.update(draw(st.dictionaries(resource_names, amounts, max_size=2)))
    limit = {r: max(a, quota.get(r, 0)) for r, a in limit.items()}
    return {
        "name": name,
        "quota": {r: format_quantity(a, r) for r, a in quota.items()},
        "limit": {r: format_quantity(a, r) for r, a in limit.items()},
    }


durations = st.integers(0, 10**6).map(lambda s: format_duration(timedelta(seconds=s)))


@st.composite
def cluster_queues(draw: st.DrawFn, namespace: str | None = None) -> dict[str, Any]:
    name = draw(dns_labels)
    flavor_names = draw(st.lists(dns_labels, unique=True, max_size=3))
    spec = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "parent": dns_labels.filter(lambda p: p != name),
                "priority": st.integers(-(2**31), 2**31 - 1),
                "overQuotaWeight": st.integers(0, 1000),
                "queueingStrategy": st.sampled_from(["StrictFIFO", "BestEffortFIFO"]),
                "preemption": st.fixed_dictionaries(
                    {},
                    optional={
                        "withinQueue": st.sampled_from(
                            ["Never", "LowerPriority", "LowerOrNewerEqualPriority"]
                        ),
                        "reclaim": st.sampled_from(["Never", "LowerPriority", "Any"]),
                        "preemptMinRuntime": durations,
                        "reclaimMinRuntime": durations,
                    },
                ),
                "namespaceSelector": st.fixed_dictionaries(
                    {},
                    optional={
                        "matchLabels": labels,
                        "matchExpressions": st.lists(
                            st.fixed_dictionaries(
                                {
                                    "key": dns_labels,
                                    "operator": st.just("In"),
                                    "values": st.lists(dns_labels, min_size=1, max_size=2),
                                }
                            )
                            | st.fixed_dictionaries(
                                {"key": dns_labels, "operator": st.just("Exists")}
                            ),
                            max_size=2,
                        ),
                    },
                ),
                "stopPolicy": st.sampled_from(["None", "Hold", "HoldAndDrain"]),
                "dispatch": st.fixed_dictionaries(
                    {},
                    optional={
                        "clusterSelector": st.fixed_dictionaries(
                            {}, optional={"matchLabels": labels}
                        )
                    },
                ),
            },
        )
    )
    spec["flavors"] = [draw(flavor_quotas(f)) for f in flavor_names]
    status = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "pendingWorkloads": st.integers(0, 10**6),
                "admittedWorkloads": st.integers(0, 10**6),
                "fairShare": flavor_resources(),
                "usage": flavor_resources(),
                "borrowed": flavor_resources(),
                "usageSummary": words,
                "conditions": conditions(["Active"]),
            },
        )
    )
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "ClusterQueue",
        "metadata": draw(metadata(name, None)),
        "spec": spec,
        "status": status,
    }


@st.composite
def local_queues(draw: st.DrawFn, namespace: str | None = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "LocalQueue",
        "metadata": draw(metadata(draw(dns_labels), namespace)),
        "spec": {"clusterQueue": draw(dns_labels)},
        "status": draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "pendingWorkloads": st.integers(0, 10**6),
                    "admittedWorkloads": st.integers(0, 10**6),
                    "usage": flavor_resources(),
                    "conditions": conditions(["Active"]),
                },
            )
        ),
    }


@st.composite
def pod_sets(draw: st.DrawFn, name: str) -> dict[str, Any]:
    count = draw(st.integers(0, 1000))
    pod_set: dict[str, Any] = {"name": name, "count": count, "requests": draw(resource_lists())}
    if count and draw(st.booleans()):
        pod_set["minCount"] = draw(st.integers(1, count))
    pod_set["template"] = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "nodeSelector": labels,
                "tolerations": st.lists(tolerations, max_size=2),
                "affinity": st.dictionaries(dns_labels, json_values, max_size=2),
            },
        )
    )
    if draw(st.booleans()):
        request: dict[str, Any] = {}
        mode = draw(st.sampled_from(("required", "preferred", "unconstrained", None)))
        if mode == "unconstrained":
            request[mode] = True
        elif mode is not None:
            request[mode] = draw(level_labels)
        divisors = [d for d in range(1, min(count, 8) + 1) if count % d == 0]
        if divisors and draw(st.booleans()):
            request["sliceRequiredTopology"] = draw(level_labels)
            request["sliceSize"] = draw(st.sampled_from(divisors))
        pod_set["topologyRequest"] = request
    return pod_set


@st.composite
def workloads(draw: st.DrawFn, namespace: str | None = "team-a") -> dict[str, Any]:
    set_names = draw(st.lists(dns_labels, unique=True, min_size=1, max_size=3))
    spec: dict[str, Any] = {
        "queueName": draw(dns_labels),
        "podSets": [draw(pod_sets(n)) for n in set_names],
    }
    spec.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "priorityClassName": dns_labels,
                    "priority": st.integers(-(2**31), 2**31 - 1),
                },
            )
        )
    )
    if draw(st.booleans()):
        spec["sliceName"] = draw(dns_labels)
        if draw(st.booleans()):
            spec["replaces"] = draw(dns_labels)
    status: dict[str, Any] = {}
    if draw(st.booleans()):
        status["admission"] = {
            "clusterQueue": draw(dns_labels),
            "podSetAssignments": [
                {
                    "name": n,
                    "flavors": draw(st.dictionaries(resource_names, dns_labels, max_size=3)),
                    "count": draw(st.integers(0, 1000)),
                    "resourceUsage": draw(resource_lists()),
                }
                for n in set_names
            ],
        }
    status["conditions"] = draw(
        conditions(
            [
                "QuotaReserved",
                "Admitted",
                "Evicted",
                "Preempted",
                "Requeued",
                "Finished",
                "PodsReady",
            ]
        )
    )
    if draw(st.booleans()):
        status["requeueState"] = {"count": draw(st.integers(0, 50))}
        if draw(st.booleans()):
            status["requeueState"]["requeueAt"] = draw(times).isoformat()
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": draw(metadata(draw(dns_labels), namespace)),
        "spec": spec,
        "status": status,
    }


@st.composite
def pod_groups(draw: st.DrawFn, namespace: str | None = "team-a") -> dict[str, Any]:
    policy = draw(
        st.just({"basic": {}}) | st.integers(1, 10**6).map(lambda n: {"gang": {"minCount": n}})
    )
    spec: dict[str, Any] = {"schedulingPolicy": policy}
    spec.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "workloadRef": st.fixed_dictionaries(
                        {"workloadName": dns_labels, "templateName": dns_labels}
                    ),
                    "disruptionMode": st.sampled_from([{"single": {}}, {"all": {}}]),
                    "priorityClassName": dns_labels,
                    "priority": st.integers(-(2**31), 10**9),
                    "preemptionPolicy": st.sampled_from(["Never", "PreemptLowerPriority"]),
                    "schedulingConstraints": st.fixed_dictionaries(
                        {
                            "topology": st.lists(
                                st.fixed_dictionaries({"key": dns_labels}), max_size=1
                            )
                        }
                    ),
                },
            )
        )
    )
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "PodGroup",
        "metadata": draw(metadata(draw(dns_labels), namespace)),
        "spec": spec,
        "status": {
            "conditions": draw(conditions(["PodGroupInitiallyScheduled", "DisruptionTarget"]))
        },
    }


@st.composite
def worker_clusters(draw: st.DrawFn, namespace: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kubeconfig": draw(
            st.fixed_dictionaries(
                {"name": dns_labels}, optional={"key": st.sampled_from(["kubeconfig", "config"])}
            )
        )
    }
    if draw(st.booleans()):
        spec["lostAfter"] = draw(durations)
    meta = draw(metadata(draw(dns_labels), None))
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "WorkerCluster",
        "metadata": meta,
        "spec": spec,
    }


MANIFESTS = {
    "ResourceFlavor": resource_flavors,
    "ClusterQueue": cluster_queues,
    "LocalQueue": local_queues,
    "Workload": workloads,
    "PodGroup": pod_groups,
    "Topology": topologies,
    "WorkerCluster": worker_clusters,
}


def any_manifest() -> st.SearchStrategy[dict[str, Any]]:
    """A valid manifest of any Muster kind."""
    return st.one_of(*(strategy() for strategy in MANIFESTS.values()))


# --- properties -------------------------------------------------------------------------


def test_there_is_a_strategy_for_every_kind() -> None:
    assert set(MANIFESTS) == set(KINDS)


@settings(max_examples=60, deadline=None)
@given(manifest=any_manifest())
def test_generated_manifests_are_valid(manifest: dict[str, Any]) -> None:
    model = parse_manifest(manifest, 0)
    assert type(model).__name__ == manifest["kind"]


@settings(max_examples=60, deadline=None)
@given(manifest=any_manifest())
def test_model_survives_json_round_trip(manifest: dict[str, Any]) -> None:
    model: MusterObject = parse_manifest(manifest, 0)
    text = json.dumps(model.to_manifest())
    again = parse_manifest(json.loads(text), 0)
    assert again == model
    # Dumping again gives the same document: the manifest form is canonical.
    assert again.to_manifest() == model.to_manifest()
    # And the Python dump validates back to the same model (no quantity re-interpretation).
    assert type(model).model_validate(model.model_dump()) == model


@settings(max_examples=30, deadline=None)
@given(manifest=cluster_queues())
def test_manifest_values_survive_parsing(manifest: dict[str, Any]) -> None:
    cq = parse_manifest(manifest, 0)
    assert isinstance(cq, ClusterQueue)
    dumped = cq.to_manifest()
    # Canonical quantities are written back exactly as the manifest had them.
    assert [f["quota"] for f in dumped["spec"]["flavors"]] == [
        f["quota"] for f in manifest["spec"]["flavors"]
    ]
    assert dumped["metadata"]["name"] == manifest["metadata"]["name"]


__all__ = [
    "ClusterQueue",
    "LocalQueue",
    "PodGroup",
    "ResourceFlavor",
    "Workload",
    "any_manifest",
    "cluster_queues",
    "local_queues",
    "pod_groups",
    "resource_flavors",
    "topologies",
    "workloads",
]
