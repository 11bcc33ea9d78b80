"""What the leader sees happen to Workloads, fed to the history store.

The admission loop records what it decides; this feed records what the Workload cache shows
happening (created, requeued, finished), and on taking over replays what every Workload's
status shows, so that a transition a previous leader wrote to the apiserver but was killed
before recording is filled in (the store keeps each transition once). Earlier attempts (an
eviction since followed by a new admission, and who caused it) are no longer visible in a
status: those come back from the recording replica's spool, which the recorder writes ahead
and replays on start.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from controllers.history import transitions as history
from controllers.history.records import TransitionKind, WorkloadTransition
from controllers.runtime.resources import Obj
from controllers.state.caches import Context
from quota.model.queues import cluster_queue_of

log = logging.getLogger("muster.controller")

# Admissions as well as what only the cache sees: an admission write that timed out after the
# apiserver applied it is logged as failed and recorded by nobody else. (Evictions are left to
# the admission loop, whose record names the preemptor; the first record of a key is kept.)
FEED_KINDS = history.WATCHED_KINDS | {TransitionKind.ADMITTED}


class HistoryFeed:
    """Turns Workload cache changes into history records while this replica leads."""

    def __init__(self, ctx: Context, is_leader: Callable[[], bool]) -> None:
        self.ctx = ctx
        self.is_leader = is_leader
        # Set when leading: from then on Workload changes seen are recorded.
        self.recording = False

    def cluster_queue_of(self, wl: Obj) -> str:
        """The ClusterQueue the Workload counts in ("" if none: its LocalQueue is gone)."""
        return cluster_queue_of(wl, self.ctx.caches.local_queues.get) or ""

    def on_workload(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Record what the leader sees happen to a Workload (creation, requeue, finish).

        Runs on whichever thread changed the cache, often an admission write: it compares a
        few fields and builds the records, which the recorder writes ahead before returning."""
        if new is None or not self.recording or not self.is_leader():
            return
        if old is not None and history.milestones(old) == history.milestones(new):
            return
        at = self.ctx.now()
        self.ctx.record_later(
            lambda: history.new_transitions(
                old, new, at=at, kinds=FEED_KINDS, cluster_queue=self.cluster_queue_of(new)
            )
        )

    def start_recording(self) -> None:
        """Start recording (on taking the lead) and replay what the cluster shows.

        The replay runs on a thread of its own: it is called from the elector, whose next
        renewal must not wait for thousands of records to be built and written ahead."""
        if self.ctx.recorder is None:
            return
        self.recording = True
        objects = self.ctx.caches.workloads.objects()

        # Cached objects are replaced, never changed, so they may be read later.
        def replay(chunk: list[Obj]) -> Callable[[], list[WorkloadTransition]]:
            return lambda: [
                t
                for wl in chunk
                for t in history.visible(wl, cluster_queue=self.cluster_queue_of(wl))
            ]

        def run() -> None:
            for start in range(0, len(objects), 100):
                self.ctx.record_later(replay(objects[start : start + 100]))

        threading.Thread(target=run, name="history-replay", daemon=True).start()
        log.info("history: replaying what the cluster shows", extra={"workloads": len(objects)})

    def stop_recording(self) -> None:
        """Stop recording (on shutting down)."""
        self.recording = False
