"""A file of manifests, read: every document checked and filed by kind, and the parts of a
snapshot any such file describes (priority classes, queues, flavors, node capacity).

A scenario for `muster simulate` (quota.simulation.scenario) and a cluster file for
`muster fairshare` / `muster admit` (cluster.py) are both read here. Everything is pure:
decoded YAML documents in, models and frozen values out, or a ManifestError naming the
document index, the object, the field and the rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_core import ErrorDetails

from quota.api import KINDS, ManifestError, parse_manifest
from quota.api.clusterqueue import ClusterQueue
from quota.api.localqueue import LocalQueue
from quota.api.meta import DNS_SUBDOMAIN
from quota.api.quantity import QuantityError, parse_quantity
from quota.api.queuetree import check_queue_tree
from quota.api.resourceflavor import ResourceFlavor
from quota.api.topology import Topology
from quota.api.workload import Workload as WorkloadModel
from quota.model import convert
from quota.model.nodeconvert import node_from_manifest
from quota.model.nodes import Node
from quota.model.queues import queue_specs
from quota.model.resources import FlavorResource
from quota.model.snapshot import Flavor, QueueSpec

MAX_TREE_DEPTH = 32  # levels of ClusterQueues, far more than any organisation has
_DNS = re.compile(DNS_SUBDOMAIN)

# Cross-object rules the tree check reports that make a file unusable (as opposed to
# Stopped, which is a legitimate state to simulate or to ask about).
_BROKEN_TREE = {"Cycle": "spec.parent", "ParentNotFound": "spec.parent"}


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int) or "." in part or "/" in part:
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _rule(error: ErrorDetails) -> str:
    if error["type"] == "missing":
        return "required field is missing"
    if error["type"] == "extra_forbidden":
        return "unknown field (check the spelling; the files in examples/ use every field)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] not in ("value_error", "missing"):
        message += f" (got {error['input']!r})"
    return message


def problem(error: ErrorDetails) -> tuple[str, str]:
    """A pydantic error as (field path, rule)."""
    path, rule = _path(error["loc"]), _rule(error)
    if rule.startswith("[") and "]: " in rule:
        # A rule about one entry of a mapping starts with its key: "[nvidia.com/gpu]: ...".
        entry, _, rule = rule.partition(": ")
        path += entry
    return path, rule


def subject(doc: Mapping[str, Any]) -> str:
    """How an error names the object: its kind, namespace and name."""
    kind = doc.get("kind") or "object without kind"
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name")
    if not name:
        return str(kind)
    namespace = meta.get("namespace")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def invalid(index: int, doc: Mapping[str, Any], path: str, rule: str) -> ManifestError:
    """The error for one broken rule of document `index`."""
    return ManifestError(index, subject(doc), [(path, rule)])


@dataclass
class Documents:
    """Documents filed by kind, each with its index in the file."""

    flavors: list[tuple[int, ResourceFlavor]] = field(default_factory=list)
    topologies: list[tuple[int, Topology]] = field(default_factory=list)
    cluster_queues: list[tuple[int, ClusterQueue]] = field(default_factory=list)
    local_queues: list[tuple[int, LocalQueue]] = field(default_factory=list)
    workloads: list[tuple[int, WorkloadModel]] = field(default_factory=list)
    priority_classes: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    nodes: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    jobs: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    raw: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    # (kind, namespace, name) -> the index of the document that defines it
    seen: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def remember(self, key: tuple[str, str, str], index: int, doc: Mapping[str, Any]) -> None:
        """Note that document `index` defines `key`; raise if another one did already."""
        if key in self.seen:
            raise invalid(
                index,
                doc,
                "metadata.name",
                f"duplicate: document {self.seen[key]} already defines {key[0]} "
                + (f"{key[1]}/{key[2]}" if key[1] else key[2]),
            )
        self.seen[key] = index


# Files the kinds read here do not know: (the documents so far, index, document).
OtherKinds = Callable[[Documents, int, Mapping[str, Any]], None]

# Kubernetes kinds a scenario or cluster file may hold, with the apiVersion each must have.
_CORE_KINDS_BY_KIND = {
    "Namespace": "v1",
    "Node": "v1",
    "PriorityClass": "scheduling.k8s.io/v1",
    "Job": "batch/v1",
}


def _name_of(doc: Mapping[str, Any], index: int, namespaced: bool) -> tuple[str, str]:
    """The namespace and name of a Kubernetes object, checked as the apiserver checks them."""
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise invalid(index, doc, "metadata.name", "required field is missing")
    fields = [("metadata.name", meta["name"])]
    if namespaced and meta.get("namespace") is not None:
        fields.append(("metadata.namespace", meta["namespace"]))
    for path, value in fields:
        limit = 63 if path == "metadata.namespace" else 253
        if not isinstance(value, str) or len(value) > limit or not _DNS.fullmatch(value):
            raise invalid(
                index,
                doc,
                path,
                f"{value!r} is not a valid name: lower-case letters, digits, '-' and '.', "
                f"starting and ending with a letter or digit, at most {limit} characters",
            )
    for field_name in ("labels", "annotations"):
        value = meta.get(field_name)
        if value is not None and not (
            isinstance(value, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            raise invalid(
                index, doc, f"metadata.{field_name}", "must be a mapping of strings to strings"
            )
    namespace = str(meta.get("namespace") or ("default" if namespaced else ""))
    return namespace, str(meta["name"])


def read_documents(
    docs: Sequence[Any], accepted: frozenset[str], tool: str, other: OtherKinds | None = None
) -> Documents:
    """Validate each document of a kind `tool` accepts and file it by kind; names unique.

    Kinds neither Kubernetes' nor Muster's (a scenario's own) go to `other`, in file order."""
    out = Documents()
    for index, doc in enumerate(docs):
        if doc is None:
            continue  # an empty document (a stray "---") is not an object
        if not isinstance(doc, Mapping):
            raise ManifestError(index, "document", [("", "expected a mapping (a manifest)")])
        kind = str(doc.get("kind") or "")
        api_version = str(doc.get("apiVersion") or "")
        if kind not in accepted:
            raise invalid(
                index,
                doc,
                "kind",
                f"kind {kind!r} is not accepted by {tool} (one of {', '.join(sorted(accepted))})",
            )
        out.raw[index] = doc
        if kind not in _CORE_KINDS_BY_KIND and kind not in KINDS and other is not None:
            other(out, index, doc)
            continue
        if kind in _CORE_KINDS_BY_KIND:
            expected = _CORE_KINDS_BY_KIND[kind]
            if api_version != expected:
                raise invalid(index, doc, "apiVersion", f"{kind} needs apiVersion {expected}")
            namespaced = kind == "Job"
            namespace, name = _name_of(doc, index, namespaced)
            out.remember((kind, namespace, name), index, doc)
            if kind == "Node":
                _check_node(index, doc)
                out.nodes.append((index, doc))
            elif kind == "PriorityClass":
                _check_priority_class(index, doc)
                out.priority_classes.append((index, doc))
            elif kind == "Job":
                out.jobs.append((index, doc))
            continue
        model = parse_manifest(doc, index)
        namespace = model.metadata.namespace or ""
        if isinstance(model, LocalQueue | WorkloadModel):
            namespace = namespace or "default"
        if not model.name:
            raise invalid(index, doc, "metadata.name", "required field is missing")
        out.remember((kind, namespace, model.name), index, doc)
        if isinstance(model, ResourceFlavor):
            out.flavors.append((index, model))
        elif isinstance(model, Topology):
            out.topologies.append((index, model))
        elif isinstance(model, ClusterQueue):
            out.cluster_queues.append((index, model))
        elif isinstance(model, LocalQueue):
            out.local_queues.append((index, model))
        elif isinstance(model, WorkloadModel):
            out.workloads.append((index, model))
    return out


def _check_node(index: int, doc: Mapping[str, Any]) -> None:
    node_from_manifest(doc, index=index)  # the type of every field placement reads
    status = doc.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping) or not allocatable:
        raise invalid(index, doc, "status.allocatable", "required: what the node offers to pods")
    for resource, value in allocatable.items():
        try:
            parse_quantity(value, str(resource))
        except QuantityError as error:
            raise invalid(
                index, doc, f"status.allocatable[{resource}]", str(error).split(": ", 1)[-1]
            ) from None


