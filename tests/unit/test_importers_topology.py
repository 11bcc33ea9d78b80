"""`muster import`: the sources' topology objects and requests as Muster's (Kueue's
Topology, flavors' topologyName, Workloads' topologyRequest and Job annotations; KAI's
Topology and PodGroup constraints; Volcano's HyperNodes and networkTopology), and what does
not map, reported. Manifests as each project documents them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from quota.importers import ImportInputError, ImportResult, import_documents
from quota.importers.simulation import to_scenario
from quota.simulation.simulator import simulate

BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
HOST = "kubernetes.io/hostname"


def run(source: str, text: str) -> ImportResult:
    return import_documents(source, [("in.yaml", list(yaml.safe_load_all(text)))])


def of_kind(result: ImportResult, kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: dict(m) for m in result.manifests if m["kind"] == kind}


def requests(result: ImportResult) -> dict[str, list[Any]]:
    return {
        w.manifest["metadata"]["name"]: [
            ps.get("topologyRequest") for ps in w.manifest["spec"]["podSets"]
        ]
        for w in result.workloads
    }


def reported(result: ImportResult) -> list[str]:
    return [f"{u.origin.subject}: {u.path}: {u.reason}" for u in result.unmapped]


KUEUE_QUEUES = f"""
apiVersion: kueue.x-k8s.io/v1beta1
kind: Topology
metadata:
  name: default
spec:
  levels:
  - nodeLabel: {BLOCK}
  - nodeLabel: {RACK}
  - nodeLabel: {HOST}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata:
  name: tas-flavor
spec:
  nodeLabels:
    cloud.provider.com/node-group: tas-node-group
  topologyName: default
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata:
  name: tas-cluster-queue
spec:
  namespaceSelector: {{}}
  resourceGroups:
  - coveredResources: [cpu, nvidia.com/gpu]
    flavors:
    - name: tas-flavor
      resources:
      - name: cpu
        nominalQuota: 100
      - name: nvidia.com/gpu
        nominalQuota: 64
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata:
  name: tas-user-queue
  namespace: default
spec:
  clusterQueue: tas-cluster-queue
"""


def kueue_job(annotations: dict[str, str], parallelism: int = 4) -> str:
    return f"""
---
apiVersion: batch/v1
kind: Job
metadata:
  name: tas-sample
  namespace: default
  labels:
    kueue.x-k8s.io/queue-name: tas-user-queue
spec:
  parallelism: {parallelism}
  completions: {parallelism}
  completionMode: Indexed
  template:
    metadata:
      annotations: {annotations!r}
    spec:
      containers:
      - name: dummy-job
        image: registry.k8s.io/e2e-test-images/agnhost:2.53
        resources:
          requests:
            cpu: "1"
            nvidia.com/gpu: "8"
      restartPolicy: Never
"""


KUEUE_WORKLOAD = f"""
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata:
  name: job-train-1a2b3
  namespace: default
spec:
  queueName: tas-user-queue
  podSets:
  - name: main
    count: 8
    template:
      spec:
        containers:
        - name: c
          resources:
            requests:
              nvidia.com/gpu: "8"
    topologyRequest:
      preferred: {BLOCK}
      podIndexLabel: batch.kubernetes.io/job-completion-index
      podSetSliceRequiredTopology: {RACK}
      podSetSliceSize: 4
      podSetGroupName: trainers
