"""`kubectl muster queues`: the ClusterQueue tree with quota, usage, fair share and counts,
and the LocalQueues that feed each leaf; for a user who may not read ClusterQueues (a batch
user bound in one namespace), that namespace's LocalQueues and a line saying why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from rich.tree import Tree

from controllers.runtime.resources import Obj
from quota.api.quantity import QuantityError, format_quantity, parse_quantity


def _amount(value: Any, resource: str) -> int | None:
    try:
        return parse_quantity(value, resource)
    except QuantityError:
        return None


def _show(amount: int | None, resource: str) -> str:
    return "?" if amount is None else format_quantity(amount, resource)


def _active(queue: Mapping[str, Any]) -> tuple[bool, str]:
    for cond in (queue.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Active":
            return cond.get("status") == "True", str(cond.get("reason") or "")
    return False, "NoStatus"


def resource_lines(cq: Mapping[str, Any]) -> list[Text]:
    """One line per flavor and resource: used / quota (limit), fair share."""
    status = cq.get("status") or {}
    usage = status.get("usage") or {}
    share = status.get("fairShare") or {}
    lines: list[Text] = []
    entries = [e for e in (cq.get("spec") or {}).get("flavors") or [] if isinstance(e, Mapping)]
    named = [str(e.get("name")) for e in entries]
    for flavor in named + sorted(set(usage) - set(named)):
        entry = next((e for e in entries if e.get("name") == flavor), {})
        quota = entry.get("quota") or {}
        limit = entry.get("limit") or {}
        used = usage.get(flavor) or {}
        for resource in sorted(set(quota) | set(used) | set(limit)):
            q = _amount(quota.get(resource, 0), resource)
            u = _amount(used.get(resource, 0), resource)
            line = Text(f"{flavor} {resource}: ", style="dim")
            over = u is not None and q is not None and u > q
            line.append(f"{_show(u, resource)}", style="bold red" if over else "bold")
            line.append(f" / {_show(q, resource)} used")
            if resource in limit:
                line.append(f" (limit {_show(_amount(limit[resource], resource), resource)})")
            fair = (share.get(flavor) or {}).get(resource)
            if fair is not None:
                line.append(f", fair share {_show(_amount(fair, resource), resource)}", "cyan")
            lines.append(line)
    return lines


def _state_and_counts(label: Text, queue: Mapping[str, Any]) -> Text:
    """`label` + active or inactive (reason), admitted and pending: a queue of either kind."""
    status = queue.get("status") or {}
    active, reason = _active(queue)
    label.append("active" if active else f"inactive ({reason})", "green" if active else "yellow")
    pending = int(status.get("pendingWorkloads") or 0)
    label.append(f"  admitted {int(status.get('admittedWorkloads') or 0)}")
    label.append(f"  pending {pending}", "magenta" if pending else "")
    return label


def _label(cq: Mapping[str, Any]) -> Text:
    label = _state_and_counts(Text(str(cq["metadata"]["name"]), style="bold").append("  "), cq)
    stop = (cq.get("spec") or {}).get("stopPolicy") or "None"
    if stop != "None":
        label.append(f"  stopped ({stop})", "red")
    return label


def queue_tree(cluster_queues: list[Obj], local_queues: list[Obj]) -> Tree:
    """The forest of ClusterQueues (roots first, children by name) under one root."""
    by_name = {str(cq["metadata"]["name"]): cq for cq in cluster_queues}
    children: dict[str | None, list[str]] = {}
    for name, cq in sorted(by_name.items()):
        parent = (cq.get("spec") or {}).get("parent")
        # A parent that does not exist: shown as a root, its Active condition says why.
        children.setdefault(parent if parent in by_name else None, []).append(name)
    feeds: dict[str, list[str]] = {}
    for lq in sorted(
        local_queues, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"])
    ):
        target = str((lq.get("spec") or {}).get("clusterQueue") or "")
        pending = int((lq.get("status") or {}).get("pendingWorkloads") or 0)
        feeds.setdefault(target, []).append(
            f"{lq['metadata']['namespace']}/{lq['metadata']['name']} (pending {pending})"
        )
    forest = Tree(Text("ClusterQueues", style="bold underline"), guide_style="dim")
    seen: set[str] = set()

    def add(node: Tree, name: str) -> None:
        if name in seen:  # a cycle: its Active condition says so
            return
        seen.add(name)
        branch = node.add(_label(by_name[name]))
        for line in resource_lines(by_name[name]):
            branch.add(line)
        if feeds.get(name):
            branch.add(Text("local queues: " + ", ".join(feeds[name]), style="dim"))
        for child in children.get(name, []):
            add(branch, child)

    for root in children.get(None, []):
        add(forest, root)
    for name in sorted(set(by_name) - seen):  # only reachable through a cycle
        add(forest, name)
    return forest


def local_queue_tree(local_queues: list[Obj], namespace: str | None) -> Tree:
    """LocalQueues alone (their ClusterQueues unreadable): each with its ClusterQueue, its
    Active state (it carries the ClusterQueue's, as NamespaceNotSelected or
    ClusterQueueInactive), admitted and pending counts and usage."""
    title = f"LocalQueues in namespace {namespace}" if namespace else "LocalQueues"
    tree = Tree(Text(title, style="bold underline"), guide_style="dim")
    for lq in sorted(
        local_queues, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"])
    ):
        meta = lq["metadata"]
        name = meta["name"] if namespace else f"{meta['namespace']}/{meta['name']}"
        label = Text(str(name), style="bold")
        label.append(f"  -> ClusterQueue {(lq.get('spec') or {}).get('clusterQueue')}  ")
        branch = tree.add(_state_and_counts(label, lq))
        for flavor, used in sorted(((lq.get("status") or {}).get("usage") or {}).items()):
            for resource, amount in sorted((used or {}).items()):
                line = Text(f"{flavor} {resource}: ", style="dim")
                line.append(_show(_amount(amount, resource), resource), style="bold")
                branch.add(line.append(" used"))
    return tree


def unreadable_queues(said: str) -> str:
    """Why only LocalQueues are shown, and which right shows the whole tree."""
    return (
        "ClusterQueues are not readable with your rights, so their quota, fair share and "
        "other teams' queues are not shown; the whole tree needs the chart's queue-reader role "
        "(a cluster admin binds it to a group with the value userRoles.queueReaderGroups) or "
        f"a cluster-wide batch-admin. The apiserver said: {said}"
    )