def _check_priority_class(index: int, doc: Mapping[str, Any]) -> None:
    value = doc.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(index, doc, "value", f"required: a whole number (got {value!r})")


def priority_classes(docs: Documents) -> tuple[dict[str, int], str | None]:
    """Each PriorityClass's value by name, and the global default's name, if one is."""
    classes: dict[str, int] = {}
    default: str | None = None
    for index, doc in docs.priority_classes:
        name = str(doc["metadata"]["name"])
        classes[name] = int(doc["value"])
        if doc.get("globalDefault"):
            if default is not None:
                raise invalid(
                    index, doc, "globalDefault", f"PriorityClass {default} is already the default"
                )
            default = name
    return classes, default


def _check_depth(docs: Documents) -> None:
    """Refuse a queue tree deeper than MAX_TREE_DEPTH (before the tree checks, whose cost
    grows with the square of the depth). Cycles and missing parents are the tree check's."""
    parents = {cq.name: cq.spec.parent for _, cq in docs.cluster_queues}
    depth: dict[str, int] = {}
    for index, cq in docs.cluster_queues:
        chain: list[str] = []
        name: str | None = cq.name
        while name is not None and name in parents and name not in depth:
            if name in chain:
                break  # a cycle: reported by the tree check
            chain.append(name)
            name = parents[name]
        below = depth.get(name, 0) if name is not None else 0
        for offset, queue in enumerate(reversed(chain)):
            depth[queue] = below + offset + 1
        if depth.get(cq.name, 0) > MAX_TREE_DEPTH:
            raise invalid(
                index,
                docs.raw[index],
                "spec.parent",
                f"the queue is {depth[cq.name]} levels deep; a queue tree has at most "
                f"{MAX_TREE_DEPTH} levels",
            )


