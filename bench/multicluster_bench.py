"""Many clusters (issue 29): Muster's dispatch against Kueue's MultiKueue, side by side on the
same three fresh local clusters, one system after the other in one invocation.

For each system, three local clusters (each a real etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok) are started afresh and deleted whole at the
end:

- the manager, with no nodes, where the Jobs are created, with a quota covering the fleet;
- worker A: `--nodes` kwok nodes of 8 GPUs, all free;
- worker B: as many nodes, of which `--taken` carry someone else's pod of 4 GPUs (bound by
  name, never finishing): an 8-GPU pod fits only B's other nodes, so where a Job is sent
  matters.

Each worker's own queue has the quota of its nodes (8 GPUs a node), as an admin who counts
nodes sets it. Then `--jobs` Jobs are created in the manager in a burst (4 kubectl
processes): half 1 pod x 1 GPU, a quarter 1 pod x 8 GPUs, a quarter gangs of 2-4 pods x 8
GPUs (parallelism = completions), each pod running a few seconds (kwok's
`pod-complete.stage.kwok.x-k8s.io/delay`).

- Muster: `muster controller` in all three clusters; WorkerCluster objects with kubeconfig
  Secrets in `muster-system`; the manager's ClusterQueue with `spec.dispatch`; Jobs with
  `spec.managedBy: muster.dev/multicluster`.
- MultiKueue: Kueue v0.19.2 (built from the Go module proxy, as bench/kueue_bench.py runs it)
  in all three clusters; in the manager MultiKueueCluster objects (kubeconfig Secrets in
  `kueue-system`, everything inline as Kueue requires), a MultiKueueConfig, an
  AdmissionCheck of controller `kueue.x-k8s.io/multikueue` on its ClusterQueue; Jobs with
  `spec.managedBy: kueue.x-k8s.io/multikueue`; ClusterQueues and LocalQueues in the workers.
  Kueue's default dispatcher (all at once: a Workload copy in every worker, the first that
  admits keeps it).

Figures per system: time from the first create to every Job running (all its pods Ready, as
the manager's Job status says) and to every Job complete; p50/p95 of each Job's create ->
running; API writes per cluster (apiserver_request_total, write verbs, between the first
create and the end); how many Jobs ran in a worker where they then waited (a copy whose
pods were Pending there, unschedulable, gated or unbound, or that stayed suspended, for more
than `--wait-threshold` seconds after the copy was created); and how many Jobs ever had
copies (Jobs, or Workloads) in two workers at once.

    python bench/multicluster_bench.py [--jobs 500] [--systems muster,multikueue]
        [--nodes 20] [--taken 10] [--json PATH]

Prints figures; never fails on time.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench.harness import metrics, objects
from bench.harness.cluster import Cluster
from bench.harness.controller import controller_argv
from bench.harness.create import create_all
from bench.harness.process import Process
from bench.harness.waits import http_ok, wait_for, wait_until
from controllers.localcluster.binaries import ensure_binaries
from controllers.localcluster.cluster import LocalCluster, free_port
from controllers.localcluster.nodes import create_nodes
from controllers.multicluster import copies
from controllers.runtime.client import api_client
from controllers.runtime.informer import Informer
from controllers.runtime.resources import JOB, POD, WORKLOAD, Kind, Kube

REPO = Path(__file__).resolve().parents[1]
GPU = "nvidia.com/gpu"
NAMESPACE = "mk"
QUEUE = "lq"  # the LocalQueue's name, the same in all three clusters
POOL_LABEL = "mk-bench/pool"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
KUEUE_WORKLOAD = Kind(
    "Workload", True, group="kueue.x-k8s.io", version="v1beta2", plural="workloads"
)
MUSTER_MANAGED_BY = "muster.dev/multicluster"
KUEUE_MANAGED_BY = "kueue.x-k8s.io/multikueue"
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"}
KWOK_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"

# --------------------------------------------------------------------------- pure helpers


@dataclass(frozen=True)
class Shape:
    """One Job: `pods` pods (parallelism = completions) of `gpus` GPUs each, running `runs`
    seconds."""

    pods: int
    gpus: int
    runs: int

    @property
    def kind(self) -> str:
        if self.pods > 1:
            return "gang"
        return f"1x{self.gpus}"


def job_mix(n: int) -> list[Shape]:
    """`n` Jobs in a fixed interleaved order: of every 8, four of 1 pod x 1 GPU (4 s), two of
    1 pod x 8 GPUs (6 s) and two gangs x 8 GPUs (8 s) of 2, 3 or 4 pods in turn."""
    pattern = ("1", "8", "1", "g", "1", "8", "1", "g")
    out: list[Shape] = []
    gangs = 0
    for i in range(n):
        kind = pattern[i % len(pattern)]
        if kind == "1":
            out.append(Shape(1, 1, 4))
        elif kind == "8":
            out.append(Shape(1, 8, 6))
        else:
            out.append(Shape(2 + gangs % 3, 8, 8))
            gangs += 1
    return out


def job_manifest(name: str, shape: Shape, queue_label: str, managed_by: str) -> dict[str, Any]:
    """A batch/v1 Job of `shape` for a dispatching queue (`managed_by`), labelled for it."""
    container = {
        "name": "main",
        "image": "busybox",
        "resources": {
            "requests": {"cpu": "1", GPU: str(shape.gpus)},
            "limits": {GPU: str(shape.gpus)},
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {queue_label: QUEUE}},
        "spec": {
            "parallelism": shape.pods,
            "completions": shape.pods,
            "managedBy": managed_by,
            "template": {
                "metadata": {"annotations": {KWOK_DELAY: f"{shape.runs}s"}},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }


def inline_kubeconfig(config: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """`config` with every file it names (certificate-authority, client-certificate,
    client-key; relative to `base`) carried inline as *-data, as MultiKueue requires."""
    out: dict[str, Any] = json.loads(json.dumps(config))
    for section, key in (("clusters", "cluster"), ("users", "user")):
        for entry in out.get(section) or []:
            body = entry.get(key) or {}
            for field_ in ("certificate-authority", "client-certificate", "client-key"):
                path = body.pop(field_, None)
                if path:
                    data = (
                        (base / path).read_bytes()
                        if not Path(path).is_absolute()
                        else (Path(path).read_bytes())
                    )
                    body[f"{field_}-data"] = base64.b64encode(data).decode()
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def request_writes(
    before: metrics.Scrape, after: metrics.Scrape, refused: bool = False
) -> dict[str, int]:
    """Write requests the apiserver served between two scrapes of apiserver_request_total,
    by "VERB resource[/subresource]" (the same request under two label sets counted once
    each, as the apiserver counts it); with `refused`, only those answered 4xx or 5xx."""
    out: Counter[str] = Counter()
    for (name, labels), value in after.items():
        if name != "apiserver_request_total":
            continue
        tags = dict(labels)
        if tags.get("verb") not in WRITE_VERBS:
            continue
        if refused and not tags.get("code", "").startswith(("4", "5")):
            continue
        delta = value - before.get((name, labels), 0.0)
        if delta <= 0:
            continue
        what = tags.get("resource", "?")
        if tags.get("subresource"):
            what += "/" + tags["subresource"]
        out[f"{tags['verb']} {what}"] += round(delta)
    return dict(out.most_common())


BACKGROUND = ("leases", "nodes/status", "events")


def split_writes(writes: Mapping[str, int]) -> tuple[int, int]:
    """(all writes, writes other than node heartbeats, Leases and Events)."""
    total = sum(writes.values())
    background = sum(n for k, n in writes.items() if k.split(" ", 1)[1] in BACKGROUND)
    return total, total - background


@dataclass
class PodTrace:
    first: float
    bound: float | None = None
    running: float | None = None  # Running (or already Succeeded) first seen
    gone: float | None = None
    unschedulable: bool = False
    gated: bool = False


@dataclass
class CopyTrace:
    """One Job's copy in one worker, as watched there."""

    created: float
    deleted: float | None = None
    unsuspended: float | None = None
    complete: float | None = None
    pods: dict[str, PodTrace] = field(default_factory=dict)

    def waits(self, threshold: float, end: float) -> list[str]:
        """Why this copy waited longer than `threshold` seconds in its worker (empty: it did
        not): it stayed suspended, or a pod stayed unbound (marked unschedulable, gated, or
        neither)."""
        why: list[str] = []
        until = self.deleted if self.deleted is not None else end
        started = self.unsuspended if self.unsuspended is not None else until
        if started - self.created > threshold:
            why.append("suspended")
        for pod in self.pods.values():
            stop = pod.bound or pod.gone or until
            if stop - pod.first > threshold:
                if pod.unschedulable:
                    why.append("unschedulable")
                elif pod.gated:
                    why.append("gated")
                else:
                    why.append("unbound")
        return sorted(set(why))


