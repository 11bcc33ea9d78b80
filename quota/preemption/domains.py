"""Preemption on nodes for a gang that keeps to one topology domain: evict in the domain
whose victims cost least, and only there.

KEP-5710 treats the whole cluster as one domain. For a gang whose pod set must (or would
rather) sit inside one rack, that search removes every candidate, lets placement pick the
fullest rack that fits, and keeps the victims in its way: it can pick a rack whose victims
cost more than another's. Here the search runs domain by domain at the request's level:
per domain, the candidates with a pod (or room planned for one) on its nodes, the same
shortest-prefix search and reprieve as on the whole cluster (`nodes.preempt_on_nodes`), with
the gang kept to that domain (`DomainRequest.within`). Every victim goes whole (but a
disruptionMode Single one, which loses its pods in the way), so one with pods in two racks
goes from both; no victim has no pod in the chosen domain.

The domains are compared as Muster's victim order compares workloads (priority first,
then budgets), which is KEP-5710's ceiling: the lowest highest victim priority, then the
fewest victims whose eviction breaks a PodDisruptionBudget, the fewest victims, the
smallest sum of priorities, and the latest start of the most important victims (less work
lost); ties go to the domain first by name. Priority first also bounds the search: once a
domain can be freed with victims up to priority P, the next ones are searched only among
candidates up to P.

A preferred request searches its own level first and climbs only when no domain there can
be freed; past the widest level it may go anywhere in the topology, which is the whole-
cluster search again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from quota.placement.candidates import candidates
from quota.placement.gang import GangRequest, Placement, Unplaceable
from quota.placement.nodes import NodeView
from quota.placement.profiles import PROFILES, Strategy
from quota.placement.topology import (
    DomainRequest,
    common_domain,
    domain_words,
    domains_at,
    node_path,
)
from quota.preemption.nodes import NodePlan, Place, WhatIf, preempt_on_nodes
from quota.preemption.victims import Candidate, started_at

# How to place the gang kept to one domain (given by its label values widest first).
PlaceIn = Callable[[tuple[str, ...]], Place]

# What evicting a set of victims costs (see `cost`).
Cost = tuple[int, int, int, int, float]


@dataclass(frozen=True, slots=True)
class Scope:
    """The domains a gang keeps to: its widest pod set request (`lead`) and the levels a
    preemption search looks at, narrowest first (one for a required request)."""

    gang: GangRequest
    lead: DomainRequest
    depths: tuple[int, ...]

    def pinned(self, path: tuple[str, ...]) -> GangRequest:
        """The gang with every pod set that keeps to a domain of the same Topology kept to
        the domain `path` (pod sets asking for a narrower level choose inside it)."""
        lead = self.lead
        return GangRequest(
            tuple(
                replace(ps, domain=replace(ps.domain, within=path))
                if ps.domain is not None
                and ps.domain.level is not None
                and ps.domain.topology == lead.topology
                else ps
                for ps in self.gang.pod_sets
            ),
            self.gang.min_count,
        )

    def domain_of(self, view: NodeView, nodes: Iterable[str]) -> tuple[str, ...]:
        """The domain of the lead's request holding all of `nodes` that are still in the
        view (empty: none narrower than the whole topology)."""
        return common_domain(view, (n for n in nodes if n in view), self.lead)

    def words(self, view: NodeView, placed: Placement) -> str:
        """ "rack b0-r1 of Topology fabric": where the lead pod set's pods were placed ("" when
        not inside one domain)."""
        for ps in self.gang.pod_sets:
            if ps.domain == self.lead:
                path = self.domain_of(view, (n for n, _ in placed.nodes.get(ps.name, ())))
                return domain_words(self.lead, path) if path else ""
        return ""


def domain_scope(gang: GangRequest) -> Scope | None:
    """The domains `gang` keeps to, or None when no pod set asks for a level."""
    leveled = [
        ps.domain for ps in gang.pod_sets if ps.domain is not None and ps.domain.level is not None
    ]
    if not leveled:
        return None
    # The widest level holds the narrower ones; a required request before a preferred one.
    lead = min(leveled, key=lambda d: (d.level, not d.required))
    assert lead.level is not None
    depths = (lead.level,) if lead.required else tuple(range(lead.level, -1, -1))
    return Scope(gang, lead, depths)


@dataclass(frozen=True, slots=True)
class Search:
    """One preemption search for a gang that keeps to domains (see the module docstring)."""

    view: NodeView
    scope: Scope
    pods_of: Mapping[str, Sequence[str]]
    leaving: Sequence[str]
    place_in: PlaceIn
    strategy: Strategy

    def run(self, allowed: Sequence[Candidate]) -> NodePlan | None:
        """The cheapest domain's plan, the gang's placement assumed in the view (as
        `preempt_on_nodes` leaves it); None, the view as it was, when no domain at any
        level of the search can be freed."""
        for depth in self.scope.depths:
            best: tuple[Cost, tuple[str, ...], list[Candidate]] | None = None
            for path, inside in self._inside(depth, allowed):
                if best is not None:
                    # A domain needing a victim above the best one's highest priority costs
                    # more: its candidates are cut there (victim order: priority first).
                    ceiling = best[0][0]
                    inside = [c for c in inside if c.workload.priority <= ceiling]
                if not inside:
                    continue
                plan = self._search(path, inside, keep=False)
                if isinstance(plan, Unplaceable):
                    continue
                found = (cost(plan.victims), path, inside)
                if best is None or found[:2] < best[:2]:
                    best = found
            if best is not None:
                plan = self._search(best[1], best[2], keep=True)
                if isinstance(plan, Unplaceable):  # the same search on the same view
                    raise AssertionError(f"domain {best[1]} stopped being freeable")
                return plan
        return None

    def freeable(self, victims: Sequence[Candidate]) -> tuple[int, int]:
        """How many domains at the narrowest level could hold the gang were `victims` in
        them gone (the view left as it was), with that level."""
        depth = self.scope.depths[0]
        count = 0
        for path, inside in self._inside(depth, victims):
            if not inside:
                continue  # nothing would leave it: it holds no more than now, too little
            what_if = WhatIf(self.view)
            what_if.remove(k for w in self.leaving for k in self.pods_of.get(w, ()))
            what_if.remove(k for c in inside for k in self.pods_of.get(c.workload.key, ()))
            count += isinstance(self.place_in(path)(), Placement)
            what_if.undo()
        return count, depth

    def _search(
        self, path: tuple[str, ...], inside: Sequence[Candidate], keep: bool
    ) -> NodePlan | Unplaceable:
        # The caller saw the leaving alone not make room anywhere.
        place = self.place_in(path)
        return preempt_on_nodes(
            self.view, inside, self.pods_of, self.leaving, place, keep, short=True
        )

    def _inside(
        self, depth: int, pool: Sequence[Candidate]
    ) -> list[tuple[tuple[str, ...], list[Candidate]]]:
        """Each domain at `depth` the lead pod set may use, with the candidates (victim
        order kept) having a pod on one of its nodes."""
        view = self.view
        lead = self.scope.lead
        shape = next(ps.shape for ps in self.scope.gang.pod_sets if ps.domain == lead)
        cands = candidates(view, shape, PROFILES[self.strategy].filters)
        paths = domains_at(view, cands, lead, depth) if cands.failure is None else []
        members: dict[tuple[str, ...], list[Candidate]] = {path: [] for path in paths}
        levels = lead.levels[: depth + 1]
        node_domain: dict[str, tuple[str, ...]] = {}
        for c in pool:
            seen: set[tuple[str, ...]] = set()
            for key in self.pods_of.get(c.workload.key, ()):
                pod = view.pods.get(key)
                if pod is None:
                    continue
                path = node_domain.get(pod.node)
                if path is None:
                    path = node_domain[pod.node] = node_path(view, pod.node, levels)
                if path not in seen:
                    seen.add(path)
                    found = members.get(path)
                    if found is not None:
                        found.append(c)
        return list(members.items())


def cost(victims: Sequence[Candidate]) -> Cost:
    """How much evicting `victims` costs, lowest first (see the module docstring)."""
    if not victims:  # room without evicting anyone: nothing costs less
        return (-(2**63), 0, 0, 0, 0.0)
    top = max(c.workload.priority for c in victims)
    earliest = min(started_at(c.workload) for c in victims if c.workload.priority == top)
    return (
        top,
        sum(c.workload.disrupts_budget for c in victims),
        len(victims),
        sum(c.workload.priority for c in victims),  # among as many victims
        -earliest,
    )
