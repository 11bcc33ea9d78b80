"""Nodes, the pods bound to them, and what a pod asks of a node: the inputs of placement.

Plain frozen data, like the rest of the snapshot: the shell parses Node and Pod objects into
these (`quota.model.nodeconvert`), the placement core (`quota.placement`) decides from them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True, slots=True)
class Taint:
    """A taint carried by every node of a flavor."""

    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"

    def __str__(self) -> str:
        value = f"={self.value}" if self.value else ""
        return f"{self.key}{value}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration, with the Kubernetes matching rules."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: TaintEffect | Literal[""] = ""

    def tolerates(self, taint: Taint) -> bool:
        """True when this toleration matches `taint` (empty key with Exists matches all)."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
OPERATORS: tuple[Operator, ...] = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
NAME_FIELD = "metadata.name"

# Gt/Lt compare label values as base-10 int64, as Kubernetes parses them (strconv.ParseInt).
_INTEGER = re.compile(r"^[+-]?[0-9]+$")


def label_integer(text: str) -> int | None:
    """A label value or Gt/Lt operand as Kubernetes reads it (base 10), or None."""
    return int(text) if _INTEGER.match(text) else None


@dataclass(frozen=True, slots=True)
class Requirement:
    """One node selector requirement (a matchExpressions or matchFields entry)."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()
    # matchFields: the key is metadata.name and is matched against the node's name.
    field: bool = False

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        """Kubernetes semantics: NotIn and DoesNotExist hold for a missing label."""
        value = name if self.field else labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None or len(self.values) != 1:
            return False
        have, bound = label_integer(value), label_integer(self.values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound

    def __str__(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        if self.operator in ("Gt", "Lt"):
            return f"{self.key} {self.operator} {', '.join(self.values)}"
        return f"{self.key} {self.operator} ({', '.join(self.values)})"


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """Requirements that must all hold (a nodeSelectorTerm); an empty term matches no node."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        """True when every requirement holds (never for an empty term, as in Kubernetes)."""
        return bool(self.requirements) and all(r.matches(labels, name) for r in self.requirements)

    def __str__(self) -> str:
        return " and ".join(map(str, self.requirements)) or "(empty term)"


@dataclass(frozen=True, slots=True)
class PodShape:
    """Everything about one pod that decides where it may go."""

    requests: Mapping[str, int] = field(default_factory=dict)  # base units, per pod
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # Required node affinity: the node must match at least one term; () means none is set.
    affinity: tuple[SelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class Node:
    """A node as placement sees it; `allocatable` includes "pods" (missing means none)."""

    name: str
    allocatable: Mapping[str, int]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod bound to a node and not finished, whoever owns it; it holds one pod slot too."""

    key: str  # "namespace/name"
    node: str
    requests: Mapping[str, int]
    # The admitted workload ("namespace/name") the pod runs for, when Muster manages it:
    # its planned room counts only for pods not yet bound.
    workload: str | None = None
    # Its pod set in that workload, when known (the `muster.dev/pod-set` label; a planned
    # pod's own): single-pod disruption never takes a protected one.
    pod_set: str | None = None
