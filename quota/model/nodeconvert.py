"""From decoded Kubernetes Nodes and Pods (camelCase dicts) to placement's types.

The shell's watch caches, the simulator and tests all go through these, so a Node means
the same to each of them. Quantities are parsed here, once, into base units. A malformed
value raises `ManifestError` naming the object, the field and the rule; the caller decides
whether to skip that object, and nothing else is lost because of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from quota.api import ManifestError
from quota.api.quantity import QuantityError, parse_quantity
from quota.model.nodes import (
    NAME_FIELD,
    OPERATORS,
    BoundPod,
    Node,
    Operator,
    PodShape,
    Requirement,
    SelectorTerm,
    Taint,
    TaintEffect,
    Toleration,
    label_integer,
)

_EFFECTS: tuple[TaintEffect, ...] = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_FINISHED = ("Succeeded", "Failed")


class _Fields:
    """Reads fields of one object and raises ManifestError naming it on a bad one."""

    def __init__(self, index: int, subject: str) -> None:
        self.index = index
        self.subject = subject

    def fail(self, path: str, rule: str) -> NoReturn:
        raise ManifestError(self.index, self.subject, [(path, rule)])

    def mapping(self, value: object, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, f"must be a mapping (got {type(value).__name__})")
        return value

    def items(self, value: object, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(path, f"must be a list (got {type(value).__name__})")
        return value

    def text(self, value: object, path: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            self.fail(path, f"must be a string (got {value!r})")
        return value

    def strings(self, value: object, path: str) -> dict[str, str]:
        out = {}
        for key, item in self.mapping(value, path).items():
            if not isinstance(key, str) or not isinstance(item, str):
                self.fail(f"{path}[{key}]", f"keys and values must be strings (got {item!r})")
            out[key] = item
        return out

    def quantities(self, value: object, path: str) -> dict[str, int]:
        out = {}
        for resource, raw in self.mapping(value, path).items():
            try:
                out[str(resource)] = parse_quantity(raw, str(resource), field=f"{path}[{resource}]")
            except QuantityError as error:
                where, _, rule = str(error).partition(": ")
                self.fail(where, rule)
        return out

    def requests(self, spec: Mapping[str, Any], path: str) -> dict[str, int]:
        try:
            return pod_requests(spec, path)
        except QuantityError as error:
            where, _, rule = str(error).partition(": ")
            self.fail(where, rule)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def node_from_manifest(node: Mapping[str, Any], *, index: int = 0) -> Node:
    """A Node: allocatable (else capacity), labels, taints, Ready condition, cordon."""
    name = _meta(node).get("name")
    f = _Fields(index, f"Node {name or '?'}")
    if not isinstance(name, str) or not name:
        f.fail("metadata.name", "required: the node's name")
    spec = f.mapping(node.get("spec"), "spec")
    status = f.mapping(node.get("status"), "status")
    # The kubelet reports both; allocatable is capacity less what the system reserves.
    if status.get("allocatable") is not None:
        allocatable = f.quantities(status.get("allocatable"), "status.allocatable")
    else:
        allocatable = f.quantities(status.get("capacity"), "status.capacity")
    taints = []
    for i, raw in enumerate(f.items(spec.get("taints"), "spec.taints")):
        path = f"spec.taints[{i}]"
        taint = f.mapping(raw, path)
        key = f.text(taint.get("key"), f"{path}.key")
        if not key:
            f.fail(f"{path}.key", "required: the taint's key")
        effect = _effect(taint.get("effect"))
        if effect is None:
            f.fail(
                f"{path}.effect",
                f"must be one of {', '.join(_EFFECTS)} (got {taint.get('effect')!r})",
            )
        taints.append(Taint(key, f.text(taint.get("value"), f"{path}.value"), effect))
    ready = False
    for i, raw in enumerate(f.items(status.get("conditions"), "status.conditions")):
        condition = f.mapping(raw, f"status.conditions[{i}]")
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
    unschedulable = spec.get("unschedulable") or False
    if not isinstance(unschedulable, bool):
        f.fail("spec.unschedulable", f"must be true or false (got {unschedulable!r})")
    return Node(
        name=name,
        allocatable=allocatable,
        labels=f.strings(_meta(node).get("labels"), "metadata.labels"),
        taints=tuple(taints),
        unschedulable=unschedulable,
        ready=ready,
    )


def bound_pod_from_manifest(pod: Mapping[str, Any], *, index: int = 0) -> BoundPod | None:
    """A Pod that holds room on a node; None when it is unbound or has finished.

    Requests are counted as kube-scheduler counts them: containers and sidecars, or the
    largest init container when that is more, plus the pod overhead.
    """
    meta = _meta(pod)
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
    f = _Fields(index, f"Pod {key}")
    spec = f.mapping(pod.get("spec"), "spec")
    node = f.text(spec.get("nodeName"), "spec.nodeName")
    phase = f.mapping(pod.get("status"), "status").get("phase")
    if not node or phase in _FINISHED:
        return None
    return BoundPod(key=key, node=node, requests=f.requests(spec, "spec"))


def _shaped(value: object, kind: type, where: str) -> Any:
    """`value` if it is of `kind` (None reads as empty); a QuantityError naming the field
    otherwise, which every caller of `pod_requests` already turns into a ManifestError."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        name = "a mapping" if kind is dict else "a list"
        raise QuantityError(f"{where}: must be {name} (got {type(value).__name__})")
    return value


