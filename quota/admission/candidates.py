"""The victim candidate lists of one admission cycle, each sorted once and shared.

Every admitted workload that may still be chosen becomes a `Candidate` once per cycle, in
victim order (quota/preemption/victims.py): per leaf queue (shared by within-queue
preemption and reclaim), all of them, those with pods on nodes, and those a minRuntime still
protects. Taken ones are filtered where a list is used. A non-preemptible workload is never
a candidate: it is left out here, once, so that no search (within-queue preemption, reclaim,
preemption on nodes, consolidation) can choose it.
"""

from __future__ import annotations

from collections.abc import Sequence

from quota.admission.state import CycleState
from quota.fairness.fairshare import Counted
from quota.model.resources import FlavorResource
from quota.model.snapshot import QueueSpec, Workload, is_preemptible
from quota.preemption.nodes import node_candidates
from quota.preemption.reclaim import ReclaimIndex
from quota.preemption.victims import (
    Candidate,
    VictimKey,
    in_victim_order,
    pair_holders,
    started_at,
    victim_order,
    within_queue_candidates,
    within_queue_holders,
)


class VictimLists:
    """The candidate lists of one cycle, each made on first use."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        self._everyone: list[Candidate] | None = None
        self._on_nodes: list[Candidate] | None = None
        self._young: list[Candidate] | None = None
        self._per_queue: dict[str, list[Candidate]] = {}
        self._keys: dict[str, list[VictimKey]] = {}
        # Per queue and (flavor, resource): its admitted workloads holding that pair, in
        # victim order, with their priorities (see within_queue).
        self._holders: dict[tuple[str, FlavorResource], tuple[list[Candidate], list[int]]] = {}
        self._reclaim: ReclaimIndex | None = None
        # Per queue, its admitted workloads that may be chosen, and the non-preemptible rest.
        self._preemptible: dict[str, Sequence[Counted]] = {}
        self._shielded: dict[str, list[Counted]] = {}
        self._shielding: list[str] | None = None  # the queues with any, see `shielding`

    def close(self) -> None:
        """Drop the reclaim index: it holds bound methods of this object, a cycle of
        references the collector would otherwise have to find."""
        self._reclaim = None

    def of_queue(self, queue: str) -> list[Candidate]:
        """The admitted workloads of a leaf as candidates in victim order, sorted once per
        cycle and shared by preemption and reclaim."""
        found = self._per_queue.get(queue)
        if found is None:
            found, keys = in_victim_order(self.preemptible(queue), queue)
            self._per_queue[queue] = found
            self._keys[queue] = keys
        return found

    def preemptible(self, queue: str) -> Sequence[Counted]:
        """The admitted workloads of `queue` (with their usage) that may be chosen as
        victims: all but the non-preemptible ones."""
        found = self._preemptible.get(queue)
        if found is None:
            admitted = self.state.admitted_by_queue.get(queue, ())
            spec = self.state.queues[queue]
            kept = [c for c in admitted if is_preemptible(c[0], spec)]
            # The same list when nothing is left out: most queues hold no non-preemptible work.
            found = admitted if len(kept) == len(admitted) else kept
            self._preemptible[queue] = found
            self._shielded[queue] = [c for c in admitted if not is_preemptible(c[0], spec)]
        return found

    def shielding(self) -> list[str]:
        """The queues holding non-preemptible admitted workloads: found once per cycle, on
        the first search that fails, so that each failure after looks at those alone."""
        if self._shielding is None:
            self._shielding = [
                queue for queue in self.state.admitted_by_queue if self._shielded_of(queue)
            ]
        return self._shielding

    def _shielded_of(self, queue: str) -> list[Counted]:
        self.preemptible(queue)
        return self._shielded[queue]

    def shielded(
        self, spec: QueueSpec, w: Workload, contended: set[FlavorResource]
    ) -> list[Workload]:
        """The non-preemptible workloads `w` could otherwise have taken by its queue's
        policies, holding some of `contended`: lower-priority ones of its own queue, and
        those of queues above their fair share in what it is short of, as reclaim allows.
        Why a search that found no victims may have found none."""
        state = self.state
        out: list[Workload] = []
        for queue in self.shielding():
            own = queue == spec.name
            policy = spec.within_queue if own else spec.reclaim
            if policy == "Never":
                continue
            shielded = self._shielded[queue]
            pairs = contended
            if not own:
                used, share = state.planned.used[queue], state.fair.shares.get(queue, {})
                pairs = {k for k in contended if used.get(k, 0) > share.get(k, 0)}
            lower = own or policy == "LowerPriority"
            out.extend(
                v
                for v, usage in shielded
                if v.key not in state.taken
                and (not lower or v.priority < w.priority)
                and not pairs.isdisjoint(usage)
            )
        return out

    def shielded_on_nodes(
        self, w: Workload, spec: QueueSpec, excluded: set[str] | frozenset[str]
    ) -> list[Workload]:
        """The non-preemptible workloads with pods on nodes that `w` could otherwise evict
        for room there (by `node_candidates`' rules): why a placement that found no victims
        may have found none."""
        state = self.state
        ordered: list[Candidate] = []
        for queue in self.shielding():
            placed = [c for c in self._shielded[queue] if c[0].key in state.pods_of]
            ordered.extend(in_victim_order(placed, queue)[0])
        if not ordered:
            return []
        ordered.sort(key=victim_order)
        found = node_candidates(w, spec, state.queues, ordered, excluded, state.snapshot.now)
        return [c.workload for c in found.allowed]

    def keys(self, queue: str) -> list[VictimKey]:
        """`victim_order` of each of `of_queue(queue)`, for the reclaim search's merge."""
        keys = self._keys.get(queue)
        if keys is None:
            self.of_queue(queue)
            keys = self._keys[queue]
        return keys

    def everyone(self) -> list[Candidate]:
        """Every admitted workload as a candidate, in victim order."""
        if self._everyone is None:
            self._everyone = sorted(
                (c for name in self.state.admitted_by_queue for c in self.of_queue(name)),
                key=victim_order,
            )
        return self._everyone

    def young(self) -> list[Candidate]:
        """Admitted workloads some minRuntime still protects (in their own queue or from
        reclaim), in victim order: the only ones a failed search may have spared for it.

        A failed search asks after them; walking every admitted workload instead made each
        failure cost as much as the cluster is large."""
        if self._young is None:
            state = self.state
            now = state.snapshot.now
            young: list[Candidate] = []
            for name in state.admitted_by_queue:
                queue = state.queues[name]
                preempt, reclaim = queue.min_runtime_preempt_s, queue.min_runtime_reclaim_s
                if not preempt and not reclaim:
                    continue
                for c in self.of_queue(name):
                    start = started_at(c.workload)
                    if (preempt and now < start + preempt) or (reclaim and now < start + reclaim):
                        young.append(c)
            young.sort(key=victim_order)
            self._young = young
        return self._young

    def on_nodes(self) -> list[Candidate]:
        """Admitted workloads with pods on nodes, in victim order."""
        if self._on_nodes is None:
            pods_of = self.state.pods_of
            self._on_nodes = [c for c in self.everyone() if c.workload.key in pods_of]
        return self._on_nodes

    def within_queue(
        self, spec: QueueSpec, w: Workload, contended: set[FlavorResource]
    ) -> list[Candidate]:
        """The workloads of `w`'s own queue it may preempt, in victim order."""
        state = self.state
        if len(contended) == 1 and spec.within_queue != "Never":
            # Short of one pair: only the queue's workloads holding it can help. They are
            # listed once per queue and pair, in victim order, for every search to bisect.
            pair = next(iter(contended))
            found = self._holders.get((spec.name, pair))
            if found is None:
                found = self._holders[spec.name, pair] = pair_holders(
                    self.preemptible(spec.name), pair, spec.name
                )
            return within_queue_holders(
                w,
                spec.within_queue,
                found[0],
                found[1],
                state.taken,
                state.snapshot.now,
                spec.min_runtime_preempt_s,
            )
        return within_queue_candidates(
            w,
            spec.within_queue,
            spec.name,
            self.preemptible(spec.name),
            state.taken,
            contended,
            state.snapshot.now,
            spec.min_runtime_preempt_s,
        )

    def reclaim_index(self) -> ReclaimIndex:
        """Every admitted workload as a reclaim candidate, per leaf in victim order."""
        if self._reclaim is None:
            state = self.state
            self._reclaim = ReclaimIndex(
                state.admitted_by_queue,
                self.of_queue,
                self.keys,
                state.planned,
                state.tree,
                state.fair.shares,
                state.quotas,
            )
        return self._reclaim


def shielded_words(shielded: Sequence[Workload]) -> str:
    """ "2 workloads in its way are non-preemptible and never evicted: ns/a, ns/b" ("" for
    none)."""
    if not shielded:
        return ""
    n = len(shielded)
    names = ", ".join(v.key for v in shielded[:4]) + (f" and {n - 4} more" if n > 4 else "")
    verb = "workloads in its way are" if n != 1 else "workload in its way is"
    return f"{n} {verb} non-preemptible and never evicted: {names}"
