"""What deciding for one pending workload came to, as the cycle's passes read it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(Enum):
    """How a pending workload's turn ended (its decision is recorded either way)."""

    ADMITTED = "admitted"
    # Victims were chosen for it, or its room is reserved: it waits for them to leave.
    WAITING = "waiting"
    # It waits for something that may come in a later cycle (quota, room on nodes).
    PENDING = "pending"
    # No node could ever host it: it must not hold up its queue, even a StrictFIFO one.
    NEVER = "never"
    # It would take its queue beyond fair share: set aside, undecided, for the second pass.
    BEYOND = "beyond"


@dataclass(frozen=True, slots=True)
class NoEviction:
    """A preemption search that evicts no one; `words` add to the wait's reason ("": none)."""

    words: str = ""
