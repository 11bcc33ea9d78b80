"""What the scheduler loop reads off a Pod: where it is, whether it may be bound, its shape."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from controllers.runtime.resources import object_key

FINISHED = ("Succeeded", "Failed")


def spec_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def node_of(pod: Mapping[str, Any]) -> str:
    """The node the pod is bound to, or ""."""
    return str(spec_of(pod).get("nodeName") or "")


def scheduler_of(pod: Mapping[str, Any]) -> str:
    return str(spec_of(pod).get("schedulerName") or "default-scheduler")


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Any scheduling gate, Muster's or another's: the apiserver refuses to bind such a pod."""
    return bool(spec_of(pod).get("schedulingGates"))


def is_deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED


def uid_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def age_order(pod: Mapping[str, Any]) -> tuple[str, str]:
    """Oldest first, then by name: the pods that have waited longest are bound first."""
    meta = pod.get("metadata") or {}
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))


def placement_inputs(pod: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What the scheduler loop and the admission cycle decide from: a pod changing in
    anything else (status heartbeats, conditions, IPs) changes no placement."""
    if pod is None:
        return ()
    return (
        node_of(pod),
        scheduler_of(pod),
        is_gated(pod),
        is_deleting(pod),
        is_finished(pod),
    )


def shape_key(pod: Mapping[str, Any]) -> str:
    """Pods with equal keys have the same PodShape: everything `pod_shape_from_spec` reads.

    Pods of one pod template are identical in practice; keying keeps the loop right if a
    group ever holds two generations of a template.
    """
    spec = spec_of(pod)
    containers = [
        [c.get("resources"), c.get("restartPolicy")]
        for field in ("containers", "initContainers")
        for c in spec.get(field) or []
        if isinstance(c, Mapping)
    ]
    return json.dumps(
        [
            containers,
            spec.get("overhead"),
            spec.get("nodeSelector"),
            (spec.get("affinity") or {}).get("nodeAffinity")
            if isinstance(spec.get("affinity"), Mapping)
            else spec.get("affinity"),
            spec.get("tolerations"),
        ],
        sort_keys=True,
        default=str,
    )


def key_of(pod: Mapping[str, Any]) -> str:
    """ "namespace/name", as BoundPod keys and the caches name pods."""
    return object_key(pod)
