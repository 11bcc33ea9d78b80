"""The Muster side of every import: queue drafts checked as a tree, weights made whole
numbers, manifests validated against Muster's own models, and the cluster state (Nodes,
PriorityClasses) every source shares."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from quota.api import API_VERSION, ManifestError, parse_manifest, wire
from quota.api.meta import INT32_MAX, INT32_MIN
from quota.importers.reader import SourceObject
from quota.importers.report import ImportInputError, Origin, Unmapped, refuse
from quota.manifests.documents import MAX_TREE_DEPTH
from quota.model.nodeconvert import node_from_manifest

MAX_WEIGHT = 1_000_000  # ClusterQueueSpec.over_quota_weight's bound
DEFAULT_FLAVOR = "default"  # KAI and Volcano queues have no flavors: one for the whole cluster


@dataclass
class QueueDraft:
    """A ClusterQueue to be: its source, its parent (and the source field naming it), its
    spec in Muster's wire form, and its weight before scaling to whole numbers."""

    name: str
    origin: Origin
    parent: str | None = None
    parent_path: str = ""
    weight: Fraction = Fraction(1)
    weight_path: str = ""
    spec: dict[str, Any] = field(default_factory=dict)


def ordered(drafts: Mapping[str, QueueDraft]) -> list[QueueDraft]:
    """The drafts parents first; refuse a missing parent, a cycle or a tree too deep."""
    for draft in drafts.values():
        if draft.parent is not None and draft.parent not in drafts:
            refuse(
                draft.origin,
                draft.parent_path,
                f"parent {draft.parent!r} is not defined in the files given",
            )
    depth: dict[str, int] = {}
    for draft in drafts.values():
        chain: list[str] = []
        name: str | None = draft.name
        while name is not None and name not in depth:
            if name in chain:
                loop = [*chain[chain.index(name) :], name]
                culprit = drafts[name]
                refuse(
                    culprit.origin,
                    culprit.parent_path,
                    f"parents form a cycle: {' -> '.join(loop)}",
                )
            chain.append(name)
            name = drafts[name].parent
        below = depth[name] if name is not None else 0
        for offset, queue in enumerate(reversed(chain)):
            depth[queue] = below + offset + 1
            if depth[queue] > MAX_TREE_DEPTH:
                culprit = drafts[queue]
                refuse(
                    culprit.origin,
                    culprit.parent_path,
                    f"the queue is {depth[queue]} levels deep; Muster's queue tree has at most "
                    f"{MAX_TREE_DEPTH} levels",
                )
    return sorted(drafts.values(), key=lambda d: (depth[d.name], d.name))


def whole_weights(drafts: Iterable[QueueDraft], unmapped: list[Unmapped]) -> dict[str, int]:
    """Over-quota weights as Muster's whole numbers: every weight multiplied by the smallest
    power of ten that makes them all whole (only ratios among siblings matter, and 0 stays
    0). Weights that still are not whole at the largest usable factor are rounded (a
    positive weight never to 0) and reported."""
    drafts = list(drafts)
    weights = {d.name: d.weight for d in drafts}
    largest = max(weights.values(), default=Fraction(1)) or Fraction(1)
    factor = 1
    while factor < MAX_WEIGHT and any((w * factor).denominator != 1 for w in weights.values()):
        if largest * factor * 10 > MAX_WEIGHT:
            break
        factor *= 10
    scale = Fraction(MAX_WEIGHT) / largest if largest * factor > MAX_WEIGHT else Fraction(factor)
    out: dict[str, int] = {}
    for draft in drafts:
        exact = draft.weight * scale
        whole = round(exact)
        if draft.weight > 0:
            whole = max(whole, 1)
        if whole != exact:
            unmapped.append(
                Unmapped(
                    draft.origin,
                    draft.weight_path,
                    f"weight {float(draft.weight):g} is not a whole multiple of the others at "
                    f"Muster's precision: imported as {whole} (x{float(scale):g})",
                )
            )
        out[draft.name] = whole
    if scale != 1 and drafts:
        # Said about the weight that made the scaling necessary (the largest, or a fraction).
        first = next((d for d in drafts if d.weight.denominator != 1), None) or max(
            drafts, key=lambda d: d.weight
        )
        unmapped.append(
            Unmapped(
                first.origin,
                first.weight_path,
                f"Muster's over-quota weights are whole numbers: every imported weight is "
                f"multiplied by {float(scale):g} (ratios between siblings are unchanged)",
            )
        )
    return out


