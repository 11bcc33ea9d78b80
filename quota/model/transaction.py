"""Tentative changes that a cycle may take back: checkpoint, rollback, commit.

Victim searches release quota to ask "would the preemptor fit now?" and must put back exactly
what they released when the answer is no. Undoing by hand (charge, then charge again with the
opposite sign on every exit path) turns one forgotten path into a silent quota leak. A
Transaction journals every change it makes and undoes them in reverse order, to a checkpoint
or entirely, so a search only says which state it wants to keep.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from quota.model.ledger import Ledger
from quota.model.resources import FlavorResource


class Transaction:
    """A journal of tentative ledger charges (and any other undoable change)."""

    __slots__ = ("_journal",)

    def __init__(self) -> None:
        # Each entry undoes one change: a ledger charge to reverse, or a callable.
        self._journal: list[
            tuple[Ledger, str, Mapping[FlavorResource, int], int] | Callable[[], None]
        ] = []

    def checkpoint(self) -> int:
        """A mark to roll back to; marks stay valid until a rollback to an earlier one."""
        return len(self._journal)

    def charge(self, ledger: Ledger, queue: str, usage: Mapping[FlavorResource, int]) -> None:
        """Charge `usage` to `queue` (and its ancestors), tentatively."""
        ledger.charge(queue, usage)
        self._journal.append((ledger, queue, usage, -1))

    def release(self, ledger: Ledger, queue: str, usage: Mapping[FlavorResource, int]) -> None:
        """Release `usage` from `queue` (and its ancestors), tentatively."""
        ledger.release(queue, usage)
        self._journal.append((ledger, queue, usage, 1))

    def record(self, undo: Callable[[], None]) -> None:
        """Journal a change made elsewhere (a node view, say) by the callable that undoes it."""
        self._journal.append(undo)

    def rollback(self, mark: int = 0) -> None:
        """Undo every change made since `mark` (all of them by default), newest first."""
        journal = self._journal
        while len(journal) > mark:
            entry = journal.pop()
            if callable(entry):
                entry()
            else:
                ledger, queue, usage, sign = entry
                ledger.charge(queue, usage, sign)

    def commit(self) -> None:
        """Keep every change: nothing can be rolled back past this point."""
        self._journal.clear()
