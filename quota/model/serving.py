"""The pod sets of workloads queued by their pods (docs/integrations.md, "Queued by their
pods"), one home for the controller (`controllers/owners`) and the simulator: what a
LeaderWorkerSet group, a serving Deployment or StatefulSet asks for, and which of its pods
preemption may take one by one."""

from __future__ import annotations

from dataclasses import dataclass

# A LeaderWorkerSet group's pod sets: its leader (worker index 0) and the rest.
LEADER = "leader"
WORKERS = "workers"
# The one pod set of a Deployment's, a StatefulSet's or any other owner's group.
MAIN = "main"


@dataclass(frozen=True)
class GroupPodSet:
    """One pod set of a group: its pods, and how many of them single-pod preemption never
    takes (all of them unless the group is degradable)."""

    name: str
    count: int
    protected: int


def lws_group(size: int, degradable: bool) -> tuple[GroupPodSet, ...]:
    """A LeaderWorkerSet replica of `size` pods (>= 1): its leader and `size - 1` workers,
    placed whole. Degradable (`disruptionMode` single): workers may be taken one by one, the
    leader never (without it the group serves nothing)."""
    if size < 1:
        raise ValueError(f"a LeaderWorkerSet group has at least one pod (got size {size})")
    workers = size - 1
    sets = [GroupPodSet(LEADER, 1, 1)]
    if workers:
        sets.append(GroupPodSet(WORKERS, workers, 0 if degradable else workers))
    return tuple(sets)


def replicas_group(replicas: int) -> tuple[GroupPodSet, ...]:
    """A serving Deployment's or StatefulSet's replicas, as one pod set that grows and
    shrinks through slices (every pod is a replica; none is taken alone)."""
    if replicas < 0:
        raise ValueError(f"replicas must not be negative (got {replicas})")
    return (GroupPodSet(MAIN, replicas, replicas),)


# KubeRay's bound on a worker group's replicas when it sets no maxReplicas.
RAY_MAX_REPLICAS = 2147483647


def ray_worker_pods(
    replicas: int, min_replicas: int, max_replicas: int, hosts: int, suspended: bool
) -> int:
    """Pods KubeRay runs for a worker group (its `GetWorkerGroupDesiredReplicas`): replicas,
    at least minReplicas and at most maxReplicas (maxReplicas if they cross), times
    numOfHosts; none while the group is suspended."""
    if suspended:
        return 0
    bounded = (
        max_replicas
        if min_replicas > max_replicas
        else min(max(replicas, min_replicas), max_replicas)
    )
    return bounded * hosts
