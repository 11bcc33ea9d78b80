"""Scheduling-gate lifting for elastic Jobs (and other elastic kinds): pods are created with
the gate `muster.dev/admission`, and the gate is lifted from exactly as many pods of each
elastic pod set as the admitted slice grants it, never more. A pod's pod set is its
`muster.dev/pod-set` label (a RayCluster's worker groups); a kind with one elastic pod set
need not label its pods (a batch Job's).

How many ungated pods may exist is derived on every pass from the admitted slice's count,
never remembered: after a restart, or across rapid scale events, the rule is recomputed from
what the apiserver holds. Before lifting anything the pods are listed from the apiserver
(a quorum read), because a pod this process ungated a moment ago may not have reached the
cache yet, and counting it as gated would lift one pod too many.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from controllers.runtime import apply
from controllers.runtime.resources import POD, Obj, object_key
from controllers.state.caches import Context
from quota.api.names import ADMISSION_GATE, ELASTIC_POD_LABEL, POD_SET_POD_LABEL

log = logging.getLogger(__name__)


def is_gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def holds_capacity(pod: Mapping[str, Any]) -> bool:
    """A pod that is not finished counts against the slice, terminating ones included:
    their resources are not free until they are gone."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def in_pod_set(pods: Iterable[Mapping[str, Any]], pod_set: str, only: bool) -> list[Any]:
    """The pods of `pod_set`: labelled so, or, when it is the `only` elastic pod set, not
    labelled at all."""
    out = []
    for pod in pods:
        label = ((pod.get("metadata") or {}).get("labels") or {}).get(POD_SET_POD_LABEL)
        if label == pod_set or (label is None and only):
            out.append(pod)
    return out


def runs(pod: Mapping[str, Any]) -> bool:
    """Released from the gate, not finished, not going: what an admission grants."""
    meta = pod.get("metadata") or {}
    return not is_gated(pod) and holds_capacity(pod) and not meta.get("deletionTimestamp")


def ungated_holding(pods: Iterable[Mapping[str, Any]]) -> int:
    """Pods already released from the gate that still hold capacity (running, pending on a
    node, or terminating): what the admitted slice must keep covering."""
    return sum(1 for p in pods if holds_capacity(p) and not is_gated(p))


def pods_to_ungate(pods: Iterable[Mapping[str, Any]], allowed: int) -> list[Mapping[str, Any]]:
    """Which gated pods to release so that at most `allowed` ungated pods hold capacity:
    the oldest first, so the pods that have waited longest start first."""
    live = [p for p in pods if holds_capacity(p)]
    ungated = sum(1 for p in live if not is_gated(p))
    room = allowed - ungated
    if room <= 0:
        return []
    candidates = [
        p for p in live if is_gated(p) and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    candidates.sort(
        key=lambda p: (
            str((p.get("metadata") or {}).get("creationTimestamp") or ""),
            str((p.get("metadata") or {}).get("name") or ""),
        )
    )
    return candidates[:room]


def hold_template(template: Obj) -> bool:
    """Add the admission gate and the elastic pod label to a pod template, so that its pods
    wait until a slice grants them (the webhook does this for a Job at creation; this also
    covers Jobs created while it was away, and other elastic kinds at admission)."""
    changed = False
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    if labels.get(ELASTIC_POD_LABEL) != "true":
        labels[ELASTIC_POD_LABEL] = "true"
        changed = True
    held = template.setdefault("spec", {}).setdefault("schedulingGates", [])
    if not any(g.get("name") == ADMISSION_GATE for g in held):
        held.append({"name": ADMISSION_GATE})
        changed = True
    return changed


def drop_gate(obj: Obj) -> bool:
    """Take the admission gate out of a pod, or a pod template; False if it had none."""
    spec = obj.get("spec") or {}
    held = spec.get("schedulingGates") or []
    kept = [g for g in held if g.get("name") != ADMISSION_GATE]
    if len(kept) == len(held):
        return False
    if kept:
        spec["schedulingGates"] = kept
    else:
        spec.pop("schedulingGates", None)
    return True


def lift(ctx: Context, job: Mapping[str, Any], allowed: Mapping[str, int], selector: str) -> int:
    """Lift gates so each elastic pod set has at most `allowed[pod_set]` ungated pods;
    returns how many were lifted. `selector` selects the object's pods (for the quorum
    read). Raises on a conflicting write, so the caller retries from a fresh read."""
    uid = job["metadata"]["uid"]
    only = len(allowed) == 1

    def chosen_of(pods: list[Obj]) -> list[Mapping[str, Any]]:
        return [
            pod
            for pod_set, n in allowed.items()
            for pod in pods_to_ungate(in_pod_set(pods, pod_set, only), n)
        ]

    if not chosen_of(ctx.caches.pods_of_job(uid)):
        return 0  # the cache can only over-count gated pods, so nothing to do is certain
    namespace = job["metadata"]["namespace"]
    pods, _ = ctx.kube.list(POD, namespace, label_selector=selector)
    for pod in pods:
        ctx.caches.pods.write_through(pod)
    lifted = 0
    for chosen in chosen_of(pods):

        def mutate(p: Obj) -> bool:
            # A concurrent change to this pod (deleted, already ungated) invalidates the
            # count; give up and recount from scratch rather than guess.
            if not is_gated(p) or (p.get("metadata") or {}).get("deletionTimestamp"):
                raise apply.ConflictRetriesExhausted("pod changed while ungating; recounting")
            return drop_gate(p)

        written = apply.update(
            ctx.kube,
            POD,
            object_key(chosen),
            mutate,
            cache=ctx.caches.pods,
            current=dict(chosen),
            attempts=1,
        )
        if written is not None:
            lifted += 1
    if lifted:
        log.info(
            "lifted scheduling gates",
            extra={"job": object_key(job), "lifted": lifted, "allowed": allowed},
        )
        ctx.events.emit(
            job,
            "Normal",
            "GatesLifted",
            f"lifted the {ADMISSION_GATE} gate from {lifted} pod(s); "
            f"{sum(allowed.values())} pod(s) admitted",
        )
    return lifted
