"""Topology domains: which domain of a flavor's topology a pod set goes to, and how its pods
spread over the domains inside it.

A flavor's Topology is an ordered list of node labels, widest first (block, rack, hostname).
The nodes a pod set may use (`candidates.Candidates`) form a tree: one domain per value of
each level's label, under the domain of the level above; a node lacking one of the labels is
outside the topology. Because nodes with different label values are different node classes,
a class (a `Share`) sits in exactly one domain: the tree is built from classes, not nodes,
unless a level's label is per-node in the view (the hostname, or a label whose every value
names one node), whose domains are single nodes.

`choose` is the filter made for one domain plus the score over domains (KEP-5732's
placement generate and score, KAI's and Kueue's best fit):

- **Required** level L: among the domains at L that can hold every pod, the fullest (least
  room for this pod shape); ties go to the fuller parent, then the name.
- **Preferred** level L: the same at L if some domain there can hold them all; else at the
  level above, and so on up; else anywhere in the topology.
- **Unconstrained**: anywhere in the topology.

Inside the chosen domain, pods go to as few lower domains as possible at every level: when
one child can hold the rest, the fullest such child; otherwise the roomiest children first,
the last one again the fullest that fits (Kueue's way). A **slice** of S pods counts a domain
at its level as room for whole slices only (room // S x S), so every run of S consecutive
pods lands in one such domain. The answer is a list of portions (the nodes of one lowest
domain, how many pods) that `gang.place_gang` places with the queue's score, or a reason.

Room is counted per node class and cached by the class's version (`NodeClass.fit_total`),
so after one gang is placed only the classes it touched are counted again.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from quota.model.nodes import Node
from quota.placement.candidates import Candidates, Share
from quota.placement.nodes import HOSTNAME_LABEL, Demand, NodeState, NodeView, fit_count

# Domains named in a reason, roomiest first.
_NAMED = 3
# What metrics and reports call pods that share no domain of even the widest level, and a
# wait for room anywhere in the topology (not one domain of a level).
SPREAD = "spread"
ANYWHERE = "topology"


@dataclass(frozen=True, slots=True)
class DomainRequest:
    """A pod set's topology request, resolved against its flavor's Topology.

    `level` and `slice_level` are indexes into `levels`; `level` None: anywhere in the
    topology. `slice_level`, when set, is at or below `level`.
    """

    topology: str
    levels: tuple[str, ...]
    level: int | None
    required: bool
    slice_size: int | None = None
    slice_level: int | None = None
    # A domain to keep to, by its label values widest first (the node's name at the
    # hostname level): what preemption frees and a hold keeps is one domain, and the pods
    # must land in it. Within it the request applies as usual.
    within: tuple[str, ...] | None = None


def domain_request(
    topology: str,
    levels: tuple[str, ...],
    mode: str,
    level: str | None,
    slice_size: int | None,
    slice_level: str | None,
    *,
    tier: int | None = None,
) -> DomainRequest | str:
    """The request against `levels`, or the rule it breaks (for a reason). A `tier` names
    the level in Volcano's terms, counted up from the narrowest level that is not the
    hostname (tier 1, e.g. the rack or NVLink domain: the HyperNodes that hold nodes)."""
    known = ", ".join(levels)
    at: int | None = None
    if level is not None:
        if level not in levels:
            return f"{level} is not a level of Topology {topology} (levels: {known})"
        at = levels.index(level)
    elif tier is not None:
        tiers = [i for i, label in enumerate(levels) if label != HOSTNAME_LABEL]
        if tier > len(tiers):
            field = "requiredTier" if mode == "Required" else "preferredTier"
            counted = ", ".join(f"tier {n} is {levels[i]}" for n, i in enumerate(tiers[::-1], 1))
            return (
                f"{field} {tier} is beyond Topology {topology}, which has {len(tiers)} "
                f"tier{'' if len(tiers) == 1 else 's'} ({counted or 'its only level is the host'})"
            )
        at = tiers[-tier]
        level = levels[at]
    slice_at: int | None = None
    if slice_level is not None:
        if slice_level not in levels:
            return (
                f"slice level {slice_level} is not a level of Topology {topology} (levels: {known})"
            )
        slice_at = levels.index(slice_level)
        if at is not None and slice_at < at:
            return f"slice level {slice_level} is wider than the level {level} asked for"
    return DomainRequest(topology, levels, at, mode == "Required", slice_size, slice_at)


def level_name(label: str) -> str:
    """What a reason calls a level: "rack" for example.com/rack, "node" for the hostname."""
    return "node" if label == HOSTNAME_LABEL else label.rsplit("/", 1)[-1]


class Domain:
    """One domain of a topology tree: its nodes (classes whole or in part, or single nodes)
    and the domains of the next level inside it."""

    __slots__ = ("_hosts", "children", "depth", "name", "nodes", "parent", "shares")

    def __init__(self, name: str, depth: int, parent: Domain | None) -> None:
        self.name = name
        self.depth = depth  # its level's index; -1 for the whole topology
        self.parent = parent
        self.children: dict[str, Domain] = {}
        self.shares: list[Share] = []  # only on the lowest domains of the tree
        self.nodes: list[NodeState] = []
        self._hosts: tuple[Domain, ...] | None = None

    def hosts(self) -> tuple[Domain, ...]:
        """One domain per node, for a topology whose last level is the hostname: made only
        for requests that name that level, since most never look at single nodes."""
        if self._hosts is None:
            states = [
                s for share in self.shares for s in share.group.states if s.name not in share.skip
            ]
            states += self.nodes
            depth = self.depth + 1
            hosts = []
            for state in sorted(states, key=lambda s: s.name):
                host = Domain(state.name, depth, self)
                host.nodes.append(state)
                hosts.append(host)
            self._hosts = tuple(hosts)
        return self._hosts

    def candidates(self) -> Candidates:
        """Its nodes, as the placement walk takes them (the filter made for this domain)."""
        return Candidates(tuple(self.shares), tuple(self.nodes), None)


@dataclass(frozen=True, slots=True)
class Tree:
    """The domains of one topology over the nodes of one pod shape."""

    root: Domain
    by_depth: tuple[tuple[Domain, ...], ...]  # the levels but a last hostname one
    hostname: bool  # the last level is the hostname: `Domain.hosts` below the lowest
    inside: int  # nodes in the topology
    outside: int  # nodes that pass but lack a level's label

    def level(self, depth: int) -> list[Domain]:
        """The domains at `depth` (single nodes at the hostname level)."""
        if depth < len(self.by_depth):
            return list(self.by_depth[depth])
        lowest = self.by_depth[-1] if self.by_depth else (self.root,)
        return [host for domain in lowest for host in domain.hosts()]


def tree(view: NodeView, cands: Candidates, levels: tuple[str, ...]) -> Tree:
    """The domains of `levels` over `cands`, built once per view, shape and topology."""
    key = ("topology", id(cands), levels)
    found = view.shape_cache.get(key)
    if isinstance(found, tuple) and isinstance(found[1], Tree):
        return found[1]
    built = _build(view, cands, levels)
    view.shape_cache[key] = (cands, built)  # keeps `cands` alive, so its id stays its own
    return built


def domain_path(labels: Mapping[str, str], levels: tuple[str, ...]) -> tuple[str, ...] | None:
    """The node's domain at each level, or None when it lacks a level's label."""
    out = []
    for label in levels:
        value = labels.get(label)
        if value is None:
            return None
        out.append(value)
    return tuple(out)


def _build(view: NodeView, cands: Candidates, levels: tuple[str, ...]) -> Tree:
    hostname = levels[-1] == HOSTNAME_LABEL
    if hostname:
        levels = levels[:-1]  # every node is a domain there: no label to read
    root = Domain("", -1, None)
    by_depth: list[list[Domain]] = [[] for _ in levels]
    inside = outside = 0

    def at(path: tuple[str, ...]) -> Domain:
        domain = root
        for depth, value in enumerate(path):
            child = domain.children.get(value)
            if child is None:
                child = domain.children[value] = Domain(value, depth, domain)
                by_depth[depth].append(child)
            domain = child
        return domain

    loose = list(cands.nodes)
    whole = view.per_node_labels.isdisjoint(levels)
    for share in cands.shares:
        if not whole:
            loose.extend(s for s in share.group.states if s.name not in share.skip)
            continue
        # Every node of a class carries the same value of each level: one domain.
        path = domain_path(share.group.states[0].node.labels, levels)
        if path is None:
            outside += share.count
        else:
            at(path).shares.append(share)
            inside += share.count
    for state in loose:
        path = domain_path(state.node.labels, levels)
        if path is None:
            outside += 1
        else:
            at(path).nodes.append(state)
            inside += 1
    for domains in by_depth:
        domains.sort(key=lambda d: d.name)
    return Tree(root, tuple(tuple(d) for d in by_depth), hostname, inside, outside)


@dataclass(frozen=True, slots=True)
class Refused:
    """No domain can take the pods: why, and whether emptied nodes could."""

    reason: str
    never: bool


# Where a pod set's pods go: (the nodes of one lowest domain, how many pods), in pod order.
Portions = list[tuple[Candidates, int]]


class _Room:
    """Room for one pod shape in the domains of a tree, counted once per call."""

    def __init__(
        self, found: Tree, demand: Demand, request: DomainRequest, empty: bool = False
    ) -> None:
        self.demand = demand
        # Down to single nodes only when the request names the hostname level.
        deepest = max(request.level or 0, request.slice_level or 0)
        self.hosts_below = len(found.by_depth) - 1 if deepest >= len(found.by_depth) else None
        self.size = request.slice_size or 1
        self.slice_at = request.slice_level
        self.empty = empty  # count allocatable (room if every pod were gone)
        self.raw: dict[int, int] = {}
        self.usable_memo: dict[int, int] = {}

    def _free(self, domain: Domain) -> int:
        demand = self.demand
        if self.empty:
            count = 0
            for share in domain.shares:
                for vector, n in share.group.allocatables.items():
                    count += fit_count(dict(vector), demand) * n
                count -= sum(fit_count(s.node.allocatable, demand) for s in share.excluded)
            return count + sum(fit_count(s.node.allocatable, demand) for s in domain.nodes)
        count = 0
        for share in domain.shares:
            count += share.group.fit_total(demand)
            for state in share.excluded:
                count -= fit_count(state.free, demand)
        for state in domain.nodes:
            count += fit_count(state.free, demand)
        return count

    def kids(self, domain: Domain) -> tuple[Domain, ...]:
        """The domains one level down that this request looks at."""
        if domain.children:
            return tuple(domain.children.values())
        if domain.depth == self.hosts_below:
            return domain.hosts()
        return ()

    def pods(self, domain: Domain) -> int:
        """Pods of the shape the domain's nodes take between them."""
        found = self.raw.get(id(domain))
        if found is None:
            kids = self.kids(domain)
            found = sum(self.pods(c) for c in kids) if kids else self._free(domain)
            self.raw[id(domain)] = found
        return found

    def usable(self, domain: Domain) -> int:
        """Pods the domain can take as the request counts them: whole slices only, at and
        above the slice level."""
        at = self.slice_at
        if at is None or domain.depth > at:
            return self.pods(domain)
        found = self.usable_memo.get(id(domain))
        if found is None:
            if domain.depth == at:
                found = self.pods(domain) // self.size * self.size
            else:
                found = sum(self.usable(c) for c in self.kids(domain))
            self.usable_memo[id(domain)] = found
        return found


