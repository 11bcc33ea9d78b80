"""One admission cycle: which pending workloads to admit, whom to evict, and why.

Queues are visited lowest usage/fair-share ratio first, subtrees compared before the queues
in them (quota/fairness/ordering.py); a queue keeps admitting while it stays the most
deserving, so one cycle admits as many workloads per queue as fit. Queues are visited twice:
first for what keeps them within fair share, then for what borrows beyond it.

This module is the driver: the queue passes. The parts it drives, each over the one
`CycleState` (state.py: the two ledgers, the node view, the decisions):

- decide.py: one workload at its queue's turn (fit quota, place, admit or wait);
- quota_preemption.py: within-queue preemption and reclaim;
- node_room.py: preemption on nodes, with the holds and lapses of a waiting preemptor;
- moves.py: consolidation (moving workloads so that a gang fits);
- candidates.py: the victim candidate lists they share;
- requests.py, reasons.py: a pending workload prepared for fitting, and the words.
"""

from __future__ import annotations

from collections.abc import Mapping

from quota.admission.candidates import VictimLists
from quota.admission.decide import Decide
from quota.admission.moves import Moves
from quota.admission.node_room import NodeRoom
from quota.admission.quota_preemption import QuotaPreemption
from quota.admission.requests import Requests
from quota.admission.state import CycleState
from quota.fairness.fairshare import FairShare, fair_share
from quota.fairness.ordering import workload_order
from quota.model.decisions import CycleResult, Pending
from quota.model.snapshot import QueueSpec, Snapshot, Workload, admission_blocker


def admission_cycle(snapshot: Snapshot, fair: FairShare | None = None) -> CycleResult:
    """Decide, for every pending workload of `snapshot`, admit or keep pending (and evict whom).

    `fair` may be passed when the caller already computed it for the same snapshot.
    """
    state = CycleState(snapshot, fair if fair is not None else fair_share(snapshot))
    lists = VictimLists(state)
    room = NodeRoom(state, lists)
    decide = Decide(
        state,
        Requests(state),
        room,
        QuotaPreemption(state, lists, room),
        Moves(state, lists, room),
    )
    open_queues = _open_queues(state)
    # Two passes, as KAI-Scheduler allocates deserved quota before over-quota: first each
    # queue admits while it stays (with its ancestors) within fair share, then, from what
    # is left, the rest. Otherwise a queue could borrow room that another queue below
    # its share was about to use (room a reclaim had just freed, say), and lose it to
    # that queue's reclaim in the next cycle: churn.
    beyond: dict[str, list[Workload]] = {}
    _pass(state, decide, open_queues, beyond)
    _pass(state, decide, beyond, None)
    # The reclaim index holds bound methods of the victim lists: dropped so that the cycle
    # and all it made (fair share's per-workload usage, ledgers, victim lists: ~80,000
    # objects in the bench's contended cycle) are freed by reference counting as it
    # returns, not left as cyclic garbage for the collector, whose next pass then walked
    # them all (~30 ms there, usually as the caller turns the collector back on).
    lists.close()
    return CycleResult(
        admit=tuple(state.admit),
        preempt=tuple(state.preempt),
        pending=tuple(state.pending),
        drain=tuple(state.drain),
    )


def _open_queues(state: CycleState) -> dict[str, list[Workload]]:
    """The pending workloads per queue that admits, in order; those of a stopped queue
    wait with its reason."""
    by_queue: dict[str, list[Workload]] = {}
    for w in state.snapshot.pending:
        by_queue.setdefault(w.queue, []).append(w)
    open_queues: dict[str, list[Workload]] = {}
    held = state.reserved
    for name in sorted(by_queue):
        items = by_queue[name]
        items.sort(key=workload_order)
        if held:
            # Holders first (a moved workload, a preemptor whose room is held): they already
            # won their place, and are not put behind newcomers (nor held back for the
            # second pass behind one, nor kept waiting behind a StrictFIFO head).
            items.sort(key=lambda w: w.key not in held)
        blocker = admission_blocker(state.queues, state.tree, name)
        if blocker is not None:
            state.pending.extend(Pending(w.key, name, blocker) for w in items)
            continue
        open_queues[name] = items
    return open_queues


def _pass(
    state: CycleState,
    decide: Decide,
    by_queue: Mapping[str, list[Workload]],
    beyond: dict[str, list[Workload]] | None,
) -> None:
    """Visit the queues in order and decide for their workloads.

    With `beyond`, a workload that would take its queue beyond fair share is set aside
    there, in order, with whatever `_held_back` keeps behind it.
    """
    order = state.order = state.new_order()
    order.push_all(name for name in by_queue if by_queue[name])
    cursor = dict.fromkeys(by_queue, 0)
    while (name := order.pop()) is not None:
        items = by_queue[name]
        spec = state.queues[name]
        index = cursor[name]
        moved = False
        decide.new_turn()
        while index < len(items):
            w = items[index]
            index += 1
            if beyond is not None and name in beyond and _held_back(spec, w, beyond[name][0]):
                beyond[name].extend(items[index - 1 :])
                index = len(items)
                break
            outcome = decide.consider(spec, w, within_share=beyond is not None)
            if outcome == "beyond":
                assert beyond is not None
                beyond.setdefault(name, []).append(w)
                continue
            if outcome == "admitted":
                moved = True
                break
            if outcome == "never":
                continue  # no node could ever host it: it must not hold up the queue
            if spec.queueing_strategy == "StrictFIFO" or outcome == "waiting":
                if spec.queueing_strategy == "StrictFIFO":
                    why = f"waiting behind {w.key}, the head of StrictFIFO queue {name}" + (
                        " (it is waiting for preempted workloads)" if outcome == "waiting" else ""
                    )
                    state.pending.extend(Pending(x.key, name, why) for x in items[index:])
                    index = len(items)
                moved = True
                break
        cursor[name] = index
        if moved and index < len(items):
            order.push(name)
        elif moved:
            order.refresh(name)  # its ancestors stay in line with their new usage


def _held_back(spec: QueueSpec, w: Workload, first: Workload) -> bool:
    """Whether `w` must wait for the borrowing pass because `first`, ahead of it in its
    queue, was set aside for it.

    BestEffortFIFO lets a workload pass one that cannot be admitted yet, and one set
    aside is in that position, so `w` may go unless `first` could preempt it within the
    queue: it would only be evicted for `first` a cycle later. StrictFIFO holds all.
    """
    if spec.queueing_strategy == "StrictFIFO":
        return True
    if spec.within_queue == "LowerPriority":
        return w.priority < first.priority
    if spec.within_queue == "LowerOrNewerEqualPriority":
        return w.priority <= first.priority  # those behind it arrived later
    return False
