"""Which domains of its flavors' Topology each pod set of a group keeps to.

The scheduler loop binds inside the domains the admission planned in, and must decide by
the same rule when the plan no longer fits: a pod set's `topologyRequest` resolved against
the Topology of the flavors its admission assigned (`quota.admission.requests.topology_for`,
the admission cycle's own rule). Flavors and Topologies are read from the caches once per
pass and parsed once per resourceVersion; a Workload's requests are worked out once per
version of it, of the flavors and of the Topologies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from controllers.runtime.resources import Obj, object_key
from controllers.scheduler.versions import ByVersion
from controllers.state import workloads as wls
from controllers.state.caches import Caches
from quota.admission.requests import topology_for
from quota.api.resourceflavor import ResourceFlavor
from quota.api.topology import Topology, TopologyRequest
from quota.model import convert
from quota.model.snapshot import Flavor
from quota.placement.topology import DomainRequest

# Pod set name -> its domain request.
Domains = dict[str, DomainRequest]


class Topologies:
    """The caches' flavors and Topologies as the placement core reads them, and each
    admitted Workload's domain requests, worked out again only when the Workload, a flavor
    or a Topology changed."""

    def __init__(self) -> None:
        self._flavors = ByVersion(_flavor, "ResourceFlavor")
        self._topologies = ByVersion(Topology.model_validate, "Topology")
        self.flavors: dict[str, Flavor] = {}
        self.levels: dict[str, tuple[str, ...]] = {}
        self._named: frozenset[str] = frozenset()  # flavors that name a Topology
        # Workload key -> (its resourceVersion, what `domains` said), for these flavors and
        # Topologies: cleared when they change.
        self._memo: dict[str, tuple[str, tuple[Domains, str | None]]] = {}
        self._asked: set[str] = set()

    def refresh(self, caches: Caches) -> None:
        """Read the flavors and Topologies as they are now (at the start of a pass)."""
        flavors = {f.name: f for f in self._flavors.convert(caches.flavors.objects()).values()}
        topologies = self._topologies.convert(caches.topologies.objects()).values()
        levels = {t.name: t.spec.labels for t in topologies}
        if flavors != self.flavors or levels != self.levels:
            self._memo = {}
        else:  # Workloads no pass asked about since the last refresh are gone or done
            self._memo = {k: v for k, v in self._memo.items() if k in self._asked}
        self._asked = set()
        self.flavors, self.levels = flavors, levels
        self._named = frozenset(n for n, f in flavors.items() if f.topology is not None)

    def domains(self, wl: Mapping[str, Any]) -> tuple[Domains, str | None]:
        """The domain request of each pod set of the admitted Workload `wl`, or why its pods
        cannot be placed as it asks (then none is bound)."""
        key = object_key(wl)
        version = str((wl.get("metadata") or {}).get("resourceVersion") or "")
        self._asked.add(key)
        known = self._memo.get(key)
        if known is None or known[0] != version:
            known = (version, self._domains(wl))
            self._memo[key] = known
        return known[1]

    def _domains(self, wl: Mapping[str, Any]) -> tuple[Domains, str | None]:
        assigned = wls.assigned_flavors(wl)
        out: Domains = {}
        several = len((wl.get("spec") or {}).get("podSets") or []) > 1
        for i, ps in enumerate((wl.get("spec") or {}).get("podSets") or []):
            name = str(ps.get("name") or "main")
            chosen = set(assigned.get(name, {}).values())
            raw = ps.get("topologyRequest")
            if raw is None and self._named.isdisjoint(chosen):
                continue
            try:
                ask = convert.pod_set_topology(
                    TopologyRequest.model_validate(raw) if raw is not None else None
                )
            except ValidationError as error:
                first = error.errors()[0]
                return {}, (
                    f"spec.podSets[{i}].topologyRequest: {first.get('msg', 'is not valid')}"
                )
            found, refused = topology_for(self.flavors, self.levels, ask, chosen)
            if refused is not None:
                return {}, f"pod set {name}: {refused}" if several else refused
            if found is not None:
                out[name] = found
        return out, None


def _flavor(raw: Obj) -> Flavor:
    return convert.flavor(ResourceFlavor.model_validate(raw))