def _fullest(room: _Room, domains: list[Domain], want: int) -> Domain | None:
    """The fullest domain that still takes `want` pods; ties: the fuller parent, the name."""
    best: Domain | None = None
    best_key: tuple[int, int, str] | None = None
    for domain in domains:
        usable = room.usable(domain)
        if usable < want:
            continue
        parent = domain.parent
        key = (usable, room.usable(parent) if parent is not None else 0, domain.name)
        if best_key is None or key < best_key:
            best, best_key = domain, key
    return best


def _spread(room: _Room, domain: Domain, want: int, out: Portions) -> None:
    """`want` pods over `domain` (which takes them), in as few lower domains as possible."""
    if not want:
        return
    kids = [c for c in room.kids(domain) if room.usable(c)]
    if not kids:
        out.append((domain.candidates(), want))
        return
    one = _fullest(room, kids, want)
    if one is not None:
        _spread(room, one, want, out)
        return
    kids.sort(key=lambda c: (-room.usable(c), c.name))
    left = want
    for i, child in enumerate(kids):
        # The roomiest first, until the rest fits in one; that one is the fullest that does.
        last = _fullest(room, kids[i:], left)
        if last is not None:
            _spread(room, last, left, out)
            return
        took = room.usable(child)
        _spread(room, child, took, out)
        left -= took
    raise AssertionError(f"domain {domain.name} was counted to take {want} pods but does not")