def _container_requests(raw: object, where: str) -> dict[str, int]:
    container: Mapping[str, Any] = _shaped(raw, dict, where)
    resources = _shaped(container.get("resources"), dict, f"{where}.resources")
    # The apiserver defaults a missing request to the limit; so does the quota.
    merged = dict(_shaped(resources.get("limits"), dict, f"{where}.resources.limits"))
    merged.update(_shaped(resources.get("requests"), dict, f"{where}.resources.requests"))
    return {
        str(r): parse_quantity(v, str(r), field=f"{where}.resources[{r}]")
        for r, v in merged.items()
    }


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for r, v in more.items():
        into[r] = into.get(r, 0) + v


def pod_requests(pod_spec: Mapping[str, Any], where: str = "spec") -> dict[str, int]:
    """What one pod requests, as the scheduler counts it: the sum of its containers and
    sidecars, or its largest init container if that is more, plus the pod overhead.

    `where` prefixes the field path in errors (e.g. ``spec.template.spec``).
    """
    total: dict[str, int] = {}
    containers = _shaped(pod_spec.get("containers"), list, f"{where}.containers")
    for i, container in enumerate(containers):
        _add(total, _container_requests(container, f"{where}.containers[{i}]"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    inits = _shaped(pod_spec.get("initContainers"), list, f"{where}.initContainers")
    for i, container in enumerate(inits):
        requests = _container_requests(container, f"{where}.initContainers[{i}]")
        if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
            _add(sidecars, requests)
            continue
        # A regular init container runs next to the sidecars started before it.
        for r in set(requests) | set(sidecars):
            init_peak[r] = max(init_peak.get(r, 0), requests.get(r, 0) + sidecars.get(r, 0))
    _add(total, sidecars)
    for r, v in init_peak.items():
        total[r] = max(total.get(r, 0), v)
    overhead = _shaped(pod_spec.get("overhead"), dict, f"{where}.overhead")
    _add(
        total,
        {
            str(r): parse_quantity(v, str(r), field=f"{where}.overhead[{r}]")
            for r, v in overhead.items()
        },
    )
    return {r: v for r, v in total.items() if v > 0}


def pod_shape_from_spec(
    spec: Mapping[str, Any], *, subject: str = "Pod", where: str = "spec", index: int = 0
) -> PodShape:
    """What placement needs of a pod spec: requests, node selector, node affinity, tolerations.

    `subject` names the object in errors ("Job team-a/train") and `where` is the spec's
    path in it ("spec.template.spec"). Only required node affinity constrains placement;
    preferred affinity is a score, which the strategy replaces.
    """
    f = _Fields(index, subject)
    spec = f.mapping(spec, where)
    terms = _affinity_terms(f, spec.get("affinity"), f"{where}.affinity")
    tolerations = tuple(
        t
        for i, raw in enumerate(f.items(spec.get("tolerations"), f"{where}.tolerations"))
        if (t := _toleration(f, raw, f"{where}.tolerations[{i}]")) is not None
    )
    return PodShape(
        requests=f.requests(spec, where),
        node_selector=f.strings(spec.get("nodeSelector"), f"{where}.nodeSelector"),
        affinity=terms,
        tolerations=tolerations,
    )


def affinity_terms(
    affinity: object, *, subject: str = "Pod", where: str = "spec.affinity", index: int = 0
) -> tuple[SelectorTerm, ...]:
    """The required node affinity terms of a pod's `affinity` (core/v1 Affinity), () if none."""
    return _affinity_terms(_Fields(index, subject), affinity, where)


def _affinity_terms(f: _Fields, raw: object, where: str) -> tuple[SelectorTerm, ...]:
    affinity = f.mapping(raw, where)
    node_affinity = f.mapping(affinity.get("nodeAffinity"), f"{where}.nodeAffinity")
    path = f"{where}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return ()
    raw_terms = f.items(f.mapping(required, path).get("nodeSelectorTerms"), path)
    if not raw_terms:
        f.fail(f"{path}.nodeSelectorTerms", "must have at least one term")
    return tuple(
        _term(f, term, f"{path}.nodeSelectorTerms[{i}]") for i, term in enumerate(raw_terms)
    )


def _term(f: _Fields, raw: object, path: str) -> SelectorTerm:
    term = f.mapping(raw, path)
    requirements = [
        _requirement(f, item, f"{path}.matchExpressions[{i}]", field=False)
        for i, item in enumerate(f.items(term.get("matchExpressions"), f"{path}.matchExpressions"))
    ]
    requirements += [
        _requirement(f, item, f"{path}.matchFields[{i}]", field=True)
        for i, item in enumerate(f.items(term.get("matchFields"), f"{path}.matchFields"))
    ]
    return SelectorTerm(tuple(requirements))


def _effect(value: object) -> TaintEffect | None:
    for effect in _EFFECTS:
        if value == effect:
            return effect
    return None


def _operator(value: object) -> Operator | None:
    for op in OPERATORS:
        if value == op:
            return op
    return None


def _requirement(f: _Fields, raw: object, path: str, *, field: bool) -> Requirement:
    item = f.mapping(raw, path)
    key = f.text(item.get("key"), f"{path}.key")
    if not key:
        f.fail(f"{path}.key", "required: the label key to match")
    if field and key != NAME_FIELD:
        f.fail(f"{path}.key", f"matchFields supports only {NAME_FIELD} (got {key!r})")
    operator = _operator(item.get("operator"))
    allowed = ("In", "NotIn") if field else OPERATORS
    if operator is None or operator not in allowed:
        f.fail(
            f"{path}.operator",
            f"must be one of {', '.join(allowed)} (got {item.get('operator')!r})",
        )
    raw_values = f.items(item.get("values"), f"{path}.values")
    values = tuple(f.text(v, f"{path}.values[{i}]") for i, v in enumerate(raw_values))
    if operator in ("In", "NotIn") and not values:
        f.fail(f"{path}.values", f"{operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        f.fail(f"{path}.values", f"{operator} takes no values")
    if operator in ("Gt", "Lt"):
        if len(values) != 1:
            f.fail(f"{path}.values", f"{operator} takes exactly one value")
        if label_integer(values[0]) is None:
            f.fail(f"{path}.values[0]", f"{operator} compares integers (got {values[0]!r})")
    return Requirement(key, operator, values, field=field)


def _toleration(f: _Fields, raw: object, path: str) -> Toleration | None:
    item = f.mapping(raw, path)
    key = f.text(item.get("key"), f"{path}.key")
    operator = item.get("operator") or "Equal"
    value = f.text(item.get("value"), f"{path}.value")
    raw_effect = item.get("effect") or ""
    effect = _effect(raw_effect) if raw_effect else ""
    if effect is None:
        f.fail(f"{path}.effect", f"must be one of {', '.join(_EFFECTS)} (got {raw_effect!r})")
    if operator in ("Lt", "Gt"):
        # Numeric tolerations (alpha) cannot be represented; dropping one can only keep a
        # pod off a node kube-scheduler would allow, never put it where it is not wanted.
        return None
    if operator == "Exists":
        if value:
            f.fail(f"{path}.value", "must be empty when operator is Exists")
        return Toleration(key, "Exists", "", effect)
    if operator != "Equal":
        f.fail(f"{path}.operator", f"must be Equal or Exists (got {operator!r})")
    if not key:
        f.fail(f"{path}.key", "required when operator is Equal")
    return Toleration(key, "Equal", value, effect)
