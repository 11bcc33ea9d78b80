"""The admission loop's view of the cluster: one cycle's snapshot, built from the caches,
plus what the shell needs to act on the engine's decisions.

Parsed models and engine workloads are cached by resourceVersion, so a cycle converts only
the objects that changed since the last one; so is what a cycle reads off each Workload
(finished? admitted where? owned by which Job?), so that a cycle over Workloads that did not
change costs a few dictionary reads each. Queues the tree check or the model rejects,
queues being deleted and queues already gone still count what they admitted (as inactive
queues): nothing admitted is ever dropped from the snapshot. A Workload whose decision is
being written in the background is seen as the write will make it (`assumed.py`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from controllers.admission.assumed import Assumptions
from controllers.jobs.reconciler import priority_classes
from controllers.runtime.resources import Obj, object_key
from controllers.state import workloads as wls
from controllers.state.budgets import budget_breakers
from controllers.state.caches import Context, job_uid_of_pod
from controllers.state.dispatch import not_dispatchable
from quota.api import ManifestError
from quota.api.clusterqueue import ClusterQueue
from quota.api.conditions import PodGroupConditions as PGC
from quota.api.localqueue import LocalQueue
from quota.api.queuetree import QueueState, QueueTree, check_queue_tree
from quota.api.resourceflavor import ResourceFlavor
from quota.api.topology import Topology
from quota.api.workload import Workload as WorkloadModel
from quota.model import convert
from quota.model.nodeconvert import bound_pod_from_manifest, node_from_manifest
from quota.model.nodes import BoundPod, Node
from quota.model.queues import admitted_to, counts_in, queue_specs
from quota.model.resources import FlavorResource
from quota.model.snapshot import (
    Flavor,
    Hold,
    QueueSpec,
    Snapshot,
    Workload,
)
from quota.placement.reservations import leaving_of

if TYPE_CHECKING:
    from controllers.history.usage import UsageFigures

from quota.api.conditions import WorkloadConditions as WC
from quota.api.names import POD_SET_POD_LABEL

log = logging.getLogger(__name__)

INADMISSIBLE = WC.INADMISSIBLE
PENDING = WC.PENDING


def _epoch(text: str | None, default: float = 0.0) -> float:
    moment = wls.parse_time(text)
    return moment.timestamp() if moment is not None else default


def engine_workload(
    wl: WorkloadModel,
    queue: str,
    raw: Mapping[str, Any],
    priority_classes: Mapping[str, int] | None = None,
) -> Workload:
    """A Workload as the engine sees it (through `quota.model.convert`), with the times and the
    eviction state only the cluster object knows."""
    admitted_at = None
    if wls.has_quota(raw):
        reserved = wls.condition(raw, wls.QUOTA_RESERVED) or {}
        admitted_at = _epoch(reserved.get("lastTransitionTime"))
    converted = convert.workload(
        wl,
        queue,
        arrival=_epoch((raw.get("metadata") or {}).get("creationTimestamp")),
        admitted_at=admitted_at,
        priority_classes=priority_classes,
        evicting=wls.is_evicted(raw),
    )
    nomination = wl.status.nomination
    # Pending preemptors hold room, and so do workloads being moved (consolidation).
    if nomination is None or (converted.admission is not None and not converted.evicting):
        return converted
    hold = Hold(
        convert.pod_set_assignments(nomination.pod_set_assignments),
        nomination.since.timestamp(),
        tuple(nomination.victims),
    )
    return replace(converted, hold=hold)


@dataclass(slots=True)
class _Facts:
    """What a cycle reads off one version of a Workload, read once per version."""

    version: str
    finished: bool = False
    invalid: str | None = None  # why the model refuses it
    namespace: str = ""
    queue_name: str = ""  # its LocalQueue
    admitted_to: str | None = None  # the ClusterQueue of its status.admission
    holds_quota: bool = False  # admitted, not finished: it holds quota in `admitted_to`
    owner_uid: str = ""  # the Job (or JobSet, TrainJob) behind it
    reserved_at: str = ""  # QuotaReserved's lastTransitionTime
    deleting: bool = False
    # Its pods single-pod preemption took ("namespace/name"): leaving, no longer its own.
    preempted_pods: frozenset[str] = frozenset()
    requeue_at: datetime | None = None
    priority_class: str = ""  # the PriorityClass its priority comes from, if it gives none
    # The engine's Workload, for the queue it was converted for (a pending Workload's
    # ClusterQueue is its LocalQueue's, which can change without the Workload changing).
    engine: Workload | None = None
    engine_queue: str | None = None


def _read_facts(raw: Obj, version: str) -> tuple[_Facts, WorkloadModel | None]:
    """The facts of `raw`, and its parsed model when it had to be parsed (None if finished)."""
    if wls.is_finished(raw):
        return _Facts(version, finished=True), None
    try:
        model = WorkloadModel.model_validate(raw)
    except ValidationError as error:
        return _Facts(version, invalid=f"invalid Workload: {str(error)[:500]}"), None
    spec_class = model.spec.priority_class_name or ""
    facts = _Facts(
        version,
        namespace=model.metadata.namespace or "",
        queue_name=model.spec.queue_name,
        owner_uid=wls.owner_job_uid(raw) or "",
        deleting=wls.is_deleting(raw),
        requeue_at=wls.requeue_at(raw),
        priority_class="" if model.spec.priority is not None else spec_class,
    )
    facts.admitted_to = admitted_to(raw)
    if wls.has_quota(raw):
        facts.holds_quota = True
        facts.preempted_pods = frozenset(
            f"{facts.namespace}/{name}" for name in model.status.preempted_pods
        )
        reserved = wls.condition(raw, wls.QUOTA_RESERVED) or {}
        facts.reserved_at = str(reserved.get("lastTransitionTime") or "")
    return facts, model


@dataclass(slots=True)
class _PodFacts:
    """One version of a bound pod as placement reads it."""

    version: str
    pod: BoundPod | None
    owners: list[str]  # uids that may name its Workload's Job (`job_uid_of_pod`)
    labels: Mapping[str, str]
    # The pod marked with the Workload it counts for, and which Workload that was.
    owned: BoundPod | None = None
    owner: str | None = None


@dataclass
class View:
    """One cycle's snapshot plus what the shell needs to act on the decisions."""

    snapshot: Snapshot
    tree: QueueTree
    raw: dict[str, Obj]  # workload key -> the object the snapshot was built from
    engine: dict[str, Workload]  # workload key -> as the engine saw it
    cluster_queues: dict[str, ClusterQueue]
    lq_of: dict[str, str]  # workload key -> "namespace/localqueue"
    blocked: list[tuple[str, str, str]] = field(default_factory=list)  # key, reason, message


