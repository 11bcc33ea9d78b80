"""The immutable input of one admission cycle: queues, flavors, capacity and workloads.

The shell builds a Snapshot from its caches; the core reads it and never changes it. Every
class here is a frozen, slotted dataclass so a cycle can share one snapshot freely and two
runs over the same snapshot decide the same things.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from quota.lifecycle.slices import superseded_slice
from quota.model.nodes import BoundPod, Node, SelectorTerm, Taint, Toleration
from quota.model.resources import FlavorResource, flavor_resource

QueueingStrategy = Literal["StrictFIFO", "BestEffortFIFO"]
WithinQueuePolicy = Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"]
ReclaimPolicy = Literal["Never", "LowerPriority", "Any"]
StopPolicy = Literal["None", "Hold", "HoldAndDrain"]
PlacementStrategy = Literal["BinPack", "Spread"]
TopologyMode = Literal["Required", "Preferred", "Unconstrained"]


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    """What a queue is guaranteed (quota) and may at most use (limit) of one flavor.

    `limit` holds only the resources that have one; a resource missing there is unlimited.
    A resource missing from `quota` cannot be taken from this flavor by a leaf queue.
    """

    flavor: str
    quota: Mapping[str, int]
    limit: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A ClusterQueue: one node of the queue tree."""

    name: str
    parent: str | None = None
    priority: int = 0
    over_quota_weight: float = 1.0
    flavors: tuple[FlavorQuota, ...] = ()  # preference order
    queueing_strategy: QueueingStrategy = "BestEffortFIFO"
    within_queue: WithinQueuePolicy = "Never"
    reclaim: ReclaimPolicy = "Never"
    min_runtime_preempt_s: float = 0.0
    min_runtime_reclaim_s: float = 0.0
    # A pending workload evicts no one until it has waited this long (waitBeforeEvicting).
    wait_before_evicting_s: float = 0.0
    stop_policy: StopPolicy = "None"
    placement: PlacementStrategy = "BinPack"  # how its workloads' pods are placed on nodes
    # Consolidation: its running workloads may be moved to other nodes (below this priority).
    movable: bool = False
    movable_below: int | None = None
    # Workloads with a lower priority are preemptible (may borrow, may be evicted); None:
    # every workload is. The API's default is 100 (queues.py); the engine's is None, as its
    # reclaim default is Never, so that a QueueSpec says only what it is given.
    preemptible_below: int | None = None
    active: bool = True
    inactive_reason: str = ""
    # Its workloads run in worker clusters (ClusterQueue.spec.dispatch): admitted here by
    # quota alone, placed on the worker's nodes by the dispatcher, never on this cluster's.
    remote: bool = False
    # Derived once: quota and limits keyed by (flavor, resource), for lookups in hot loops.
    quotas: Mapping[FlavorResource, int] = field(init=False, repr=False, compare=False)
    limits: Mapping[FlavorResource, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        quotas: dict[FlavorResource, int] = {}
        limits: dict[FlavorResource, int] = {}
        for fq in self.flavors:
            for resource, amount in fq.quota.items():
                quotas.setdefault(flavor_resource(fq.flavor, resource), amount)
            for resource, amount in fq.limit.items():
                limits.setdefault(flavor_resource(fq.flavor, resource), amount)
        object.__setattr__(self, "quotas", quotas)
        object.__setattr__(self, "limits", limits)

    def quota_for(self, flavor: str, resource: str) -> int:
        """Guaranteed amount of `resource` in `flavor` (0 when the queue lists none)."""
        return self.quotas.get((flavor, resource), 0)

    def limit_for(self, flavor: str, resource: str) -> int | None:
        """Hard cap on `resource` in `flavor`, or None when there is none."""
        return self.limits.get((flavor, resource))


@dataclass(frozen=True, slots=True)
class Flavor:
    """A ResourceFlavor: the node labels and taints shared by the nodes of one kind."""

    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()  # added to pods admitted on this flavor
    topology: str | None = None  # the Topology its nodes form (spec.topologyName)


@dataclass(frozen=True, slots=True)
class PodSetTopology:
    """Where a pod set's pods must or should be, in node labels of its flavor's Topology.

    Required: every pod in one domain at `level`. Preferred: in one domain at `level` if one
    can hold them all, else at the lowest wider level that can, else anywhere in the
    topology. Unconstrained: anywhere in the topology (`level` None). With a slice, each
    run of `slice_size` consecutive pods is inside one domain at `slice_level` too. `tier`
    names the level instead of `level`, counted up from the narrowest that is not the
    hostname (Volcano's HyperNode tiers); the flavor's Topology resolves it.
    """

    mode: TopologyMode
    level: str | None = None
    slice_size: int | None = None
    slice_level: str | None = None
    tier: int | None = None


@dataclass(frozen=True, slots=True)
class PodSet:
    """A group of identical pods of a workload (e.g. the workers of a training Job)."""

    name: str
    count: int
    per_pod: Mapping[str, int]
    min_count: int | None = None  # partial admission: the fewest pods the job can run with
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    # Required node affinity: a node must match one of the terms; () sets none.
    affinity: tuple[SelectorTerm, ...] = ()
    topology: PodSetTopology | None = None  # None: placed without regard to domains
    # Pods single-pod disruption never takes (Workload disruption_single only).
    protected_count: int = 0


@dataclass(frozen=True, slots=True)
class Assignment:
    """How one pod set was admitted: how many pods and which flavor per resource."""

    pod_set: str
    count: int
    flavors: Mapping[str, str]  # resource -> flavor
    # Where its pods are planned, ((node, pods), ...), when the cluster has nodes: the
    # placement it was admitted with. Room planned and not yet bound stays reserved for it.
    nodes: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Hold:
    """Room on nodes held for a pending preemptor while the victims evicted for it leave.

    `assignments` say where its pods go (as an admission's plans do); no other workload may
    be placed on that room until the preemptor is admitted, or until `since` is more than
    the snapshot's `hold_timeout_s` ago and the hold lapses (a victim that would not go).
    """

    assignments: tuple[Assignment, ...]
    since: float
    victims: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Workload:
    """A unit of admission: every pod set is admitted together or not at all."""

    key: str  # "namespace/name"
    queue: str  # leaf ClusterQueue name
    priority: int
    arrival: float  # seconds; earlier arrivals go first among equal priority
    pod_sets: tuple[PodSet, ...]
    admission: tuple[Assignment, ...] | None = None  # set when admitted
    admitted_at: float | None = None
    replaces: str | None = None  # elastic scale-up: key of the admitted slice it replaces
    # The shell has already asked for this admitted workload to be evicted (preempted,
    # reclaimed or drained): it still holds its quota until it is gone, but nothing should
    # choose it as a victim again, and a preemptor may count on the quota it will release.
    evicting: bool = False
    # Evicting all its pods now would take some PodDisruptionBudget below its minimum: a
    # victim of last resort among equals (best effort, as kube-scheduler's preemption).
    disrupts_budget: bool = False
    # Admitted only: when it last saved its work (annotation muster.dev/last-checkpoint), if
    # it says; victims that would lose the least work go first among equal priorities.
    checkpointed_at: float | None = None
    # Pending preemptors only: the room held for it on nodes (see Hold).
    hold: Hold | None = None
    # Its object's muster.dev/preemptible annotation; None: its queue's threshold decides
    # (`is_preemptible`).
    preemptible: bool | None = None
    # spec.disruptionMode Single: a victim loses single pods (quota/preemption/partial.py).
    disruption_single: bool = False


def is_preemptible(w: Workload, spec: QueueSpec) -> bool:
    """Whether `w` may borrow beyond its queue's quota and be chosen as a victim: its own
    annotation, else a priority below its queue's threshold (KAI's rule)."""
    if w.preemptible is not None:
        return w.preemptible
    below = spec.preemptible_below
    return below is None or w.priority < below


def non_preemptible_words(w: Workload, spec: QueueSpec) -> str:
    """ "non-preemptible (priority 150 >= 100 in queue serve)", or "(by its annotation)"."""
    if w.preemptible is not None:
        # Not spelled out here: quota.api (names.py's package) is not the engine's to load.
        return "non-preemptible (by its annotation)"
    threshold = spec.preemptible_below
    return f"non-preemptible (priority {w.priority} >= {threshold} in queue {spec.name})"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one admission cycle decides from."""

    now: float
    queues: Mapping[str, QueueSpec]
    flavors: Mapping[str, Flavor]
    # (flavor, resource) -> capacity of Ready nodes; None = quota-only mode.
    capacity: Mapping[FlavorResource, int] | None = None
    # Every node, and every pod bound to one and not finished, whoever owns it. None: the
    # cluster (or file) has no nodes, and admission trusts quota alone.
    nodes: tuple[Node, ...] | None = None
    pods: tuple[BoundPod, ...] = ()
    admitted: tuple[Workload, ...] = ()
    pending: tuple[Workload, ...] = ()
    # Per queue, decayed past usage; empty turns time-based fairness off.
    historical_usage: Mapping[str, float] = field(default_factory=dict)
    usage_fairness_k: float = 0.0
    # How long room held for a preemptor stays reserved while its victims leave.
    hold_timeout_s: float = 300.0
    # Topology name -> its levels' node labels, widest first. None: whoever built the
    # snapshot does not place by topology (Muster's controller, until its scheduler loop
    # binds inside a domain), so workloads that need a flavor naming a Topology wait.
    topologies: Mapping[str, tuple[str, ...]] | None = None
    # Derived once: the flavors that name a Topology (most clusters: none), so that placing
    # a workload on the others costs no topology look-up.
    topology_flavors: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        named = frozenset(name for name, f in self.flavors.items() if f.topology is not None)
        object.__setattr__(self, "topology_flavors", named)

    def active_hold(self, w: Workload) -> Hold | None:
        """`w`'s hold while it has not lapsed."""
        return active_hold(w, self.now, self.hold_timeout_s)


def active_hold(w: Workload, now: float, timeout_s: float) -> Hold | None:
    """`w`'s hold on nodes, unless it is more than `timeout_s` old at `now`."""
    hold = w.hold
    if hold is None or now - hold.since >= timeout_s:
        return None
    return hold


@dataclass(frozen=True, slots=True)
class QueueTree:
    """The parent/child structure of the queues, resolved once per cycle."""

    roots: tuple[str, ...]
    children: Mapping[str, tuple[str, ...]]
    # Each queue's path from itself up to its root, itself first.
    paths: Mapping[str, tuple[str, ...]]

    def is_leaf(self, name: str) -> bool:
        """True for queues without children: only those hold workloads."""
        return not self.children.get(name)


def queue_tree(queues: Mapping[str, QueueSpec]) -> QueueTree:
    """Resolve parents into a tree; raise ValueError naming the queue on a bad parent or cycle."""
    children: dict[str, list[str]] = {name: [] for name in queues}
    roots: list[str] = []
    for name in sorted(queues):
        parent = queues[name].parent
        if parent is None:
            roots.append(name)
        elif parent not in queues:
            raise ValueError(f"queue {name}: parent {parent} does not exist")
        else:
            children[parent].append(name)
    paths: dict[str, tuple[str, ...]] = {}
    for name in queues:
        path = [name]
        seen = {name}
        parent = queues[name].parent
        while parent is not None:
            if parent in seen:
                raise ValueError(f"queue {name}: parent chain loops back to {parent}")
            seen.add(parent)
            path.append(parent)
            parent = queues[parent].parent
        paths[name] = tuple(path)
    return QueueTree(
        roots=tuple(roots),
        children={name: tuple(kids) for name, kids in children.items()},
        paths=paths,
    )


def pod_set_usage(
    workload: Workload, into: dict[FlavorResource, int] | None = None
) -> dict[FlavorResource, int]:
    """Quota an admitted workload holds, per (flavor, resource), from its admission.

    The keys are the shared ones (`flavor_resource`): a caller that keeps the usage of
    every admitted workload of a cluster keeps a few keys instead of one tuple per workload
    and resource, and finds them by identity in the ledgers. The usage is also added into
    `into` when given (a sum over many workloads, without walking each result again).
    """
    out: dict[FlavorResource, int] = {}
    admission = workload.admission
    if admission is None:
        return out
    pod_sets = workload.pod_sets
    if len(admission) == 1 and len(pod_sets) == 1:
        # The usual shape, worked out for every admitted workload of every cycle: one pod
        # set, one assignment, so each resource is one key and nothing is added up.
        assignment, ps = admission[0], pod_sets[0]
        if ps.name != assignment.pod_set:
            return out
        flavors, count = assignment.flavors, assignment.count
        for resource, amount in ps.per_pod.items():
            if amount:
                flavor = flavors.get(resource)
                if flavor is not None:
                    key = flavor_resource(flavor, resource)
                    out[key] = held = amount * count
                    if into is not None:
                        into[key] = into.get(key, 0) + held
        return out
    per_pod = {ps.name: ps.per_pod for ps in pod_sets}
    for assignment in admission:
        requests = per_pod.get(assignment.pod_set, {})
        for resource, amount in requests.items():
            flavor = assignment.flavors.get(resource)
            if flavor is None or not amount:
                continue
            key = flavor_resource(flavor, resource)
            out[key] = out.get(key, 0) + amount * assignment.count
    if into is not None:
        for key, held in out.items():
            into[key] = into.get(key, 0) + held
    return out


def superseded_slices(admitted: tuple[Workload, ...]) -> frozenset[str]:
    """Keys of admitted slices that an admitted successor slice already replaces.

    The shell retires the old slice a little after the new one is admitted; until then both
    are in the snapshot and only the successor's usage counts.
    """
    replacing = [w for w in admitted if w.replaces is not None]
    if not replacing:
        return frozenset()  # the usual case, and every cycle asks
    keys = {w.key for w in admitted}
    gone = (superseded_slice(w.key, w.replaces, keys) for w in replacing)
    return frozenset(key for key in gone if key is not None)


def admission_blocker(queues: Mapping[str, QueueSpec], tree: QueueTree, name: str) -> str | None:
    """Why workloads of queue `name` cannot be admitted at all, or None.

    A stop policy or deactivation on an ancestor holds the whole subtree: holding a
    department holds its teams.
    """
    if name not in queues:
        return f"queue {name} does not exist"
    if not tree.is_leaf(name):
        return f"queue {name} has child queues; workloads must name a leaf queue"
    for queue_name in tree.paths[name]:
        spec = queues[queue_name]
        where = "" if queue_name == name else f" (ancestor of {name})"
        if not spec.active:
            why = f": {spec.inactive_reason}" if spec.inactive_reason else ""
            return f"queue {queue_name}{where} is inactive{why}"
        if spec.stop_policy != "None":
            return (
                f"queue {queue_name}{where} is stopped (stopPolicy {spec.stop_policy}); "
                "set stopPolicy to None to resume admission"
            )
    return None


def draining(queues: Mapping[str, QueueSpec], tree: QueueTree, name: str) -> str | None:
    """The queue on `name`'s path whose stopPolicy HoldAndDrain evicts its workloads, if any."""
    if name not in tree.paths:
        return None
    for queue_name in tree.paths[name]:
        if queues[queue_name].stop_policy == "HoldAndDrain":
            return queue_name
    return None
