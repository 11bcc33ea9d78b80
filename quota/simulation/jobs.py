"""A Job as the simulator follows it: its state, its slices, its waits and its resizes.

The engine sees only workloads; this is the Job around them that the loop moves through
arrival, admission, eviction, backoff and completion, and that becomes a `JobOutcome`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from quota.lifecycle.eviction import Requeue
from quota.model.snapshot import Hold, PodSet
from quota.simulation.results import Resize, is_placement_reason

# Job states in which it waits to run (its wait time grows): for admission, after an
# eviction, or admitted by a queue that dispatches and waiting for a worker cluster.
WAITING = ("pending", "backoff", "dispatching")


@dataclass(slots=True)
class Job:
    key: str
    local_queue: str
    cluster_queue: str
    priority: int
    submit_at: float
    run_for: float
    pod_sets: tuple[PodSet, ...]  # at the desired parallelism
    elastic: bool
    state: Literal["waiting", "pending", "backoff", "dispatching", "running", "finished"] = (
        "waiting"
    )
    workload: str = ""  # the engine key of its pending or running slice
    scale_slice: str | None = None  # a pending scale-up slice
    slices: int = 0
    run: int = 0  # bumps on every admission and eviction, so stale completions are ignored
    first_admitted: float | None = None
    finished_at: float | None = None
    pending_since: float = 0.0
    waited: float = 0.0
    evictions: int = 0
    requeue: Requeue | None = None  # after its last eviction
    evicted_for: str = ""  # the reason of its last eviction
    hold: Hold | None = None  # moved (consolidation): the room it goes to
    flavors: dict[str, str] = field(default_factory=dict)
    resizes: list[Resize] = field(default_factory=list)
    reason: str = ""
    preemptible: bool | None = None  # muster.dev/preemptible, or None: its queue decides
    placement_wait: float = 0.0
    placement_since: float | None = None  # since when the cycle has said "cannot place"
    pods: int = 0  # pods ever bound, for unique pod names
    landed: str | None = None  # where its gang landed at its last admission (topology level)
    # Why it can never be decided (it names a PriorityClass that does not exist): it waits
    # with this reason from its arrival on, never handed to the admission cycle.
    waits_for: str = ""
    disruption_single: bool = False  # preemption may take single pods (a shrink in place)
    pods_preempted: int = 0  # pods single-pod disruption took from it
    cluster: str | None = None  # the worker cluster it runs (or last ran) in

    def waited_for_placement(self, t: float) -> float:
        """Seconds spent waiting for placement up to `t`."""
        since = self.placement_since
        return self.placement_wait + (t - since if since is not None else 0.0)

    def note(self, reason: str, t: float) -> None:
        """The cycle at `t` kept the Job pending for `reason`, until the next decision."""
        self.stop_placement_wait(t)
        if is_placement_reason(reason):
            self.placement_since = t
        self.reason = reason

    def stop_placement_wait(self, t: float) -> None:
        if self.placement_since is not None:
            self.placement_wait += t - self.placement_since
            self.placement_since = None

    def new_slice_key(self) -> str:
        self.slices += 1
        return self.key if self.slices == 1 else f"{self.key}-slice-{self.slices}"


def with_count(pod_sets: tuple[PodSet, ...], count: int) -> tuple[PodSet, ...]:
    """An elastic Job's pod sets at a new parallelism (its single pod set resizes)."""
    first, *rest = pod_sets
    return (replace(first, count=count), *rest)
