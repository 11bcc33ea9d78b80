"""Names Muster uses on the cluster: labels, annotations, gates, finalizers, the pod-set name.

Defined once, here, because the controller, the webhooks, the converter and the simulator
must agree on every one of them; a second spelling anywhere would be a silent split.
"""

from __future__ import annotations

# On a Job (and other integrated kinds): the LocalQueue in its namespace.
QUEUE_LABEL = "muster.dev/queue-name"
# On a Job: opt into WorkloadSlices (scale without restarting). Also copied onto its pods.
ELASTIC_ANNOTATION = "muster.dev/elastic-job"
ELASTIC_POD_LABEL = ELASTIC_ANNOTATION
# On a Job: the fewest pods it can run with (partial admission).
MIN_PARALLELISM_ANNOTATION = "muster.dev/min-parallelism"
# On a Job (any integrated kind), copied to its Workload: when it last saved its work (RFC
# 3339). Among victims of equal priority, those that would lose the least work go first.
LAST_CHECKPOINT_ANNOTATION = "muster.dev/last-checkpoint"
# On a Job (or JobSet, TrainJob, PodGroup, ...), copied to its Workload: "true" or "false"
# overrides the queue's spec.preemption.preemptibleBelowPriority for this one workload.
PREEMPTIBLE_ANNOTATION = "muster.dev/preemptible"
# On a Job: its pod template's scheduling fields before Muster merged flavors into them.
ORIGINAL_SCHEDULING_ANNOTATION = "muster.dev/original-scheduling"
# Scheduling gate that holds the pods of an elastic slice until the slice is admitted.
ADMISSION_GATE = "muster.dev/admission"
# On Workloads: the owning Job's uid and name (for `kubectl get wl -l muster.dev/job-name=x`).
JOB_UID_LABEL = "muster.dev/job-uid"
JOB_NAME_LABEL = "muster.dev/job-name"
# Set by the Job controller on its pods.
JOB_UID_POD_LABEL = "batch.kubernetes.io/controller-uid"
# Set by Muster at admission on the pod templates of kinds whose pods belong to Jobs of their
# own (JobSet, TrainJob): the uid of the object the Workload is owned by. Its pods are
# indexed, placed and handed to Muster's scheduler (the pod webhook) by it.
OWNER_UID_POD_LABEL = "muster.dev/owner-uid"
# On ClusterQueues: held while workloads still use the queue's quota.
QUEUE_FINALIZER = "muster.dev/resource-in-use"
# On Workloads Muster creates: held while the pods of an admitted Workload still hold room
# (running or terminating), so deleting a Job never frees quota before its pods are gone.
# The same name as on queues, as Kueue does: both mean "resources still in use".
WORKLOAD_FINALIZER = QUEUE_FINALIZER
# The schedulerName of pods Muster places (the controller's --scheduler-name default).
SCHEDULER_NAME = "muster-scheduler"
# The one pod set of a batch Job's Workload.
JOB_POD_SET = "main"
# The node label naming each node; as a Topology level, one node per domain (only last).
HOSTNAME_LABEL = "kubernetes.io/hostname"
# On a Job's pod template (as Kueue's kueue.x-k8s.io/podset-*-topology): keep its pods in one
# domain of the flavor's Topology at the level (node label) given, or prefer to; or anywhere
# in the topology ("true"); and each run of slice-size pods inside one domain at the slice
# level. Read into the Workload's spec.podSets[].topologyRequest.
REQUIRED_TOPOLOGY_ANNOTATION = "muster.dev/podset-required-topology"
PREFERRED_TOPOLOGY_ANNOTATION = "muster.dev/podset-preferred-topology"
UNCONSTRAINED_TOPOLOGY_ANNOTATION = "muster.dev/podset-unconstrained-topology"
SLICE_TOPOLOGY_ANNOTATION = "muster.dev/podset-slice-required-topology"
SLICE_SIZE_ANNOTATION = "muster.dev/podset-slice-size"

# On a pod: the Workload pod set it belongs to, where its kind has more than one pod set
# and names none of its own (Ray's head and worker groups, a LeaderWorkerSet's leader and
# workers). Muster writes it into the templates; the scheduler loop reads it.
POD_SET_POD_LABEL = "muster.dev/pod-set"
# On pods whose owner no integration knows (Kueue's pod groups): the group they form and
# how many pods it has in all; without them the pods are grouped by their owner.
POD_GROUP_LABEL = "muster.dev/pod-group"
POD_GROUP_COUNT_ANNOTATION = "muster.dev/pod-group-total-count"
# On a workload (and copied to its Workload as spec.disruptionMode): "single" lets
# preemption take single pods above each pod set's minimum instead of the whole workload.
DISRUPTION_MODE_ANNOTATION = "muster.dev/disruption-mode"
# On a StatefulSet: "true" admits its replicas all or none (else one by one, elastic).
GANG_ANNOTATION = "muster.dev/gang"
# On a Workload Muster made for pods grouped by their owner (controllers/owners): the id the
# group's pods are indexed by (`controllers.state.ownergroups.OwnerGroup.gid`).
OWNER_GROUP_ANNOTATION = "muster.dev/owner-group"

# Many clusters (docs/multicluster.md). On a Job in the management cluster: its
# spec.managedBy, so that the Job controller there leaves it (and its status) to Muster,
# which runs it in a worker cluster and copies the copy's status back.
DISPATCH_MANAGED_BY = "muster.dev/multicluster"
# On the management cluster's Workload: the worker cluster it was sent to (written before the
# copy is created there, so that a restarted manager never sends it twice), the placement it
# was planned with there (JSON), and "true" once the manager let the copy start.
DISPATCHED_TO_ANNOTATION = "muster.dev/dispatched-to"
DISPATCH_PLAN_ANNOTATION = "muster.dev/dispatch-plan"
DISPATCH_STARTED_ANNOTATION = "muster.dev/dispatch-started"
# Worker clusters a workload was sent to, lost before it started there, and whose copies
# must be deleted when they answer again (comma-separated).
DISPATCH_ABANDONED_ANNOTATION = "muster.dev/dispatch-abandoned"
# On a copy in a worker cluster (and its pods' template): the management cluster's Workload
# ("namespace/name") and its uid. A copy waits suspended, even once admitted there, until the
# manager sets the start annotation: only the manager starts copies, so it always knows
# which copies may be running (never two).
DISPATCHED_FROM_ANNOTATION = "muster.dev/dispatched-from"
ORIGIN_UID_LABEL = "muster.dev/origin-uid"
DISPATCH_START_ANNOTATION = "muster.dev/dispatch-start"
