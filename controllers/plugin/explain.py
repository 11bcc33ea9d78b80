"""`kubectl muster explain JOB|WORKLOAD|KIND/NAME`: why a Job (or a LeaderWorkerSet, a
Deployment, a StatefulSet queued by their pods: `lws/NAME`, `deploy/NAME`, `sts/NAME`)
waits (or what happened to it): the engine's reason from the Workload's conditions, the
placement reason from its PodGroup, and a timeline from the Events on the Job (or the
owner), its Workloads and its PodGroups, plus the history store's record of it when the
store is reachable."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from controllers.history.queries import TimelineEntry
from controllers.plugin.kube import Forbidden, get_one, list_all
from controllers.runtime.resources import EVENT, JOB, POD_GROUP, WORKLOAD, Kube, Obj
from controllers.state import workloads as wls
from quota.api.names import JOB_UID_LABEL, QUEUE_LABEL
from quota.model.queues import admitted_to

INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"
# (namespace, workload) -> the history store's timeline of it, or why there is none.
HistoryReader = Callable[[str, str], list[TimelineEntry] | str]


def _cond(obj: Mapping[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def _sentence(cond: Mapping[str, Any]) -> str:
    reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "")
    return f"{reason}: {message}" if reason and message else reason or message


def state_of(wl: Mapping[str, Any]) -> tuple[str, str]:
    """(state, the engine's reason for it), as a user asks "why does it wait".

    An evicted Workload is "being stopped" only while it still holds its quota; once its
    pods are gone and the quota released it is queued again, and says since when, after
    what eviction and from when it competes for quota (`workloads.queued_story`)."""
    if wls.is_finished(wl):
        return "finished", _sentence(_cond(wl, wls.FINISHED))
    if wls.has_quota(wl):
        if wls.is_evicted(wl):
            return "evicted (its pods are being stopped)", _sentence(_cond(wl, wls.EVICTED))
        return "admitted", _sentence(_cond(wl, wls.ADMITTED) or _cond(wl, wls.QUOTA_RESERVED))
    waiting = _cond(wl, wls.QUOTA_RESERVED)
    story = wls.queued_story(wl)
    if story is not None:
        return f"queued ({story})", _sentence(waiting)
    if waiting:
        return "waiting for quota", _sentence(waiting)
    return "waiting", "not looked at by an admission cycle yet (is the controller running?)"


def placement_of(pod_group: Mapping[str, Any] | None, wl: Mapping[str, Any]) -> str:
    """Where the pods stand: the scheduler loop's reason, or what is planned."""
    if pod_group is not None:
        cond = _cond(pod_group, INITIALLY_SCHEDULED)
        if cond:
            return _sentence(cond)
    planned = [
        f"{n['count']} on {n['name']}"
        for a in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
        for n in a.get("nodes") or []
    ]
    if planned:
        return "planned: " + ", ".join(planned)
    return "not placed yet" if wls.has_quota(wl) else "placed once admitted"


def explain(
    kube: Kube,
    namespace: str,
    name: str,
    console: Console,
    history: HistoryReader | None = None,
) -> bool:
    """Print the explanation; False if there is no Job or Workload of that name."""
    if "/" in name:
        return _explain_owner(kube, namespace, name, console, history)
    job = get_one(kube, JOB, namespace, name)
    if job is not None:
        uid = job["metadata"]["uid"]
        workloads = list_all(kube, WORKLOAD, namespace, label_selector=f"{JOB_UID_LABEL}={uid}")
    else:
        wl = get_one(kube, WORKLOAD, namespace, name)
        if wl is None:
            return False
        workloads = [wl]
    workloads.sort(key=lambda w: str(w["metadata"].get("creationTimestamp")))
    if job is not None:
        labels = job["metadata"].get("labels") or {}
        spec = job.get("spec") or {}
        head = Text(f"Job {namespace}/{name}", style="bold")
        head.append(f"  queue {labels.get(QUEUE_LABEL, '(none: not managed by Muster)')}")
        head.append(f"  parallelism {spec.get('parallelism', 1)}")
        head.append("  suspended" if spec.get("suspend") else "  running", "yellow")
        console.print(head)
        if not workloads:
            console.print(
                "  no Workload yet: "
                + (
                    "the controller creates one for a queued Job within seconds"
                    if QUEUE_LABEL in labels
                    else f"the Job has no {QUEUE_LABEL} label"
                )
            )
    owner_uids = {job["metadata"]["uid"]} if job is not None else set()
    _workloads(kube, namespace, owner_uids, workloads, console, history)
    return True


# KIND/NAME as kubectl spells the kinds queued by their pods -> the kind in a group's id.
OWNER_ALIASES = {
    **dict.fromkeys(("lws", "leaderworkerset", "leaderworkersets"), "LeaderWorkerSet"),
    **dict.fromkeys(("deploy", "deployment", "deployments"), "Deployment"),
    **dict.fromkeys(("sts", "statefulset", "statefulsets"), "StatefulSet"),
}


def _explain_owner(
    kube: Kube, namespace: str, name: str, console: Console, history: HistoryReader | None
) -> bool:
    """The Workloads of an object queued by its pods (one per LeaderWorkerSet group)."""
    alias, _, owner = name.partition("/")
    kind = OWNER_ALIASES.get(alias.lower())
    if kind is None:
        known = ", ".join(sorted({a for a in OWNER_ALIASES if len(a) <= 6}))
        console.print(f"unknown kind {alias!r}: name a Job or Workload, or one of {known}/NAME")
        return False
    stem = f"/{kind}:{namespace}/{owner}"
    workloads = [
        w
        for w in list_all(kube, WORKLOAD, namespace)
        if (wls.owner_group_id(w) or "").partition("#")[0].endswith(stem)
    ]
    if not workloads:
        return False
    workloads.sort(key=lambda w: str(w["metadata"].get("creationTimestamp")))
    groups = {wls.owner_group_id(w) for w in workloads}
    head = Text(f"{kind} {namespace}/{owner}", style="bold")
    head.append(f"  {len(groups)} group(s) queued by their pods, {len(workloads)} Workload(s)")
    console.print(head)
    # Its own Events (refusals, why its pods wait) by the uid its Workloads' owner refs carry
    # (two once the object was deleted and made again under its name).
    owner_uids = {
        str(r["uid"])
        for w in workloads
        for r in w["metadata"].get("ownerReferences") or []
        if r.get("uid")
    }
    _workloads(kube, namespace, owner_uids, workloads, console, history)
    return True


def _workloads(
    kube: Kube,
    namespace: str,
    owner_uids: set[str],
    workloads: list[Obj],
    console: Console,
    history: HistoryReader | None,
) -> None:
    """Each Workload's state, reason and placement, then the timeline (the Events on the
    Workloads, their PodGroups and the objects of `owner_uids`: the Job, or the owner queued
    by its pods) and the history."""
    pod_groups: list[Obj] = []
    for wl in workloads:
        wl_name = wl["metadata"]["name"]
        state, reason = state_of(wl)
        admitted_in = admitted_to(wl)
        line = Text(f"Workload {wl_name}", style="bold")
        line.append(f"  {state}", "green" if state == "admitted" else "magenta")
        if admitted_in is not None:
            line.append(f"  in {admitted_in}")
        console.print(line)
        console.print(Text("  why: ", style="dim") + Text(reason or "-"))
        if not wls.is_finished(wl):
            try:
                pod_group = get_one(kube, POD_GROUP, namespace, wl_name)
            except Forbidden:
                # The reason above is the answer; where the pods stand is a detail.
                console.print(Text("  placement: ", style="dim") + Text(_not_shown("PodGroups")))
                continue
            if pod_group is not None:
                pod_groups.append(pod_group)
            console.print(Text("  placement: ", style="dim") + Text(placement_of(pod_group, wl)))
    uids = owner_uids | {o["metadata"]["uid"] for o in [*workloads, *pod_groups]}
    _timeline(kube, namespace, uids, console)
    if history is not None:
        for wl in workloads:
            _history(history, namespace, wl["metadata"]["name"], console)


def _timeline(kube: Kube, namespace: str, uids: set[str], console: Console) -> None:
    """The Events on the objects of `uids`, oldest first."""
    try:
        every = list_all(kube, EVENT, namespace)
    except Forbidden:
        console.print(f"timeline: {_not_shown('Events')}")
        return
    events = [e for e in every if (e.get("involvedObject") or {}).get("uid") in uids]
    table = Table(title="timeline (Events)", title_justify="left", show_edge=False)
    for col in ("time (UTC)", "object", "reason", "message"):
        table.add_column(col)

    def at(e: Obj) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")

    for e in sorted(events, key=at):
        involved = e.get("involvedObject") or {}
        table.add_row(
            at(e).replace("T", " ").rstrip("Z")[:19],
            f"{involved.get('kind')}/{involved.get('name')}",
            str(e.get("reason") or ""),
            str(e.get("message") or ""),
        )
    if events:
        console.print(table)
    else:
        console.print("timeline: no Events (they expire after an hour by default)")


def _history(history: HistoryReader, namespace: str, name: str, console: Console) -> None:
    entries = history(namespace, name)
    if isinstance(entries, str):
        console.print(Text(f"history of {name}: {entries}", style="dim"))
        return
    table = Table(title=f"history of {name}", title_justify="left", show_edge=False)
    for col in ("time (UTC)", "event", "queue", "reason"):
        table.add_column(col)
    for e in entries:
        table.add_row(str(e.at)[:19], e.event, e.cluster_queue, e.reason)
    console.print(table)


def _not_shown(what: str) -> str:
    """What a user without the chart's batch-user role (or view) in the namespace is told
    instead of a part of the answer."""
    return (
        f"not shown: {what} are not readable with your rights (the chart's batch-user role "
        "or the built-in view role grants it)"
    )
