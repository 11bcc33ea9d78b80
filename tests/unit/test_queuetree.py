"""Rules of the queue tree a CRD schema cannot check: missing parents, cycles, missing
flavors, LocalQueues pointing at parent queues. Each turns into an inactive queue with a
reason and a message that says what to fix."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.api import ClusterQueue, LocalQueue, ResourceFlavor
from quota.api.queuetree import check_queue_tree


def cq(
    name: str, parent: str | None = None, flavors: tuple[str, ...] = (), **spec: Any
) -> ClusterQueue:
    body: dict[str, Any] = {"flavors": [{"name": f, "quota": {"cpu": 1}} for f in flavors], **spec}
    if parent:
        body["parent"] = parent
    return ClusterQueue.model_validate({"metadata": {"name": name}, "spec": body})


def lq(namespace: str, name: str, cluster_queue: str) -> LocalQueue:
    return LocalQueue.model_validate(
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        }
    )


def test_a_well_formed_tree_is_active_everywhere() -> None:
    tree = check_queue_tree(
        [cq("org", flavors=("h100",)), cq("a", "org", ("h100",)), cq("b", "org", ("h100",))],
        ["h100"],
        [lq("team-a", "gpu", "a")],
    )
    assert tree.inactive() == frozenset()
    assert {s.reason for s in tree.cluster_queues.values()} == {"Ready"}
    assert tree.cluster_queues["org"].message.endswith("2 child queue(s): a, b")
    assert tree.local_queues[("team-a", "gpu")].active
    assert tree.is_leaf("a") and not tree.is_leaf("org")
    assert tree.children["org"] == ("a", "b")


def test_missing_parent_makes_the_queue_and_its_subtree_inactive() -> None:
    tree = check_queue_tree(
        [cq("vision", "research"), cq("team-a", "vision"), cq("team-c")], [], []
    )
    vision = tree.cluster_queues["vision"]
    assert (vision.active, vision.reason) == (False, "ParentNotFound")
    assert "'research', which does not exist" in vision.message
    child = tree.cluster_queues["team-a"]
    assert (child.active, child.reason) == (False, "AncestorInactive")
    assert "'vision' is inactive (ParentNotFound" in child.message
    assert tree.cluster_queues["team-c"].active
    assert tree.inactive() == {"vision", "team-a"}


def test_cycle_is_reported_on_every_member_with_the_loop() -> None:
    tree = check_queue_tree(
        [cq("a", "c"), cq("b", "a"), cq("c", "b"), cq("leaf", "b"), cq("ok")], [], []
    )
    for name in ("a", "b", "c"):
        state = tree.cluster_queues[name]
        assert (state.active, state.reason) == (False, "Cycle")
    assert "(a -> c -> b -> a)" in tree.cluster_queues["a"].message
    assert "(b -> a -> c -> b)" in tree.cluster_queues["b"].message
    leaf = tree.cluster_queues["leaf"]
    assert (leaf.active, leaf.reason) == (False, "AncestorInactive")
    assert "'b' is inactive (Cycle" in leaf.message
    assert tree.cluster_queues["ok"].active


def test_two_queue_cycle_and_self_loop() -> None:
    tree = check_queue_tree([cq("x", "y"), cq("y", "x")], [], [])
    assert tree.inactive() == {"x", "y"}
    assert "(x -> y -> x)" in tree.cluster_queues["x"].message


def test_missing_flavor_names_the_flavor() -> None:
    tree = check_queue_tree(
        [cq("org", flavors=("h100",)), cq("a", "org", ("h100", "b200", "a100"))],
        [ResourceFlavor.model_validate({"metadata": {"name": "h100"}}), "a100"],
        [],
    )
    state = tree.cluster_queues["a"]
    assert (state.active, state.reason) == (False, "FlavorNotFound")
    assert "ResourceFlavor 'b200', which does not exist" in state.message
    assert tree.cluster_queues["org"].active


def test_missing_flavor_in_a_parent_stops_its_children() -> None:
    tree = check_queue_tree([cq("org", flavors=("gone",)), cq("a", "org")], [], [])
    assert tree.cluster_queues["org"].reason == "FlavorNotFound"
    assert tree.cluster_queues["a"].reason == "AncestorInactive"


def test_stop_policy_holds_the_queue() -> None:
    tree = check_queue_tree([cq("a", stopPolicy="HoldAndDrain")], [], [])
    state = tree.cluster_queues["a"]
    assert (state.active, state.reason) == (False, "Stopped")
    assert "evicts what is admitted" in state.message


def test_local_queue_pointing_at_a_parent_queue_is_inactive() -> None:
    tree = check_queue_tree([cq("org"), cq("a", "org"), cq("b", "org")], [], [lq("ns", "q", "org")])
    state = tree.local_queues[("ns", "q")]
    assert (state.active, state.reason) == (False, "ClusterQueueNotLeaf")
    assert "children: a, b" in state.message
    # The parent itself is fine; only the LocalQueue is wrong.
    assert tree.cluster_queues["org"].active


def test_local_queue_pointing_nowhere_or_at_an_inactive_queue() -> None:
    tree = check_queue_tree([cq("a", "missing")], [], [lq("ns", "q1", "nope"), lq("ns", "q2", "a")])
    assert tree.local_queues[("ns", "q1")].reason == "ClusterQueueNotFound"
    inactive = tree.local_queues[("ns", "q2")]
    assert (inactive.active, inactive.reason) == (False, "ClusterQueueInactive")
    assert "ParentNotFound" in inactive.message


def test_namespace_selector_is_checked_when_labels_are_known() -> None:
    queue = cq("a", namespaceSelector={"matchLabels": {"team": "a"}})
    queues = [lq("ns-a", "q", "a"), lq("ns-b", "q", "a"), lq("unknown", "q", "a")]
    tree = check_queue_tree(
        [queue], [], queues, namespace_labels={"ns-a": {"team": "a"}, "ns-b": {"team": "b"}}
    )
    assert tree.local_queues[("ns-a", "q")].active
    assert tree.local_queues[("ns-b", "q")].reason == "NamespaceNotSelected"
    assert tree.local_queues[("unknown", "q")].active


@st.composite
def forests(draw: st.DrawFn) -> list[ClusterQueue]:
    """Random parent pointers over a handful of names, including missing ones and cycles."""
    names = [f"q{i}" for i in range(draw(st.integers(1, 8)))]
    choices = st.none() | st.sampled_from([*names, "ghost"])
    parents = {n: draw(choices.filter(lambda p, n=n: p != n)) for n in names}
    return [cq(n, parents[n]) for n in names]


@settings(max_examples=150, deadline=None)
@given(queues=forests())
def test_a_queue_is_active_exactly_when_its_chain_reaches_a_root(
    queues: list[ClusterQueue],
) -> None:
    tree = check_queue_tree(queues, [], [])
    parents = {q.name: q.spec.parent for q in queues}
    for name, state in tree.cluster_queues.items():
        seen: set[str] = set()
        node: str | None = name
        while node is not None and node in parents and node not in seen:
            seen.add(node)
            node = parents[node]
        reaches_root = node is None
        assert state.active == reaches_root, (name, parents, state)
