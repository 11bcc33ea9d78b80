"""`kubectl muster what-if --set QUEUE.quota.RESOURCE=AMOUNT ...`: export the live cluster
(flavors, queues, priority classes, nodes, unfinished queued Jobs) into a `muster simulate`
scenario, simulate it as it is and with the proposed change, and print how waits change.

What the export assumes, since a live cluster does not say: every unfinished Job runs for
its `muster.dev/run-for` annotation if it has one, else `--run-for` (a running Job for what
is left of that since it started); Jobs running now are submitted at 0s and waiting ones
at 1s, in creation order, so what runs now is admitted first again.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click

from controllers.plugin.kube import list_all
from controllers.runtime.resources import (
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    NODE,
    PRIORITY_CLASS,
    RESOURCE_FLAVOR,
    Kube,
    Obj,
)
from quota.api import ManifestError, parse_manifest
from quota.api.clusterqueue import ClusterQueue
from quota.api.localqueue import LocalQueue
from quota.api.meta import parse_duration
from quota.api.names import QUEUE_LABEL
from quota.api.queuetree import check_queue_tree
from quota.api.resourceflavor import ResourceFlavor
from quota.simulation.results import SimResult
from quota.simulation.scenario import (
    RUN_FOR_ANNOTATION,
    SCENARIO_API,
    SUBMIT_AT_ANNOTATION,
    parse_scenario,
)
from quota.simulation.simulator import simulate

# User priority classes only: the apiserver's system classes sit above what a Job may use.
_MAX_USER_PRIORITY = 1_000_000_000
_CHANGE = re.compile(
    r"^(?P<queue>[^.=]+)(\.(?P<flavor>[^.=]+))?\.(?P<field>quota|limit)\.(?P<resource>[^=]+)=(?P<amount>.+)$"
)


def _finished(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _job_doc(job: Obj, run_for: float, now: datetime) -> Obj:
    meta = job["metadata"]
    annotations = dict(meta.get("annotations") or {})
    running = not (job.get("spec") or {}).get("suspend")
    runtime = run_for
    if RUN_FOR_ANNOTATION in annotations:
        try:
            runtime = parse_duration(annotations[RUN_FOR_ANNOTATION]).total_seconds()
        except ValueError as error:
            raise click.ClickException(
                f"Job {meta['namespace']}/{meta['name']}: annotation {RUN_FOR_ANNOTATION}: {error}"
            ) from None
    started = (job.get("status") or {}).get("startTime")
    if running and started:
        elapsed = (now - datetime.fromisoformat(started.replace("Z", "+00:00"))).total_seconds()
        runtime = max(60.0, runtime - elapsed)
    annotations[RUN_FOR_ANNOTATION] = f"{int(runtime)}s"
    annotations[SUBMIT_AT_ANNOTATION] = "0s" if running else "1s"
    template = (job.get("spec") or {}).get("template") or {}
    pod_spec = template.get("spec") or {}
    spec = {
        key: (job.get("spec") or {})[key]
        for key in ("parallelism", "completions")
        if key in (job.get("spec") or {})
    }
    spec["template"] = {
        "spec": {
            key: pod_spec[key]
            for key in ("containers", "nodeSelector", "tolerations", "priorityClassName")
            if key in pod_spec
        }
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {QUEUE_LABEL: meta["labels"][QUEUE_LABEL]},
            "annotations": annotations,
        },
        "spec": spec,
    }


def export_scenario(
    kube: Kube, run_for: float, now: datetime | None = None, skipped: list[str] | None = None
) -> list[Obj]:
    """The live cluster as scenario documents. Objects the model refuses, and what depends
    on them, are left out (each said in `skipped`): one bad ClusterQueue must not stop a
    what-if of the rest, as it does not stop the controller."""
    now = now or datetime.now(UTC)
    docs: list[Obj] = [
        {
            "apiVersion": SCENARIO_API,
            "kind": "Simulation",
            "metadata": {"name": "live"},
            "spec": {"start": now.isoformat()},
        }
    ]

    def plain(obj: Obj, kind: str, namespaced: bool = False) -> Obj:
        meta = {"name": obj["metadata"]["name"]}
        if namespaced:
            meta["namespace"] = obj["metadata"]["namespace"]
        return {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": kind,
            "metadata": meta,
            "spec": copy.deepcopy(obj.get("spec") or {}),
        }

    docs += [plain(o, "ResourceFlavor") for o in list_all(kube, RESOURCE_FLAVOR)]
    docs += [plain(o, "ClusterQueue") for o in list_all(kube, CLUSTER_QUEUE)]
    docs += [plain(o, "LocalQueue", namespaced=True) for o in list_all(kube, LOCAL_QUEUE)]
    for pc in list_all(kube, PRIORITY_CLASS):
        if int(pc.get("value") or 0) <= _MAX_USER_PRIORITY:
            docs.append(
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": pc["metadata"]["name"]},
                    "value": pc.get("value") or 0,
                }
            )
    for node in list_all(kube, NODE):
        status = node.get("status") or {}
        ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node["metadata"]["name"],
                    "labels": dict(node["metadata"].get("labels") or {}),
                },
                "spec": {"taints": list((node.get("spec") or {}).get("taints") or [])},
                "status": {
                    "allocatable": dict(status.get("allocatable") or {}),
                    "conditions": [{"type": "Ready", "status": c.get("status")} for c in ready],
                },
            }
        )
    jobs = [j for j in list_all(kube, JOB, label_selector=QUEUE_LABEL) if not _finished(j)]
    jobs.sort(key=lambda j: str(j["metadata"].get("creationTimestamp")))
    docs += [_job_doc(j, run_for, now) for j in jobs]
    return _leave_out_invalid(docs, skipped if skipped is not None else [])


def _leave_out_invalid(docs: list[Obj], skipped: list[str]) -> list[Obj]:
    """`docs` without the queue objects the model refuses and what depends on them: child
    queues, queues over a refused flavor, LocalQueues of a refused queue, and their Jobs."""
    bad: set[tuple[str, str]] = set()  # (kind, name or namespace/name)

    def ident(doc: Obj) -> tuple[str, str]:
        meta = doc.get("metadata") or {}
        name = str(meta.get("name") or "")
        if meta.get("namespace"):
            name = f"{meta['namespace']}/{name}"
        return str(doc.get("kind")), name

    for index, doc in enumerate(docs):
        if doc.get("kind") in ("ResourceFlavor", "ClusterQueue", "LocalQueue"):
            try:
                parse_manifest(doc, index)
            except ManifestError as error:
                bad.add(ident(doc))
                problems = "; ".join(f"{path}: {rule}" for path, rule in error.problems)
                skipped.append(f"{error.subject}: {problems}")
    # A flavor no node carries has no capacity: the controller tells its workloads so, a
    # scenario refuses it as a likely typo. Left out, and taken off the queues' lists.
    labels_of_nodes = [
        (d.get("metadata") or {}).get("labels") or {} for d in docs if d.get("kind") == "Node"
    ]
    homeless: set[str] = set()
    for doc in docs:
        wanted = (doc.get("spec") or {}).get("nodeLabels") or {}
        if doc.get("kind") != "ResourceFlavor" or not wanted or not labels_of_nodes:
            continue
        if not any(all(n.get(k) == v for k, v in wanted.items()) for n in labels_of_nodes):
            kind, name = ident(doc)
            if (kind, name) not in bad:
                bad.add((kind, name))
                homeless.add(name)
                skipped.append(f"{kind} {name}: no node carries its labels (no capacity)")
    for doc in docs:
        if doc.get("kind") == "ClusterQueue" and homeless:
            spec = doc.get("spec") or {}
            spec["flavors"] = [
                f for f in spec.get("flavors") or [] if f.get("name") not in homeless
            ]
    # What the controller holds inactive the scenario file refuses: queues the tree check
    # finds broken (a missing parent or flavor, a cycle), LocalQueues of missing or non-leaf
    # queues, and Jobs of LocalQueues left out. Left out too, until nothing else falls.
    broken = {"Cycle", "ParentNotFound", "FlavorNotFound"}
    changed = True
    while changed:
        changed = False
        kept = [(d, ident(d)) for d in docs if ident(d) not in bad]
        models = {
            key: parse_manifest(d, 0)
            for d, key in kept
            if key[0] in ("ResourceFlavor", "ClusterQueue", "LocalQueue")
        }
        tree = check_queue_tree(
            [m for m in models.values() if isinstance(m, ClusterQueue)],
            [m for m in models.values() if isinstance(m, ResourceFlavor)],
            [m for m in models.values() if isinstance(m, LocalQueue)],
        )
        lq_names = {k for k in models if k[0] == "LocalQueue"}
        for doc, (kind, name) in kept:
            why = ""
            if kind == "ClusterQueue":
                state = tree.cluster_queues[name]
                if not state.active and state.reason in broken:
                    why = state.message
            elif kind == "LocalQueue":
                namespace, _, lq = name.partition("/")
                state = tree.local_queues.get((namespace, lq))
                target = str((doc.get("spec") or {}).get("clusterQueue"))
                if target not in tree.cluster_queues:
                    why = f"its ClusterQueue {target} does not exist or was left out"
                elif state is not None and state.reason == "ClusterQueueNotLeaf":
                    why = state.message
            elif kind == "Job":
                namespace = name.split("/", 1)[0]
                queue = ((doc.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
                if ("LocalQueue", f"{namespace}/{queue}") not in lq_names:
                    why = f"its LocalQueue {queue} does not exist or was left out"
            if why:
                bad.add((kind, name))
                skipped.append(f"{kind} {name}: {why}")
                changed = True
    return [doc for doc in docs if ident(doc) not in bad]


def apply_change(docs: list[Obj], change: str) -> None:
    """Apply one `QUEUE[.FLAVOR].quota|limit.RESOURCE=AMOUNT` to the exported documents."""
    match = _CHANGE.match(change)
    if not match:
        raise click.BadParameter(
            f"{change!r}: expected QUEUE[.FLAVOR].quota.RESOURCE=AMOUNT or "
            "QUEUE[.FLAVOR].limit.RESOURCE=AMOUNT (e.g. team-a.quota.nvidia.com/gpu=16)",
            param_hint="--set",
        )
    queue, flavor, field, resource, amount = match.group(
        "queue", "flavor", "field", "resource", "amount"
    )
    cq = next(
        (d for d in docs if d["kind"] == "ClusterQueue" and d["metadata"]["name"] == queue), None
    )
    if cq is None:
        raise click.BadParameter(f"{change!r}: no ClusterQueue {queue!r}", param_hint="--set")
    entries = cq["spec"].setdefault("flavors", [])
    if flavor:
        chosen = [e for e in entries if e.get("name") == flavor]
        if not chosen:
            raise click.BadParameter(
                f"{change!r}: ClusterQueue {queue} has no flavor {flavor!r} "
                f"(it has {', '.join(e.get('name', '?') for e in entries) or 'none'})",
                param_hint="--set",
            )
    else:
        chosen = [e for e in entries if resource in (e.get("quota") or {})] or entries
        if len(chosen) != 1:
            raise click.BadParameter(
                f"{change!r}: ClusterQueue {queue} has {len(chosen)} flavors that could be "
                f"meant; name one: {queue}.FLAVOR.{field}.{resource}=...",
                param_hint="--set",
            )
    chosen[0].setdefault(field, {})[resource] = amount


@dataclass(frozen=True)
class Comparison:
    queue: str
    jobs: int
    before_mean: float
    after_mean: float
    before_max: float
    after_max: float


def run(docs: Sequence[Obj], name: str) -> SimResult:
    try:
        scenario = parse_scenario(list(docs), name)
    except ManifestError as error:
        raise click.ClickException(f"{name}: {error}") from None
    return simulate(scenario, record=False)


def compare(before: SimResult, after: SimResult) -> list[Comparison]:
    waits_after = {j.key: j.waited for j in after.jobs}
    by_queue: dict[str, list[tuple[float, float]]] = {}
    for job in before.jobs:
        pair = (job.waited, waits_after.get(job.key, job.waited))
        by_queue.setdefault(job.cluster_queue, []).append(pair)
    out = []
    for queue, pairs in sorted(by_queue.items()):
        b = [p[0] for p in pairs]
        a = [p[1] for p in pairs]
        out.append(Comparison(queue, len(pairs), sum(b) / len(b), sum(a) / len(a), max(b), max(a)))
    return out


def changed_jobs(before: SimResult, after: SimResult) -> list[tuple[str, float, float]]:
    waits_after = {j.key: j.waited for j in after.jobs}
    return [
        (j.key, j.waited, waits_after[j.key])
        for j in before.jobs
        if j.key in waits_after and abs(waits_after[j.key] - j.waited) >= 1
    ]
