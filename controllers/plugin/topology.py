"""`kubectl muster topology`: the free room in every domain of each Topology (block > rack >
node), per flavor naming it, read from the live cluster: per domain its nodes, allocatable
and free accelerators (else cpu), the pods bound there (Muster's or not), and, for a pod
shape, how many such pods it holds now and where a gang of them would go.

Room is the placement core's: the cluster's Nodes and bound Pods, and the room Muster has
planned for admitted gangs not bound yet or holds for preemptors (placeholder pods, by the
rules the admission cycle and the scheduler loop reserve with, `placement.reservations`),
make a `NodeView`; the flavor's nodes are the ones its pods may use (`candidates`, the
queue's filters), the tree is `topology.tree` and a domain's room for a shape is
`topology.domain_room`, the count `choose` ranks domains by. Where a gang would go is
`place_gang`'s answer (or its reason).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import click
from rich.console import Group
from rich.text import Text
from rich.tree import Tree

from controllers.plugin.kube import Forbidden, list_all
from controllers.runtime.resources import (
    NODE,
    POD,
    RESOURCE_FLAVOR,
    TOPOLOGY,
    WORKLOAD,
    Kind,
    Kube,
    Obj,
    object_key,
)
from controllers.scheduler.nodeview import nominees
from controllers.scheduler.versions import describe
from controllers.state import workloads as wls
from controllers.state.caches import job_uid_of_pod
from quota.api import ManifestError, parse_manifest
from quota.api.names import SCHEDULER_NAME
from quota.api.resourceflavor import ResourceFlavor
from quota.api.topology import Topology
from quota.api.workload import Workload as WorkloadModel
from quota.model import convert
from quota.model.nodeconvert import bound_pod_from_manifest, node_from_manifest
from quota.model.nodes import BoundPod, Node, PodShape
from quota.model.resources import format_amount
from quota.model.snapshot import Flavor
from quota.placement import GangRequest, NodeView, Placement, PodSetRequest, place_gang
from quota.placement.candidates import candidates
from quota.placement.nodes import HOSTNAME_LABEL, NodeState, demand_of
from quota.placement.profiles import PROFILES
from quota.placement.reservations import held_pods, planned_pods
from quota.placement.topology import Domain, DomainRequest, domain_room, level_name, tree
from quota.simulation.report import placement_resources

# The controller's --preemption-hold-timeout default: how long room stays held for a
# preemptor whose victims are slow to leave.
HOLD_TIMEOUT_S = 300.0

# The profile whose filters say which of a flavor's nodes its pods may use (room aside), and
# which places the gang of --fits: every profile shares the filters; BinPack is the default.
_PROFILE = PROFILES["BinPack"]


@dataclass
class LiveCluster:
    """What the command read: Topologies (name -> levels), flavors, nodes, bound pods."""

    topologies: dict[str, tuple[str, ...]]
    flavors: list[Flavor]
    nodes: list[Node]
    pods: list[BoundPod] | None  # None: Pods could not be read (no free room then)
    muster_pods: frozenset[str] = frozenset()  # keys of the pods Muster's scheduler placed
    left_out: list[str] = field(default_factory=list)  # objects that did not parse, and why
    pods_refused: str = ""  # the apiserver's words when Pods were refused
    # Placeholder pods for room planned or held for gangs not bound yet (in `pods` too).
    reserved: frozenset[str] = frozenset()
    workloads_refused: str = ""  # the apiserver's words when Workloads were refused


def _parsed(objects: Iterable[Obj], left_out: list[str]) -> list[object]:
    out: list[object] = []
    for obj in objects:
        try:
            out.append(parse_manifest(obj, 0))
        except ManifestError as error:
            left_out.append(describe(error))
    return out


# Who may read what the command needs (docs/tenancy.md, "Roles for people").
_QUEUE_READER = (
    "the chart's queue-reader role (a cluster admin binds it with the value "
    "userRoles.queueReaderGroups) or batch-admin bound cluster-wide"
)
_NODE_READER = (
    "a ClusterRole granting list on nodes, bound cluster-wide (no Muster role grants it: "
    "nodes are the cluster admins')"
)


def _read(kube: Kube, kind: Kind, what: str, right: str) -> list[Obj]:
    try:
        return list_all(kube, kind)
    except Forbidden as refused:
        raise click.ClickException(
            f"kubectl muster topology reads every {what}, which needs {right}. {refused.message}"
        ) from None


def read_cluster(kube: Kube) -> LiveCluster:
    """Topologies, flavors, Nodes and every bound Pod. Refused Topologies, flavors or Nodes
    stop it, naming the right (nothing to show without them); refused Pods leave `pods` None
    (allocatable is still shown)."""
    left_out: list[str] = []
    topologies = {
        t.name: t.spec.labels
        for t in _parsed(_read(kube, TOPOLOGY, "Topology", _QUEUE_READER), left_out)
        if isinstance(t, Topology)
    }
    raw_flavors = _read(kube, RESOURCE_FLAVOR, "ResourceFlavor", _QUEUE_READER)
    flavors = [
        convert.flavor(f) for f in _parsed(raw_flavors, left_out) if isinstance(f, ResourceFlavor)
    ]
    nodes: list[Node] = []
    for raw in _read(kube, NODE, "Node", _NODE_READER):
        try:
            nodes.append(node_from_manifest(raw))
        except ManifestError as error:
            left_out.append(describe(error))
    try:
        raw_pods = list_all(kube, POD, field_selector="spec.nodeName!=")
    except Forbidden as refused:
        return LiveCluster(
            topologies, flavors, nodes, None, left_out=left_out, pods_refused=refused.said
        )
    pods: list[BoundPod] = []
    muster: set[str] = set()
    owners: dict[str, list[str]] = {}  # pod -> the ids of what owns it (Job, PodGroup)
    for raw in raw_pods:
        try:
            pod = bound_pod_from_manifest(raw)
        except ManifestError as error:
            left_out.append(describe(error))
            continue
        if pod is not None:
            pods.append(pod)
            if (raw.get("spec") or {}).get("schedulerName") == SCHEDULER_NAME:
                muster.add(pod.key)
            owners[pod.key] = list(job_uid_of_pod(raw))
    live = LiveCluster(topologies, flavors, nodes, pods, frozenset(muster), left_out)
    try:
        raw_workloads = list_all(kube, WORKLOAD)
    except Forbidden as refused:
        live.workloads_refused = refused.said
        return live
    reserved = reserved_pods(raw_workloads, pods, owners, left_out)
    live.pods = pods + reserved
    live.reserved = frozenset(p.key for p in reserved)
    return live


def reserved_pods(
    workloads: list[Obj],
    pods: list[BoundPod],
    owners: Mapping[str, Sequence[str]],
    left_out: list[str],
) -> list[BoundPod]:
    """Placeholder pods for the room planned for admitted Workloads whose pods are not all
    bound, and held for pending preemptors: what the admission cycle and the scheduler loop
    count as taken (`placement.reservations`)."""
    admitted = []
    workload_of: dict[str, str] = {}  # owner id (as the caches index it) -> Workload key
    for raw in workloads:
        if wls.is_finished(raw) or not wls.has_quota(raw):
            continue
        try:
            model = WorkloadModel.model_validate(raw)
        except ValueError as error:
            left_out.append(f"Workload {object_key(raw)}: {str(error).splitlines()[0]}")
            continue
        engine = convert.workload(model, "")
        admitted.append(engine)
        uid = wls.owner_job_uid(raw)
        if uid:
            workload_of[uid] = engine.key
    # A Workload's own bound pods fill its plan: only the rest is held for it.
    mine = [replace(p, workload=_first(workload_of, owners.get(p.key, ()))) for p in pods]
    held = held_pods(nominees(workloads), time.time(), HOLD_TIMEOUT_S)
    return planned_pods(admitted, mine) + held


def _first(found: Mapping[str, str], keys: Iterable[str]) -> str | None:
    return next((found[k] for k in keys if k in found), None)


@dataclass(frozen=True)
class Shape:
    """--gpus G (of `resource`) and --fits N: the pods whose room each domain shows."""

    resource: str
    amount: int
    gang: int | None = None

    def words(self) -> str:
        return f"{format_amount(self.resource, self.amount)} {self.resource}"


@dataclass(frozen=True)
class Row:
    """One domain (or node) as shown."""

    level: str  # "rack", "node"
    name: str
    nodes: int
    allocatable: Mapping[str, int]
    free: Mapping[str, int] | None  # None: pods unreadable
    pods: int | None
    muster_pods: int | None
    reserved: int | None  # pods' room planned or held there for gangs not bound yet
    room: int | None  # pods of the shape it holds now (None: no shape asked)
    children: tuple[Row, ...] = ()


@dataclass(frozen=True)
class FlavorView:
    """A flavor's nodes as the domains of its Topology."""

    flavor: Flavor
    topology: str
    levels: tuple[str, ...]
    resources: tuple[str, ...]
    root: Row
    unusable: int  # nodes carrying its labels that its pods may not use now (NotReady, ...)
    outside: int  # nodes its pods may use that lack a level's label
    # Per level: (its name, where a gang of --fits pods would go or why not, whether it goes).
    fits: tuple[tuple[str, str, bool], ...] = ()