def choose(
    view: NodeView,
    cands: Candidates,
    demand: Demand,
    request: DomainRequest,
    want: int,
    floor: int,
    subject: str,
) -> tuple[Portions, int] | Refused:
    """Where `want` pods (at least `floor`) of `demand` go under `request`: the portions and
    how many pods they hold, or why no domain takes them. `subject` names the pods for a
    reason ("gang of 16 pods x 8 nvidia.com/gpu")."""
    found = tree(view, cands, request.levels)
    room = _Room(found, demand, request)
    size = request.slice_size or 1
    level = request.level
    if not found.inside:
        labels = ", ".join(request.levels)
        outside = f" ({found.outside:,} lack them)" if found.outside else ""
        return Refused(
            f"no matching node carries the labels of Topology {request.topology} ({labels})"
            f"{outside}",
            True,
        )
    top = found.root if request.within is None else _find(found, request.within)
    if top is None:
        where_name = level_name(request.levels[len(request.within or ()) - 1])
        return Refused(
            f"{where_name} {(request.within or ('',))[-1]} of Topology {request.topology} has no "
            "matching node",
            False,
        )
    if request.required and level is not None:
        where = _at_depth(found, top, max(level, top.depth))
    else:
        where = [top]
        if level is not None:
            # Preferred: the lowest level with a domain that takes every pod, climbing.
            for depth in range(max(level, top.depth), top.depth, -1):
                domains = _at_depth(found, top, depth)
                if _fullest(room, domains, want) is not None:
                    where = domains
                    break
    for count in _counts(want, floor, size):
        domain = _fullest(room, where, count)
        if domain is not None:
            out: Portions = []
            _spread(room, domain, count, out)
            return out, count
    refused = _refusal(found, room, where, request, want, min(floor, want) or want, subject)
    # "Never" speaks of the whole topology: a domain kept to may be too small while another
    # is not.
    return refused if top is found.root else Refused(refused.reason, False)