"""


def test_kueue_topology_flavor_and_requests_become_musters() -> None:
    result = run(
        "kueue",
        KUEUE_QUEUES
        + kueue_job({"kueue.x-k8s.io/podset-required-topology": RACK})
        + KUEUE_WORKLOAD,
    )
    assert of_kind(result, "Topology")["default"]["spec"] == {
        "levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]
    }
    assert of_kind(result, "ResourceFlavor")["tas-flavor"]["spec"]["topologyName"] == "default"
    # Topologies come before the flavors that name them, in apply order.
    kinds = [m["kind"] for m in result.manifests]
    assert kinds.index("Topology") < kinds.index("ResourceFlavor")
    assert requests(result) == {
        "tas-sample": [{"required": RACK}],
        "job-train-1a2b3": [{"preferred": BLOCK, "sliceRequiredTopology": RACK, "sliceSize": 4}],
    }
    # Kueue's own bookkeeping of pod order is passed over; what Muster lacks is reported.
    assert reported(result) == [
        "Workload default/job-train-1a2b3: spec.podSets[0].topologyRequest.podSetGroupName: "
        "Muster places each pod set by its own request; pod sets are not kept in one domain "
        "together"
    ]


def test_kueue_job_annotations_are_refused_in_kueues_words() -> None:
    with pytest.raises(ImportInputError) as error:
        run(
            "kueue",
            KUEUE_QUEUES
            + kueue_job(
                {
                    "kueue.x-k8s.io/podset-slice-required-topology": RACK,
                    "kueue.x-k8s.io/podset-slice-size": "3",
                }
            ),
        )
    assert (error.value.path, error.value.rule) == (
        "spec.template.metadata.annotations[kueue.x-k8s.io/podset-slice-size]",
        "3 does not divide the Job's 4 pods",
    )
    assert "(Job default/tas-sample)" in str(error.value)


def test_kueue_pods_carry_their_request_and_a_flavor_may_name_a_missing_topology() -> None:
    text = (
        KUEUE_QUEUES.replace("topologyName: default", "topologyName: elsewhere")
        + f"""
---
apiVersion: v1
kind: Pod
metadata:
  name: p0
  namespace: default
  labels:
    kueue.x-k8s.io/queue-name: tas-user-queue
    kueue.x-k8s.io/pod-group-name: g
  annotations:
    kueue.x-k8s.io/pod-group-total-count: "1"
    kueue.x-k8s.io/podset-preferred-topology: {RACK}
    kueue.x-k8s.io/podset-group-name: leaders
spec:
  containers:
  - name: c
    resources: {{requests: {{cpu: "1"}}}}
"""
    )
    result = run("kueue", text)
    assert of_kind(result, "ResourceFlavor")["tas-flavor"]["spec"]["topologyName"] == "elsewhere"
    assert requests(result) == {"g": [{"preferred": RACK}]}
    assert reported(result) == [
        "ResourceFlavor tas-flavor: spec.topologyName: Topology elsewhere is not in the files: "
        "workloads that need this flavor wait until it exists",
        "Pod default/p0: metadata.annotations[kueue.x-k8s.io/podset-group-name]: Muster has "
        "no equivalent: each pod set is placed by its own topology request",
    ]


KAI = f"""
apiVersion: kai.scheduler/v1alpha1
kind: Topology
metadata:
  name: cluster-topology
spec:
  levels:
  - nodeLabel: topology.kubernetes.io/zone
  - nodeLabel: {RACK}
    alias: rack
  - nodeLabel: {HOST}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata:
  name: research
spec:
  resources:
    gpu: {{quota: 16, limit: -1, overQuotaWeight: 1}}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: topology-aware-job
  namespace: team-a
  labels:
    kai.scheduler/queue: research
  annotations:
    kai.scheduler/topology: cluster-topology
    kai.scheduler/topology-required-placement: topology.kubernetes.io/zone
    kai.scheduler/topology-preferred-placement: {RACK}
spec:
  parallelism: 4
  completions: 4
  template:
    spec:
      containers:
      - name: c
        resources: {{requests: {{nvidia.com/gpu: "8"}}}}
---
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata:
  name: pg-train
  namespace: team-a
spec:
  queue: research
  minMember: 2
  topologyConstraint:
    topology: cluster-topology
    preferredTopologyLevel: {RACK}
  subGroups:
  - name: decode
    minMember: 1
    topologyConstraint:
      topology: cluster-topology
      requiredTopologyLevel: {RACK}
"""


def kai_pod(name: str) -> str:
    return f"""
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: team-a
  annotations:
    pod-group-name: pg-train
spec:
  containers:
  - name: c
    resources: {{requests: {{nvidia.com/gpu: "8"}}}}