class ViewBuilder:
    """Builds each cycle's View from the caches, reusing what did not change."""

    def __init__(
        self,
        ctx: Context,
        *,
        use_node_capacity: bool = True,
        usage: UsageFigures | None = None,
        hold_timeout_s: float = 300.0,
        assumed: Assumptions | None = None,
    ) -> None:
        self.ctx = ctx
        self.hold_timeout_s = hold_timeout_s
        # Decisions written in the background, seen in place of the cached Workloads.
        self.assumed = assumed if assumed is not None else Assumptions()
        # (Workload, QuotaReserved time) whose pods the cache has shown bound whole.
        self._confirmed: set[tuple[str, str]] = set()
        # This cycle's admitted workloads' bound pods, by their labels (for budgets).
        self._pod_labels: dict[str, list[Mapping[str, str]]] = {}
        self.use_node_capacity = use_node_capacity
        # What the worker clusters' Ready nodes provide per (flavor, resource), when this
        # cluster dispatches to some (controllers/multicluster).
        self.remote_capacity: (
            Callable[[Mapping[str, Flavor]], Mapping[FlavorResource, int]] | None
        ) = None
        self._parsed: dict[str, tuple[Any, Any]] = {}  # key -> (version, parsed)
        self._facts: dict[str, _Facts] = {}  # Workload key -> its facts, for its version
        self._pods: dict[str, _PodFacts] = {}  # bound pod key -> its facts
        # The nodes and flavors capacity was last worked out from, and what it came to.
        self._capacity_of: (
            tuple[tuple[Node, ...], dict[str, Flavor], dict[FlavorResource, int]] | None
        ) = None
        # Time-based fair share: figures a history job refreshes; None turns it off.
        self.usage = usage
        self._historical: tuple[Any, dict[str, float]] = (None, {})
        self._classes: dict[str, int] = {}  # PriorityClass values, as this cycle read them

    def _engine_workload(
        self, facts: _Facts, raw: Obj, model: WorkloadModel | None, queue: str
    ) -> Workload:
        """The engine's Workload, kept in the facts for its queue; `model` is the parsed object
        when this cycle parsed it anyway, else it is parsed again only on a miss. Only the facts
        are kept between cycles, not the model: it weighs ~9 KB a Workload (50,000 pending:
        ~0.4 GiB), and the engine's Workload is all a later cycle needs."""
        if facts.engine is not None and facts.engine_queue == queue:
            return facts.engine
        if model is None:
            model = WorkloadModel.model_validate(raw)
        facts.engine = engine_workload(model, queue, raw, self._classes)
        facts.engine_queue = queue
        return facts.engine

    def _model(self, key: str, raw: Obj, model: type[Any], rv: str | None = None) -> Any:
        """`raw` parsed as `model`, cached by version (`rv`, by default its resourceVersion)."""
        if rv is None:
            rv = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._parsed.get(key)
        if cached is not None and cached[0] == rv:
            return cached[1]
        parsed = model.model_validate(raw)
        self._parsed[key] = (rv, parsed)
        return parsed

    def build(self) -> View:
        """The snapshot, from the caches."""
        caches = self.ctx.caches
        now = self.ctx.now()
        flavor_models: list[ResourceFlavor] = []
        for raw in caches.flavors.objects():
            try:
                flavor_models.append(self._model(f"rf:{object_key(raw)}", raw, ResourceFlavor))
            except ValidationError as error:
                log.warning("invalid ResourceFlavor", extra={"error": str(error)[:300]})
        cq_models: dict[str, ClusterQueue] = {}
        unreadable: dict[str, tuple[Any, str]] = {}  # name -> (parent as written, why)
        for raw in caches.cluster_queues.objects():
            try:
                cq = self._model(f"cq:{object_key(raw)}", raw, ClusterQueue)
            except ValidationError as error:
                log.warning("invalid ClusterQueue", extra={"error": str(error)[:300]})
                parent = (raw.get("spec") or {}).get("parent")
                unreadable[object_key(raw)] = (parent, str(error).splitlines()[0][:300])
                continue
            cq_models[cq.name] = cq
        lqs: dict[str, LocalQueue] = {}  # "namespace/name" -> a LocalQueue the model accepts
        for raw in caches.local_queues.objects():
            key = object_key(raw)
            try:
                lqs[key] = self._model(f"lq:{key}", raw, LocalQueue)
            except ValidationError as error:
                log.warning("invalid LocalQueue", extra={"error": str(error)[:300]})
        tree = check_queue_tree(
            cq_models.values(), flavor_models, lqs.values(), caches.namespace_labels()
        )
        tree = self._with_deletions(tree, cq_models)

        flavors = {rf.name: convert.flavor(rf) for rf in flavor_models}
        topologies = self._topologies() if self.use_node_capacity else None
        queues = queue_specs(cq_models.values(), tree, unreadable)
        self._classes, _ = priority_classes(self.ctx)

        admitted: list[Workload] = []
        placed_whole: list[str] = []
        pending: list[Workload] = []
        raw_by_key: dict[str, Obj] = {}
        engine: dict[str, Workload] = {}
        lq_of: dict[str, str] = {}
        blocked: list[tuple[str, str, str]] = []
        holder: dict[str, str] = {}  # Job uid -> its admitted Workload (for its pods)
        took: dict[str, frozenset[str]] = {}  # admitted Workload -> the pods it lost
        cached_workloads = caches.workloads.items()
        self.assumed.keep_only(key for key, _ in cached_workloads)
        known = self._facts
        for key, cached in cached_workloads:
            # A decision whose write is under way counts as made (assumed.py).
            raw, version = self.assumed.effective(key, cached)
            facts = known.get(key)
            model = None
            if facts is None or facts.version != version:
                facts, model = _read_facts(raw, version)
                known[key] = facts
            if facts.finished:
                continue
            if facts.invalid is not None:
                blocked.append((key, INADMISSIBLE, facts.invalid))
                continue
            namespace, queue_name = facts.namespace, facts.queue_name
            lq_key = f"{namespace}/{queue_name}"
            lq_of[key] = lq_key
            raw_by_key[key] = raw
            if facts.holds_quota and facts.admitted_to is not None:
                w = self._engine_workload(facts, raw, model, facts.admitted_to)
                # Pods hold their own room once bound; a Workload with no Job behind it
                # (written by hand) never gets pods, so its plan must not hold room either.
                if not facts.owner_uid:
                    w = _without_plan(w)
                else:
                    holder[facts.owner_uid] = key
                    if facts.preempted_pods:
                        took[key] = facts.preempted_pods
                    if self._placed_whole(key, facts.reserved_at):
                        placed_whole.append(key)
                admitted.append(w)
                engine[key] = w
                continue
            if facts.deleting:
                continue  # leaving before admission: its finalizer goes at once
            lq = lqs.get(lq_key)
            if lq is None:
                blocked.append(
                    (
                        key,
                        INADMISSIBLE,
                        f"LocalQueue {queue_name} does not exist in namespace {namespace}; "
                        "label the Job muster.dev/queue-name=<a LocalQueue of the namespace>, "
                        f"or ask an admin to create LocalQueue {queue_name}",
                    )
                )
                continue
            lq_state = tree.local_queues.get((namespace, lq.name))
            if lq_state is not None and not lq_state.active:
                blocked.append(
                    (key, INADMISSIBLE, f"LocalQueue {lq.name} is inactive: {lq_state.message}")
                )
                continue
            when = facts.requeue_at
            if when is not None and when > now:
                story = wls.queued_story(raw, competing=False)
                why = f"queued {story}" if story else f"in backoff until {wls.rfc3339(when)}"
                blocked.append((key, PENDING, why))
                continue
            if facts.priority_class and (
                wait := convert.priority_wait(None, facts.priority_class, self._classes)
            ):
                blocked.append((key, INADMISSIBLE, wait))
                continue
            queue = counts_in(facts.admitted_to, lq.spec.cluster_queue)
            assert queue is not None, "its LocalQueue exists (above)"
            cq_model = cq_models.get(queue)
            if cq_model is not None and cq_model.spec.dispatch is not None:
                refusal = not_dispatchable(raw, caches.jobs, queue)
                if refusal is not None:
                    blocked.append((key, INADMISSIBLE, refusal))
                    continue
            w = self._engine_workload(facts, raw, model, queue)
            pending.append(w)
            engine[key] = w
        for w in admitted:
            if w.queue not in queues:
                # Deleted before its finalizer was on it: what it admitted still counts.
                queues[w.queue] = QueueSpec(
                    w.queue, active=False, inactive_reason="the ClusterQueue no longer exists"
                )
        # Forget the Workloads that are gone.
        if len(known) > len(cached_workloads):
            for stale in known.keys() - {key for key, _ in cached_workloads}:
                del known[stale]

        nodes, pods = self._nodes_and_pods(holder, took) if self.use_node_capacity else (None, ())
        # No node of any flavor known: quota-only mode.
        capacity = self._capacity(nodes, flavors) or None if nodes is not None else None
        if self.remote_capacity is not None:
            # Queues that dispatch share out the worker clusters' nodes too.
            remote = self.remote_capacity(flavors)
            if remote:
                capacity = dict(Counter(capacity or {}) + Counter(remote))
        stripped = self._confirm_placed(placed_whole, engine, pods)
        stripped |= self._mark_budget_breakers(engine)
        if stripped:
            admitted = [engine[w.key] if w.key in stripped else w for w in admitted]
        snapshot = Snapshot(
            now=now.timestamp(),
            queues=queues,
            flavors=flavors,
            capacity=capacity,
            nodes=nodes,
            pods=pods,
            admitted=tuple(admitted),
            pending=tuple(pending),
            historical_usage=self._historical_usage(queues),
            usage_fairness_k=self.usage.k if self.usage is not None else 0.0,
            hold_timeout_s=self.hold_timeout_s,
            topologies=topologies,
        )
        return View(snapshot, tree, raw_by_key, engine, cq_models, lq_of, blocked)

    def _capacity(
        self, nodes: tuple[Node, ...], flavors: Mapping[str, Flavor]
    ) -> dict[FlavorResource, int]:
        """What the nodes provide per (flavor, resource), worked out again only when a node
        or a flavor changed: the parsed nodes are kept per resourceVersion, so the same
        objects in the same order mean nothing changed."""
        cached = self._capacity_of
        if (
            cached is not None
            and cached[1] == flavors
            and len(cached[0]) == len(nodes)
            and all(a is b for a, b in zip(cached[0], nodes, strict=True))
        ):
            return cached[2]
        capacity = convert.capacity_of(nodes, flavors)
        self._capacity_of = (nodes, dict(flavors), capacity)
        return capacity

    def _topologies(self) -> dict[str, tuple[str, ...]]:
        """Each Topology's levels, widest first. One the model rejects is left out, so the
        workloads of a flavor naming it wait saying it does not exist (its CRD's own rules
        refuse such an object on create; this is the guard for one written before them)."""
        out: dict[str, tuple[str, ...]] = {}
        for raw in self.ctx.caches.topologies.objects():
            try:
                topology = self._model(f"topo:{object_key(raw)}", raw, Topology)
            except ValidationError as error:
                log.warning("invalid Topology", extra={"error": str(error)[:300]})
                continue
            out[topology.name] = topology.spec.labels
        return out

    def _confirm_placed(
        self,
        keys: list[str],
        engine: dict[str, Workload],
        pods: tuple[BoundPod, ...],
    ) -> set[str]:
        """Strip the plans of Workloads placed whole, once this view's pods show it.

        The PodGroup's status and the pods come through different watches: the PodGroup
        may say "scheduled" before the pod cache shows the bindings, and for that moment
        neither the plan nor the pods would hold the room (another workload would be
        admitted onto it). So a plan is dropped only when the pod cache has shown every
        admitted pod bound once for this admission; after that, pods that finish must not
        bring the plan back."""
        bound = Counter(p.workload for p in pods if p.workload is not None)
        live: set[tuple[str, str]] = set()
        stripped: set[str] = set()
        for key in keys:
            w = engine[key]
            mark = (key, self._facts[key].reserved_at)
            live.add(mark)
            admitted = sum(a.count for a in w.admission or ())
            if mark in self._confirmed or bound[key] >= admitted:
                self._confirmed.add(mark)
                engine[key] = _without_plan(w)
                stripped.add(key)
        self._confirmed &= live
        return stripped

    def _mark_budget_breakers(self, engine: dict[str, Workload]) -> set[str]:
        """Mark admitted workloads whose eviction would break a PodDisruptionBudget
        (controllers/state/budgets.py); returns their keys."""
        budgets = self.ctx.caches.budgets.objects()
        if not budgets or not self._pod_labels:
            return set()
        marked = budget_breakers(budgets, self._pod_labels)
        for key in marked:
            w = engine.get(key)
            if w is not None:
                engine[key] = replace(w, disrupts_budget=True)
        return {key for key in marked if key in engine}

    def _placed_whole(self, key: str, reserved_at: str) -> bool:
        """Whether Muster's scheduler already bound this admission's pods once (its PodGroup
        turned PodGroupInitiallyScheduled after the current QuotaReserved): from then on its
        pods hold their own room, and a finished pod must not bring its planned room back."""
        pod_group = self.ctx.caches.pod_groups.get(key)
        if not pod_group:
            return False
        scheduled = wls.condition(pod_group, PGC.INITIALLY_SCHEDULED) or {}
        if scheduled.get("status") != "True":
            return False
        # Both RFC 3339 UTC: they compare as text.
        return str(scheduled.get("lastTransitionTime") or "") >= reserved_at

    def _nodes_and_pods(
        self, holder: Mapping[str, str], took: Mapping[str, frozenset[str]]
    ) -> tuple[tuple[Node, ...] | None, tuple[BoundPod, ...]]:
        """Every node, and every bound, unfinished pod (Muster's or not), for placement; no
        nodes at all means quota-only mode. A pod of a Job that Muster admitted is marked
        with its Workload (`holder`: Job uid -> admitted Workload), so that only the unbound
        rest of that Workload's plan stays reserved, with its pod set; a pod single-pod
        preemption took from it (`took`) is marked leaving instead. Parsed objects are cached by
        resourceVersion."""
        caches = self.ctx.caches
        seen: set[str] = set()
        nodes: list[Node] = []
        for raw in caches.nodes.objects():
            seen.add(f"node:{object_key(raw)}")
            node = self._parsed_node(raw)
            if node is not None:
                nodes.append(node)
        self._forget_unseen(seen)
        if not nodes:
            self._pods.clear()
            return None, ()
        self._pod_labels = {}
        pods: list[BoundPod] = []
        known = self._pods
        live: set[str] = set()
        for raw in caches.bound_pods():
            key = object_key(raw)
            live.add(key)
            facts = self._pod_facts(key, raw)
            if facts.pod is None:
                continue
            owner = next((holder[u] for u in facts.owners if u in holder), None)
            if owner is None:
                pods.append(facts.pod)
                continue
            self._pod_labels.setdefault(owner, []).append(facts.labels)
            if key in took.get(owner, ()):
                owner = leaving_of(owner)
            if facts.owned is None or facts.owner != owner:
                pod_set = facts.labels.get(POD_SET_POD_LABEL)
                facts.owned = replace(facts.pod, workload=owner, pod_set=pod_set)
                facts.owner = owner
            pods.append(facts.owned)
        if len(known) > len(live):
            for stale in known.keys() - live:
                del known[stale]
        return tuple(nodes), tuple(pods)

    def _forget_unseen(self, seen: set[str]) -> None:
        """Drop parsed nodes that are gone, so the cache never outgrows the cluster."""
        for stale in [k for k in self._parsed if k.startswith("node:") and k not in seen]:
            del self._parsed[stale]

    def _parsed_node(self, raw: Obj) -> Node | None:
        key = f"node:{object_key(raw)}"
        rv = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._parsed.get(key)
        if cached is not None and cached[0] == rv:
            node: Node | None = cached[1]
            return node
        try:
            node = node_from_manifest(raw)
        except ManifestError as error:
            # One malformed node must not stop admission: it is left out, and said once.
            log.warning("node left out of placement", extra={"error": str(error)[:300]})
            node = None
        self._parsed[key] = (rv, node)
        return node

    def _pod_facts(self, key: str, raw: Obj) -> _PodFacts:
        rv = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        facts = self._pods.get(key)
        if facts is not None and facts.version == rv:
            return facts
        try:
            pod: BoundPod | None = bound_pod_from_manifest(raw)
        except ManifestError as error:
            # The apiserver validated it; only a quantity we cannot read gets here.
            log.warning("pod left out of placement", extra={"error": str(error)[:300]})
            pod = None
        labels = (raw.get("metadata") or {}).get("labels") or {}
        facts = self._pods[key] = _PodFacts(rv, pod, list(job_uid_of_pod(raw)), labels)
        return facts

    def _historical_usage(self, queues: Mapping[str, QueueSpec]) -> dict[str, float]:
        """Each queue's recent usage among its siblings, from the figures in memory.

        Recomputed only when the figures were refreshed or the tree changed shape."""
        if self.usage is None:
            return {}
        parents = {name: spec.parent for name, spec in queues.items()}
        stamp = (self.usage.computed_at, tuple(sorted(parents.items(), key=lambda p: p[0])))
        if self._historical[0] != stamp:
            self._historical = (stamp, self.usage.historical_usage(parents))
        return self._historical[1]

    @staticmethod
    def _with_deletions(tree: QueueTree, cqs: Mapping[str, ClusterQueue]) -> QueueTree:
        """A ClusterQueue being deleted admits nothing more (its admitted work keeps running
        until it finishes or is drained; the finalizer holds the deletion until then)."""
        states = dict(tree.cluster_queues)
        changed = False
        for name, cq in cqs.items():
            if cq.metadata.deletion_timestamp is not None and states[name].active:
                states[name] = QueueState(
                    False,
                    "Terminating",
                    "the ClusterQueue is being deleted; it admits nothing new and is removed "
                    "once no admitted workload holds quota in it",
                )
                changed = True
        if not changed:
            return tree
        return QueueTree(states, tree.local_queues, tree.children)


def _without_plan(w: Workload) -> Workload:
    """`w` with no planned nodes: nothing of its plan is reserved any more."""
    if w.admission is None or not any(a.nodes for a in w.admission):
        return w
    return replace(w, admission=tuple(replace(a, nodes=()) for a in w.admission))