def _states(domain: Domain) -> list[NodeState]:
    if domain.children:
        return [s for child in domain.children.values() for s in _states(child)]
    states = [s for share in domain.shares for s in share.group.states if s.name not in share.skip]
    return states + domain.nodes


def flavor_view(
    view: NodeView,
    flavor: Flavor,
    topology: str,
    levels: tuple[str, ...],
    shape: Shape | None,
    live: LiveCluster,
) -> FlavorView:
    """The tree of `flavor`'s nodes in `view` by the levels of its Topology."""
    counted_pods = live.pods is not None
    requests = {shape.resource: shape.amount} if shape is not None else {}
    pod = PodShape(requests, dict(flavor.node_labels), (), flavor.tolerations)
    cands = candidates(view, pod, _PROFILE.filters)
    labelled = sum(
        1
        for name in view
        if all(view.node(name).labels.get(k) == v for k, v in flavor.node_labels.items())
    )
    found = tree(view, cands, levels)
    nodes = [view.node(s.name) for s in _states(found.root)]
    resources = tuple(placement_resources(nodes)) if nodes else ()
    room = domain_room(found, demand_of(requests)) if shape is not None else None
    lowest = len(found.by_depth)  # the depth of single nodes

    def kids(domain: Domain) -> list[Domain]:
        """The domains one level down, single nodes under the lowest."""
        if domain.children:
            return list(domain.children.values())
        return list(domain.hosts()) if domain.depth < lowest else []

    def row(domain: Domain) -> Row:
        states = _states(domain)
        allocatable = {r: sum(s.node.allocatable.get(r, 0) for s in states) for r in resources}
        free = {r: sum(s.free.get(r, 0) for s in states) for r in resources}
        keys = [k for s in states for k in (p.key for p in view.pods_on(s.name))]
        reserved = sum(1 for k in keys if k in live.reserved)
        depth = domain.depth
        if depth < 0:
            level = ""
        elif depth < lowest:
            level = level_name(levels[depth])
        else:
            level = "node"
        return Row(
            level=level,
            name=domain.name,
            nodes=len(states),
            allocatable=allocatable,
            free=free if counted_pods else None,
            pods=len(keys) - reserved if counted_pods else None,
            muster_pods=sum(1 for k in keys if k in live.muster_pods) if counted_pods else None,
            reserved=reserved if counted_pods else None,
            room=room(domain) if room is not None else None,
            children=tuple(row(k) for k in sorted(kids(domain), key=lambda d: d.name)),
        )

    root = row(found.root)
    fits: tuple[tuple[str, str, bool], ...] = ()
    if shape is not None and shape.gang is not None and counted_pods and found.inside:
        fits = tuple(_fits(view, pod, topology, levels, shape.gang, d) for d in range(len(levels)))
    return FlavorView(
        flavor, topology, levels, resources, root, labelled - cands.count, found.outside, fits
    )