"""


def test_kai_topology_and_constraints_become_musters() -> None:
    result = run("kai", KAI + kai_pod("p0") + kai_pod("p1"))
    assert of_kind(result, "Topology")["cluster-topology"]["spec"]["levels"] == [
        {"nodeLabel": "topology.kubernetes.io/zone"},
        {"nodeLabel": RACK},
        {"nodeLabel": HOST},
    ]
    assert of_kind(result, "ResourceFlavor")["default"]["spec"]["topologyName"] == (
        "cluster-topology"
    )
    assert requests(result) == {
        "topology-aware-job": [{"required": "topology.kubernetes.io/zone"}],
        "pg-train": [{"preferred": RACK}],
    }
    assert reported(result) == [
        "Topology cluster-topology: spec.levels[1].alias: Muster names a level by its node label",
        "Job team-a/topology-aware-job: "
        "metadata.annotations[kai.scheduler/topology-preferred-placement]: inside one domain "
        "of topology.kubernetes.io/zone, Muster keeps the pods in as few domains of each lower "
        "level as it can: the preferred level adds nothing to that",
        "PodGroup team-a/pg-train: spec.subGroups[0].topologyConstraint: Muster places a group "
        "by one request; sub-groups of it are not placed apart yet",
    ]


def hypernode(name: str, tier: int, members: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name},
        "spec": {"tier": tier, "members": members},
    }


def by_label(key: str, value: str) -> dict[str, Any]:
    return {"type": "Node", "selector": {"labelMatch": {"matchLabels": {key: value}}}}


def of_hypernodes(*names: str) -> list[dict[str, Any]]:
    return [{"type": "HyperNode", "selector": {"exactMatch": {"name": n}}} for n in names]


VOLCANO = [
    {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "ai"},
        "spec": {"weight": 1},
    },
    {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "hard", "namespace": "ml"},
        "spec": {
            "queue": "ai",
            "minMember": 1,
            "networkTopology": {"mode": "hard", "highestTierAllowed": 2},
        },
    },
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "hard-0",
            "namespace": "ml",
            "annotations": {"scheduling.k8s.io/group-name": "hard"},
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    },
    {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "soft", "namespace": "ml"},
        "spec": {
            "queue": "ai",
            "networkTopology": {"mode": "soft"},
            "tasks": [
                {
                    "name": "t0",
                    "replicas": 8,
                    "partitionPolicy": {
                        "totalPartitions": 2,
                        "partitionSize": 4,
                        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
                    },
                    "template": {
                        "spec": {
                            "containers": [{"name": "c0", "resources": {"requests": {"cpu": "4"}}}]
                        }
                    },
                }
            ],
        },
    },
]


def volcano_import(*docs: dict[str, Any]) -> ImportResult:
    return import_documents("volcano", [("in.yaml", [*VOLCANO, *docs])])


def test_volcano_hypernodes_chosen_by_a_node_label_become_a_topology() -> None:
    result = volcano_import(
        hypernode("s0", 1, [by_label(RACK, "r0")]),
        hypernode("s1", 1, [by_label(RACK, "r1")]),
        hypernode("s2", 2, [by_label(BLOCK, "b0")]),
        # Tier 3 holds HyperNodes, not nodes chosen by a label: it does not map.
        hypernode("s3", 3, of_hypernodes("s2")),
    )
    assert of_kind(result, "Topology")["hypernodes"]["spec"]["levels"] == [
        {"nodeLabel": BLOCK},
        {"nodeLabel": RACK},
    ]
    assert of_kind(result, "ResourceFlavor")["default"]["spec"]["topologyName"] == "hypernodes"
    # networkTopology by the rule the controller's intake follows.
    assert requests(result) == {"hard": [{"requiredTier": 2}], "soft": [{"preferredTier": 1}]}
    assert reported(result) == [
        "Job ml/soft: spec.tasks[0].partitionPolicy: Muster's slices name a level by its node "
        "label, not a HyperNode tier; write the task's pods as a Muster Workload with "
        "sliceRequiredTopology",
        "HyperNode s3: spec.members[0].type: a member of type HyperNode: Muster's Topology "
        "levels are node labels, so a tier of HyperNodes made of HyperNodes maps only once the "
        "nodes carry a label naming it",
    ]


def test_volcano_tiers_above_one_that_does_not_map_are_reported_not_renumbered() -> None:
    result = volcano_import(
        hypernode("s0", 1, [by_label(RACK, "r0")]),
        hypernode("s1", 2, of_hypernodes("s0")),
        hypernode("s2", 3, [by_label(BLOCK, "b0")]),
        hypernode("s4", 1, [by_label(RACK, "r1")]),
    )
    assert of_kind(result, "Topology")["hypernodes"]["spec"]["levels"] == [{"nodeLabel": RACK}]
    assert [r for r in reported(result) if r.startswith("HyperNode")] == [
        "HyperNode s1: spec.members[0].type: a member of type HyperNode: Muster's Topology "
        "levels are node labels, so a tier of HyperNodes made of HyperNodes maps only once the "
        "nodes carry a label naming it",
        "HyperNode s2: spec.tier: tier 2 does not map to a node label, so no tier above it "
        "does (mapping it would renumber the tiers)",
    ]


def test_volcano_hypernodes_choosing_nodes_by_name_map_to_nothing() -> None:
    result = volcano_import(
        hypernode(
            "s0", 1, [{"type": "Node", "selector": {"regexMatch": {"pattern": "^node-[0-3]$"}}}]
        ),
    )
    assert "Topology" not in {m["kind"] for m in result.manifests}
    assert "topologyName" not in of_kind(result, "ResourceFlavor")["default"]["spec"]
    assert (
        "HyperNode s0: spec.members[0].selector: chooses nodes by name: Muster's Topology "
        "levels are node labels, one value per domain; label the nodes instead"
    ) in reported(result)


def test_a_volcano_network_topology_muster_cannot_honour_is_refused_naming_the_field() -> None:
    group = {
        **VOLCANO[1],
        "spec": {
            **VOLCANO[1]["spec"],
            "networkTopology": {"mode": "hard", "highestTierAllowed": 12},
        },
    }
    with pytest.raises(ImportInputError) as error:
        import_documents("volcano", [("in.yaml", [VOLCANO[0], group, VOLCANO[2]])])
    assert (error.value.path, error.value.rule) == (
        "spec.networkTopology.highestTierAllowed",
        "tier 12 is beyond any Muster Topology, which has at most 8 levels",
    )


def nodes(per_rack: int) -> str:
    """Two blocks of two racks of `per_rack` nodes with 8 GPUs, in the flavor's node group."""
    docs = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"b{b}-r{r}-n{n}",
                "labels": {
                    BLOCK: f"b{b}",
                    RACK: f"b{b}-r{r}",
                    HOST: f"b{b}-r{r}-n{n}",
                    "cloud.provider.com/node-group": "tas-node-group",
                },
            },
            "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": "8", "pods": "110"}},
        }
        for b in range(2)
        for r in range(2)
        for n in range(per_rack)
    ]
    return "\n---\n" + yaml.safe_dump_all(docs)


