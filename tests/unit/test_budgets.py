"""PodDisruptionBudgets in preemption, best effort: among victims of one priority, those whose
eviction would break a budget are chosen last, and never spared when nothing else makes room."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from controllers.state.budgets import budget_breakers, selects
from quota.admission.cycle import admission_cycle
from quota.model.snapshot import Snapshot
from tests.unit.strategies import queue, queues_of, workload
from tests.unit.test_preemption_nodes import H100, NOW, gangs, gpu_nodes


def budget(namespace: str, selector: dict[str, Any] | None, allowed: int) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": "pdb"},
        "spec": {"selector": selector} if selector is not None else {},
        "status": {"disruptionsAllowed": allowed},
    }


def test_label_selectors_match_as_kubernetes_does() -> None:
    labels = {"app": "db", "tier": "data"}
    assert selects({}, labels)  # empty: everything
    assert not selects(None, labels)  # null: nothing
    assert selects({"matchLabels": {"app": "db"}}, labels)
    assert not selects({"matchLabels": {"app": "web"}}, labels)
    assert selects(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["data"]}]}, labels
    )
    assert not selects(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["data"]}]}, labels
    )
    assert selects({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, labels)
    assert not selects({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, labels)
    assert not selects(
        {"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, labels
    )


def test_a_workload_breaks_a_budget_when_more_of_its_pods_are_selected_than_allowed() -> None:
    pods = {
        "ns/a": [{"app": "db"}, {"app": "db"}],
        "ns/b": [{"app": "web"}],
        "other/c": [{"app": "db"}, {"app": "db"}],
    }
    breakers = budget_breakers([budget("ns", {"matchLabels": {"app": "db"}}, 1)], pods)
    assert breakers == {"ns/a"}  # b is not selected; c is in another namespace
    assert budget_breakers([budget("ns", {"matchLabels": {"app": "db"}}, 2)], pods) == set()


def test_among_equal_victims_those_that_keep_every_budget_go_first() -> None:
    a = queue("a", quota=64, reclaim="Any")
    b = queue("b", quota=80)
    big = workload("ns/big", "a", gpus=8, count=2, priority=100)
    ws, pods = gangs([0] * 5)  # g4 started last: the usual first victim

    def victims(protected: set[str]) -> list[str]:
        admitted = tuple(replace(w, disrupts_budget=w.key in protected) for w in ws)
        result = admission_cycle(
            Snapshot(
                now=NOW,
                queues=queues_of(a, b),
                flavors={"h100": H100},
                admitted=admitted,
                pending=(big,),
                nodes=gpu_nodes(10),
                pods=tuple(pods),
            )
        )
        return [v.workload for p in result.preempt for v in p.victims]

    assert victims(set()) == ["ns/g4"]
    assert victims({"ns/g4"}) == ["ns/g3"]
    # Best effort: when every candidate would break a budget, one still goes.
    assert victims({w.key for w in ws}) == ["ns/g4"]