def overlapping(spans: Mapping[str, Sequence[tuple[float, float | None]]]) -> bool:
    """Whether any two of the workers' [created, deleted) spans of one Job's copies meet."""
    flat = [(a, b if b is not None else float("inf"), w) for w, ss in spans.items() for a, b in ss]
    for i, (a1, b1, w1) in enumerate(flat):
        for a2, b2, w2 in flat[i + 1 :]:
            if w1 != w2 and a1 < b2 and a2 < b1:
                return True
    return False


# --------------------------------------------------------------------------- watching


def watch(kube: Kube, kind: Kind, on_event: Callable[[str, Any, float], None]) -> Informer:
    """The project's informer on one kind in the benchmark's namespace of one cluster, handing
    every event (ADDED, MODIFIED, DELETED with the last object seen) and the time it was seen
    to `on_event`."""
    informer = Informer(kube, kind, field_selector=f"metadata.namespace={NAMESPACE}")
    informer.add_handler(
        lambda type_, old, new: on_event(type_, new if new is not None else old, time.monotonic())
    )
    informer.start()
    return informer


def _cond(obj: Mapping[str, Any], type_: str, reason: str | None = None) -> bool:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return reason is None or c.get("reason") == reason
    return False


class Tracker:
    """What the manager's Jobs and the workers' copies, pods and Workloads went through."""

    def __init__(self, shapes: Mapping[str, Shape]) -> None:
        self.shapes = shapes
        self.lock = threading.Lock()
        self.created: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.complete: dict[str, float] = {}
        self.copies: dict[tuple[str, str], list[CopyTrace]] = {}  # (worker, job) -> copies
        self.workloads: dict[tuple[str, str], list[list[float | None]]] = {}
        self.where_pods: dict[str, set[str]] = {}

    def on_manager_job(self, kind: str, job: dict[str, Any], at: float) -> None:
        name = job["metadata"]["name"]
        if name not in self.shapes or kind == "DELETED":
            return
        status = job.get("status") or {}
        with self.lock:
            self.created.setdefault(name, at)
            pods = self.shapes[name].pods
            if name not in self.running and (
                (status.get("ready") or 0) >= pods or (status.get("succeeded") or 0) >= pods
            ):
                self.running[name] = at
            if name not in self.complete and _cond(job, "Complete"):
                self.complete[name] = at

    def on_worker_job(self, worker: str, kind: str, job: dict[str, Any], at: float) -> None:
        name = job["metadata"]["name"]
        if name not in self.shapes:
            return
        uid = job["metadata"]["uid"]
        with self.lock:
            copies = self.copies.setdefault((worker, name), [])
            current = next((c for c in copies if getattr(c, "uid", None) == uid), None)
            if current is None:
                current = CopyTrace(at)
                current.uid = uid  # type: ignore[attr-defined]
                copies.append(current)
            if kind == "DELETED":
                current.deleted = current.deleted or at
            elif _cond(job, "Complete") and current.complete is None:
                current.complete = at
            elif not (job.get("spec") or {}).get("suspend") and current.unsuspended is None:
                current.unsuspended = at

    def on_worker_pod(self, worker: str, kind: str, pod: dict[str, Any], at: float) -> None:
        labels = pod["metadata"].get("labels") or {}
        name = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
        if name not in self.shapes:
            return
        with self.lock:
            copies = self.copies.get((worker, name))
            if not copies:
                return
            current = copies[-1]
            trace = current.pods.setdefault(pod["metadata"]["name"], PodTrace(at))
            spec = pod.get("spec") or {}
            if kind == "DELETED" or pod["metadata"].get("deletionTimestamp"):
                trace.gone = trace.gone or at
            if spec.get("nodeName") and trace.bound is None:
                trace.bound = at
                self.where_pods.setdefault(name, set()).add(worker)
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Running", "Succeeded") and trace.running is None:
                trace.running = at
            if spec.get("schedulingGates"):
                trace.gated = True
            for c in (pod.get("status") or {}).get("conditions") or []:
                if (
                    c.get("type") == "PodScheduled"
                    and c.get("status") == "False"
                    and c.get("reason") == "Unschedulable"
                ):
                    trace.unschedulable = True

    def on_worker_workload(self, worker: str, kind: str, wl: dict[str, Any], at: float) -> None:
        meta = wl["metadata"]
        labels = meta.get("labels") or {}
        owners = [o.get("name") for o in meta.get("ownerReferences") or []]
        name = labels.get("muster.dev/job-name") or next(
            (o for o in owners if o in self.shapes), None
        )
        if name is None:
            # MultiKueue's copies are named as the manager's Workload: job-<name>-<hash>.
            stem = meta["name"].removeprefix("job-").rsplit("-", 1)[0]
            name = stem if stem in self.shapes else None
        if name is None:
            return
        with self.lock:
            spans = self.workloads.setdefault((worker, name), [])
            if kind != "DELETED" and (not spans or spans[-1][1] is not None):
                spans.append([at, None])
            if kind == "DELETED" and spans and spans[-1][1] is None:
                spans[-1][1] = at

    def summary(self, start: float, end: float, threshold: float) -> dict[str, Any]:
        with self.lock:
            n = len(self.shapes)
            latency = [self.running[j] - self.created[j] for j in self.running if j in self.created]
            waited: dict[str, list[str]] = {}
            for (worker, job), copies in self.copies.items():
                for c in copies:
                    why = c.waits(threshold, end)
                    if why:
                        waited.setdefault(job, []).extend(f"{worker}:{w}" for w in why)
            held: list[float] = []  # each copy: created -> unsuspended (or gone)
            unbound: list[float] = []  # each pod of a copy: seen -> bound (or gone)
            for copies in self.copies.values():
                for c in copies:
                    until = c.deleted if c.deleted is not None else end
                    held.append((c.unsuspended or until) - c.created)
                    unbound += [(q.bound or q.gone or until) - q.first for q in c.pods.values()]
            # As the workers see it: every pod of one copy of the Job Running.
            ran_there: dict[str, float] = {}
            for (_, job), copies in self.copies.items():
                for c in copies:
                    times = [q.running for q in c.pods.values()]
                    if len(times) >= self.shapes[job].pods and all(t is not None for t in times):
                        at = sorted(t for t in times if t is not None)[self.shapes[job].pods - 1]
                        ran_there[job] = min(at, ran_there.get(job, at))
            there = [ran_there[j] - self.created[j] for j in ran_there if j in self.created]
            reasons = Counter(r.split(":", 1)[1] for rs in waited.values() for r in sorted(set(rs)))
            # Started there, then its pods waited for a node: what the issue asks about. A
            # copy held suspended waits too, but takes no node and runs nothing.
            for_nodes = [
                j for j, rs in waited.items() if any(not r.endswith(":suspended") for r in rs)
            ]
            by_kind = Counter(self.shapes[j].kind for j in waited)
            job_spans: dict[str, dict[str, list[tuple[float, float | None]]]] = {}
            for (worker, job), copies in self.copies.items():
                job_spans.setdefault(job, {})[worker] = [(c.created, c.deleted) for c in copies]
            wl_spans: dict[str, dict[str, list[tuple[float, float | None]]]] = {}
            for (worker, job), spans in self.workloads.items():
                wl_spans.setdefault(job, {})[worker] = [
                    (s[0], s[1]) for s in spans if s[0] is not None
                ]
            done_there = {
                job: min(c.complete for c in cs if c.complete is not None)
                for (_, job), cs in self.copies.items()
                if any(c.complete is not None for c in cs)
            }
            copies_per_job = Counter(
                sum(len(v) for v in spans.values()) for spans in job_spans.values()
            )
            return {
                "jobs": n,
                "running": len(self.running),
                "complete": len(self.complete),
                "all_running_s": round(max(self.running.values()) - start, 1)
                if len(self.running) == n
                else None,
                "all_complete_s": round(max(self.complete.values()) - start, 1)
                if len(self.complete) == n
                else None,
                "copies_complete": len(done_there),
                "all_copies_complete_s": round(max(done_there.values()) - start, 1)
                if len(done_there) == n
                else None,
                "last_running_s": round(max(self.running.values()) - start, 1)
                if self.running
                else None,
                "p50_to_running_s": _round(percentile(latency, 0.5)),
                "p95_to_running_s": _round(percentile(latency, 0.95)),
                "ran_in_worker": len(ran_there),
                "all_running_in_workers_s": round(max(ran_there.values()) - start, 1)
                if len(ran_there) == n
                else None,
                "p50_to_running_in_worker_s": _round(percentile(there, 0.5)),
                "p95_to_running_in_worker_s": _round(percentile(there, 0.95)),
                "waited_in_worker": len(waited),
                "waited_for_nodes": len(for_nodes),
                "held_suspended": sum(
                    1 for rs in waited.values() if any(r.endswith(":suspended") for r in rs)
                ),
                "waited_reasons": dict(reasons),
                "waited_by_kind": dict(by_kind),
                "copy_suspended_s": _spread(held),
                "pod_unbound_s": _spread(unbound),
                "job_copies_in_two_workers": sum(1 for s in job_spans.values() if overlapping(s)),
                "workload_copies_in_two_workers": sum(
                    1 for s in wl_spans.values() if overlapping(s)
                ),
                "pods_in_two_workers": sum(1 for w in self.where_pods.values() if len(w) > 1),
                "job_copies_made": sum(k * v for k, v in copies_per_job.items()),
                "jobs_by_copies": {str(k): v for k, v in sorted(copies_per_job.items())},
                "ran_in": dict(
                    Counter(
                        next(iter(w)) if len(w) == 1 else "both" for w in self.where_pods.values()
                    )
                ),
            }