@pytest.mark.parametrize("per_rack", [2, 4])
def test_an_imported_required_rack_decides_where_the_simulator_places(per_rack: int) -> None:
    """The Job asks for 4 pods of 8 GPUs in one rack: racks of 4 such nodes hold it; racks of
    2 never can, so it waits saying so, although the cluster has room for it twice over."""
    result = run(
        "kueue",
        KUEUE_QUEUES
        + kueue_job({"kueue.x-k8s.io/podset-required-topology": RACK})
        + nodes(per_rack),
    )
    (job,) = simulate(to_scenario(result, run_for=60.0)).jobs
    if per_rack == 4:
        assert job.admitted_at == 0.0
    else:
        assert job.admitted_at is None
        assert "no topology-rack of Topology default can ever hold" in job.last_pending_reason


def test_a_tier_mixing_labels_or_repeating_one_is_reported_and_ends_the_levels() -> None:
    mixed = volcano_import(
        hypernode("s0", 1, [by_label(RACK, "r0")]),
        hypernode("s1", 1, [by_label("example.com/nvlink", "nv0")]),
    )
    assert "Topology" not in {m["kind"] for m in mixed.manifests}
    assert (
        f"HyperNode s0: spec.members: tier 1 mixes node labels {RACK}, example.com/nvlink"
    ) in reported(mixed)
    repeated = volcano_import(
        hypernode("s0", 1, [by_label(RACK, "r0")]),
        hypernode("s1", 2, [by_label(RACK, "r0")]),
    )
    assert of_kind(repeated, "Topology")["hypernodes"]["spec"]["levels"] == [{"nodeLabel": RACK}]
    assert (
        f"HyperNode s1: spec.members: tier 2 repeats the node label {RACK} of a lower tier"
    ) in reported(repeated)