def _fits(
    view: NodeView, pod: PodShape, topology: str, levels: tuple[str, ...], count: int, depth: int
) -> tuple[str, str, bool]:
    """Where a gang of `count` pods required in one domain at `depth` would go now, or the
    core's reason why none holds it."""
    request = DomainRequest(topology, levels, depth, True)
    placed = place_gang(view, GangRequest((PodSetRequest("main", count, pod, None, request),)))
    view.settle()  # a found placement holds its room until then: the next level starts afresh
    name = level_name(levels[depth])
    if not isinstance(placed, Placement):
        return name, placed.reason, False
    node = view.node(placed.nodes["main"][0][0])
    where = node.name if levels[depth] == HOSTNAME_LABEL else node.labels[levels[depth]]
    return name, f"{name} {where} (the fullest that holds it)", True


def views(
    cluster: LiveCluster,
    shape: Shape | None,
    topology: str | None = None,
    flavor: str | None = None,
) -> tuple[list[FlavorView], list[str]]:
    """Every flavor naming a Topology (or the one asked), as trees; and what cannot be shown
    (a flavor naming a Topology that does not exist, a Topology no flavor names)."""
    view = NodeView(cluster.nodes, cluster.pods or ())
    out: list[FlavorView] = []
    notes: list[str] = []
    named: set[str] = set()
    for f in sorted(cluster.flavors, key=lambda f: f.name):
        if f.topology is None or (flavor is not None and f.name != flavor):
            continue
        if topology is not None and f.topology != topology:
            continue
        named.add(f.topology)
        levels = cluster.topologies.get(f.topology)
        if levels is None:
            notes.append(f"flavor {f.name} names Topology {f.topology}, which does not exist")
            continue
        out.append(flavor_view(view, f, f.topology, levels, shape, cluster))
    if flavor is None:
        for name in sorted(set(cluster.topologies) - named):
            if topology is None or name == topology:
                notes.append(f"Topology {name}: no ResourceFlavor names it (spec.topologyName)")
    return out, notes