def _spread(values: Sequence[float]) -> str:
    """p50 / p95 / max, in seconds."""
    if not values:
        return "-"
    return " / ".join(f"{percentile(values, q):.1f}" for q in (0.5, 0.95, 1.0))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# --------------------------------------------------------------------------- clusters


@dataclass
class Member:
    """One local cluster of the fleet: manager, a or b."""

    role: str
    local: LocalCluster
    kc: str
    processes: list[Process] = field(default_factory=list)

    @property
    def kubeconfig(self) -> str:
        return str(self.local.kubeconfig)

    @property
    def cluster(self) -> Cluster:
        return Cluster(self.kc, self.kubeconfig, self.local)

    def kubectl(self, *argv: str, input: str | None = None, check: bool = True) -> str:
        return self.cluster.kubectl(*argv, input=input, check=check).stdout

    def apply(self, docs: Sequence[Mapping[str, Any]]) -> None:
        self.cluster.apply(list(docs), server_side=True)

    def scrape(self) -> metrics.Scrape:
        return metrics.fetch(
            self.cluster.metrics_url("kube-apiserver"),
            self.cluster.ssl_context(),
            metrics.starting("apiserver_request_total"),
        )


@contextlib.contextmanager
def fleet(root: Path, tag: str, args: argparse.Namespace) -> Iterator[dict[str, Member]]:
    """Three fresh local clusters `mk-<tag>-{manager,a,b}` under `root`, with the workers'
    nodes (and B's foreign pods); every process stopped and every cluster deleted at the
    end."""
    binaries = ensure_binaries(build=False)
    members: dict[str, Member] = {}
    try:
        for role in ("manager", "a", "b"):
            local = LocalCluster(root / f"mk-{tag}-{role}", binaries)
            members[role] = Member(role, local, binaries["kubectl"])
            local.up()
        for role in ("a", "b"):
            m = members[role]
            create_nodes(
                m.kc,
                m.kubeconfig,
                args.nodes,
                prefix=f"{role}-gpu",
                cpu="64",
                memory="512Gi",
                gpu=8,
                labels={POOL_LABEL: "gpu"},
                wait_ready=180,
            )
            m.apply([objects.namespace(NAMESPACE), objects.namespace("others")])
        members["manager"].apply([objects.namespace(NAMESPACE)])
        foreign = [_foreign_pod(f"b-gpu-{i}") for i in range(args.taken)]
        if foreign:
            members["b"].apply(foreign)
        yield members
    finally:
        for m in members.values():
            for p in reversed(m.processes):
                with contextlib.suppress(Exception):
                    p.stop()
        for m in members.values():
            with contextlib.suppress(Exception):
                m.local.down()
            if not args.keep_logs:
                shutil.rmtree(m.local.directory, ignore_errors=True)