def _find(found: Tree, path: tuple[str, ...]) -> Domain | None:
    """The domain named by `path` (label values widest first), or None when no node of
    the tree is in it."""
    domain = found.root
    for depth, value in enumerate(path):
        if depth < len(found.by_depth):
            child = domain.children.get(value)
        else:
            child = next((h for h in domain.hosts() if h.name == value), None)
        if child is None:
            return None
        domain = child
    return domain


def _at_depth(found: Tree, top: Domain, depth: int) -> list[Domain]:
    """The domains at `depth` inside `top` (`top` itself at its own depth)."""
    if top is found.root:
        return found.level(depth)
    out = [top]
    while out and out[0].depth < depth:
        out = [
            kid
            for d in out
            for kid in (
                sorted(d.children.values(), key=lambda k: k.name) if d.children else d.hosts()
            )
        ]
    return out


def _counts(want: int, floor: int, size: int) -> Iterator[int]:
    """`want`, then (partial placement) whole slices down to `floor`, most first."""
    yield want
    count = (want - 1) // size * size
    while count >= max(floor, 1):
        yield count
        count -= size


def _refusal(
    found: Tree,
    room: _Room,
    where: list[Domain],
    request: DomainRequest,
    want: int,
    least: int,
    subject: str,
) -> Refused:
    """Why no domain of `where` takes `want` pods: the roomiest ones, or that none could ever
    take even the `least` a partial placement would do with."""
    slices = ""
    if request.slice_size is not None and request.slice_level is not None:
        slice_name = level_name(request.levels[request.slice_level])
        slices = f" in slices of {request.slice_size} per {slice_name}"
    empty = _Room(found, room.demand, request, empty=True)
    largest = max(where, key=lambda d: (empty.usable(d), d.name))
    spread = where == [found.root]
    what = (
        f"the nodes of Topology {request.topology}"
        if spread
        else f"no {level_name(request.levels[where[0].depth])} of Topology {request.topology}"
    )
    if empty.usable(largest) < least:
        if spread:
            text = (
                f"{what} cannot hold {subject}{slices} even when empty "
                f"(room for {empty.usable(largest):,})"
            )
        else:
            text = (
                f"{what} can ever hold {subject}{slices}: the largest holds "
                f"{empty.usable(largest):,} even when empty ({largest.name})"
            )
        return Refused(text, True)
    if spread:
        return Refused(
            f"{what} have room for {room.usable(found.root):,} of {subject}{slices}", False
        )
    roomy = sorted(where, key=lambda d: (-room.usable(d), d.name))[:_NAMED]
    named = ", ".join(f"{room.usable(d):,} ({d.name})" for d in roomy)
    plural = "s" if len(where) != 1 else ""
    return Refused(
        f"{what} can hold {subject}{slices}: the roomiest of its {len(where):,} "
        f"{level_name(request.levels[where[0].depth])}{plural} have room for {named}",
        False,
    )


