"""Workload objects as the controller reads and writes them: names, labels, the lifecycle
read off their conditions, and the status changes the reconcilers make.

The Workload status is the record of every decision. Admission is written there before the
Job is started, so a controller that restarts finds every admission it made and counts its
quota again; nothing is kept only in memory.

Readers take any Workload, a cached one included. Status helpers (`status_of`, `set_condition`,
`mark_*`) change the dict they are given in place: they work on a copy, the mutation of an
optimistic-concurrency write; given a cached object, which is frozen (controllers/runtime/
frozen.py), they raise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from controllers.state.foreigngroups import group_id_of_workload, is_foreign_group
from quota.api.conditions import WorkloadConditions as WC
from quota.api.meta import API_VERSION
from quota.api.names import (
    JOB_NAME_LABEL,
    JOB_UID_LABEL,
    OWNER_GROUP_ANNOTATION,
    WORKLOAD_FINALIZER,
)
from quota.api.quantity import format_quantity, parse_quantity
from quota.lifecycle.eviction import requeue_after_eviction
from quota.lifecycle.slices import pods_after_scale_down
from quota.model.convert import COPIED_ANNOTATIONS, copied_annotations

Obj = dict[str, Any]

# Labels on every Workload Muster creates for a Job: which Job, so a reconciler can find all
# slices of a Job from the cache, and `kubectl get wl -l muster.dev/job-name=x` works.

QUOTA_RESERVED = WC.QUOTA_RESERVED
ADMITTED = WC.ADMITTED
EVICTED = WC.EVICTED
PREEMPTED = WC.PREEMPTED
REQUEUED = WC.REQUEUED
FINISHED = WC.FINISHED

MAX_NAME = 253


def now_utc() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    """metav1.Time on the wire (second precision, Z)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def short_hash(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:5]


def workload_name(job_name: str, job_uid: str, generation: int | None = None) -> str:
    """Deterministic Workload name for a Job: `job-<name>-<hash>`.

    The hash covers the Job's uid, so a Job deleted and created again under the same name
    gets a new Workload; slices of an elastic Job add the Job generation that asked for
    them, so every scale-up has its own name and creating one twice (after a restart, or by
    two reconciles racing) is the same create."""
    digest = short_hash(job_uid) if generation is None else short_hash(job_uid, str(generation))
    room = MAX_NAME - len("job--") - len(digest)
    return f"job-{job_name[:room]}-{digest}"


# --------------------------------------------------------------------- reading


def conditions(wl: Mapping[str, Any]) -> list[Obj]:
    return list(((wl.get("status") or {}).get("conditions")) or [])


def condition(wl: Mapping[str, Any], type_: str) -> Obj | None:
    return next((c for c in conditions(wl) if c.get("type") == type_), None)


def is_true(wl: Mapping[str, Any], type_: str) -> bool:
    found = condition(wl, type_)
    return found is not None and found.get("status") == "True"


def is_finished(wl: Mapping[str, Any]) -> bool:
    return is_true(wl, FINISHED)


def has_quota(wl: Mapping[str, Any]) -> bool:
    """Quota is reserved (and so counted against its queue) until cleared or finished."""
    admission = (wl.get("status") or {}).get("admission")
    return bool(admission) and is_true(wl, QUOTA_RESERVED) and not is_finished(wl)


def is_evicted(wl: Mapping[str, Any]) -> bool:
    return is_true(wl, EVICTED)


def is_deleting(obj: Mapping[str, Any]) -> bool:
    """Deletion was asked for; finalizers may still hold the object."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def holds_finalizer(wl: Mapping[str, Any]) -> bool:
    return WORKLOAD_FINALIZER in ((wl.get("metadata") or {}).get("finalizers") or [])


def is_active(wl: Mapping[str, Any]) -> bool:
    """Not finished: pending or admitted (a Job has at most two active slices)."""
    return not is_finished(wl)


def admitted_count(wl: Mapping[str, Any], pod_set: str = "main") -> int:
    """Pods of `pod_set` the admission grants (0 when the Workload holds no quota)."""
    if not has_quota(wl):
        return 0
    admission = (wl.get("status") or {}).get("admission") or {}
    granted = 0
    for assignment in admission.get("podSetAssignments") or []:
        if assignment.get("name") == pod_set:
            granted = int(assignment.get("count") or 0)
    spec_count = next(
        (
            int(ps.get("count") or 0)
            for ps in (wl.get("spec") or {}).get("podSets") or []
            if ps.get("name") == pod_set
        ),
        0,
    )
    # Scale-down lowers both; until both are written the smaller one holds.
    return pods_after_scale_down(granted, spec_count)


def assigned_flavors(wl: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Pod set -> resource -> flavor, from the admission."""
    admission = (wl.get("status") or {}).get("admission") or {}
    return {
        a["name"]: dict(a.get("flavors") or {}) for a in admission.get("podSetAssignments") or []
    }


