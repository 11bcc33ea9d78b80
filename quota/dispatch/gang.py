"""The gang an admitted workload sends to a worker cluster: its admitted pods, on the flavors
its admission chose, shaped exactly as the admission cycle places them in one cluster."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from quota.admission.requests import gang_of
from quota.model.snapshot import Flavor, Snapshot, Workload
from quota.placement.gang import GangRequest

# No Topology known: a flavor that names one cannot be honoured anywhere.
NO_TOPOLOGIES: Mapping[str, tuple[str, ...]] = MappingProxyType({})


def admitted_gang(
    workload: Workload,
    flavors: Mapping[str, Flavor],
    topologies: Mapping[str, tuple[str, ...]] = NO_TOPOLOGIES,
) -> GangRequest | None:
    """The gang of `workload`'s admitted pods (None: it has none), every one to be placed.

    The admission's count and flavors per pod set, the flavors' node labels and
    tolerations added to each pod's own (`quota.admission.requests.gang_of`, as a moved
    workload is re-placed), and each pod set's topology request resolved against
    `topologies` (Topology name -> its levels' node labels, widest first).
    """
    if workload.admission is None:
        raise ValueError(f"workload {workload.key} is not admitted: only admitted ones are sent")
    by_name = {a.pod_set: a for a in workload.admission}
    counts = [by_name[ps.name].count if ps.name in by_name else 0 for ps in workload.pod_sets]
    chosen = [
        dict(by_name[ps.name].flavors) if ps.name in by_name else {} for ps in workload.pod_sets
    ]
    # gang_of reads only the flavors and Topologies of a snapshot: one made of just those
    # keeps one rule for how an admitted workload's pods are shaped.
    snapshot = Snapshot(0.0, {}, flavors, topologies=topologies)
    gang, _ = gang_of(snapshot, workload, counts, chosen, False)
    return gang
