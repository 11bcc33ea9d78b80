"""quota/model/transaction.py: whatever a search charges, releases or records tentatively is
undone exactly, to a checkpoint or entirely, and kept for good once committed.

Every victim search and node what-if leans on this: a change left behind by a rollback is
a silent quota leak the next decision of the cycle is made on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.model.ledger import Ledger
from quota.model.resources import FlavorResource, flavor_resource
from quota.model.transaction import Transaction

GPU = flavor_resource("a100", "nvidia.com/gpu")
CPU = flavor_resource("default", "cpu")
KEYS = (GPU, CPU)
# root -> team-a -> {a1, a2}; root -> team-b. team-a is limited, so headroom walks a limit.
PATHS = {
    "root": ("root",),
    "team-a": ("team-a", "root"),
    "a1": ("a1", "team-a", "root"),
    "a2": ("a2", "team-a", "root"),
    "team-b": ("team-b", "root"),
}
LIMITS = {"team-a": {GPU: 12}}
AMOUNT = {GPU: 16, CPU: 64}

usages = st.dictionaries(st.sampled_from(KEYS), st.integers(min_value=0, max_value=9), max_size=2)
# One step: a charge, a release, a recorded side change, or a checkpoint.
Step = tuple[str, str, dict[FlavorResource, int]]
steps: st.SearchStrategy[Step] = st.one_of(
    st.tuples(st.just("charge"), st.sampled_from(sorted(PATHS)), usages),
    st.tuples(st.just("release"), st.sampled_from(sorted(PATHS)), usages),
    st.tuples(st.just("record"), st.integers(min_value=-3, max_value=3).map(str), st.just({})),
    st.tuples(st.just("mark"), st.just(""), st.just({})),
)


def _ledger() -> Ledger:
    ledger = Ledger(PATHS, LIMITS, AMOUNT)
    ledger.charge("a1", {GPU: 4, CPU: 8})
    ledger.charge("team-b", {GPU: 2})
    return ledger


State = tuple[
    dict[str, dict[FlavorResource, int]], dict[tuple[str, FlavorResource], int], list[int]
]


def _state(ledger: Ledger, side: list[int]) -> State:
    """What a decision can observe: usage per queue (zeros dropped) and every headroom."""
    used = {q: {k: v for k, v in u.items() if v} for q, u in ledger.used.items()}
    room = {(q, k): ledger.headroom(q, k) for q in PATHS for k in KEYS}
    return (used, room, list(side))


def _drop_last(side: list[int]) -> None:
    side.pop()


def _run(
    tx: Transaction,
    ledger: Ledger,
    side: list[int],
    program: list[Step],
) -> list[tuple[int, State]]:
    """Apply `program`; return each checkpoint with the state it was taken in."""
    marks = []
    for op, arg, usage in program:
        if op == "charge":
            tx.charge(ledger, arg, usage)
        elif op == "release":
            tx.release(ledger, arg, usage)
        elif op == "record":
            delta = int(arg)
            side.append(delta)
            tx.record(lambda: _drop_last(side))
        else:
            marks.append((tx.checkpoint(), _state(ledger, side)))
    return marks


@settings(max_examples=200, deadline=None)
@given(program=st.lists(steps, max_size=25), pick=st.integers(min_value=0))
def test_a_rollback_to_any_checkpoint_restores_exactly_what_was_there(
    program: list[Step], pick: int
) -> None:
    ledger, side, tx = _ledger(), list[int](), Transaction()
    start = _state(ledger, side)
    marks = _run(tx, ledger, side, program)
    # Marks stay valid until a rollback to an earlier one: unwind from the newest to the
    # oldest (a random suffix of them), checking each.
    for mark, state in reversed(marks[pick % (len(marks) + 1) :]):
        tx.rollback(mark)
        assert _state(ledger, side) == state
    tx.rollback()
    assert _state(ledger, side) == start


@settings(max_examples=100, deadline=None)
@given(program=st.lists(steps, min_size=1, max_size=25))
def test_committed_changes_stay_and_a_later_rollback_undoes_only_what_came_after(
    program: list[Step],
) -> None:
    ledger, side, tx = _ledger(), list[int](), Transaction()
    _run(tx, ledger, side, program)
    tx.commit()
    kept = _state(ledger, side)
    tx.rollback()
    assert _state(ledger, side) == kept
    tx.charge(ledger, "a2", {GPU: 3})
    assert ledger.headroom("a2", GPU) == kept[1][("a2", GPU)] - 3
    tx.rollback(0)
    assert _state(ledger, side) == kept


def test_changes_are_undone_newest_first() -> None:
    """A recorded undo that reads the ledger sees it as it was when the change was made."""
    ledger, tx = _ledger(), Transaction()
    seen: list[int] = []
    tx.charge(ledger, "a2", {GPU: 5})
    tx.record(lambda: seen.append(ledger.headroom("a2", GPU)))
    tx.charge(ledger, "a2", {GPU: 1})
    tx.rollback()
    # team-a's limit is 12 with 4 (a1) + 5 (a2) charged when the record was made: 3 left.
    assert seen == [3]
    assert ledger.headroom("a2", GPU) == 8