def queues(docs: Documents) -> tuple[dict[str, QueueSpec], dict[tuple[str, str], str]]:
    """The snapshot's queues, and each LocalQueue's ClusterQueue by (namespace, name); raise
    on what makes the file unusable."""
    _check_depth(docs)
    cluster_queues = [cq for _, cq in docs.cluster_queues]
    tree = check_queue_tree(
        cluster_queues, [rf for _, rf in docs.flavors], [lq for _, lq in docs.local_queues]
    )
    for index, cq in docs.cluster_queues:
        state = tree.cluster_queues[cq.name]
        if not state.active and state.reason in _BROKEN_TREE:
            raise invalid(index, docs.raw[index], _BROKEN_TREE[state.reason], state.message)
        if not state.active and state.reason == "FlavorNotFound":
            known = {rf.name for _, rf in docs.flavors}
            position = next(i for i, f in enumerate(cq.spec.flavors) if f.name not in known)
            raise invalid(index, docs.raw[index], f"spec.flavors[{position}].name", state.message)
    specs = queue_specs(cluster_queues, tree)
    local: dict[tuple[str, str], str] = {}
    for index, lq in docs.local_queues:
        key = (lq.metadata.namespace or "default", lq.name)
        lq_state = tree.local_queues.get((lq.metadata.namespace or "", lq.name))
        target = lq.spec.cluster_queue
        if target not in specs:
            raise invalid(
                index,
                docs.raw[index],
                "spec.clusterQueue",
                f"ClusterQueue {target!r} does not exist",
            )
        if lq_state is not None and lq_state.reason == "ClusterQueueNotLeaf":
            raise invalid(index, docs.raw[index], "spec.clusterQueue", lq_state.message)
        local[key] = target
    return specs, local


def flavors(docs: Documents) -> dict[str, Flavor]:
    """The ResourceFlavors as the engine sees them."""
    return {rf.name: convert.flavor(rf) for _, rf in docs.flavors}


def topologies(docs: Documents) -> dict[str, tuple[str, ...]]:
    """The Topologies as the engine sees them: name -> node labels, widest first.

    A flavor naming one the file does not define is not an error here: as in a cluster,
    the workloads that need the flavor wait, with a reason that names it."""
    return {t.name: t.spec.labels for _, t in docs.topologies}


def ready(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """`node`, Ready when written without conditions: writing the kubelet's status by hand
    is noise; a node written NotReady stays NotReady."""
    status = node.get("status") or {}
    if status.get("conditions"):
        return node
    return {**node, "status": {**status, "conditions": [{"type": "Ready", "status": "True"}]}}


DEFAULT_MAX_PODS = 110  # the kubelet's default, for nodes that do not say


def with_max_pods(node: Node) -> Node:
    """`node`, with room for the kubelet's default number of pods when it does not say."""
    if "pods" in node.allocatable:
        return node
    return replace(node, allocatable={**node.allocatable, "pods": DEFAULT_MAX_PODS})


def nodes(docs: Documents) -> tuple[Node, ...] | None:
    """The file's Nodes as placement sees them; None when it has none (quota-only)."""
    found = tuple(
        with_max_pods(node_from_manifest(ready(doc), index=index)) for index, doc in docs.nodes
    )
    return found or None


def capacity(
    docs: Documents,
    flavors: Mapping[str, Flavor],
    more_nodes: Sequence[Mapping[str, Any]] = (),
) -> dict[FlavorResource, int] | None:
    """What the file's Nodes (and `more_nodes`) provide per (flavor, resource); None when
    there are no nodes at all (quota-only)."""
    nodes = [ready(doc) for _, doc in docs.nodes] + list(more_nodes)
    if not nodes:
        return None
    return convert.node_capacity(nodes, flavors)
