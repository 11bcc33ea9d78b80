"""Managed namespaces (`--managed-namespace-selector`): the namespaces where Muster queues
every object of a kind it integrates, labelled or not (Kueue's `managedJobsNamespaceSelector`
with `manageJobsWithoutQueueName`). The selector comes in kubectl's label-selector syntax and
is kept as a metav1.LabelSelector, the form the admission policies' bindings and the webhook
configurations take; the controller's watch of Namespaces says which it selects.
"""

from __future__ import annotations

import re
from typing import Any

from controllers.runtime.informer import Informer
from controllers.state.budgets import selects

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}")
_VALUE = re.compile(rf"({_NAME})?")
_SET = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)$")
_EQUALITY = re.compile(r"^(?P<key>[^!=\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>\S*)$")


def _terms(text: str) -> list[str]:
    """The comma-separated terms, commas inside `in (...)` kept."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(text[start:i].strip())
            start = i + 1
    terms.append(text[start:].strip())
    return terms


def parse_selector(text: str) -> dict[str, Any] | None:
    """A label selector in kubectl's syntax (`team`, `!legacy`, `tier=batch`, `env!=dev`,
    `zone in (a,b)`, `zone notin (c)`, joined by commas) as a metav1.LabelSelector; None for
    an empty text (no namespace is managed). ValueError names the term at fault."""
    if not text.strip():
        return None
    labels: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    for term in _terms(text):
        key, values, operator = term.lstrip("!").strip(), [], "DoesNotExist"
        if (found := _SET.match(term)) is not None:
            key = found["key"]
            values = [v.strip() for v in found["values"].split(",") if v.strip()]
            operator = "In" if found["op"] == "in" else "NotIn"
        elif (found := _EQUALITY.match(term)) is not None:
            key, values = found["key"], [found["value"]]
            operator = "NotIn" if found["op"] == "!=" else "="
        elif not term.startswith("!"):
            operator = "Exists"
        sets = operator in ("In", "NotIn")
        bad = [v for v in values if not _VALUE.fullmatch(v)] or (sets and not values)
        if not term or not _KEY.fullmatch(key) or bad:
            raise ValueError(
                f"{term!r} is not a label selector term: write key, !key, key=value, "
                "key!=value, key in (v1,v2) or key notin (v1,v2), joined by commas"
            )
        if operator == "=":
            labels[key] = values[0]
        else:
            expressions.append(
                {"key": key, "operator": operator, **({"values": values} if values else {})}
            )
    selector: dict[str, Any] = {}
    if labels:
        selector["matchLabels"] = labels
    if expressions:
        selector["matchExpressions"] = expressions
    return selector


def no_selector(selector: dict[str, Any] | None) -> bool:
    """Whether a selector manages no namespace (unset or empty: the chart's `{}` too)."""
    return not selector or not (selector.get("matchLabels") or selector.get("matchExpressions"))


class ManagedNamespaces:
    """Which namespaces the selector picks, read from the caches' watch of Namespaces (the
    one a ClusterQueue's namespaceSelector reads too); none without a selector."""

    def __init__(self, namespaces: Informer, selector: dict[str, Any] | None):
        self.selector = None if no_selector(selector) else selector
        self.namespaces = namespaces

    @property
    def enabled(self) -> bool:
        return self.selector is not None

    def __call__(self, namespace: str) -> bool:
        """Whether Muster manages every workload in `namespace`."""
        if self.selector is None:
            return False
        found = self.namespaces.get(namespace)
        labels = ((found or {}).get("metadata") or {}).get("labels") or {}
        return found is not None and selects(self.selector, labels)
