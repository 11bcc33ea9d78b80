"""The dispatcher: sends each admitted workload of a dispatching ClusterQueue, whole, to the
worker cluster where its placement is feasible now, starts it there once the worker's Muster
has admitted it, mirrors its status back, and takes it back when it must.

Every step writes what it is about to do on the management cluster's Workload *before* doing
it in the worker (`muster.dev/dispatched-to` before the copy is created, `dispatch-started`
before the copy is let start), so a restarted manager resumes without a second copy, and the
manager always knows which copies may be running: only those it let start. A lost worker's
copies that were never let start are sent elsewhere (they can never start where they are:
the worker's Muster waits for the manager, `controllers.state.dispatch.awaits_manager`), and
deleted once the worker answers again; copies that were let start are left alone until the
worker answers.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from controllers.admission.view import engine_workload
from controllers.history import transitions as history
from controllers.multicluster import copies
from controllers.multicluster.sent import FORGET, Sent, annotate, merged, placement_to_json
from controllers.multicluster.status import same_status, worker_status
from controllers.multicluster.workers import Worker, Workers
from controllers.runtime.informer import Informer
from controllers.runtime.resources import JOB, WORKER_CLUSTER, Obj, object_key
from controllers.state import workloads as wls
from controllers.state.caches import Context
from quota.api.clusterqueue import ClusterQueue
from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import (
    DISPATCH_ABANDONED_ANNOTATION,
    DISPATCH_MANAGED_BY,
    DISPATCH_PLAN_ANNOTATION,
    DISPATCH_STARTED_ANNOTATION,
    DISPATCHED_TO_ANNOTATION,
    JOB_POD_SET,
    JOB_UID_LABEL,
    ORIGIN_UID_LABEL,
    POD_SET_POD_LABEL,
)
from quota.api.resourceflavor import ResourceFlavor
from quota.api.topology import Topology
from quota.api.workload import Workload as WorkloadModel
from quota.dispatch import Dispatched, NoCluster, WorkerState, choose_cluster
from quota.model import convert
from quota.model.nodes import BoundPod
from quota.model.queues import admitted_to
from quota.model.resources import FlavorResource
from quota.model.snapshot import Flavor, Workload
from quota.placement.gang import Placement

log = logging.getLogger(__name__)

PROBE_PERIOD_S = 5.0
STATUS_PERIOD_S = 10.0
MIN_PASS_S = 0.2
# A copy the worker's Muster has not admitted this long after it was sent is taken back and
# the workload planned again, elsewhere if it can (the worker's own queues may disagree).
ADMIT_WITHIN_S = 60.0


class Dispatcher:
    """Runs the dispatch loop of the management cluster (leader only acts)."""

    def __init__(
        self, ctx: Context, clusters: Informer, namespace: str, interval: float = 1.0
    ) -> None:
        self.ctx = ctx
        self.clusters = clusters  # WorkerCluster objects
        self.workers = Workers(ctx.kube, namespace, on_change=self.poke)
        self.interval = interval
        self._last_probe = 0.0
        self._last_status = 0.0
        self._said: dict[str, str] = {}  # workload key -> the last wait reason said
        # workload key -> {cluster: until}: a worker that did not admit its copy in time.
        self._shunned: dict[str, dict[str, float]] = {}
        # workload key -> the fleet it fit nowhere in (see `dispatch`).
        self._no_room: dict[str, object] = {}
        # workload key -> the copy's resourceVersion whose status its Job here refused: tried
        # again only once the copy changes, not on every pass.
        self._refused: dict[str, str] = {}
        self._poke = threading.Event()

    def poke(self) -> None:
        self._poke.set()

    # ---------------------------------------------------------------- the loop
    def run(self, stop: threading.Event, is_leader: Callable[[], bool]) -> None:
        while not stop.is_set():
            self._poke.wait(self.interval)
            self._poke.clear()
            # Pokes come with every Workload change: passes at most this often under load.
            if stop.wait(MIN_PASS_S):
                break
            try:
                self.step(is_leader())
            except Exception:
                log.exception("dispatch pass failed")
        self.workers.stop()

    def step(self, leader: bool) -> None:
        """One pass: follow the WorkerClusters, probe them, and (leader) act."""
        self.workers.sync(self.clusters.objects())
        now = time.time()
        if now - self._last_probe >= PROBE_PERIOD_S:
            self._last_probe = now
            for worker in self.workers.all():
                worker.probe()
        if not leader:
            return
        self.dispatch(now)
        if now - self._last_status >= STATUS_PERIOD_S:
            self._last_status = now
            self.write_status(now)

    # ------------------------------------------------------------ the decisions
    def dispatch(self, now: float) -> None:
        caches = self.ctx.caches
        queues = self._dispatching_queues()
        if not queues and not self.workers.all():
            return  # nothing to send and nowhere to follow a copy: a pass costs nothing
        flavors = self._flavors()
        mine: dict[str, Obj] = {}  # workload key -> Workload, every one with a dispatch state
        waiting: list[tuple[str, Obj, str]] = []  # admitted, not sent yet
        resizing: list[tuple[str, Obj, str, Obj]] = []  # scale-up slices of sent ones
        for key, wl in caches.workloads.items():
            sent = Sent.of(wl)
            queue = admitted_to(wl)
            if sent.cluster or sent.abandoned:
                mine[key] = wl
            if queue in queues and wls.has_quota(wl) and not wls.is_finished(wl):
                mine[key] = wl
                if sent.cluster is None and not wls.is_evicted(wl) and not wls.is_deleting(wl):
                    before = _replaced(caches.workloads, wl)
                    if before is not None and Sent.of(before).cluster:
                        resizing.append((key, wl, queue, before))
                    else:
                        waiting.append((key, wl, queue))
        # A slice whose successor carries its copy on is no longer followed.
        superseded = {
            f"{key.split('/', 1)[0]}/{wls.replaces(wl)}"
            for key, wl in mine.items()
            if wls.replaces(wl) and Sent.of(wl).cluster
        }
        # What is remembered per workload goes with it.
        self._said = {k: v for k, v in self._said.items() if k in mine}
        self._shunned = {k: v for k, v in self._shunned.items() if k in mine}
        self._refused = {k: v for k, v in self._refused.items() if k in mine}
        self._sweep_orphans()
        for key, wl in mine.items():
            if key not in superseded:
                self._follow(key, wl, queues, now)
        holders = {
            wls.owner_job_uid(wl) or "": key
            for key, wl in sorted(mine.items(), key=lambda kv: kv[0] in superseded, reverse=True)
            if Sent.of(wl).cluster and not wls.is_finished(wl)
        }
        states = {w.name: self._state(w, mine, holders, now) for w in self.workers.all()}
        for key, wl, queue, before in resizing:
            self._resize(key, wl, queues[queue], before, flavors, states)
        # Sending only takes room: a workload that fit nowhere is tried again once a worker's
        # nodes or pods changed, a worker came or went, or a plan it was up against ended.
        fleet = (
            tuple((w.name, w.changes, w.available(now)[0]) for w in self.workers.all()),
            frozenset(k for state in states.values() for k in state.dispatched),
        )
        waiting_keys = {key for key, _, _ in waiting}
        self._no_room = {k: v for k, v in self._no_room.items() if k in waiting_keys}
        for key, wl, queue in sorted(waiting, key=lambda t: _arrival(t[1])):
            shunned = frozenset(c for c, t in self._shunned.get(key, {}).items() if t > now)
            if self._no_room.get(key) == (fleet, shunned):
                continue
            choice = self._choose(key, wl, queues[queue], flavors, states, now)
            if isinstance(choice, NoCluster):
                self._no_room[key] = (fleet, shunned)
                self._say(key, wl, choice.reason)
                continue
            if self._send(key, wl, choice, now):
                state = states[choice.cluster]
                states[choice.cluster] = replace(
                    state, dispatched={**state.dispatched, key: choice.placement}
                )

    def _choose(
        self,
        key: str,
        wl: Obj,
        cq: ClusterQueue,
        flavors: Mapping[str, Flavor],
        states: Mapping[str, WorkerState],
        now: float,
    ) -> Dispatched | NoCluster:
        assert cq.spec.dispatch is not None
        selector = cq.spec.dispatch.cluster_selector
        shunned = {c for c, until in self._shunned.get(key, {}).items() if until > now}
        candidates = []
        for raw in self.clusters.objects():
            name = str(raw["metadata"]["name"])
            labels = dict((raw.get("metadata") or {}).get("labels") or {})
            if not selector.matches(labels):
                continue
            state = states.get(name)
            if state is None:
                why = self.workers.problems.get(name, "not connected yet")
                state = WorkerState(name, (), (), {}, available=False, why=why)
            elif name in shunned:
                state = replace(
                    state,
                    available=False,
                    why=f"did not admit it within {ADMIT_WITHIN_S:.0f}s when it was sent there",
                )
            candidates.append(state)
        try:
            model = WorkloadModel.model_validate(wl)
        except ValidationError as error:
            return NoCluster(f"invalid Workload: {str(error)[:300]}")
        engine = engine_workload(model, cq.name, wl)
        return choose_cluster(
            engine, flavors, candidates, cq.spec.placement_strategy, self._topologies()
        )

    def _resize(
        self,
        key: str,
        wl: Obj,
        cq: ClusterQueue,
        before: Obj,
        flavors: Mapping[str, Flavor],
        states: Mapping[str, WorkerState],
    ) -> None:
        """A scale-up slice of a workload already sent: its extra pods go to the same worker
        or wait, never elsewhere (the running pods stay where they are)."""
        sent = Sent.of(before)
        assert sent.cluster is not None
        state = states.get(sent.cluster)
        if state is None or not state.available or sent.plan is None:
            why = state.why if state is not None else "not connected"
            self._say(key, wl, f"its scale-up waits for worker cluster {sent.cluster}: {why}")
            return
        try:
            model = WorkloadModel.model_validate(wl)
        except ValidationError as error:
            self._say(key, wl, f"invalid Workload: {str(error)[:300]}")
            return
        extra = _extra_pods(engine_workload(model, cq.name, wl), sent.plan)
        plan = sent.plan
        if extra is not None:
            old = state.dispatched
            state = replace(state, dispatched={k: v for k, v in old.items() if k != key})
            choice = choose_cluster(
                extra, flavors, [state], cq.spec.placement_strategy, self._topologies()
            )
            if isinstance(choice, NoCluster):
                self._say(
                    key,
                    wl,
                    f"its scale-up waits for room in worker cluster {sent.cluster}, where it "
                    f"runs: {choice.reason}",
                )
                return
            plan = merged(sent.plan, choice.placement)
        changes: dict[str, str | None] = {
            DISPATCHED_TO_ANNOTATION: sent.cluster,
            DISPATCH_PLAN_ANNOTATION: placement_to_json(plan, sent.at),
            DISPATCH_STARTED_ANNOTATION: "true" if sent.started else None,
        }
        if self.ctx.update_workload(wl, annotate(changes)) is not None:
            self._said.pop(key, None)
            log.info("scale-up dispatched", extra={"workload": key, "cluster": sent.cluster})

    def _send(self, key: str, wl: Obj, choice: Dispatched, now: float) -> bool:
        """Record the choice on the Workload, then create the copy there."""
        worker = self.workers.get(choice.cluster)
        job = self._job(wl)
        if worker is None or job is None:
            return False
        written = self.ctx.update_workload(
            wl,
            annotate(
                {
                    DISPATCHED_TO_ANNOTATION: choice.cluster,
                    DISPATCH_PLAN_ANNOTATION: placement_to_json(choice.placement, now),
                }
            ),
        )
        if written is None:
            return False
        self._said.pop(key, None)
        self.ctx.record_later(
            lambda: [history.dispatched(written, choice.cluster, choice.reason, at=wls.now_utc())]
        )
        self._create_copy(worker, key, written, job)
        self.ctx.events.emit(wl, "Normal", "Dispatched", choice.reason)
        self.ctx.events.emit(job, "Normal", "Dispatched", choice.reason)
        log.info("dispatched", extra={"workload": key, "cluster": choice.cluster})
        return True

    def _create_copy(self, worker: Worker, key: str, wl: Obj, job: Obj) -> None:
        uid = str(job["metadata"]["uid"])
        body = copies.job_copy(job, key, uid)
        try:
            worker.kube.create(JOB, body["metadata"]["namespace"], body)
        except ApiException as error:
            if error.status != 409:
                # Said on the Workload (a namespace missing there, say); taken back and planned
                # again if it lasts (`_follow`).
                self._say(
                    key,
                    wl,
                    f"its copy cannot be created in worker cluster {worker.name}: "
                    f"{_api_error(error)}",
                )
                return
            # Created before (a restart between the create and now): ours, or a stranger.
            existing = worker.kube.get(JOB, body["metadata"]["namespace"], body["metadata"]["name"])
            if existing is not None and not copies.is_copy_of(existing, uid):
                self._say(
                    key,
                    wl,
                    f"worker cluster {worker.name} already has a Job "
                    f"{object_key(body)} that is not this workload's copy",
                )

    def _follow(self, key: str, wl: Obj, queues: Mapping[str, ClusterQueue], now: float) -> None:
        """Carry a sent workload on: start it, mirror it, take it back, or clean up."""
        sent = Sent.of(wl)
        for cluster in sent.abandoned:
            self._clean_abandoned(key, wl, cluster)
        if sent.cluster is None:
            return
        worker = self.workers.get(sent.cluster)
        uid = wls.owner_job_uid(wl) or ""
        if _replaced_by_slice(wl):
            return  # its successor carries its copy on
        done = (
            wls.is_finished(wl)
            or wls.is_deleting(wl)
            or wls.is_evicted(wl)
            or not wls.has_quota(wl)
        )
        if worker is None:
            return  # its WorkerCluster is gone or unreadable: nothing can be done there
        if worker.lost(now) and not sent.started and not done:
            # It can never start there: send it elsewhere, delete it there later.
            abandoned = ",".join(sorted({*sent.abandoned, sent.cluster}))
            self.ctx.update_workload(
                wl, annotate({**FORGET, DISPATCH_ABANDONED_ANNOTATION: abandoned})
            )
            self.ctx.events.emit(
                wl,
                "Warning",
                "WorkerLost",
                f"worker cluster {sent.cluster} is lost and its copy never started: sending "
                "it elsewhere",
            )
            return
        available, _ = worker.available(now)
        if not available:
            return  # decided when it answers again
        name = object_key(wl)
        remote = worker.copies.get(_copy_key(wl))
        if remote is not None and not copies.is_copy_of(remote, uid):
            remote = None
        if remote is not None and (remote.get("metadata") or {}).get("deletionTimestamp"):
            return  # an earlier copy still going (an eviction's): wait for it to be gone
        if done:
            if remote is not None:
                self._delete_copy(worker, remote)
            elif not wls.is_finished(wl):
                # Taken back (evicted, requeued): send it again when admitted again.
                self.ctx.update_workload(wl, annotate(FORGET))
            return
        if remote is None and (sent.started or not worker.copies.synced):
            return
        if not sent.started:
            remote_wl = None if remote is None else self._remote_workload(worker, remote)
            if remote is not None and remote_wl is not None and wls.has_quota(remote_wl):
                self._start(worker, wl, remote)
            elif remote is None and now - sent.at <= ADMIT_WITHIN_S:
                job = self._job(wl)
                if job is not None:
                    self._create_copy(worker, name, wl, job)
            elif now - sent.at > ADMIT_WITHIN_S:
                self._shunned.setdefault(key, {})[sent.cluster] = now + 5 * ADMIT_WITHIN_S
                why = (
                    "its copy could not be created there"
                    if remote is None
                    else (remote_wl and _pending_message(remote_wl)) or "no Workload there yet"
                )
                self.ctx.events.emit(
                    wl,
                    "Warning",
                    "NotAdmittedThere",
                    f"worker cluster {sent.cluster} did not admit it within "
                    f"{ADMIT_WITHIN_S:.0f}s ({why}): planning it again",
                )
                abandoned = ",".join(sorted({*sent.abandoned, sent.cluster}))
                self.ctx.update_workload(
                    wl, annotate({**FORGET, DISPATCH_ABANDONED_ANNOTATION: abandoned})
                )
            return
        if remote is None:
            return  # started, and its copy gone from the cache: nothing to mirror
        self._mirror(wl, remote)
        self._follow_size(worker, wl, remote)

    def _follow_size(self, worker: Worker, wl: Obj, remote: Obj) -> None:
        """An elastic copy runs as many pods as are admitted here: scale-ups once their slice
        was sent, scale-downs at once (the copy's Muster resizes it there in place)."""
        if not copies.is_elastic(remote):
            return
        want = wls.admitted_count(wl)
        if want and (remote.get("spec") or {}).get("parallelism") != want:
            meta = remote["metadata"]
            worker.kube.patch(JOB, meta["namespace"], meta["name"], copies.size_patch(want))

    def _start(self, worker: Worker, wl: Obj, remote: Obj) -> None:
        # Here first: a crash between the two writes leaves a copy we count as maybe running
        # that is not, never the other way round.
        written = self.ctx.update_workload(wl, annotate({DISPATCH_STARTED_ANNOTATION: "true"}))
        if written is None:
            return
        meta = remote["metadata"]
        worker.kube.patch(JOB, meta["namespace"], meta["name"], copies.start_patch())

    def _mirror(self, wl: Obj, remote: Obj) -> None:
        job = self._job(wl)
        if job is None or (job.get("spec") or {}).get("managedBy") != DISPATCH_MANAGED_BY:
            return
        patch = copies.mirrored_status(remote, job)
        key = object_key(wl)
        version = str(remote["metadata"].get("resourceVersion"))
        if patch is None or self._refused.get(key) == version:
            return
        meta = job["metadata"]
        try:
            self.ctx.kube.patch(
                JOB, meta["namespace"], meta["name"], {"status": patch}, status=True
            )
            self._refused.pop(key, None)
        except ApiException as error:
            self._refused[key] = version
            log.warning(
                "status not mirrored", extra={"job": object_key(job), "error": str(error)[:300]}
            )

    def _clean_abandoned(self, key: str, wl: Obj, cluster: str) -> None:
        worker = self.workers.get(cluster)
        if worker is not None:
            available, _ = worker.available(time.time())
            if not available:
                return
            remote = worker.copies.get(_copy_key(wl))
            if remote is not None and copies.is_copy_of(remote, wls.owner_job_uid(wl) or ""):
                self._delete_copy(worker, remote)
                return  # forgotten once the cache shows it gone
        sent = Sent.of(wl)
        left = ",".join(c for c in sent.abandoned if c != cluster) or None
        self.ctx.update_workload(wl, annotate({DISPATCH_ABANDONED_ANNOTATION: left}))

    def _sweep_orphans(self) -> None:
        """Delete copies whose Job here is gone (deleted, or deleted and made again: a new
        uid)."""
        caches = self.ctx.caches
        if not (caches.workloads.synced and caches.jobs.synced):
            return
        live = {str(job["metadata"].get("uid")) for job in caches.jobs.objects()}
        live |= {wls.owner_job_uid(wl) or "" for wl in caches.workloads.objects()}
        for worker in self.workers.all():
            if not worker.copies.synced or not worker.available(time.time())[0]:
                continue
            for remote in worker.copies.objects():
                meta = remote.get("metadata") or {}
                origin = (meta.get("labels") or {}).get(ORIGIN_UID_LABEL)
                if origin and origin not in live:
                    self._delete_copy(worker, remote)

    def _delete_copy(self, worker: Worker, remote: Obj) -> None:
        meta = remote["metadata"]
        if meta.get("deletionTimestamp"):
            return
        try:
            worker.kube.delete(JOB, meta["namespace"], meta["name"], uid=meta.get("uid"))
        except ApiException as error:
            if error.status != 409:  # 409: another copy by that name since: not ours
                log.warning("copy not deleted", extra={"error": str(error)[:300]})

    # ---------------------------------------------------------------- reading
    def _state(
        self, worker: Worker, mine: Mapping[str, Obj], holders: Mapping[str, str], now: float
    ) -> WorkerState:
        """The worker as `choose_cluster` reads it; `holders`: Job uid -> the Workload here
        whose copy's pods those are."""
        available, why = worker.available(now)
        nodes = worker.parsed_nodes()
        pods: list[BoundPod] = []
        for pod, labels in worker.bound_pods():
            owner = holders.get(labels.get(ORIGIN_UID_LABEL, ""))
            if owner is not None:
                pod = replace(
                    pod, workload=owner, pod_set=labels.get(POD_SET_POD_LABEL, JOB_POD_SET)
                )
            pods.append(pod)
        dispatched: dict[str, Placement] = {}
        for key, wl in mine.items():
            sent = Sent.of(wl)
            if sent.cluster == worker.name and sent.plan is not None and not wls.is_finished(wl):
                dispatched[key] = sent.plan
        return WorkerState(
            worker.name, nodes, tuple(pods), dispatched, available=available, why=why
        )

    def _dispatching_queues(self) -> dict[str, ClusterQueue]:
        out: dict[str, ClusterQueue] = {}
        for raw in self.ctx.caches.cluster_queues.objects():
            try:
                cq = ClusterQueue.model_validate(raw)
            except ValidationError:
                continue
            if cq.spec.dispatch is not None:
                out[cq.name] = cq
        return out

    def _flavors(self) -> dict[str, Flavor]:
        out: dict[str, Flavor] = {}
        for raw in self.ctx.caches.flavors.objects():
            try:
                rf = ResourceFlavor.model_validate(raw)
            except ValidationError:
                continue
            out[rf.name] = convert.flavor(rf)
        return out

    def _topologies(self) -> dict[str, tuple[str, ...]]:
        """Each Topology's levels: the worker clusters' nodes are expected to carry them."""
        out: dict[str, tuple[str, ...]] = {}
        for raw in self.ctx.caches.topologies.objects():
            try:
                topology = Topology.model_validate(raw)
            except ValidationError:
                continue
            out[topology.name] = topology.spec.labels
        return out

    def _job(self, wl: Obj) -> Obj | None:
        key = wls.owner_job_key(wl)
        return self.ctx.caches.jobs.get(key) if key else None

    @staticmethod
    def _remote_workload(worker: Worker, remote: Obj) -> Obj | None:
        uid = str(remote["metadata"].get("uid"))
        for wl in worker.workloads.objects():
            labels = (wl.get("metadata") or {}).get("labels") or {}
            if labels.get(JOB_UID_LABEL) == uid and not wls.is_finished(wl):
                return wl
        return None

    def _say(self, key: str, wl: Obj, reason: str) -> None:
        """Explain a wait once per reason (an Event on the Workload)."""
        if self._said.get(key) == reason:
            return
        self._said[key] = reason
        self.ctx.events.emit(wl, "Normal", "WaitingForWorkerCluster", reason)

    def capacity(self, flavors: Mapping[str, Flavor]) -> dict[FlavorResource, int]:
        """What the worker clusters' Ready nodes provide per (flavor, resource): the
        admission loop shares it out to the queues that dispatch."""
        total: Counter[FlavorResource] = Counter()
        for worker in self.workers.all():
            total.update(convert.capacity_of(worker.parsed_nodes(), flavors))
        return dict(total)

    # ---------------------------------------------------------------- status
    def write_status(self, now: float) -> None:
        """Each WorkerCluster's health, capacity and usage, as the plugin shows them."""
        counts: dict[str, int] = {}
        for wl in self.ctx.caches.workloads.objects():
            sent = Sent.of(wl)
            if sent.cluster and not wls.is_finished(wl):
                counts[sent.cluster] = counts.get(sent.cluster, 0) + 1
        for raw in self.clusters.objects():
            name = str(raw["metadata"]["name"])
            status = worker_status(
                self.workers.get(name), self.workers.problems.get(name), counts.get(name, 0), now
            )
            current = raw.get("status") or {}
            if same_status(current, status):
                continue
            try:
                self.ctx.kube.patch(WORKER_CLUSTER, None, name, {"status": status}, status=True)
            except ApiException as error:
                log.warning("WorkerCluster status not written", extra={"error": str(error)[:300]})


def _replaced(workloads: Informer, wl: Mapping[str, Any]) -> Obj | None:
    """The slice a scale-up slice replaces, while it is still known."""
    name = wls.replaces(wl)
    if not name:
        return None
    return workloads.get(f"{(wl.get('metadata') or {}).get('namespace')}/{name}")


def _replaced_by_slice(wl: Mapping[str, Any]) -> bool:
    finished = wls.condition(wl, WC.FINISHED) or {}
    return finished.get("status") == "True" and finished.get("reason") == WC.SLICE_REPLACED


def _extra_pods(w: Workload, plan: Placement) -> Workload | None:
    """`w` (a scale-up slice, admitted for its full size) as the pods `plan` does not place
    yet; None when it asks for no more."""
    extra = {ps.name: ps.count - plan.count(ps.name) for ps in w.pod_sets}
    if w.admission is None or all(n <= 0 for n in extra.values()):
        return None
    return replace(
        w,
        pod_sets=tuple(
            replace(ps, count=extra[ps.name]) for ps in w.pod_sets if extra[ps.name] > 0
        ),
        admission=tuple(
            replace(a, count=extra[a.pod_set], nodes=())
            for a in w.admission
            if extra.get(a.pod_set, 0) > 0
        ),
        replaces=None,
    )


def _copy_key(wl: Mapping[str, Any]) -> str:
    """The copy's cache key in a worker: its Job's namespace and name."""
    key = wls.owner_job_key(wl)
    return key or ""


def _api_error(error: ApiException) -> str:
    """The apiserver's own message, else the status line."""
    try:
        message = json.loads(error.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"{error.status} {error.reason}")[:300]


def _arrival(wl: Mapping[str, Any]) -> str:
    return str((wl.get("metadata") or {}).get("creationTimestamp") or "")


def _pending_message(wl: Mapping[str, Any]) -> str:
    for condition in wls.conditions(wl):
        if condition.get("type") == "QuotaReserved" and condition.get("status") == "False":
            return str(condition.get("message") or "")[:300]
    return ""
