"""PodDisruptionBudgets as preemption reads them: which admitted workloads could not lose all
their pods now without taking some budget below its minimum.

Best effort, as kube-scheduler's preemption: such a workload is chosen last among victims of
its priority, never spared when no other choice makes room. A budget counts against a
workload when the workload has more of its selected pods bound than the budget allows to be
disrupted (`status.disruptionsAllowed`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controllers.runtime.resources import Obj


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists,
    DoesNotExist). A null selector selects nothing; an empty one everything (policy/v1)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key = str(expr.get("key") or "")
        values = [str(v) for v in expr.get("values") or []]
        operator = expr.get("operator")
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # unknown: select nothing rather than guess
    return True


def budget_breakers(
    budgets: Iterable[Obj], pod_labels: Mapping[str, Sequence[Mapping[str, str]]]
) -> set[str]:
    """Workload keys ("ns/name") whose eviction would break a budget of their namespace.

    `pod_labels` gives each admitted workload's bound pods (their labels)."""
    by_namespace: dict[str, list[tuple[str, Sequence[Mapping[str, str]]]]] = {}
    for key, labels in pod_labels.items():
        by_namespace.setdefault(key.split("/", 1)[0], []).append((key, labels))
    out: set[str] = set()
    for budget in budgets:
        meta = budget.get("metadata") or {}
        workloads = by_namespace.get(str(meta.get("namespace") or ""))
        if not workloads:
            continue
        selector = (budget.get("spec") or {}).get("selector")
        try:
            allowed = int((budget.get("status") or {}).get("disruptionsAllowed") or 0)
        except (TypeError, ValueError):
            allowed = 0
        for key, pods in workloads:
            if key in out:
                continue
            if sum(1 for labels in pods if selects(selector, labels)) > allowed:
                out.add(key)
    return out
