"""`kubectl muster stop|resume QUEUE`: a ClusterQueue's stopPolicy, as Kueue's.

Hold admits nothing new (what runs keeps running); HoldAndDrain also evicts what is
admitted; None resumes. The controller reports the queue Inactive (Stopped) meanwhile.
"""

from __future__ import annotations

from typing import Literal

import click
from kubernetes.client.exceptions import ApiException

from controllers.plugin.kube import api_error, get_one
from controllers.runtime.resources import CLUSTER_QUEUE, Kube

StopPolicy = Literal["None", "Hold", "HoldAndDrain"]


def set_stop_policy(kube: Kube, queue: str, policy: StopPolicy) -> str:
    """Set the policy; returns the one the queue had."""
    cq = get_one(kube, CLUSTER_QUEUE, None, queue)
    if cq is None:
        raise click.ClickException(f"ClusterQueue {queue!r} not found")
    before = str((cq.get("spec") or {}).get("stopPolicy") or "None")
    if before != policy:
        try:
            kube.patch(CLUSTER_QUEUE, None, queue, {"spec": {"stopPolicy": policy}})
        except ApiException as error:
            raise api_error(error, f"setting spec.stopPolicy of ClusterQueue {queue}") from None
    return before
