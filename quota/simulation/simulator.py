"""The simulator: the controller's decisions, in simulated time, without a cluster.

Simulated time moves from event to event — Job arrivals, completions, scale events, the end
of a requeue backoff, the end of an eviction — never by sleeping or ticking a clock. After
the events of one instant are applied (all of them: simultaneous arrivals form one batch),
an admission cycle runs on a fresh snapshot, through the very `fair_share` and
`admission_cycle` the controller calls. The simulator then does what the controller's shell
does with the decisions:

- Admit: the workload starts; it finishes `run_for` seconds later. An admitted scale-up
  slice retires the slice it replaces, and the running pods keep running throughout.
- Preempt / reclaim / drain: the victims are evicted (after `eviction_delay`, during which
  they keep their quota), counted, and requeued after an exponential backoff; an evicted Job
  restarts from scratch when admitted again. Another cycle follows as soon as they are
  gone, and admits the preemptor into the room they left.

The backoff, what an eviction leaves and the slice replacement rules come from
`quota.lifecycle`, which the controller follows too, so the two cannot drift apart.

A scenario with nodes is placed too, by the same cycle: each snapshot carries the nodes and
every pod of a running workload as a bound pod, and the cycle admits a workload only when
its pods can be placed (saying "quota is available but the pods cannot be placed ..."
when the nodes, not quota, keep it waiting). Pods bind at admission, where the cycle
planned them: there is no scheduler lag to simulate. They leave when the workload
finishes or its eviction completes. A scale-up slice keeps the running pods where they
are and adds the new ones where its admission placed them; a scale-down in place removes
the most recently placed pods first, so the nodes a scale-up added are the first to
empty (a ReplicaSet, too, removes its newest pods first). Every change of a node's use is
kept (`SimResult.node_events`) for the fragmentation and occupancy figures of the report.
Without nodes the simulation admits on quota alone.

A scenario with worker clusters (`Cluster` documents) runs what the management cluster's
dispatcher does (controllers/multicluster): the capacity the cycle admits against includes
the workers' nodes, a queue with `spec.dispatch` is admitted by quota alone, and after the
cycles of each instant every admitted workload of such a queue not yet sent is sent, in
arrival order, with `quota.dispatch.choose_cluster` over the clusters its selector picks
(seeing the pods of those sent before it), whole, to one cluster: its pods bind there as
planned and it starts running. One that fits no cluster keeps its quota and waits with the
reason `choose_cluster` gives (a wait for room, like the cycle's placement reasons), tried
again once a worker's pods changed. Its pods leave the worker when it finishes or is evicted.

Everything is deterministic for a scenario and a seed (the seed only feeds the jitter of
workload generators). Usage, fair share and demand per queue are kept as step functions and
integrated exactly, so averages are time-weighted (`meter.py`). What a run returns is in
`results.py`; the pending set, which keeps big runs fast, in `pending.py`; the Job the loop
moves from state to state in `jobs.py`.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping
from dataclasses import replace

from quota.admission.cycle import admission_cycle
from quota.dispatch import NO_WORKERS, Dispatched, NoCluster, WorkerState, choose_cluster
from quota.fairness.fairshare import FairShare, fair_share
from quota.lifecycle.backoff import Backoff
from quota.lifecycle.eviction import (
    eviction_reason,
    recorded_as,
    requeue_after_eviction,
)
from quota.lifecycle.slices import (
    pods_after_scale_down,
    slice_replaced_message,
    superseded_slice,
)
from quota.model.decisions import CycleResult, Victim
from quota.model.nodes import BoundPod, Node
from quota.model.snapshot import (
    Assignment,
    PodSet,
    Snapshot,
    Workload,
    pod_set_usage,
    queue_tree,
)
from quota.placement.topology import landed_level
from quota.preemption.partial import admitted_counts
from quota.simulation.jobs import WAITING, Job, with_count
from quota.simulation.meter import Meter, Vector
from quota.simulation.pending import Pending
from quota.simulation.results import (
    TOTAL,
    JobOutcome,
    NodeEvent,
    PreemptionRecord,
    Resize,
    SimResult,
    Transition,
    TransitionKind,
)
from quota.simulation.scenario import Scenario

# Events of one instant are applied in this order: what frees quota before what asks for it.
# A wake-up changes nothing: it is an instant a pending workload may start to evict
# (waitBeforeEvicting), so a cycle runs then even if nothing else happens.
_COMPLETE, _EVICTED, _SCALE, _ARRIVE, _REQUEUE, _WAKE = range(6)
# Cycles at one instant keep running while they evict (each round admits the preemptors of
# the previous one); the engine's anti-ping-pong rules end this long before the cap.
MAX_CYCLES_PER_INSTANT = 64


def _flavors_of(assignments: tuple[Assignment, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in assignments:
        out.update(a.flavors)
    return out


def _resources_of(w: Workload) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_, resource), amount in pod_set_usage(w).items():
        out[resource] = out.get(resource, 0) + amount
    return out


class _Simulation:
    def __init__(self, scenario: Scenario, seed: int, record: bool) -> None:
        self.scenario = scenario
        self.settings = scenario.settings
        self.backoff = Backoff(self.settings.requeue_base_s, self.settings.requeue_max_s)
        self.seed = seed
        self.record = record
        self.queues = scenario.queues
        # Each queue's path up to its root, then the whole cluster: what a workload's usage
        # adds to.
        self.paths = {name: (*path, TOTAL) for name, path in queue_tree(self.queues).paths.items()}
        self.meter = Meter([*sorted(self.queues), TOTAL], self.settings.sample_interval_s)
        self.jobs: dict[str, Job] = {}
        self.job_of: dict[str, Job] = {}  # engine key -> Job
        self.pending = Pending()
        self.admitted: dict[str, Workload] = {}
        self.usage_of: dict[str, Vector] = {}
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.counter = 0
        self.transitions: list[Transition] = []
        self.preemptions: list[PreemptionRecord] = []
        self.preemption_seq: dict[str, int] = {}
        self.sequences: dict[tuple[str, str], int] = {}
        self.finished = 0
        self.end = 0.0
        self.cycles = 0
        self.evictions = 0
        self.last_fair: FairShare | None = None
        self.now = 0.0
        self.nodes = scenario.nodes
        self.worker_nodes = {c.name: c.nodes for c in scenario.clusters}
        self.cluster_of_node = {n.name: c.name for c in scenario.clusters for n in c.nodes}
        self.node_by_name = {
            n.name: n
            for n in (*(scenario.nodes or ()), *(n for c in scenario.clusters for n in c.nodes))
        }
        # Dispatch: the worker cluster each sent workload's pods run in (engine key ->
        # cluster), a count that moves on every change of a worker's pods, and, per workload
        # that fit no cluster, the count it was tried at (tried again once it moves).
        self.sent: dict[str, str] = {}
        self.fleet = 0
        self.no_room: dict[str, int] = {}
        # Placement: each running workload's pods (engine key -> [(pod set, pod)], in the order
        # they were placed), what they take per node, and every change of that.
        self.pods_of: dict[str, list[tuple[str, BoundPod]]] = {}
        self.node_used: dict[str, dict[str, int]] = {}
        self.node_events: list[NodeEvent] = []
        self._bound: tuple[BoundPod, ...] | None = ()

    # -- setting up ------------------------------------------------------------------------

    def push(self, t: float, order: int, job: str, run: int = 0) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (t, order, self.counter, job, run))

    def load(self) -> None:
        for spec in self.scenario.jobs:
            self._add_job(
                Job(
                    spec.key,
                    spec.local_queue,
                    spec.cluster_queue,
                    spec.priority,
                    spec.submit_at,
                    spec.run_for,
                    spec.pod_sets,
                    spec.elastic,
                    waits_for=spec.waits_for,
                    preemptible=spec.preemptible,
                    disruption_single=spec.disruption_single,
                )
            )
        rng = random.Random(self.seed)
        for gen in self.scenario.generators:
            for cls in gen.classes:
                number = 0
                pod_sets = (cls.pod_set,)  # one object per class: the engine caches by shape
                for target in gen.targets:
                    t = cls.start_s
                    for i in range(cls.count):
                        number += 1
                        if cls.jitter:
                            submit = t
                            t += cls.interval_s * (1 + cls.jitter * (2 * rng.random() - 1))
                            runtime = cls.runtime_s * (1 + cls.jitter * (2 * rng.random() - 1))
                        else:
                            # Multiplying, not adding up, keeps simultaneous creations in
                            # different queues at exactly equal times, so they batch.
                            submit = cls.start_s + i * cls.interval_s
                            runtime = cls.runtime_s
                        key = f"{target.namespace}/{gen.name}-{cls.name}-{number}"
                        self._add_job(
                            Job(
                                key,
                                target.local_queue,
                                target.cluster_queue,
                                cls.priority,
                                submit,
                                runtime,
                                pod_sets,
                                False,
                                waits_for=cls.waits_for,
                                preemptible=cls.preemptible,
                            )
                        )
        for scale in self.scenario.scale_events:
            self.push(scale.at, _SCALE, scale.job, scale.parallelism)

    def _add_job(self, job: Job) -> None:
        if job.key in self.jobs:
            raise ValueError(f"two workloads are named {job.key}; rename one of them")
        self.jobs[job.key] = job
        self.push(job.submit_at, _ARRIVE, job.key)

    # -- the loop --------------------------------------------------------------------------

    def run(self, progress: Callable[[float, int], None] | None) -> None:
        until = self.settings.until_s
        while self.heap:
            t = self.heap[0][0]
            if until is not None and t > until:
                break
            self.meter.advance(t)
            self.now = t
            decide = False
            while self.heap and self.heap[0][0] == t:
                _, order, _, key, value = heapq.heappop(self.heap)
                decide |= self._apply(order, key, value, t)
            if decide:
                self._cycles(t)
            if progress is not None:
                progress(t, self.finished)
        # Stopped by --until with work left: the simulation covers up to `until`.
        self.end = until if until is not None and self.heap else self.now

    def _apply(self, order: int, key: str, value: int, t: float) -> bool:
        """Apply one event; whether a cycle should follow (every event but the wake-up of a
        workload no longer pending)."""
        if order == _WAKE:
            job = self.job_of.get(key)
            return job is not None and job.state == "pending" and job.workload == key
        if order == _ARRIVE:
            self._arrive(self.jobs[key], t)
        elif order == _COMPLETE:
            job = self.jobs[key]
            if job.state == "running" and job.run == value:
                self._complete(job, t)
        elif order == _EVICTED:
            w = self.admitted.get(key)
            if w is not None and w.evicting:
                self._evicted(key, t)
        elif order == _REQUEUE:
            job = self.jobs[key]
            if job.state == "backoff" and job.run == value:
                self._submit(job, t, requeued=True)
        elif order == _SCALE:
            self._scale(self.jobs[key], value, t)
        return True

    # -- what happens to a job ---------------------------------------------------------------

    def _log(
        self,
        t: float,
        kind: TransitionKind,
        job: Job,
        w: Workload | None,
        reason: str = "",
        actor: str = "",
    ) -> None:
        if not self.record:
            return
        # One stored row per (job, kind, sequence): count repeats of a kind per job.
        sequence = self.sequences.get((job.key, kind), 0)
        self.sequences[(job.key, kind)] = sequence + 1
        admitted = w is not None and w.admission is not None
        self.transitions.append(
            Transition(
                at=t,
                kind=kind,
                job=job.key,
                workload=w.key if w is not None else job.workload,
                sequence=sequence,
                local_queue=job.local_queue,
                cluster_queue=job.cluster_queue,
                flavors=_flavors_of(w.admission) if w is not None and w.admission else {},
                resources=_resources_of(w) if w is not None and admitted else {},
                reason=reason,
                actor=actor,
            )
        )

    def _arrive(self, job: Job, t: float) -> None:
        self._log(t, "created", job, None)
        if job.waits_for:
            job.state, job.pending_since, job.reason = "pending", t, job.waits_for
            return
        self._submit(job, t, requeued=False)

    def _submit(self, job: Job, t: float, requeued: bool) -> None:
        key = job.new_slice_key() if job.elastic or job.slices == 0 else job.key
        if not job.elastic and job.slices == 0:
            job.slices = 1
        w = Workload(
            key=key,
            queue=job.cluster_queue,
            priority=job.priority,
            # Like Kueue's default (requeuingTimestamp: Eviction), a requeued workload goes
            # behind those that arrived while it ran.
            arrival=t,
            pod_sets=job.pod_sets,
            hold=job.hold,  # a moved job goes to the room held for it
            preemptible=job.preemptible,
            disruption_single=job.disruption_single,
        )
        job.hold = None
        job.state = "pending"
        job.workload = key
        spec = self.queues.get(job.cluster_queue)
        if (
            spec is not None
            and spec.wait_before_evicting_s > 0
            and (spec.within_queue != "Never" or spec.reclaim != "Never")
        ):
            self.push(t + spec.wait_before_evicting_s, _WAKE, key)
        if not requeued:
            job.pending_since = t
        self.pending.add(w)
        self.job_of[key] = job
        if requeued:
            assert job.requeue is not None
            self._log(t, "requeued", job, None, reason=job.requeue.requeued_message)

    def _charge(self, w: Workload, sign: int, t: float) -> None:
        usage = self.usage_of.pop(w.key) if sign < 0 else pod_set_usage(w)
        if sign > 0:
            self.usage_of[w.key] = usage
        for name in self.paths[w.queue]:
            self.meter.add(name, usage, sign, t)

    def _complete(self, job: Job, t: float) -> None:
        w = self.admitted.pop(job.workload)
        self._charge(w, -1, t)
        self._unbind(w.key, t)
        self._drop_scale_slice(job)
        job.state = "finished"
        job.finished_at = t
        self.finished += 1
        self._log(t, "finished", job, w, reason="the Job completed")

    def _drop_scale_slice(self, job: Job) -> None:
        if job.scale_slice is not None:
            self.pending.remove(job.scale_slice)
            self.job_of.pop(job.scale_slice, None)
            job.scale_slice = None

    def _admit(self, key: str, assignments: tuple[Assignment, ...], reason: str, t: float) -> None:
        w = self.pending.remove(key)
        assert w is not None, f"admitted {key}, which is not pending"
        job = self.job_of[key]
        admitted = replace(w, admission=assignments, admitted_at=t)
        superseded = superseded_slice(key, w.replaces, self.admitted)
        remote = self._remote(admitted)
        if self.nodes is not None and not remote:
            admitted = self._bind(admitted, job, superseded, t)
            job.landed = self._landed(admitted, self._plan_of(admitted))
        self.admitted[key] = admitted
        self._charge(admitted, 1, t)
        job.flavors = _flavors_of(assignments)
        if superseded is not None:
            # The old slice stops counting now; its pods run on under this one.
            old = self.admitted.pop(superseded)
            self._charge(old, -1, t)
            self.job_of.pop(superseded, None)
            job.workload = key
            job.scale_slice = None
            name = key.split("/", 1)[-1]
            self._log(t, "slice_replaced", job, old, reason=slice_replaced_message(name))
            self._log(t, "admitted", job, admitted, reason=reason)
            self._resized(job, admitted, t)
            return
        if remote:
            # Quota is reserved here; it runs once a worker cluster takes it (`_dispatch`).
            self.no_room.pop(key, None)
            job.state = "dispatching"
            self._log(t, "admitted", job, admitted, reason=reason)
            return
        self._start(job, t)
        self._log(t, "admitted", job, admitted, reason=reason)
        self._resized(job, admitted, t)

    def _start(self, job: Job, t: float) -> None:
        """The Job's pods run from `t`: its wait ends, its completion is due `run_for` on."""
        job.state = "running"
        job.waited += t - job.pending_since
        job.stop_placement_wait(t)
        if job.first_admitted is None:
            job.first_admitted = t
        job.run += 1
        self.push(t + job.run_for, _COMPLETE, job.key, job.run)

    def _resized(self, job: Job, running: Workload, t: float) -> None:
        """Close the open resize once the running slice has the size it asked for."""
        if job.resizes and job.resizes[-1].effective_at is None:
            size = running.admission[0].count if running.admission else 0
            if size == job.resizes[-1].parallelism:
                job.resizes[-1] = replace(job.resizes[-1], effective_at=t)

    def _evict(self, victim: Victim, actor: str, t: float) -> None:
        w = self.admitted.get(victim.workload)
        if w is None or w.evicting:
            return
        job = self.job_of[victim.workload]
        if victim.pods is not None:
            self._lose_pods(job, w, victim, actor, t)
            return
        self.evictions += 1
        # No actor: drained by its queue's stopPolicy.
        job.evicted_for = eviction_reason(victim.kind if actor else None)
        job.evictions += 1
        job.hold = victim.hold
        self._log(t, recorded_as(job.evicted_for), job, w, reason=victim.reason, actor=actor)
        if self.settings.eviction_delay_s > 0:
            self.admitted[victim.workload] = replace(w, evicting=True, hold=victim.hold)
            self.push(t + self.settings.eviction_delay_s, _EVICTED, victim.workload)
        else:
            self._evicted(victim.workload, t)

    def _lose_pods(self, job: Job, w: Workload, victim: Victim, actor: str, t: float) -> None:
        """Single-pod disruption: `w` loses `victim.pods` at once (the Job scaled down to
        what stays admitted) and asks for them back through a scale-up slice."""
        assert victim.pods is not None and w.admission is not None
        counts = admitted_counts(w, victim.pods)
        lost = sum(n for _, n in victim.pods)
        job.pods_preempted += lost
        self._log(t, recorded_as(eviction_reason(victim.kind)), job, w, victim.reason, actor)
        shrunk = self._shrink_in_place(
            w,
            tuple(replace(ps, count=counts.get(ps.name, ps.count)) for ps in w.pod_sets),
            tuple(counts[a.pod_set] for a in w.admission),
            t,
            frozenset(victim.pod_names),
        )
        self._drop_scale_slice(job)
        self._scale_up(job, shrunk, t)

    def _evicted(self, key: str, t: float) -> None:
        w = self.admitted.pop(key)
        self._charge(w, -1, t)
        self._unbind(key, t)
        job = self.job_of.pop(key)
        self._drop_scale_slice(job)
        job.run += 1  # its completion will never come
        job.state = "backoff"
        job.pending_since = t
        requeues = job.requeue.count if job.requeue is not None else 0
        job.requeue = requeue_after_eviction(requeues, reason=job.evicted_for, backoff=self.backoff)
        self.push(job.requeue.competes_at(t), _REQUEUE, job.key, job.run)

    def _scale(self, job: Job, parallelism: int, t: float) -> None:
        if job.state == "finished":
            return
        job.resizes.append(Resize(t, parallelism, None))
        job.pod_sets = with_count(job.pod_sets, parallelism)
        if job.state in ("waiting", "backoff") or job.waits_for:
            return
        if job.state == "pending":
            w = self.pending.remove(job.workload)
            assert w is not None
            self.pending.add(replace(w, pod_sets=job.pod_sets))
            return
        running = self.admitted[job.workload]
        size = running.pod_sets[0].count
        if parallelism > size:
            self._scale_up(job, running, t)
            return
        self._drop_scale_slice(job)
        if parallelism < size and running.admission is not None:
            self._shrink_in_place(
                running,
                job.pod_sets,
                tuple(
                    pods_after_scale_down(a.count, parallelism) if i == 0 else a.count
                    for i, a in enumerate(running.admission)
                ),
                t,
            )
        job.resizes[-1] = replace(job.resizes[-1], effective_at=t)

    def _scale_up(self, job: Job, running: Workload, t: float) -> None:
        """Ask for the Job's parallelism through a scale-up slice replacing `running`."""
        if job.scale_slice is not None:
            pending = self.pending.remove(job.scale_slice)
            assert pending is not None
            self.pending.add(replace(pending, pod_sets=job.pod_sets))
            return
        key = job.new_slice_key()
        self.pending.add(
            Workload(
                key=key,
                queue=job.cluster_queue,
                priority=job.priority,
                arrival=t,
                pod_sets=job.pod_sets,
                replaces=running.key,
                preemptible=job.preemptible,
                disruption_single=job.disruption_single,
            )
        )
        self.job_of[key] = job
        job.scale_slice = key

    def _shrink_in_place(
        self,
        running: Workload,
        pod_sets: tuple[PodSet, ...],
        counts: tuple[int, ...],
        t: float,
        chosen: frozenset[str] = frozenset(),
    ) -> Workload:
        """`running` with its admission down to `counts` (one per assignment) and
        `pod_sets`: a scale-down in place, its quota freed at once; the `chosen` pods (the
        ones a preemption took on nodes) go first."""
        assert running.admission is not None
        self._charge(running, -1, t)
        shrunk = replace(
            running,
            pod_sets=pod_sets,
            admission=tuple(
                replace(a, count=n) for a, n in zip(running.admission, counts, strict=True)
            ),
        )
        if running.key in self.pods_of:
            shrunk = self._shrink(shrunk, t, chosen)
        self.admitted[running.key] = shrunk
        self._charge(shrunk, 1, t)
        return shrunk

    # -- placement ---------------------------------------------------------------------------

    def _bind(self, w: Workload, job: Job, superseded: str | None, t: float) -> Workload:
        """Bind the pods of newly admitted `w` where its admission placed them.

        A scale-up slice takes over the pods of the slice it replaces (`superseded`) where
        they run, and binds only the pods it adds. Returns `w` with its admission's nodes
        saying where its pods are.
        """
        assert w.admission is not None
        pods: list[tuple[str, BoundPod]] = []
        running: dict[tuple[str, str], int] = {}
        if superseded is not None:
            for pod_set, pod in self.pods_of.pop(superseded, []):
                pods.append((pod_set, replace(pod, workload=w.key)))
                running[(pod_set, pod.node)] = running.get((pod_set, pod.node), 0) + 1
        per_pod = {ps.name: ps.per_pod for ps in w.pod_sets}
        for a in w.admission:
            planned = sum(n for _, n in a.nodes)
            # A slice's plan may list every pod it runs, the running ones included, or only
            # the pods it adds: only pods not already running on a node are new there.
            counted = planned >= a.count
            for node, n in a.nodes:
                new = n - running.get((a.pod_set, node), 0) if counted and running else n
                for _ in range(max(new, 0)):
                    job.pods += 1
                    pod = BoundPod(
                        f"{job.key}/{a.pod_set}-{job.pods}",
                        node,
                        per_pod[a.pod_set],
                        w.key,
                        a.pod_set,
                    )
                    pods.append((a.pod_set, pod))
                    self._take(node, pod.requests, 1, t)
        self.pods_of[w.key] = pods
        self._bound = None
        return self._placed(w)

    def _shrink(self, w: Workload, t: float, chosen: frozenset[str] = frozenset()) -> Workload:
        """Remove pods of `w` beyond its admitted counts: the `chosen` ones first, then the
        most recently placed."""
        assert w.admission is not None
        pods = self.pods_of.get(w.key, [])
        # Stable: the chosen move to the end, where removal starts, each side in its order.
        pods.sort(key=lambda entry: entry[1].key in chosen)
        keep = {a.pod_set: a.count for a in w.admission}
        have: dict[str, int] = {}
        for pod_set, _ in pods:
            have[pod_set] = have.get(pod_set, 0) + 1
        for i in range(len(pods) - 1, -1, -1):
            pod_set, pod = pods[i]
            if have[pod_set] > keep.get(pod_set, 0):
                have[pod_set] -= 1
                del pods[i]
                self._take(pod.node, pod.requests, -1, t)
        self._bound = None
        # A sent workload's plan lives in its worker, not in its admission here.
        return w if self._remote(w) else self._placed(w)

    def _unbind(self, key: str, t: float) -> None:
        """The pods of workload `key` are gone (it finished or its eviction completed)."""
        for _, pod in self.pods_of.pop(key, []):
            self._take(pod.node, pod.requests, -1, t)
        self._bound = None
        self.sent.pop(key, None)

    def _take(self, node: str, requests: Mapping[str, int], sign: int, t: float) -> None:
        used = self.node_used.setdefault(node, {})
        for resource, amount in requests.items():
            if amount > 0 and resource != "pods":
                used[resource] = used.get(resource, 0) + sign * amount
        used["pods"] = used.get("pods", 0) + sign
        self.node_events.append(NodeEvent(t, node, dict(used)))
        if node in self.cluster_of_node:
            self.fleet += 1

    def _placed(self, w: Workload) -> Workload:
        """`w` with each assignment's nodes set to where its pods run now."""
        assert w.admission is not None
        where: dict[str, dict[str, int]] = {}
        for pod_set, pod in self.pods_of.get(w.key, ()):
            on = where.setdefault(pod_set, {})
            on[pod.node] = on.get(pod.node, 0) + 1
        return replace(
            w,
            admission=tuple(
                replace(a, nodes=tuple(where.get(a.pod_set, {}).items())) for a in w.admission
            ),
        )

    @staticmethod
    def _plan_of(w: Workload) -> list[tuple[str, int]]:
        assert w.admission is not None
        return [pair for a in w.admission for pair in a.nodes]

    def _landed(self, w: Workload, plan: list[tuple[str, int]]) -> str | None:
        """The narrowest level of its flavor's Topology whose one domain holds every pod of
        a gang placed as `plan` ((node, pods) pairs; `topology.landed_level`); None for a
        single pod or a flavor without one."""
        assert w.admission is not None
        names = {node for node, n in plan if n}
        if sum(n for _, n in plan) < 2:
            return None
        named = {
            self.scenario.flavors[f].topology
            for a in w.admission
            for f in a.flavors.values()
            if f in self.scenario.flavors
        }
        levels = [self.scenario.topologies.get(t) for t in named if t is not None]
        if len(levels) != 1 or levels[0] is None:
            return None
        return landed_level((self.node_by_name[n] for n in sorted(names)), levels[0])

    def _bound_pods(self) -> tuple[BoundPod, ...]:
        """The pods bound to this cluster's own nodes (the admission cycle's)."""
        if self._bound is None:
            workers = self.cluster_of_node
            self._bound = tuple(
                pod for pods in self.pods_of.values() for _, pod in pods if pod.node not in workers
            )
        return self._bound

    # -- dispatch to worker clusters ---------------------------------------------------------

    def _remote(self, w: Workload) -> bool:
        """Whether `w` runs in a worker cluster: its queue dispatches to the scenario's
        Clusters. (A Scenario built without them, as the plugin's what-if from a live
        cluster, runs a dispatching queue's workloads at admission, on quota alone.)"""
        return w.queue in self.scenario.dispatch_to

    def _worker(self, name: str) -> WorkerState:
        """Worker cluster `name` now: its nodes and the pods bound there."""
        mine = self.cluster_of_node
        pods = tuple(
            pod for pods in self.pods_of.values() for _, pod in pods if mine.get(pod.node) == name
        )
        return WorkerState(name, self.worker_nodes[name], pods)

    def _dispatch(self, t: float) -> None:
        """Send each admitted workload of a dispatching queue not sent yet, oldest first, to
        the worker cluster `choose_cluster` picks; one that fits none waits with its reason."""
        if not self.scenario.dispatch_to:
            return
        waiting = sorted(
            (
                w
                for w in self.admitted.values()
                if w.key not in self.sent and not w.evicting and self._remote(w)
            ),
            key=lambda w: (w.arrival, w.key),
        )
        states: dict[str, WorkerState] = {}
        for w in waiting:
            if self.no_room.get(w.key) == self.fleet:
                continue  # nothing changed in any worker since it fit nowhere
            job = self.job_of[w.key]
            names = self.scenario.dispatch_to.get(w.queue, ())
            choice: Dispatched | NoCluster
            if not names:
                choice = NoCluster(self.scenario.no_workers.get(w.queue, NO_WORKERS), (), True)
            else:
                for name in names:
                    if name not in states:
                        states[name] = self._worker(name)
                choice = choose_cluster(
                    w,
                    self.scenario.flavors,
                    [states[n] for n in names],
                    self.queues[w.queue].placement,
                    self.scenario.topologies,
                )
            if isinstance(choice, NoCluster):
                self.no_room[w.key] = self.fleet
                job.note(choice.reason, t)
                continue
            self.no_room.pop(w.key, None)
            self._send(w, job, choice, t)
            states.pop(choice.cluster, None)  # its pods changed: read it again

    def _send(self, w: Workload, job: Job, choice: Dispatched, t: float) -> None:
        """Bind `w`'s pods in worker `choice.cluster` exactly as planned, and start it."""
        per_pod = {ps.name: ps.per_pod for ps in w.pod_sets}
        pods: list[tuple[str, BoundPod]] = []
        for pod_set, pairs in choice.placement.nodes.items():
            for node, n in pairs:
                for _ in range(n):
                    job.pods += 1
                    pod = BoundPod(
                        f"{job.key}/{pod_set}-{job.pods}", node, per_pod[pod_set], w.key, pod_set
                    )
                    pods.append((pod_set, pod))
                    self._take(node, pod.requests, 1, t)
        self.pods_of[w.key] = pods
        self.sent[w.key] = choice.cluster
        job.cluster = choice.cluster
        job.landed = self._landed(
            w, [pair for pairs in choice.placement.nodes.values() for pair in pairs]
        )
        self._start(job, t)
        self._log(t, "dispatched", job, w, reason=choice.reason, actor=choice.cluster)

    def _all_nodes(self) -> tuple[Node, ...] | None:
        """Every node pods are placed on: this cluster's, then the workers'."""
        workers = tuple(n for nodes in self.worker_nodes.values() for n in nodes)
        if self.nodes is None and not self.scenario.clusters:
            return None
        return (*(self.nodes or ()), *workers)

    # -- cycles ------------------------------------------------------------------------------

    def _cycles(self, t: float) -> None:
        cycles = 0
        while cycles < MAX_CYCLES_PER_INSTANT:
            admitted = tuple(self.admitted.values())
            fair = fair_share(self._snapshot(t, admitted, self.pending.aggregated()))
            self.last_fair = fair
            while True:
                cycles += 1
                self.cycles += 1
                shown = self.pending.shown()
                result = admission_cycle(self._snapshot(t, admitted, shown), fair)
                progressed = {a.workload for a in result.admit}
                progressed.update(p.preemptor for p in result.preempt)
                # A window that was used up hid workloads this cycle would have decided
                # about: decide again, on the same state, with the wider window.
                if not self.pending.feedback(progressed) or cycles >= MAX_CYCLES_PER_INSTANT:
                    break
            evicted = self._carry_out(result, t)
            if not evicted or self.settings.eviction_delay_s > 0:
                break
        if self.last_fair is not None:
            self._meter_fair_share(self.last_fair, t)
        self._dispatch(t)

    def _snapshot(
        self, t: float, admitted: tuple[Workload, ...], pending: list[Workload]
    ) -> Snapshot:
        return Snapshot(
            now=t,
            queues=self.queues,
            flavors=self.scenario.flavors,
            capacity=self.scenario.capacity,
            nodes=self.nodes,
            pods=self._bound_pods() if self.nodes is not None else (),
            admitted=admitted,
            pending=tuple(pending),
            topologies=self.scenario.topologies,
        )

    def _meter_fair_share(self, fair: FairShare, t: float) -> None:
        """Fair share and demand hold from `t` until the next instant's cycle."""
        for name in self.queues:
            self.meter.set(name, "fairShare", fair.shares.get(name, {}), t)
            self.meter.set(name, "demand", fair.demand.get(name, {}), t)
        self.meter.set(TOTAL, "fairShare", fair.amount, t)
        demand: Vector = {}
        for root in (n for n, q in self.queues.items() if q.parent is None):
            for key, amount in fair.demand.get(root, {}).items():
                demand[key] = demand.get(key, 0) + amount
        self.meter.set(TOTAL, "demand", demand, t)

    def _carry_out(self, result: CycleResult, t: float) -> bool:
        for pending in result.pending:
            held = self.pending.by_key.get(pending.workload)
            if held is not None and held.hold != pending.hold:
                # The room held for a preemptor, as the controller keeps it in the
                # Workload's status.nomination.
                self.pending.remove(pending.workload)
                self.pending.add(replace(held, hold=pending.hold))
            waiting = self.job_of.get(pending.workload)
            if waiting is None:
                continue
            if waiting.workload == pending.workload and waiting.state == "pending":
                waiting.note(pending.reason, t)
            else:
                waiting.reason = pending.reason  # a scale-up slice: the Job runs meanwhile
        for admit in result.admit:
            self._admit(admit.workload, admit.assignments, admit.reason, t)
        evicted = False
        for preempt in result.preempt:
            job = self.job_of.get(preempt.preemptor)
            actor = job.key if job is not None else preempt.preemptor
            victims: list[tuple[str, str, int, Victim]] = []
            for victim in preempt.victims:
                owner = self.job_of.get(victim.workload)
                if owner is not None:
                    victims.append((owner.key, owner.cluster_queue, owner.priority, victim))
                self._evict(victim, actor, t)
                evicted = True
            if self.record and victims:
                n = self.preemption_seq.get(actor, 0)
                self.preemption_seq[actor] = n + 1
                self.preemptions.append(
                    PreemptionRecord(
                        t,
                        actor,
                        job.cluster_queue if job is not None else "",
                        n,
                        tuple(victims),
                    )
                )
        for victim in result.drain:
            self._evict(victim, "", t)
            evicted = True
        return evicted

    # -- results -----------------------------------------------------------------------------

    def result(self) -> SimResult:
        finished = [j.finished_at for j in self.jobs.values() if j.finished_at is not None]
        finished_all = all(j.state == "finished" for j in self.jobs.values())
        end = self.end
        makespan = max(finished, default=0.0) if finished_all else end
        self.meter.finish(end)
        integrals = self.meter.integrals_at(end)
        outcomes = tuple(
            JobOutcome(
                key=j.key,
                local_queue=j.local_queue,
                cluster_queue=j.cluster_queue,
                priority=j.priority,
                submitted_at=j.submit_at,
                admitted_at=j.first_admitted,
                finished_at=j.finished_at,
                evictions=j.evictions,
                waited=j.waited + (end - j.pending_since if j.state in WAITING else 0.0),
                flavors=dict(j.flavors),
                resizes=tuple(j.resizes),
                last_pending_reason=j.reason,
                placement_wait=j.waited_for_placement(end),
                landed=j.landed,
                pods_preempted=j.pods_preempted,
                cluster=j.cluster,
            )
            for j in self.jobs.values()
            if j.state != "waiting"
        )
        capacity = dict(self.last_fair.amount) if self.last_fair is not None else {}
        return SimResult(
            settings=self.settings,
            seed=self.seed,
            queues=self.queues,
            capacity=capacity,
            jobs=outcomes,
            end=end,
            makespan=makespan,
            integrals=integrals,
            timeline=tuple(self.meter.timeline),
            samples=tuple(self.meter.samples),
            transitions=tuple(self.transitions),
            preemptions=tuple(self.preemptions),
            cycles=self.cycles,
            evictions=self.evictions,
            finished_all=finished_all,
            nodes=self._all_nodes(),
            node_events=tuple(self.node_events),
            topologies=self.scenario.topologies,
            clusters=self.scenario.clusters,
        )


def simulate(
    scenario: Scenario,
    seed: int = 0,
    *,
    record: bool = True,
    progress: Callable[[float, int], None] | None = None,
) -> SimResult:
    """Run `scenario` to the end (or to its `until`) and return what happened.

    `record` keeps every transition and preemption for the history store; `progress` is
    called after each instant with the simulated time and the number of finished workloads.
    """
    sim = _Simulation(scenario, seed, record)
    sim.load()
    sim.run(progress)
    return sim.result()
