"""A `muster simulate` scenario turned into what a real cluster needs to play it.

The same file that the simulator runs in simulated time is played by `muster up` in real
time: its organisation (Namespaces, PriorityClasses, ResourceFlavors, ClusterQueues,
LocalQueues) is applied as is, its Nodes and NodePools become kwok nodes, and its Jobs,
generated workloads and ScaleEvents become timed actions against the apiserver. A Job's
`muster.dev/run-for` becomes kwok's completion delay on its pods, so a pod runs for that long
once it is Running — the simulator's meaning of run-for.

Pure: decoded YAML documents in, manifests and timed actions out. The scenario is checked by
the simulator's own parser first, so a file that `muster simulate` refuses is refused here
with the same message.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from quota.api import ManifestError
from quota.api.names import QUEUE_LABEL
from quota.api.quantity import format_quantity
from quota.simulation.scenario import (
    NodePool,
    ScaleEvent,
    WorkloadGenerator,
    parse_scenario,
)

# kwok's stages (controllers/localcluster/stages.yaml) read these.
COMPLETE_DELAY_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"

# Applied before anything refers to them, in this order.
ORGANISATION_KINDS = ("Namespace", "PriorityClass", "ResourceFlavor", "ClusterQueue", "LocalQueue")


@dataclass(frozen=True)
class Action:
    """Something the player does `at` seconds after it starts."""

    at: float
    verb: str  # "create" (a Job) or "scale" (an elastic Job's parallelism)
    namespace: str
    name: str
    job: Mapping[str, Any] | None = None
    parallelism: int = 0

    def describe(self) -> str:
        if self.verb == "scale":
            pods = "pod" if self.parallelism == 1 else "pods"
            return f"scaled {self.namespace}/{self.name} to {self.parallelism} {pods}"
        return f"submitted {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Plan:
    """What playing a scenario takes: the organisation, the nodes, the timed actions."""

    name: str
    organisation: tuple[Mapping[str, Any], ...]
    nodes: tuple[Mapping[str, Any], ...]
    actions: tuple[Action, ...] = field(default=())

    def duration(self) -> float:
        return max((a.at for a in self.actions), default=0.0)


def _go_duration(seconds: float) -> str:
    """Seconds as a Go duration kwok parses ("90s", "1500ms")."""
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _seconds(value: timedelta) -> float:
    return value.total_seconds()


def _kwok_node(
    name: str, labels: Mapping[str, str], allocatable: Mapping[str, str]
) -> dict[str, Any]:
    capacity = {"pods": "110", **allocatable}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            # kwok manages only nodes carrying this annotation.
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def _node(doc: Mapping[str, Any]) -> dict[str, Any]:
    meta = doc.get("metadata") or {}
    status = doc.get("status") or {}
    allocatable = {str(k): str(v) for k, v in (status.get("allocatable") or {}).items()}
    node = _kwok_node(str(meta["name"]), meta.get("labels") or {}, allocatable)
    node["spec"] = copy.deepcopy(dict(doc.get("spec") or {}))  # taints, unschedulable
    return node


def _pool_nodes(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    pool = NodePool.model_validate(doc)
    allocatable = {r: format_quantity(v, r) for r, v in pool.spec.allocatable.items()}
    return [
        _kwok_node(f"{pool.metadata.name}-{i}", pool.spec.labels, allocatable)
        for i in range(pool.spec.count)
    ]


_OVERCOMMITTABLE = ("cpu", "memory", "ephemeral-storage")


def _fit_for_the_apiserver(pod_spec: Mapping[str, Any]) -> None:
    """What a simulator file may leave out and the apiserver requires: quantities as strings
    (`cpu: 8` in YAML is an int), and a limit equal to the request for extended resources
    such as nvidia.com/gpu (they cannot be overcommitted)."""
    for key in ("containers", "initContainers"):
        for container in pod_spec.get(key) or []:
            resources = container.get("resources")
            if not isinstance(resources, dict):
                continue
            for part in ("requests", "limits"):
                amounts = resources.get(part)
                if isinstance(amounts, dict):
                    resources[part] = {r: str(a) for r, a in amounts.items()}
            limits = resources.setdefault("limits", {})
            for resource, amount in (resources.get("requests") or {}).items():
                extended = resource not in _OVERCOMMITTABLE and not resource.startswith(
                    "hugepages-"
                )
                if extended:
                    limits.setdefault(resource, amount)
            if not limits:
                del resources["limits"]


def _job(doc: Mapping[str, Any], run_for: float) -> dict[str, Any]:
    job = copy.deepcopy(dict(doc))
    template = job.setdefault("spec", {}).setdefault("template", {})
    _fit_for_the_apiserver(template.get("spec") or {})
    annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[COMPLETE_DELAY_ANNOTATION] = _go_duration(run_for)
    template.setdefault("spec", {}).setdefault("restartPolicy", "Never")
    return job


def _generated(
    index: int, doc: Mapping[str, Any], local_queues: Sequence[tuple[str, str]]
) -> list[Action]:
    generator = WorkloadGenerator.model_validate(doc)
    targets = (
        list(local_queues)
        if generator.spec.all_local_queues
        else [tuple(t.split("/", 1)) for t in generator.spec.targets]
    )
    actions: list[Action] = []
    for cls in generator.spec.classes:
        if cls.priority is not None:
            raise ManifestError(
                index,
                f"WorkloadGenerator {generator.metadata.name}",
                [
                    (
                        f"spec.classes[{cls.name}].priority",
                        "a played scenario gives priority through priorityClassName "
                        "(a cluster has no bare priorities)",
                    )
                ],
            )
        requests = {r: format_quantity(v, r) for r, v in cls.requests.items()}
        runtime = _seconds(cls.runtime)
        for namespace, queue in targets:
            for i in range(cls.count):
                name = f"{generator.metadata.name}-{cls.name}-{i}"
                pod_spec: dict[str, Any] = {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "workload:latest",
                            "resources": {"requests": requests},
                        }
                    ],
                }
                if cls.priority_class_name:
                    pod_spec["priorityClassName"] = cls.priority_class_name
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "labels": {QUEUE_LABEL: queue},
                    },
                    "spec": {
                        "parallelism": cls.pods,
                        "completions": cls.pods,
                        "backoffLimit": 0,
                        "template": {"spec": pod_spec},
                    },
                }
                at = _seconds(cls.start_at) + i * _seconds(cls.interval)
                actions.append(Action(at, "create", namespace, name, job=_job(job, runtime)))
    return actions


def plan_scenario(docs: Sequence[Any], name: str = "scenario") -> Plan:
    """Check a scenario as `muster simulate` does, then turn it into a Plan.

    Raises ManifestError (naming the document, the object, the field and the rule)."""
    scenario = parse_scenario(docs, name)
    organisation: dict[str, list[Mapping[str, Any]]] = {k: [] for k in ORGANISATION_KINDS}
    nodes: list[Mapping[str, Any]] = []
    actions: list[Action] = []
    generators: list[tuple[int, Mapping[str, Any]]] = []
    jobs = {spec.key: spec for spec in scenario.jobs}
    namespaces: set[str] = set()
    for index, doc in enumerate(docs):
        if not isinstance(doc, Mapping):
            continue  # empty documents; parse_scenario refused anything else
        kind = str(doc.get("kind"))
        meta = doc.get("metadata") or {}
        if kind in organisation:
            organisation[kind].append(doc)
            if kind == "LocalQueue":
                namespaces.add(str(meta.get("namespace") or "default"))
        elif kind == "Node":
            nodes.append(_node(doc))
        elif kind == "NodePool":
            nodes.extend(_pool_nodes(doc))
        elif kind == "WorkloadGenerator":
            generators.append((index, doc))
        elif kind == "ScaleEvent":
            event = ScaleEvent.model_validate(doc)
            namespace, job_name = event.spec.job.split("/", 1)
            actions.append(
                Action(
                    _seconds(event.spec.at),
                    "scale",
                    namespace,
                    job_name,
                    parallelism=event.spec.parallelism,
                )
            )
        elif kind == "Job":
            namespace = str(meta.get("namespace") or "default")
            spec = jobs[f"{namespace}/{meta.get('name')}"]
            actions.append(
                Action(
                    spec.submit_at,
                    "create",
                    namespace,
                    str(meta["name"]),
                    job=_job(doc, spec.run_for),
                )
            )
            namespaces.add(namespace)
    local_queues = sorted(scenario.local_queues)
    for index, doc in generators:
        generated = _generated(index, doc, local_queues)
        actions.extend(generated)
        namespaces.update(a.namespace for a in generated)
    declared = {str((d.get("metadata") or {}).get("name")) for d in organisation["Namespace"]}
    organisation["Namespace"].extend(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        for ns in sorted(namespaces - declared)
    )
    # Creates before scales at the same instant, so a Job exists before it is resized.
    actions.sort(key=lambda a: (a.at, a.verb != "create", a.namespace, a.name))
    return Plan(
        name=scenario.settings.name,
        organisation=tuple(d for k in ORGANISATION_KINDS for d in organisation[k]),
        nodes=tuple(nodes),
        actions=tuple(actions),
    )
