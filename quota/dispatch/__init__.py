"""Dispatch to many clusters: which one worker cluster an admitted gang is sent to, whole.

Pure like the rest of `quota/`: the controller of the management cluster keeps each
worker's nodes, bound pods and the placements of the gangs it sent there (`WorkerState`),
and asks `choose_cluster` where the next admitted workload goes.

Modules: `workers.py` (a worker cluster and the free room of its nodes, with the room of
gangs sent there and not bound yet reserved), `gang.py` (the gang an admitted workload
places, as the admission cycle shapes it), `choose.py` (the choice among clusters).
"""

from quota.dispatch.choose import NO_WORKERS, Dispatched, NoCluster, choose_cluster
from quota.dispatch.gang import NO_TOPOLOGIES, admitted_gang
from quota.dispatch.workers import WorkerState, worker_view

__all__ = [
    "NO_TOPOLOGIES",
    "NO_WORKERS",
    "Dispatched",
    "NoCluster",
    "WorkerState",
    "admitted_gang",
    "choose_cluster",
    "worker_view",
]