def nothing_to_show(cluster: LiveCluster, topology: str | None, flavor: str | None) -> str:
    """Why `views` found nothing for the Topology or flavor asked about."""
    if flavor is not None:
        found = next((f for f in cluster.flavors if f.name == flavor), None)
        if found is None:
            return f"no ResourceFlavor named {flavor}"
        if found.topology is None:
            return f"flavor {flavor} names no Topology (spec.topologyName)"
        return f"flavor {flavor} names Topology {found.topology}, not {topology}"
    if topology is not None and topology not in cluster.topologies:
        return f"no Topology named {topology}"
    return "no ResourceFlavor names a Topology (spec.topologyName); docs/placement.md, Topology"


def reservations_hidden(said: str) -> str:
    """Why room planned or held for gangs not bound yet is not subtracted."""
    return (
        "room Muster planned for admitted gangs not bound yet, or holds for preemptors, is "
        "counted as free: that needs listing Workloads in every namespace (a cluster admin's "
        f"view). The apiserver said: {said}"
    )


def pods_hidden(said: str) -> str:
    """Why free room and pods are not shown."""
    return (
        "free room, bound pods and where a gang would go are not shown, only allocatable: that "
        f"needs listing Pods in every namespace (a cluster admin's view). The apiserver said: "
        f"{said}"
    )


# -------------------------------------------------------------------------- rendering


def _amounts(row: Row, resources: Sequence[str]) -> Text:
    text = Text()
    for r in resources:
        total = format_amount(r, row.allocatable.get(r, 0))
        if row.free is None:
            text.append(f"  {r} {total}")
            continue
        free = row.free.get(r, 0)
        style = "green" if free == row.allocatable.get(r, 0) else ("red" if free <= 0 else "")
        text.append(f"  {r} ")
        text.append(format_amount(r, max(free, 0)), style=f"bold {style}".strip())
        text.append(f"/{total} free")
    return text


def _nodes(count: int, many: str, one: str) -> str:
    return f"{count:,} more nodes {many}" if count != 1 else f"1 more node {one}"


def _label(row: Row, resources: Sequence[str], shape: Shape | None) -> Text:
    nodes = f"{row.nodes:,} node{'s' if row.nodes != 1 else ''}"
    if not row.level:  # the whole topology
        label = Text(f"{nodes} in all", style="bold")
    else:
        label = Text(f"{row.level} ", style="dim").append(row.name, style="bold")
        if row.level != "node":
            label.append(f"  {nodes}")
    label.append_text(_amounts(row, resources))
    if row.pods is not None:
        label.append(f"  pods {row.pods:,}")
        if row.pods:
            label.append(f" ({row.muster_pods:,} Muster's)", style="dim")
        if row.reserved:
            label.append(f"  + room of {row.reserved:,} planned or held", style="cyan")
    if shape is not None and row.room is not None:
        holds = shape.gang is not None and row.room >= shape.gang
        style = "bold green" if holds else ("dim" if not row.room else "")
        label.append(f"  room for {row.room:,} x {shape.words()}", style=style)
    return label