def manifest(origin: Origin, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """Validate a Muster object built from `origin` and return it as Kubernetes writes it.
    A value the source allows but Muster does not is refused naming the source object."""
    document = {"apiVersion": API_VERSION, "kind": kind, **body}
    try:
        written = wire(parse_manifest(document, origin.index))
    except ManifestError as error:
        path, rule = error.problems[0]
        raise ImportInputError(
            origin, "", f"cannot be expressed as a Muster {kind}: {path}: {rule}"
        ) from None
    # In the order people write manifests; the status is the controller's to write.
    order = ("apiVersion", "kind", "metadata", "spec")
    return {key: written[key] for key in order if key in written}


def cluster_queues(
    drafts: Mapping[str, QueueDraft], unmapped: list[Unmapped]
) -> list[dict[str, Any]]:
    """ClusterQueue manifests, parents first, with whole-number weights."""
    order = ordered(drafts)
    weights = whole_weights(order, unmapped)
    out = []
    for draft in order:
        spec = dict(draft.spec)
        if draft.parent is not None:
            spec["parent"] = draft.parent
        spec["overQuotaWeight"] = weights[draft.name]
        out.append(
            manifest(draft.origin, "ClusterQueue", {"metadata": {"name": draft.name}, "spec": spec})
        )
    return out


def local_queue(origin: Origin, namespace: str, name: str, cluster_queue: str) -> dict[str, Any]:
    return manifest(
        origin,
        "LocalQueue",
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    )


def priority_class(name: str, value: int, description: str = "") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
    if description:
        doc["description"] = description
    return doc


def priority_value(obj: SourceObject, path: str) -> int:
    value = obj.integer(obj.doc.get(path), path, low=INT32_MIN, high=INT32_MAX)
    if value is None:
        refuse(obj.origin, path, "required field is missing")
    return value


def whole_cluster_flavor(
    origin: Origin, nodes: Iterable[Mapping[str, Any]], topology: str | None = None
) -> dict[str, Any]:
    """The one flavor of a source without flavors (KAI, Volcano): every node, forming
    `topology` if one is given. Muster counts a flavor's capacity on the nodes carrying its
    labels, so the flavor takes the labels all the files' Nodes share (none without Nodes:
    quota-only mode)."""
    common: dict[str, str] | None = None
    for node in nodes:
        meta = node.get("metadata")
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        labels = labels if isinstance(labels, Mapping) else {}
        current = {str(k): str(v) for k, v in labels.items()}
        common = (
            current if common is None else {k: v for k, v in common.items() if current.get(k) == v}
        )
    spec: dict[str, Any] = {"nodeLabels": dict(sorted(common.items())[:16])} if common else {}
    if topology is not None:
        spec["topologyName"] = topology
    return manifest(origin, "ResourceFlavor", {"metadata": {"name": DEFAULT_FLAVOR}, "spec": spec})


class ClusterState:
    """Nodes and PriorityClasses, which every source's files may hold alongside the queues."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.priority_classes: dict[str, int] = {}
        self.default_class: str | None = None
        self.class_docs: list[dict[str, Any]] = []

    def take(self, obj: SourceObject) -> bool:
        """Keep `obj` if it is a Node or a PriorityClass (and pass over a Namespace);
        whether it was one of those."""
        if obj.api_version == "v1" and obj.kind == "Namespace":
            return True  # LocalQueues carry their namespace; nothing else to keep
        if obj.api_version == "v1" and obj.kind == "Node":
            if not obj.name:  # the getter refuses a missing or malformed name
                return False
            try:
                node_from_manifest(obj.doc, index=obj.origin.index)
            except ManifestError as error:
                path, rule = error.problems[0]
                refuse(obj.origin, path, rule)
            status = obj.mapping(obj.doc.get("status"), "status")
            allocatable = obj.quantities(status.get("allocatable"), "status.allocatable")
            if not allocatable:
                refuse(obj.origin, "status.allocatable", "required: what the node offers to pods")
            if any(node["metadata"]["name"] == obj.name for node in self.nodes):
                refuse(obj.origin, "metadata.name", f"Node {obj.name} is defined twice")
            self.nodes.append(dict(obj.doc))
            return True
        if obj.api_version == "scheduling.k8s.io/v1" and obj.kind == "PriorityClass":
            self.add_class(obj, priority_value(obj, "value"), obj.doc.get("globalDefault"))
            self.class_docs.append(priority_class(obj.name, self.priority_classes[obj.name]))
            return True
        return False

    def add_class(self, obj: SourceObject, value: int, default: object = None) -> None:
        name = obj.name
        if name in self.priority_classes:
            refuse(obj.origin, "metadata.name", f"a priority class {name!r} is defined twice")
        self.priority_classes[name] = value
        if obj.boolean(default, "globalDefault", False):
            if self.default_class is not None:
                refuse(
                    obj.origin,
                    "globalDefault",
                    f"PriorityClass {self.default_class} is already the default",
                )
            self.default_class = name
