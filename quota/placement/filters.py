"""The built-in filters, which a node must pass to take a pod, and room, checked per node.

In kube-scheduler's words: `NodeAffinity` (node selector and required node affinity, node
names included), `NodeReady`, `NodeUnschedulable` (cordoned) and `TaintToleration` (every
NoSchedule and NoExecute taint tolerated). Each is a `framework.Filter`: the profiles in
`profiles.py` run them in that order, once per node class and pod shape (`candidates.py`).
Room for the pod's requests and a pod slot is checked per node by the placement walk, since
it changes with every pod placed (`fits_one`, `fit_count`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from quota.model.nodes import Node, PodShape, Taint, Toleration
from quota.placement.framework import Refusals
from quota.placement.nodes import Demand


def nodes_text(n: int) -> str:
    """ "1 node", "3 nodes"."""
    return f"{n} node" if n == 1 else f"{n} nodes"


def _count(refused: Sequence[tuple[Node, int]]) -> int:
    return sum(n for _, n in refused)


class NodeAffinity:
    """The pod's node selector and required node affinity both hold for the node's labels
    and name: the one filter that reads per-node facts, checked node by node when the shape
    names single nodes."""

    name = "NodeAffinity"
    per_node = True

    def passes(self, node: Node, shape: PodShape) -> bool:
        labels = node.labels
        for key, wanted in shape.node_selector.items():
            if labels.get(key) != wanted:
                return False
        return not shape.affinity or any(t.matches(labels, node.name) for t in shape.affinity)

    def summary(self, refused: Sequence[tuple[Node, int]], shape: PodShape) -> Refusals:
        # Nothing to list: the failure's head already names the selection no node matched.
        return Refusals()


class NodeReady:
    """The node's Ready condition is True."""

    name = "NodeReady"
    per_node = False

    def passes(self, node: Node, shape: PodShape) -> bool:
        return node.ready

    def summary(self, refused: Sequence[tuple[Node, int]], shape: PodShape) -> Refusals:
        return Refusals(nodes=(f"{nodes_text(_count(refused))} not Ready",))


class NodeUnschedulable:
    """The node is not cordoned (`spec.unschedulable`)."""

    name = "NodeUnschedulable"
    per_node = False

    def passes(self, node: Node, shape: PodShape) -> bool:
        return not node.unschedulable

    def summary(self, refused: Sequence[tuple[Node, int]], shape: PodShape) -> Refusals:
        return Refusals(nodes=(f"{nodes_text(_count(refused))} cordoned",))


def untolerated(tolerations: tuple[Toleration, ...], taints: tuple[Taint, ...]) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration matches, or None."""
    for taint in taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


class TaintToleration:
    """Every NoSchedule and NoExecute taint of the node is tolerated by the pod."""

    name = "TaintToleration"
    per_node = False

    def passes(self, node: Node, shape: PodShape) -> bool:
        return untolerated(shape.tolerations, node.taints) is None

    def summary(self, refused: Sequence[tuple[Node, int]], shape: PodShape) -> Refusals:
        taints: Counter[Taint] = Counter()
        for node, n in refused:
            taint = untolerated(shape.tolerations, node.taints)
            if taint is not None:
                taints[taint] += n
        # Most common first: the taint that rules out most nodes is the one to tolerate.
        ranked = sorted(taints.items(), key=lambda item: (-item[1], str(item[0])))
        return Refusals(pod=tuple(f"taint {t} not tolerated ({nodes_text(n)})" for t, n in ranked))


NODE_AFFINITY = NodeAffinity()
NODE_READY = NodeReady()
NODE_UNSCHEDULABLE = NodeUnschedulable()
TAINT_TOLERATION = TaintToleration()


# -- room: checked per node by the placement walk -----------------------------------------


def fits_one(free: Mapping[str, int], demand: Demand) -> bool:
    """True when one pod of `demand` fits in `free`."""
    # A plain loop: this runs for every node a placement looks at, and all() over a
    # generator costs about twice as much.
    for r, v in demand:  # noqa: SIM110
        if free.get(r, 0) < v:
            return False
    return True
