"""What deciding for one pending workload came to, as the cycle's passes read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How a pending workload's turn ended (its decision is recorded either way):
# - "admitted";
# - "waiting": victims were chosen for it, or its room is reserved: it waits for them to leave;
# - "pending": it waits for something that may come in a later cycle (quota, room on nodes);
# - "never": no node could ever host it: it must not hold up its queue, even a StrictFIFO one;
# - "beyond": it would take its queue beyond fair share: set aside, undecided, for the
#   second pass.
# Literal strings rather than an Enum: on Python 3.11 every member read of an Enum class
# goes through its metaclass's __getattr__ hook, and the passes read several per workload
# (1 % of the bench's contended cycle).
Outcome = Literal["admitted", "waiting", "pending", "never", "beyond"]


@dataclass(frozen=True, slots=True)
class NoEviction:
    """A preemption search that evicts no one; `words` add to the wait's reason ("": none).
    `waiting`: it did not search, because its queue's waitBeforeEvicting has not yet passed."""

    words: str = ""
    waiting: bool = False