# -- domains as preemption and holds see them ---------------------------------------------


def domains_at(
    view: NodeView, cands: Candidates, request: DomainRequest, depth: int
) -> list[tuple[str, ...]]:
    """The domains at `depth` of `request`'s Topology over `cands`, each by its label values
    widest first, by name."""
    out = []
    for domain in tree(view, cands, request.levels).level(depth):
        path: list[str] = []
        up: Domain | None = domain
        while up is not None and up.parent is not None:
            path.append(up.name)
            up = up.parent
        out.append(tuple(reversed(path)))
    return out


def node_path(view: NodeView, name: str, levels: tuple[str, ...]) -> tuple[str, ...]:
    """Node `name`'s domain at each of `levels` (its name at the hostname level; "" for a
    label it lacks)."""
    labels = view.node(name).labels
    return tuple(name if label == HOSTNAME_LABEL else labels.get(label, "") for label in levels)


def common_domain(view: NodeView, nodes: Iterable[str], request: DomainRequest) -> tuple[str, ...]:
    """The narrowest domain, at most as narrow as the request's level, holding every one of
    `nodes` (label values widest first; empty: none narrower than the whole topology)."""
    names = list(nodes)
    depth = landed_depth((view.node(n) for n in names), request.levels)
    if depth is None or request.level is None:
        return ()
    return node_path(view, names[0], request.levels[: min(depth, request.level) + 1])