def _foreign_pod(node: str) -> dict[str, Any]:
    """Someone else's pod of 4 GPUs on `node`, never finishing (no Job owns it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"other-{node}", "namespace": "others"},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": {GPU: "4", "cpu": "1"}, "limits": {GPU: "4"}},
                }
            ],
        },
    }


def worker_gpus(args: argparse.Namespace) -> int:
    return 8 * args.nodes


# --------------------------------------------------------------------------- Muster


def start_muster(m: Member, home: Path) -> None:
    m.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    m.kubectl("wait", "--for", "condition=Established", "crd", "--all", "--timeout=120s")
    m.apply([objects.namespace("muster-system")])
    home.mkdir(parents=True, exist_ok=True)
    metrics_port = free_port()
    argv = controller_argv(
        m.kubeconfig,
        lease=f"mk-bench-{m.role}",
        database_url=f"sqlite:///{home / 'history.db'}",
        spool_dir=home / "spool",
        metrics_port=metrics_port,
    )
    process = Process(f"muster-{m.role}", argv, home / "controller.log", os.environ.copy())
    m.processes.append(process)

    def leading() -> bool:
        process.check()
        out = m.kubectl(
            "get",
            "validatingwebhookconfiguration",
            "muster-webhooks",
            "-o",
            "jsonpath={.webhooks[0].clientConfig.url}",
            check=False,
        )
        return bool(out.strip())

    wait_for(f"Muster in {m.role} to lead and register its webhooks", leading, 180)


def setup_muster(members: dict[str, Member], home: Path, args: argparse.Namespace) -> None:
    for role, m in members.items():
        start_muster(m, home / role)
    gpu_flavor = objects.flavor("gpu", {POOL_LABEL: "gpu"})
    for role in ("a", "b"):
        per = worker_gpus(args)
        members[role].apply(
            [
                gpu_flavor,
                objects.cluster_queue("team", "gpu", {GPU: str(per), "cpu": str(8 * per)}),
                objects.local_queue(NAMESPACE, "team", QUEUE),
            ]
        )
    manager = members["manager"]
    docs: list[dict[str, Any]] = []
    for role in ("a", "b"):
        config = Path(members[role].kubeconfig).read_bytes()
        docs += [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"kubeconfig-{role}", "namespace": "muster-system"},
                "data": {"kubeconfig": base64.b64encode(config).decode()},
            },
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "WorkerCluster",
                "metadata": {"name": f"worker-{role}"},
                "spec": {"kubeconfig": {"name": f"kubeconfig-{role}"}},
            },
        ]
    fleet_gpus = 2 * worker_gpus(args)
    cq = objects.cluster_queue("fleet", "gpu", {GPU: str(fleet_gpus), "cpu": str(8 * fleet_gpus)})
    cq["spec"]["dispatch"] = {"clusterSelector": {}}
    manager.apply([*docs, gpu_flavor, cq, objects.local_queue(NAMESPACE, "fleet", QUEUE)])

    def active() -> bool:
        items = json.loads(manager.kubectl("get", "workerclusters.muster.dev", "-o", "json"))
        return len(items["items"]) == 2 and all(_cond(i, "Active") for i in items["items"])

    wait_for("both WorkerClusters to be Active", active, 120)


# --------------------------------------------------------------------------- Kueue


def kueue_paths(log: Path) -> tuple[Path, Path]:
    from bench.kueue_bench import ensure_kueue

    return ensure_kueue(log)


def start_kueue(m: Member, home: Path, binary: Path, manifests: Path) -> None:
    """Kueue's manager out of cluster against `m`, as bench/kueue_bench.py runs it: its CRDs
    and the webhooks of batch Jobs and its own kinds from its module, our certificates."""
    from bench.kueue_bench import kueue_config, kueue_crds, kueue_webhooks

    home.mkdir(parents=True, exist_ok=True)
    m.apply([objects.namespace("kueue-system")])
    m.apply(kueue_crds(manifests))
    m.kubectl("wait", "--for", "condition=Established", "crd", "--all", "--timeout=120s")
    config, port, health, ca_pem = kueue_config(home, f"mk-bench-kueue-{m.role}")
    argv = [str(binary), f"--config={config}", f"--kubeconfig={m.kubeconfig}"]
    process = Process(f"kueue-{m.role}", argv, home / "manager.log", os.environ.copy())
    m.processes.append(process)
    m.apply(kueue_webhooks(manifests, f"https://127.0.0.1:{port}", ca_pem))

    def ready() -> bool:
        process.check()
        return http_ok(f"http://127.0.0.1:{health}/readyz")

    wait_for(f"Kueue in {m.role} to be ready", ready, 180)


def _kueue_cq(name: str, gpus: int, checks: Sequence[str] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", GPU],
                "flavors": [
                    {
                        "name": "gpu",
                        "resources": [
                            {"name": "cpu", "nominalQuota": str(8 * gpus)},
                            {"name": GPU, "nominalQuota": str(gpus)},
                        ],
                    }
                ],
            }
        ],
    }
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def setup_multikueue(members: dict[str, Member], home: Path, args: argparse.Namespace) -> None:
    binary, manifests = kueue_paths(home / "kueue-build.log")
    for role, m in members.items():
        start_kueue(m, home / role, binary, manifests)
    for role in ("a", "b"):
        members[role].apply(
            [
                {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": "gpu"}},
                _kueue_cq("fleet", worker_gpus(args)),
                objects.local_queue(NAMESPACE, "fleet", QUEUE, api=KUEUE_API),
            ]
        )
    manager = members["manager"]
    docs: list[dict[str, Any]] = []
    for role in ("a", "b"):
        path = Path(members[role].kubeconfig)
        config = inline_kubeconfig(yaml.safe_load(path.read_text()), path.parent)
        docs += [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"kubeconfig-{role}", "namespace": "kueue-system"},
                "data": {"kubeconfig": base64.b64encode(yaml.safe_dump(config).encode()).decode()},
            },
            {
                "apiVersion": KUEUE_API,
                "kind": "MultiKueueCluster",
                "metadata": {"name": f"worker-{role}"},
                "spec": {
                    "clusterSource": {
                        "kubeConfig": {"locationType": "Secret", "location": f"kubeconfig-{role}"}
                    }
                },
            },
        ]
    docs += [
        {
            "apiVersion": KUEUE_API,
            "kind": "MultiKueueConfig",
            "metadata": {"name": "fleet"},
            "spec": {"clusters": ["worker-a", "worker-b"]},
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "AdmissionCheck",
            "metadata": {"name": "multikueue"},
            "spec": {
                "controllerName": "kueue.x-k8s.io/multikueue",
                "parameters": {
                    "apiGroup": "kueue.x-k8s.io",
                    "kind": "MultiKueueConfig",
                    "name": "fleet",
                },
            },
        },
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": "gpu"}},
        _kueue_cq("fleet", 2 * worker_gpus(args), ["multikueue"]),
        objects.local_queue(NAMESPACE, "fleet", QUEUE, api=KUEUE_API),
    ]
    manager.apply(docs)

    def active() -> bool:
        clusters = json.loads(manager.kubectl("get", "multikueueclusters", "-o", "json"))["items"]
        check = json.loads(manager.kubectl("get", "admissionchecks", "multikueue", "-o", "json"))
        cq = json.loads(
            manager.kubectl("get", "clusterqueues.kueue.x-k8s.io", "fleet", "-o", "json")
        )
        return (
            len(clusters) == 2
            and all(_cond(c, "Active") for c in clusters)
            and _cond(check, "Active")
            and _cond(cq, "Active")
        )

    if not wait_until(active, 120):
        state = manager.kubectl(
            "get", "multikueueclusters,admissionchecks,clusterqueues.kueue.x-k8s.io", "-o", "yaml"
        )
        raise RuntimeError(f"MultiKueue did not become Active:\n{state[-4000:]}")


# --------------------------------------------------------------------------- one system


@dataclass(frozen=True)
class System:
    name: str
    queue_label: str
    managed_by: str
    workload_kind: Kind
    setup: Callable[[dict[str, Member], Path, argparse.Namespace], None]


SYSTEMS = {
    "muster": System("Muster", "muster.dev/queue-name", MUSTER_MANAGED_BY, WORKLOAD, setup_muster),
    "multikueue": System(
        "MultiKueue",
        "kueue.x-k8s.io/queue-name",
        KUEUE_MANAGED_BY,
        KUEUE_WORKLOAD,
        setup_multikueue,
    ),
}


def run_system(system: System, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:5]
    home = root / f"{system.name.lower()}-{tag}"
    home.mkdir(parents=True)
    shapes = {f"j-{i:04d}": s for i, s in enumerate(job_mix(args.jobs))}
    result: dict[str, Any] = {"system": system.name}
    with fleet(root, tag, args) as members:
        t = time.monotonic()
        system.setup(members, home, args)
        result["setup_s"] = round(time.monotonic() - t, 1)
        tracker = Tracker(shapes)
        kubes = {r: Kube(api_client(m.kubeconfig, pool_size=4)) for r, m in members.items()}
        watches = [watch(kubes["manager"], JOB, tracker.on_manager_job)]
        for role in ("a", "b"):
            worker = f"worker-{role}"
            watches += [
                watch(kubes[role], JOB, _bind(tracker.on_worker_job, worker)),
                watch(kubes[role], POD, _bind(tracker.on_worker_pod, worker)),
                watch(kubes[role], system.workload_kind, _bind(tracker.on_worker_workload, worker)),
            ]
        time.sleep(2)  # the watches listed
        before = {r: m.scrape() for r, m in members.items()}
        docs = [
            job_manifest(n, s, system.queue_label, system.managed_by) for n, s in shapes.items()
        ]
        start = time.monotonic()
        create_all(members["manager"].kc, members["manager"].kubeconfig, docs)
        result["create_s"] = round(time.monotonic() - start, 1)
        print(f"{system.name}: {len(docs)} Jobs created in {result['create_s']} s", file=sys.stderr)

        last: list[Any] = [None, start]  # (complete, copies complete), when it last moved

        def progress() -> bool:
            with tracker.lock:
                done = len(tracker.complete)
                running = len(tracker.running)
                there = {j for (_, j), cs in tracker.copies.items() if any(c.complete for c in cs)}
            now = time.monotonic()
            if last[0] != (done, len(there)):
                last[0], last[1] = (done, len(there)), now
            elapsed = now - start
            if len(there) >= len(shapes) and now - last[1] > args.settle:
                print(
                    f"{system.name}: every copy complete in its worker, {done} complete "
                    f"here, nothing moved for {args.settle:.0f} s: stopping",
                    file=sys.stderr,
                )
                return True
            if int(elapsed) % 30 == 0:
                print(
                    f"{system.name}: {elapsed:.0f} s: {running} ran, {done} complete",
                    file=sys.stderr,
                )
            return done >= len(shapes)

        wait_until(progress, args.timeout, every=1.0)
        finished = len(tracker.complete) >= len(shapes)
        end = time.monotonic()
        time.sleep(3)  # the last status writes and copy deletions
        after = {r: m.scrape() for r, m in members.items()}
        for w in watches:
            w.stop()
        result["finished"] = finished
        result.update(tracker.summary(start, end, args.wait_threshold))
        result["writes"] = {}
        for role in members:
            writes = request_writes(before[role], after[role])
            total, work = split_writes(writes)
            result["writes"][role] = {
                "total": total,
                "refused": sum(request_writes(before[role], after[role], refused=True).values()),
                "without_heartbeats": work,
                "by_request": dict(list(writes.items())[:15]),
            }
        for m in members.values():
            for p in m.processes:
                with contextlib.suppress(Exception):
                    result.setdefault("cpu_s", {})[p.name] = round(p.cpu_seconds(), 1)
        if not finished:
            unfinished = sorted(set(shapes) - set(tracker.complete))
            result["unfinished"] = unfinished[:20]
            result["stuck"] = stuck_report(members, unfinished, home)
    return result


def stuck_report(
    members: dict[str, Member], unfinished: Sequence[str], home: Path
) -> dict[str, Any]:
    """For up to 5 Jobs that never completed in the manager: their status there and their
    copies' status in the workers (written to `home`), and what the apiserver answers to the
    copy's status merged onto the manager's Job (a server-side dry run): why a status
    mirror is refused, if it is."""
    out: dict[str, Any] = {}
    for name in unfinished[:5]:
        local = json.loads(
            members["manager"].kubectl(
                "get", "job", "-n", NAMESPACE, name, "-o", "json", check=False
            )
            or "{}"
        )
        entry: dict[str, Any] = {
            "manager": {
                "spec.suspend": (local.get("spec") or {}).get("suspend"),
                "status": local.get("status"),
            }
        }
        for role in ("a", "b"):
            remote = json.loads(
                members[role].kubectl(
                    "get",
                    "job",
                    "-n",
                    NAMESPACE,
                    name,
                    "-o",
                    "json",
                    "--ignore-not-found",
                    check=False,
                )
                or "{}"
            )
            if not remote:
                continue
            status = remote.get("status") or {}
            patch = {"status": copies.mirrored_status(remote, local) or {}}
            answer = members["manager"].cluster.kubectl(
                "patch",
                "job",
                "-n",
                NAMESPACE,
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps(patch),
                "--dry-run=server",
                check=False,
            )
            entry[role] = {
                "status": status,
                "mirror_dry_run": (answer.stderr or answer.stdout).strip(),
            }
        out[name] = entry
    (home / "unfinished.json").write_text(json.dumps(out, indent=1))
    return {
        k: {r: v.get("mirror_dry_run") for r, v in e.items() if r != "manager"}
        for k, e in out.items()
    }


def _bind(fn: Callable[..., None], worker: str) -> Callable[[str, dict[str, Any], float], None]:
    return lambda kind, obj, at: fn(worker, kind, obj, at)


# --------------------------------------------------------------------------- report


def table(results: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        (
            "Jobs ran / complete here / complete in a worker",
            lambda r: f"{r.get('running')} / {r.get('complete')} / {r.get('copies_complete')}",
        ),
        ("first create -> all running, manager's Job status (s)", lambda r: r.get("all_running_s")),
        ("first create -> all complete here (s)", lambda r: r.get("all_complete_s")),
        ("first create -> all complete in workers (s)", lambda r: r.get("all_copies_complete_s")),
        (
            "create -> running p50 / p95, manager's Job status (s)",
            lambda r: f"{r.get('p50_to_running_s')} / {r.get('p95_to_running_s')}",
        ),
        (
            "first create -> all running, workers' pods (s)",
            lambda r: r.get("all_running_in_workers_s"),
        ),
        (
            "create -> running p50 / p95, workers' pods (s)",
            lambda r: (
                f"{r.get('p50_to_running_in_worker_s')} / {r.get('p95_to_running_in_worker_s')}"
            ),
        ),
        (
            "Jobs started in a worker whose pods then waited for nodes",
            lambda r: r.get("waited_for_nodes"),
        ),
        ("Jobs whose copy was held suspended in its worker", lambda r: r.get("held_suspended")),
        ("Jobs that waited in their worker, either way", lambda r: r.get("waited_in_worker")),
        ("  why (copies' pods)", lambda r: _fmt(r.get("waited_reasons"))),
        ("  which Jobs", lambda r: _fmt(r.get("waited_by_kind"))),
        (
            "copy created -> started in worker, p50 / p95 / max (s)",
            lambda r: r.get("copy_suspended_s"),
        ),
        ("pod created -> bound in worker, p50 / p95 / max (s)", lambda r: r.get("pod_unbound_s")),
        ("Jobs with Job copies in 2 workers at once", lambda r: r.get("job_copies_in_two_workers")),
        (
            "Jobs with Workload copies in 2 workers at once",
            lambda r: r.get("workload_copies_in_two_workers"),
        ),
        ("Job copies created in workers", lambda r: r.get("job_copies_made")),
        ("Jobs whose pods ran in", lambda r: _fmt(r.get("ran_in"))),
        *[
            (f"API writes, {role} (without heartbeats; refused)", _writes(role))
            for role in ("manager", "a", "b")
        ],
        ("controller CPU s", lambda r: _fmt(r.get("cpu_s"))),
    ]
    head = "| | " + " | ".join(r["system"] for r in results) + " |"
    sep = "| --- |" + " ---: |" * len(results)
    lines = [head, sep]
    for label, get in rows:
        lines.append(f"| {label} | " + " | ".join(str(get(r)) for r in results) + " |")
    return "\n".join(lines)


def _writes(role: str) -> Callable[[Mapping[str, Any]], str]:
    def get(r: Mapping[str, Any]) -> str:
        w = (r.get("writes") or {}).get(role)
        if not w:
            return "-"
        return f"{w['total']} ({w['without_heartbeats']}; {w.get('refused', '?')} refused)"

    return get


def _fmt(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "-"
    return ", ".join(f"{k} {v}" for k, v in d.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--systems", default="muster,multikueue")
    parser.add_argument("--nodes", type=int, default=20, help="kwok nodes of 8 GPUs per worker")
    parser.add_argument("--taken", type=int, default=10, help="B's nodes with a foreign 4-GPU pod")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per system")
    parser.add_argument(
        "--settle",
        type=float,
        default=60,
        help="stop this long after every copy completed in its worker and nothing moved",
    )
    parser.add_argument("--wait-threshold", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep-logs", action="store_true", help="keep the clusters' directories")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mk-bench-"))
    os.environ["MUSTER_LOCAL_CLUSTER_DIR"] = str(root)
    results: list[dict[str, Any]] = []
    try:
        for key in (s.strip() for s in args.systems.split(",") if s.strip()):
            system = SYSTEMS[key]
            try:
                results.append(run_system(system, root, args))
            except Exception as error:
                traceback.print_exc()
                results.append({"system": system.name, "error": f"{type(error).__name__}: {error}"})
            print(json.dumps(results[-1], indent=1), file=sys.stderr)
    finally:
        if not args.keep_logs:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"logs kept in {root}", file=sys.stderr)
    print(table([r for r in results if "error" not in r]))
    for r in results:
        if "error" in r:
            print(f"{r['system']}: failed: {r['error']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