def requeue_at(wl: Mapping[str, Any]) -> datetime | None:
    state = (wl.get("status") or {}).get("requeueState") or {}
    return parse_time(state.get("requeueAt"))


def owner_reference(wl: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference of the object a Workload belongs to (Muster writes one), of any
    kind behind the workload seam: no list of kinds is kept here, so a new kind is found
    without one. A foreign PodGroup's is not one of them (`foreigngroups`)."""
    refs: list[Mapping[str, Any]] = (wl.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs:
        if not is_foreign_group(ref):
            return ref
    return None


def owner_job_uid(wl: Mapping[str, Any]) -> str | None:
    """The id its pods are indexed by: the owning Job's uid, a foreign PodGroup's id, or the
    id of the group of pods it was made for (controllers/owners)."""
    group = owner_group_id(wl)
    if group is not None:
        return group
    ref = owner_reference(wl)
    return str(ref["uid"]) if ref is not None else group_id_of_workload(wl)


def owner_group_id(wl: Mapping[str, Any]) -> str | None:
    """The group of pods a Workload was made for by their owner (controllers/owners), if so."""
    annotations = (wl.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(OWNER_GROUP_ANNOTATION)
    return str(value) if value else None


def owner_job_key(wl: Mapping[str, Any]) -> str | None:
    """The owning Job's key ("ns/name"), which outlives the Job in the Workload's metadata."""
    if owner_group_id(wl) is not None:
        return None  # a group's, found by its id (the owner is no Job)
    ref = owner_reference(wl)
    if ref is None:
        return None
    return f"{(wl.get('metadata') or {}).get('namespace')}/{ref.get('name')}"


def replaces(wl: Mapping[str, Any]) -> str | None:
    return (wl.get("spec") or {}).get("replaces")


def nomination(wl: Mapping[str, Any]) -> Obj | None:
    """status.nomination: the room held on nodes for a pending preemptor (None: none)."""
    found: Obj | None = (wl.get("status") or {}).get("nomination")
    return found


# --------------------------------------------------------------------- writing


def status_of(obj: Obj) -> Obj:
    """The object's status dict, created if absent (or null, as a fresh object has it): for
    changing a copy, never for reading (a cached object refuses the creation)."""
    status = obj.get("status")
    if not isinstance(status, dict):
        status = obj["status"] = {}
    return status


def set_condition(
    wl: Obj,
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: datetime,
) -> bool:
    """Set one condition on the Workload dict; True if anything changed. The transition
    time moves only when the status does, so `kubectl describe` shows how long it waited."""
    current = conditions(wl)
    previous = next((c for c in current if c.get("type") == type_), None)
    generation = (wl.get("metadata") or {}).get("generation")
    since = (
        previous["lastTransitionTime"]
        if previous and previous.get("status") == status and previous.get("lastTransitionTime")
        else rfc3339(now)
    )
    updated: Obj = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since,
    }
    if generation is not None:
        updated["observedGeneration"] = generation
    if previous == updated:
        return False
    status_of(wl)["conditions"] = [c for c in current if c.get("type") != type_] + [updated]
    return True


def remove_condition(wl: Obj, type_: str) -> bool:
    current = conditions(wl)
    kept = [c for c in current if c.get("type") != type_]
    if len(kept) == len(current):
        return False
    status_of(wl)["conditions"] = kept
    return True


def admission_status(
    cluster_queue: str,
    assignments: Sequence[tuple[str, int, Mapping[str, str], Mapping[str, str]]],
    nodes: Mapping[str, Sequence[tuple[str, int]]] | None = None,
) -> Obj:
    """The status.admission dict: (pod set, count, resource->flavor, resource->usage), with
    each pod set's planned `nodes` ((node, pods), ...) when placement decided them."""
    out: list[Obj] = []
    for name, count, flavors, usage in assignments:
        entry: Obj = {
            "name": name,
            "count": count,
            "flavors": dict(flavors),
            "resourceUsage": dict(usage),
        }
        planned = (nodes or {}).get(name)
        if planned:
            entry["nodes"] = [{"name": node, "count": n} for node, n in planned]
        out.append(entry)
    return {"clusterQueue": cluster_queue, "podSetAssignments": out}


def mark_admitted(wl: Obj, admission: Obj, message: str, now: datetime) -> bool:
    """Reserve quota and admit. Refuses (False) a finished or already-admitted Workload, so
    a decision taken on a stale view never admits anything twice."""
    if is_finished(wl) or has_quota(wl) or is_deleting(wl):
        return False
    status = status_of(wl)
    status["admission"] = admission
    set_condition(wl, QUOTA_RESERVED, "True", "QuotaReserved", message, now)
    set_condition(wl, ADMITTED, "True", "Admitted", message, now)
    remove_condition(wl, EVICTED)
    remove_condition(wl, PREEMPTED)
    if condition(wl, REQUEUED) is not None:
        set_condition(wl, REQUEUED, "False", "Admitted", "admitted again after requeue", now)
    return True


def mark_pending(
    wl: Obj, reason: str, message: str, now: datetime, settled_at: datetime | None = None
) -> bool:
    """Say why a Workload that holds no quota still waits (and, once its requeue backoff
    was over at `settled_at`, when the reason was decided: `now` by default, that it
    competes for quota again)."""
    if is_finished(wl) or has_quota(wl):
        return False
    changed = set_condition(wl, QUOTA_RESERVED, "False", reason, message, now)
    changed |= set_condition(wl, ADMITTED, "False", reason, message, now)
    changed |= settle_requeue(wl, now if settled_at is None else min(now, settled_at))
    return changed


def mark_evicted(
    wl: Obj, reason: str, message: str, now: datetime, preemptor: str | None = None
) -> bool:
    """Ask for eviction: the Job reconciler suspends the Job, and the quota stays reserved
    until its pods are gone (so a preemptor never lands on GPUs still in use). A preemption
    or reclaim names its `preemptor` ("ns/name") in the Preempted condition, as Kueue's does,
    so that the requeue can say after what eviction the workload waits."""
    if is_finished(wl) or not has_quota(wl) or is_evicted(wl):
        return False
    set_condition(wl, EVICTED, "True", reason, message, now)
    if reason in (WC.EVICTED_BY_PREEMPTION, WC.EVICTED_BY_RECLAIM):
        kind = WC.WITHIN_QUEUE if reason == WC.EVICTED_BY_PREEMPTION else WC.RECLAIM
        by = f"by {_EVICTED_BY[reason]}" + (f" for {preemptor}" if preemptor else "")
        set_condition(wl, PREEMPTED, "True", kind, by, now)
    return True


def shed_pods(wl: Obj, taken: Sequence[tuple[str, int]], names: Sequence[str]) -> bool:
    """Single-pod preemption (spec.disruptionMode Single): the admission keeps its pods but
    `taken` ((pod set, pods), ...), and their quota, and names the pods that go (their
    owner's controller deletes those first). Nothing happens to a Workload that no longer
    holds that many pods (evicted, finished, shrunk since)."""
    if is_finished(wl) or not has_quota(wl) or is_evicted(wl):
        return False
    assignments = {
        str(a.get("name")): a
        for a in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    }
    lost = dict(taken)
    if any(int((assignments.get(ps) or {}).get("count") or 0) <= n for ps, n in lost.items()):
        return False  # never to nothing: that is an eviction, and not what was decided
    for pod_set, n in lost.items():
        a = assignments[pod_set]
        before = int(a.get("count") or 0)
        a["count"] = before - n
        # Usage is per pod times pods: scaled down exactly.
        a["resourceUsage"] = {
            r: format_quantity(parse_quantity(v, r) * (before - n) // before, r)
            for r, v in (a.get("resourceUsage") or {}).items()
        }
    wl["status"]["preemptedPods"] = [name.rpartition("/")[2] for name in names]
    return True


# How a person names what an eviction of each reason was ("after an eviction by reclaim").
_EVICTED_BY = {
    WC.EVICTED_BY_PREEMPTION: "preemption",
    WC.EVICTED_BY_RECLAIM: "reclaim",
    WC.MOVED: "a move to other nodes",
    WC.CLUSTER_QUEUE_STOPPED: "its ClusterQueue's stop policy",
    WC.JOB_RESIZED: "a resize",
}


def clock(text: str | None) -> str:
    """A condition's time as a person reads it in a sentence: HH:MM:SS (UTC)."""
    moment = parse_time(text)
    return moment.astimezone(UTC).strftime("%H:%M:%S") if moment is not None else "?"


def eviction_story(wl: Mapping[str, Any]) -> str:
    """After what eviction a requeued Workload waits: "an eviction by reclaim for ns/x"."""
    preempted = str((condition(wl, PREEMPTED) or {}).get("message") or "")
    by = preempted.split(": ", 1)[-1]  # after the kept reason, once the eviction ended
    if by.startswith("by "):
        return f"an eviction {by}"
    reason = _eviction_reason(condition(wl, EVICTED) or {})
    by = _EVICTED_BY.get(reason, reason)
    return f"an eviction by {by}" if by else "an eviction"


def queued_story(wl: Mapping[str, Any], competing: bool | None = None) -> str | None:
    """ "since 14:05:03, after an eviction by reclaim for ns/x; competes for quota from
    14:05:13" for a Workload queued again after an eviction (its quota released), else None.

    Read off its conditions alone, so the controller's words and `kubectl muster explain`'s
    are one; `competing` says whether its backoff is over (default: Requeued is True)."""
    evicted = condition(wl, EVICTED)
    if has_quota(wl) or is_finished(wl) or evicted is None or evicted.get("status") != "False":
        return None
    state = (wl.get("status") or {}).get("requeueState") or {}
    if competing is None:
        competing = is_true(wl, REQUEUED)
    competes = "since" if competing else "from"
    return (
        f"since {clock(evicted.get('lastTransitionTime'))}, after {eviction_story(wl)}; "
        f"competes for quota {competes} {clock(state.get('requeueAt'))}"
    )


def release_quota(wl: Obj, now: datetime) -> bool:
    """After an eviction is complete (the Job's pods are gone): give the quota back and
    queue again after a growing backoff (quota.lifecycle, which the simulator follows too).

    The eviction is over, so Evicted (and Preempted) turn False with reason QuotaReleased,
    their messages kept, and QuotaReserved says the workload is queued, since when, after
    what and from when it competes (`queued_story`), not that it is being evicted. Requeued
    stays False until the backoff ends (`settle_requeue`), or turns True at once when there
    is none (a move)."""
    if is_finished(wl) or not has_quota(wl):
        return False
    evicted = condition(wl, EVICTED) or {}
    status = status_of(wl)
    status.pop("admission", None)
    state = dict(status.get("requeueState") or {})
    requeue = requeue_after_eviction(
        int(state.get("count") or 0),
        reason=str(evicted.get("reason") or ""),
    )
    state["count"] = requeue.count
    state["requeueAt"] = rfc3339(requeue.competes_at(now))
    status["requeueState"] = state
    _end_eviction(wl, now)
    competing = requeue.delay_s <= 0
    # Why it waits, until a cycle says more: the admission loop keeps these words while the
    # backoff lasts (controllers/admission/view.py), then writes the engine's reason.
    queued = f"queued {queued_story(wl, competing)}"
    for type_ in (QUOTA_RESERVED, ADMITTED):
        set_condition(wl, type_, "False", requeue.pending_reason, queued, now)
    requeued = "True" if competing else "False"
    set_condition(wl, REQUEUED, requeued, requeue.requeued_reason, requeue.requeued_message, now)
    return True


def _end_eviction(wl: Obj, now: datetime) -> bool:
    """Evicted and Preempted False (QuotaReleased), their reason kept at the head of the
    message ("Reclaimed: ..."), as Kueue keeps it after "Previously: "."""
    changed = False
    for type_ in (EVICTED, PREEMPTED):
        found = condition(wl, type_)
        if found is not None and found.get("status") == "True":
            was = f"{found.get('reason')}: {found.get('message') or ''}"
            set_condition(wl, type_, "False", WC.QUOTA_RELEASED, was, now)
            changed = True
    return changed


def _eviction_reason(evicted: Mapping[str, Any]) -> str:
    """The reason the eviction had, also once it ended (`_end_eviction`)."""
    reason = str(evicted.get("reason") or "")
    if reason != WC.QUOTA_RELEASED:
        return reason
    return str(evicted.get("message") or "").split(":", 1)[0]


def requeue_unsettled(wl: Mapping[str, Any], now: datetime) -> bool:
    """A Workload queued again whose conditions are behind: its backoff has ended and
    Requeued still says False, or it still shows Evicted True with its quota released (as
    controllers before issue 25 left it). The admission loop's next pending write settles
    it (`settle_requeue`)."""
    if not (wl.get("status") or {}).get("requeueState"):
        return False  # never requeued (most Workloads, every cycle: the cheap test first)
    if has_quota(wl) or is_finished(wl) or condition(wl, EVICTED) is None:
        return False  # holds quota, or was never evicted: no requeue to settle
    if is_evicted(wl):
        return True
    requeued = condition(wl, REQUEUED) or {}
    if requeued.get("status") != "False" or requeued.get("reason") == "Admitted":
        return False
    when = requeue_at(wl)
    return when is None or when <= now


def settle_requeue(wl: Obj, now: datetime) -> bool:
    """Bring a requeued Workload's conditions up to date (`requeue_unsettled`): the eviction
    ended, and Requeued True (BackoffFinished) once the backoff is over, as Kueue sets it:
    it competes for quota again."""
    if not requeue_unsettled(wl, now):
        return False
    changed = _end_eviction(wl, now)
    when = requeue_at(wl)
    if when is not None and when > now:
        return changed
    message = f"the backoff is over: competes for quota since {clock(rfc3339(when or now))}"
    set_condition(wl, REQUEUED, "True", WC.BACKOFF_FINISHED, message, now)
    return True


def set_finalizer(wl: Obj, present: bool) -> bool:
    """Add or remove the resource-in-use finalizer; False if it already is as asked."""
    meta = wl.setdefault("metadata", {})
    current = list(meta.get("finalizers") or [])
    if (WORKLOAD_FINALIZER in current) == present:
        return False
    if present:
        meta["finalizers"] = [*current, WORKLOAD_FINALIZER]
    else:
        meta["finalizers"] = [f for f in current if f != WORKLOAD_FINALIZER]
    return True


def mark_finished(wl: Obj, reason: str, message: str, now: datetime) -> bool:
    """Finished releases the quota at once: the snapshot never counts a finished Workload."""
    if is_finished(wl):
        return False
    set_condition(wl, FINISHED, "True", reason, message, now)
    return True


# The owner's annotations its Workload carries too, kept equal while it lives: what the
# admission cycle reads off the Workload but only the owner's workload can say.


def owner_annotations(owner: Mapping[str, Any]) -> dict[str, str]:
    """The owner's annotations its Workload carries too (convert.copied_annotations)."""
    return copied_annotations((owner.get("metadata") or {}).get("annotations") or {})


def follow_owner_annotations(wl: Obj, owner: Mapping[str, Any]) -> bool:
    """Make `wl`'s copied annotations the owner's (a mutation: whether it changed)."""
    wanted = owner_annotations(owner)
    annotations = wl.setdefault("metadata", {}).setdefault("annotations", {})
    changed = False
    for key in COPIED_ANNOTATIONS:
        if annotations.get(key) != wanted.get(key):
            changed = True
            if key in wanted:
                annotations[key] = wanted[key]
            else:
                annotations.pop(key, None)
    return changed


def new_workload(
    name: str,
    namespace: str,
    job: Mapping[str, Any],
    spec: Obj,
    owner_kind: tuple[str, str] = ("batch/v1", "Job"),
) -> Obj:
    """A Workload owned by its Job (or another object of `owner_kind`, (apiVersion, kind)):
    deleting the owner deletes it, and its finalizer keeps it, and its quota, until its pods
    are gone."""
    meta = job["metadata"]
    copied = owner_annotations(job)
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "finalizers": [WORKLOAD_FINALIZER],
            "labels": {JOB_UID_LABEL: meta["uid"], JOB_NAME_LABEL: meta["name"][:63]},
            **({"annotations": copied} if copied else {}),
            "ownerReferences": [
                {
                    "apiVersion": owner_kind[0],
                    "kind": owner_kind[1],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }
