"""Which domains of its flavors' Topology each pod set of a group keeps to.

The scheduler loop binds inside the domains the admission planned in, and must decide by
the same rule when the plan no longer fits: a pod set's `topologyRequest` resolved against
the Topology of the flavors its admission assigned (`quota.admission.requests.topology_for`,
the admission cycle's own rule). Flavors and Topologies are read from the caches once per
pass and parsed once per resourceVersion.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from controllers.runtime.resources import Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Caches
from quota.admission.requests import topology_for
from quota.api.resourceflavor import ResourceFlavor
from quota.api.topology import Topology, TopologyRequest
from quota.model import convert
from quota.model.snapshot import Flavor
from quota.placement.topology import DomainRequest

log = logging.getLogger(__name__)

# Pod set name -> its domain request.
Domains = dict[str, DomainRequest]


class Topologies:
    """The caches' flavors and Topologies as the placement core reads them."""

    def __init__(self) -> None:
        self._parsed: dict[str, tuple[str, Any]] = {}  # key -> (resourceVersion, parsed)
        self.flavors: dict[str, Flavor] = {}
        self.levels: dict[str, tuple[str, ...]] = {}
        self._named: frozenset[str] = frozenset()  # flavors that name a Topology

    def refresh(self, caches: Caches) -> None:
        """Read the flavors and Topologies as they are now (at the start of a pass)."""
        flavors: dict[str, Flavor] = {}
        for raw in caches.flavors.objects():
            found = self._parse(f"rf:{object_key(raw)}", raw, _flavor)
            if found is not None:
                flavors[found.name] = found
        levels: dict[str, tuple[str, ...]] = {}
        for raw in caches.topologies.objects():
            topology = self._parse(f"topo:{object_key(raw)}", raw, Topology.model_validate)
            if topology is not None:
                levels[topology.name] = topology.spec.labels
        seen = {f"rf:{name}" for name in flavors} | {f"topo:{name}" for name in levels}
        for key in self._parsed.keys() - seen:
            del self._parsed[key]
        self.flavors, self.levels = flavors, levels
        self._named = frozenset(n for n, f in flavors.items() if f.topology is not None)

    def _parse(self, key: str, raw: Obj, parse: Any) -> Any:
        version = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._parsed.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            parsed = parse(raw)
        except ValidationError as error:
            log.warning("not read for placement", extra={"object": key, "error": str(error)[:300]})
            parsed = None
        self._parsed[key] = (version, parsed)
        return parsed

    def domains(self, wl: Mapping[str, Any]) -> tuple[Domains, str | None]:
        """The domain request of each pod set of the admitted Workload `wl`, or why its pods
        cannot be placed as it asks (then none is bound)."""
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