def _summary(rows: Sequence[Row], resources: Sequence[str], shape: Shape | None) -> Text:
    """The domains left out by --limit, in one line."""
    total = Row(
        level="",
        name="",
        nodes=sum(r.nodes for r in rows),
        allocatable={res: sum(r.allocatable.get(res, 0) for r in rows) for res in resources},
        free=None
        if rows[0].free is None
        else {res: sum((r.free or {}).get(res, 0) for r in rows) for res in resources},
        pods=None,
        muster_pods=None,
        reserved=None,
        room=None,
    )
    level = rows[0].level
    text = Text(f"... {len(rows):,} more {level}{'s' if len(rows) != 1 else ''}", style="dim")
    if level != "node":
        text.append(f"  {total.nodes:,} nodes")
    text.append_text(_amounts(total, resources))
    if shape is not None and rows[0].room is not None:
        text.append(f"  most room {max(r.room or 0 for r in rows):,} x {shape.words()}")
    return text


def _key(row: Row, resources: Sequence[str]) -> tuple[int, ...]:
    """Roomiest first: room for the shape, else the free amounts."""
    if row.room is not None:
        return (-row.room,)
    amounts = row.free if row.free is not None else row.allocatable
    return tuple(-amounts.get(r, 0) for r in resources)


def render(fv: FlavorView, shape: Shape | None, depth: int | None, limit: int | None) -> Group:
    """The tree: `depth` levels below the flavor (nodes count as one; None: all), at most
    `limit` domains under each (the roomiest; None: all), then the gang's answers."""
    selector = ", ".join(f"{k}={v}" for k, v in sorted(fv.flavor.node_labels.items()))
    head = Text(f"Topology {fv.topology}", style="bold underline")
    head.append(f" ({' > '.join(fv.levels)})", style="dim")
    head.append("  flavor ").append(fv.flavor.name, style="bold")
    if selector:
        head.append(f" ({selector})", style="dim")
    root = fv.root
    top = Tree(head.append("\n").append_text(_label(root, fv.resources, shape)), guide_style="dim")

    def add(branch: Tree, rows: Sequence[Row], level: int) -> None:
        if depth is not None and level > depth:
            return
        shown = list(rows)
        rest: list[Row] = []
        if limit is not None and len(rows) > limit:
            keep = {id(r) for r in sorted(rows, key=lambda r: _key(r, fv.resources))[:limit]}
            shown = [r for r in rows if id(r) in keep]
            rest = [r for r in rows if id(r) not in keep]
        for row in shown:
            add(branch.add(_label(row, fv.resources, shape)), row.children, level + 1)
        if rest:
            branch.add(_summary(rest, fv.resources, shape))

    add(top, root.children, 1)
    lines: list[Tree | Text] = [top]
    if fv.unusable:
        lines.append(
            Text(
                f"{_nodes(fv.unusable, 'carry', 'carries')} flavor {fv.flavor.name}'s labels "
                f"and {'is' if fv.unusable == 1 else 'are'} not counted: NotReady, cordoned or "
                "tainted beyond its tolerations",
                style="yellow",
            )
        )
    if not root.nodes and not fv.unusable and not fv.outside:
        lines.append(Text(f"no node carries flavor {fv.flavor.name}'s labels", style="yellow"))
    if fv.outside:
        lines.append(
            Text(
                f"{_nodes(fv.outside, 'lack', 'lacks')} a level's label of Topology "
                f"{fv.topology}: outside it, never used by a gang asking for it",
                style="yellow",
            )
        )
    if shape is not None and shape.gang is not None:
        for level, answer, goes in fv.fits:
            line = Text(f"a gang of {shape.gang:,} x {shape.words()} required in one {level}: ")
            lines.append(line.append(answer, style="green" if goes else "yellow"))
    return Group(*lines)
