"""`kubectl muster stop|resume QUEUE`: a ClusterQueue's stopPolicy, as Kueue's.

Hold admits nothing new (what runs keeps running); HoldAndDrain also evicts what is
admitted; None resumes. The controller reports the queue Inactive (Stopped) meanwhile.
Stopping a queue stops every team that feeds it: a cluster-wide right (the chart's
batch-admin role bound with a ClusterRoleBinding, or cluster-admin; docs/tenancy.md).
"""

from __future__ import annotations

from typing import Literal

import click
from kubernetes.client.exceptions import ApiException

from controllers.plugin.kube import Forbidden, api_error, get_one
from controllers.runtime.resources import CLUSTER_QUEUE, Kube

StopPolicy = Literal["None", "Hold", "HoldAndDrain"]


def set_stop_policy(kube: Kube, queue: str, policy: StopPolicy) -> str:
    """Set the policy; returns the one the queue had."""
    try:
        cq = get_one(kube, CLUSTER_QUEUE, None, queue)
        if cq is None:
            raise click.ClickException(f"ClusterQueue {queue!r} not found")
        before = str((cq.get("spec") or {}).get("stopPolicy") or "None")
        if before != policy:
            try:
                kube.patch(CLUSTER_QUEUE, None, queue, {"spec": {"stopPolicy": policy}})
            except ApiException as error:
                raise api_error(error, f"setting spec.stopPolicy of ClusterQueue {queue}") from None
    except Forbidden as refused:
        raise click.ClickException(refusal(queue, policy, refused.message)) from None
    return before


def refusal(queue: str, policy: StopPolicy, refused: str) -> str:
    """A refusal in a batch user's words: the right it takes, who has it, then the
    apiserver's own line (`refused`)."""
    verb = "resuming" if policy == "None" else "stopping"
    return (
        f"{verb} ClusterQueue {queue} needs the right to get and patch ClusterQueues "
        "(clusterqueues.muster.dev), which you do not have: it belongs to batch admins (the "
        "chart's batch-admin role, bound with a ClusterRoleBinding) and cluster admins; ask one "
        f"of them. {refused}"
    )
