"""Muster's API (group muster.dev, version v1alpha1) as pydantic models, the single source of
truth for the CRDs, the controller and the simulator.

``parse_manifest`` turns one decoded YAML/JSON document into the matching model, or raises a
``ManifestError`` that names the document, the object, the field and the rule broken.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from quota.api.clusterqueue import (
    ClusterQueue,
    ClusterQueueSpec,
    ClusterQueueStatus,
    FlavorQuota,
    Preemption,
    usage_summary,
)
from quota.api.conditions import (
    ClusterQueueConditions,
    Condition,
    PodGroupConditions,
    WorkloadConditions,
    find_condition,
    is_true,
    set_condition,
)
from quota.api.localqueue import LocalQueue, LocalQueueSpec, LocalQueueStatus
from quota.api.meta import API_VERSION, GROUP, VERSION, ApiObject, ObjectMeta, wire
from quota.api.podgroup import PodGroup, PodGroupSpec, PodGroupStatus
from quota.api.quantity import (
    QuantityError,
    format_quantity,
    format_resource_list,
    parse_quantity,
    parse_resource_list,
)
from quota.api.resourceflavor import ResourceFlavor, ResourceFlavorSpec
from quota.api.topology import Topology, TopologyRequest, TopologySpec
from quota.api.workercluster import Dispatch, WorkerCluster, WorkerClusterSpec
from quota.api.workload import (
    Admission,
    PodSet,
    PodSetAssignment,
    RequeueState,
    Workload,
    WorkloadSpec,
    WorkloadStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "VERSION",
    "Admission",
    "ApiObject",
    "ClusterQueue",
    "ClusterQueueConditions",
    "ClusterQueueSpec",
    "ClusterQueueStatus",
    "Condition",
    "Dispatch",
    "FlavorQuota",
    "LocalQueue",
    "LocalQueueSpec",
    "LocalQueueStatus",
    "ManifestError",
    "MusterObject",
    "ObjectMeta",
    "PodGroup",
    "PodGroupConditions",
    "PodGroupSpec",
    "PodGroupStatus",
    "PodSet",
    "PodSetAssignment",
    "Preemption",
    "QuantityError",
    "RequeueState",
    "ResourceFlavor",
    "ResourceFlavorSpec",
    "Topology",
    "TopologyRequest",
    "TopologySpec",
    "WorkerCluster",
    "WorkerClusterSpec",
    "Workload",
    "WorkloadConditions",
    "WorkloadSpec",
    "WorkloadStatus",
    "find_condition",
    "format_quantity",
    "format_resource_list",
    "is_true",
    "parse_manifest",
    "parse_quantity",
    "parse_resource_list",
    "set_condition",
    "usage_summary",
    "wire",
]

MusterObject = (
    ResourceFlavor | ClusterQueue | LocalQueue | Workload | PodGroup | Topology | WorkerCluster
)

KINDS: dict[str, type[MusterObject]] = {
    "ResourceFlavor": ResourceFlavor,
    "ClusterQueue": ClusterQueue,
    "LocalQueue": LocalQueue,
    "Workload": Workload,
    "PodGroup": PodGroup,
    "Topology": Topology,
    "WorkerCluster": WorkerCluster,
}
"""Every kind Muster serves, by kind name (all in API_VERSION)."""


def _join(path: str, rule: str) -> str:
    # Rules about one entry of a mapping start with its key ("[nvidia.com/gpu]: ...").
    if rule.startswith("["):
        return f"{path}{rule}"
    return f"{path}: {rule}" if path else rule


class ManifestError(ValueError):
    """A manifest that is not a valid Muster object. ``problems`` holds one
    ``(field path, rule)`` pair per violation; the message lists them all."""

    def __init__(self, index: int, subject: str, problems: list[tuple[str, str]]) -> None:
        self.index = index
        self.subject = subject
        self.problems = problems
        lines = [_join(path, rule) for path, rule in problems]
        head = f"document {index} ({subject})"
        body = lines[0] if len(lines) == 1 else "\n  " + "\n  ".join(lines)
        super().__init__(f"{head}: {body}")


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif "." in part or "/" in part:
            text += f"[{part}]"  # resource and flavor names such as nvidia.com/gpu
        else:
            text += f".{part}" if text else part
    return text


def _rule(error: ErrorDetails) -> str:
    kind = error["type"]
    message = error["msg"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (check the spelling against docs/api.md)"
    if kind in ("value_error", "assertion_error"):
        return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "string_pattern_mismatch":
        return f"{error['input']!r} is not a valid name or value ({message})"
    if kind in ("literal_error", "enum"):
        return f"{message} (got {error['input']!r})"
    if kind.startswith(("greater_than", "less_than", "too_", "string_too")):
        return f"{message} (got {error['input']!r})"
    return message


def _subject(doc: Mapping[str, Any]) -> str:
    kind = doc.get("kind") or "object without kind"
    metadata = doc.get("metadata")
    name = namespace = None
    if isinstance(metadata, Mapping):
        name = metadata.get("name") or metadata.get("generateName")
        namespace = metadata.get("namespace")
    if not name:
        return str(kind)
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def parse_manifest(doc: Mapping[str, Any], index: int) -> MusterObject:
    """Build the model for one decoded manifest, chosen by apiVersion and kind.

    ``index`` is the document's position in its file and appears in every error message.
    Raises ManifestError for anything that is not a valid Muster object, including kinds
    Muster does not serve.
    """
    if not isinstance(doc, Mapping):
        raise ManifestError(index, "document", [("", "expected a mapping (a Kubernetes object)")])
    subject = _subject(doc)
    api_version = doc.get("apiVersion")
    kind = doc.get("kind")
    if api_version != API_VERSION:
        group = str(api_version).split("/")[0] if api_version else ""
        rule = (
            f"unsupported apiVersion {api_version!r} (Muster serves {API_VERSION})"
            if group == GROUP
            else f"apiVersion {api_version!r} is not a Muster API (expected {API_VERSION})"
        )
        raise ManifestError(index, subject, [("apiVersion", rule)])
    model = KINDS.get(str(kind))
    if model is None:
        known = ", ".join(KINDS)
        raise ManifestError(index, subject, [("kind", f"unknown kind {kind!r} (one of {known})")])
    try:
        return model.model_validate(doc)
    except ValidationError as error:
        problems = [(_path(e["loc"]), _rule(e)) for e in error.errors(include_url=False)]
        raise ManifestError(index, subject, problems) from None