def domain_words(request: DomainRequest, path: tuple[str, ...]) -> str:
    """ "rack b0-r1 of Topology fabric" for a domain given by its label values."""
    return f"{level_name(request.levels[len(path) - 1])} {path[-1]} of Topology {request.topology}"


def freeable_words(request: DomainRequest, depth: int, count: int) -> str:
    """ "3 racks would after evicting lower-priority workloads": domains that could hold a
    gang no domain holds now, were lower-priority workloads in them gone."""
    name = level_name(request.levels[depth])
    plural = "s" if count != 1 else ""
    return f"{count:,} {name}{plural} would after evicting lower-priority workloads"


def domain_of(view: NodeView, nodes: Iterable[str], request: DomainRequest) -> dict[str, str]:
    """The node labels (level: value, every level down to the request's) of the domain at
    the request's level that holds most of `nodes` (ties to the path), where pods of the same
    gang already run; empty when the request names no level or no such node is in the view.
    A pod set that must keep to one domain places its later pods (a scale-up slice, a
    replacement) there. The whole path, because a rack is a rack of its block: two blocks
    may both have a rack labelled r1."""
    if request.level is None:
        return {}
    levels = request.levels[: request.level + 1]
    paths = Counter(path for n in nodes if n in view and all(path := node_path(view, n, levels)))
    if not paths:
        return {}
    path = max(paths.items(), key=lambda kv: (kv[1], kv[0]))[0]
    # The hostname level is a node's name; its label says the same where the node has it.
    return {
        label: value
        for label, value in zip(levels, path, strict=True)
        if label != HOSTNAME_LABEL or label in view.node(value).labels
    }


def domain_room(found: Tree, demand: Demand) -> Callable[[Domain], int]:
    """Pods of `demand` a domain of `found` takes now, counted as `choose` counts them (down
    to single nodes when the last level is the hostname): for views of free room."""
    hosts = len(found.by_depth) if found.hostname else None
    return _Room(found, demand, DomainRequest("", (), hosts, True)).pods


def landed_depth(nodes: Iterable[Node], levels: tuple[str, ...]) -> int | None:
    """The narrowest level at which one domain holds every one of `nodes` (its index in
    `levels`); -1 when they span domains of the widest level; None when there are none or
    one lacks a level's label (it is outside the topology)."""
    hostname = bool(levels) and levels[-1] == HOSTNAME_LABEL
    labelled = levels[:-1] if hostname else levels
    paths: set[tuple[str, ...]] = set()
    for node in nodes:
        path = domain_path(node.labels, labelled)
        if path is None:
            return None
        paths.add((*path, node.name) if hostname else path)
    if not paths:
        return None
    depth = -1
    while depth + 1 < len(levels) and len({p[: depth + 2] for p in paths}) == 1:
        depth += 1
    return depth


def landed_level(nodes: Iterable[Node], levels: tuple[str, ...]) -> str | None:
    """`landed_depth` in the words reasons use: "rack", "node", or SPREAD."""
    depth = landed_depth(nodes, levels)
    if depth is None:
        return None
    return level_name(levels[depth]) if depth >= 0 else SPREAD


# The head of `_refusal`'s sentences, read back by `waiting_level`: a test holds them together.
_NO_DOMAIN = re.compile(r"\bno (?P<level>\S+) of Topology \S+ can (ever )?hold ")
_NOWHERE = re.compile(r"\bthe nodes of Topology \S+ (have room for|cannot hold) ")


def waiting_level(reason: str) -> str | None:
    """The level (as reasons name it) at which no domain can hold a waiting pod set, read
    from the reason `choose` gave it, wherever the cycle wrapped it (ANYWHERE: not even the
    whole topology has room); None for a wait of any other kind. Metrics count topology
    waits by it."""
    found = _NO_DOMAIN.search(reason)
    if found is not None:
        return found.group("level")
    return ANYWHERE if _NOWHERE.search(reason) else None
