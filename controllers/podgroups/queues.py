"""The rule that maps the queue a foreign PodGroup names to a Muster LocalQueue.

Volcano's queues are cluster-scoped and Muster's LocalQueues are namespaced doors into
ClusterQueues, so a queue name Q of a PodGroup in namespace N means, in this order:

1. the LocalQueue Q in N (a team that mirrors its Volcano queue names in LocalQueues);
2. else the LocalQueue in N that points at the ClusterQueue Q (Q was a Volcano queue, and
   ClusterQueues are what Volcano queues become); if several do, the first by name.

A ClusterQueue is never used without a LocalQueue in the group's namespace: the LocalQueue
is how an administrator lets a namespace use a ClusterQueue, and a PodGroup must not get
around that. Anything else is refused with a reason that says what to create.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def resolve(
    namespace: str,
    queue: str,
    local_queues: Iterable[Mapping[str, Any]],
) -> tuple[str | None, str]:
    """(LocalQueue name, how it was found) or (None, why none fits), for `queue` in
    `namespace`, among `local_queues` (any namespaces)."""
    mine = [
        lq
        for lq in local_queues
        if (lq.get("metadata") or {}).get("namespace") == namespace
        and not (lq.get("metadata") or {}).get("deletionTimestamp")
    ]
    names = {str((lq.get("metadata") or {}).get("name")) for lq in mine}
    if queue in names:
        return queue, f"LocalQueue {queue}"
    pointing = sorted(
        str((lq.get("metadata") or {}).get("name"))
        for lq in mine
        if (lq.get("spec") or {}).get("clusterQueue") == queue
    )
    if pointing:
        return pointing[0], f"LocalQueue {pointing[0]} (of ClusterQueue {queue})"
    return None, (
        f"queue {queue!r} maps to no LocalQueue: there is no LocalQueue {queue} in namespace "
        f"{namespace}, and no LocalQueue there points at a ClusterQueue {queue}; create one"
    )
