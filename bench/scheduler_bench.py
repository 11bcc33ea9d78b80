"""Schedulers side by side on one local cluster: kube-scheduler 1.37 with its native gang
scheduling against Muster's scheduler loop, on the same kwok nodes; and the KAI-Scheduler
scale-test shape through Muster's whole path.

Scenarios (run in this order, one after the other; each in its own namespace, and the pods
of one are gone before the next starts):

- `native`: N nodes (32 cpu, 256Gi, 110 pods), G gangs of 3 pods (100m, 100Mi). Per gang a
  `scheduling.k8s.io/v1beta1` PodGroup (`spec.schedulingPolicy.gang.minCount: 3`) and 3 pods
  with `spec.schedulingGroup.podGroupName`, placed by the default scheduler. Timed from the
  first create to every pod bound; kube-scheduler's own
  `scheduler_podgroup_scheduling_attempt_duration_seconds` is read from its /metrics.
- `muster-pg`: the native scenario's very objects handed to Muster: each PodGroup labelled
  with a LocalQueue whose ClusterQueue has ample quota on a flavor matching the nodes, each
  pod naming `muster-scheduler`; through the PodGroup intake (one Workload per group),
  admission, Muster's scheduler loop and pods/binding. Timed as `native`, plus admitted.
- `muster`: the same gangs as batch Jobs (parallelism 3) in a LocalQueue whose ClusterQueue
  has ample quota on a flavor matching the nodes, through the controller: webhook, Workload,
  admission (which consults placement), the Job controller's pods, Muster's scheduler loop,
  pods/binding. Timed create -> admitted -> pods created -> bound -> Running; the loop's
  per-group decide time is measured by wrapping `decide` in this process.
- `kai`: the KAI-Scheduler scale test: 500 nodes x 8 GPUs, 4,000 one-GPU Jobs of one pod in
  a queue whose quota covers all 4,000 GPUs; create -> admitted -> bound -> Running of the
  last Job. A fresh local cluster of its own (with `--kubeconfig`, the same cluster once
  the CPU nodes of the scenarios before it are deleted).
- `kai-floor` (in `kai-all`): the apiserver's write floor for that fill, in a cluster of its
  own with no Muster: the same Jobs created suspended, and as each appears the raw client
  loop (`bench/raw_client_loop.py --follow`) makes Muster's three writes for it (Workload,
  admission, unsuspend); the Job controller and kube-scheduler do the rest.
- `preemption` (only when asked for; not part of `all`): scheduler_perf's GangPreemption
  shape on its own 4-cpu nodes, by kube-scheduler and then by Muster. The nodes are filled
  with low-priority gangs of one-cpu pods (priority 1000), then one high-priority gang
  (9999999, PreemptLowerPriority) that fits only once some of them are gone. kube-scheduler:
  a PodGroup per gang (gang minCount = its pods, disruptionMode all), pods owned by nothing.
  Muster: queued Jobs in a queue that preempts within itself by priority, quota ten times
  the nodes. Reported: the low gangs that lost pods (and any that lost only some), the time
  from creating the preemptor to its last pod bound, victims' pods pending or made again
  after; when the preemptor is not bound in time, its group's and a waiting pod's
  conditions instead of a time.
- `topology` (only when asked for; issue 30): kwok nodes of 8 GPUs in blocks of racks
  (labels `muster-bench/block`, `muster-bench/rack`), and one stream of gangs of 2-GPU pods,
  an eighth, a quarter and half of a rack in turn up to `--fill` of the GPUs, each requiring
  all its pods inside one rack. kube-scheduler (gate TopologyAwareWorkloadScheduling): a
  PodGroup per gang with `schedulingConstraints.topology` on the rack label, bare pods.
  Muster: a Topology (block, rack, hostname), a flavor naming it, a Job per gang whose pod
  template carries `muster.dev/podset-required-topology`. Reported for each: gangs whole
  inside one rack, gangs over several, racks used and left free, time from the first create
  to every pod created and to every pod bound; kube-scheduler's placement metrics, Muster's
  decide time.

The controller runs in this process (the Manager `muster controller` runs), started after
the native scenario so that it costs kube-scheduler nothing. CPU seconds of every cluster
process and of each thread of this one are read from /proc around each scenario; `--profile`
adds a stack sampler over the controller's threads. Prints figures; never fails on time.

    python bench/scheduler_bench.py [--nodes 5000] [--gangs 1000] [--gpu-nodes 500]
        [--gpu-jobs 4000] [--scenario native|muster|kai|all|preemption|topology]
        [--kubeconfig PATH] [--preemption-nodes 100] [--low-gang-pods 20]
        [--preemptor-pods 100] [--blocks 4] [--racks 8] [--rack-nodes 16] [--fill 0.75]
        [--pod-cpu 16] [--pod-memory 128Gi] [--profile] [--json]

Without --kubeconfig a fresh local cluster is started in a temporary directory, deleted at
the end (unless --keep, or the run failed); its last scenario's objects go with it, not one
by one. With one, kube-scheduler's metrics and the
cluster's CPU are read only when the kubeconfig belongs to a `muster local-cluster` state
directory.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar, cast

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import controllers.admission.loop as admission_loop
import controllers.localcluster.cluster as cluster_module
import controllers.scheduler.loop as scheduler_loop
from bench.harness import meter, metrics, objects
from bench.harness.cluster import Cluster, running_cluster
from bench.harness.controller import start_manager as start_controller
from bench.harness.controller import stop_manager
from bench.harness.create import create_all
from bench.harness.tables import render
from bench.harness.timing import percentile
from bench.harness.waits import wait_for, wait_or_warn
from controllers.localcluster.cluster import LocalCluster
from controllers.localcluster.kubectl import kubectl
from controllers.localcluster.nodes import node_manifest
from controllers.manager.manager import Manager
from controllers.runtime.client import api_client
from controllers.runtime.informer import Informer
from controllers.runtime.logs import setup_logging
from controllers.runtime.resources import NODE, POD, WORKLOAD, Kube, Obj, object_key
from controllers.state import workloads as wls
from quota.api.names import (
    HOSTNAME_LABEL,
    JOB_NAME_LABEL,
    QUEUE_LABEL,
    REQUIRED_TOPOLOGY_ANNOTATION,
    SCHEDULER_NAME,
)

RUN_LABEL = "muster-bench/run"
POOL_LABEL = "muster-bench/pool"
GANG_LABEL = "muster-bench/gang"
IMAGE = "registry.k8s.io/pause:3.10"
GPU = "nvidia.com/gpu"
GANG_SIZE = 3
PODGROUP_METRICS = (
    "scheduler_podgroup_scheduling_attempt_duration_seconds",
    "scheduler_podgroup_scheduling_algorithm_duration_seconds",
)

WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
REQUEST_METRIC = "apiserver_request_duration_seconds"
WRITE_VERBS = ("POST", "PUT", "PATCH")

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- manifests
def pod_spec(cpu: str = "100m", memory: str = "100Mi", gpu: int = 0) -> Obj:
    """A pause container asking `cpu`, `memory` and `gpu` GPUs (a small pod by default)."""
    resources: Obj = {"requests": {"cpu": cpu, "memory": memory}}
    if gpu:
        resources["requests"][GPU] = str(gpu)
        resources["limits"] = {GPU: str(gpu)}
    return {"containers": [{"name": "pause", "image": IMAGE, "resources": resources}]}


def native_docs(gangs: int, namespace: str, tag: str, pool: str) -> list[Obj]:
    """Per gang: its PodGroup, then its pods (each kubectl stream creates the group first)."""
    return [
        doc
        for g in range(gangs)
        for doc in native_gang_docs(f"gang-{g:05d}", GANG_SIZE, namespace, tag, pool, pod_spec())
    ]


def native_gang_docs(
    name: str,
    pods: int,
    namespace: str,
    tag: str,
    pool: str,
    pod_spec: Obj,
    group: Mapping[str, Any] | None = None,
) -> list[Obj]:
    """A `scheduling.k8s.io/v1beta1` PodGroup (gang minCount = pods, and the rest of its spec
    from `group`), then its pods on the pool, owned by nothing."""
    docs: list[Obj] = [
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulingPolicy": {"gang": {"minCount": pods}}, **(group or {})},
        }
    ]
    for i in range(pods):
        spec = copy.deepcopy(pod_spec)
        spec["schedulingGroup"] = {"podGroupName": name}
        spec["nodeSelector"] = {POOL_LABEL: pool}
        labels = {RUN_LABEL: tag, GANG_LABEL: name}
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name}-{i}", "namespace": namespace, "labels": labels},
                "spec": spec,
            }
        )
    return docs


def muster_podgroup_docs(gangs: int, namespace: str, tag: str, pool: str) -> list[Obj]:
    """The native scenario's objects, handed to Muster: each PodGroup labelled with the
    LocalQueue `q`, each pod naming Muster's scheduler (docs/podgroups.md)."""
    docs = native_docs(gangs, namespace, tag, pool)
    for doc in docs:
        if doc["kind"] == "PodGroup":
            doc["metadata"]["labels"] = {QUEUE_LABEL: "q"}
        else:
            doc["spec"]["schedulerName"] = SCHEDULER_NAME
    return docs


def queue_docs(
    pool: str,
    namespace: str,
    quota: Mapping[str, str],
    preemption: Mapping[str, str] | None = None,
    topology: str | None = None,
) -> list[Obj]:
    """A flavor on the pool's nodes (naming `topology` if given), a ClusterQueue with `quota`
    on it, a LocalQueue `q`."""
    return [
        objects.namespace(namespace),
        objects.flavor(pool, {POOL_LABEL: pool}, topology=topology),
        objects.cluster_queue(pool, pool, quota, preemption=preemption),
        objects.local_queue(namespace, pool),
    ]


def job_docs(count: int, pods: int, namespace: str, tag: str, gpu: int = 0) -> list[Obj]:
    """`count` labelled Jobs of `pods` small pods each (and `gpu` GPUs a pod)."""
    spec = pod_spec(gpu=gpu)
    return [muster_job(f"job-{i:05d}", pods, namespace, tag, spec) for i in range(count)]


def muster_job(
    name: str,
    pods: int,
    namespace: str,
    tag: str,
    pod_spec: Obj,
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    """A Job of `pods` pods (parallelism = completions) in the LocalQueue `q`, whose flavor
    puts them on the pool; `annotations` on its pod template."""
    template: Obj = {"labels": {RUN_LABEL: tag, GANG_LABEL: name}}
    if annotations:
        template["annotations"] = dict(annotations)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: "q"}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "template": {"metadata": template, "spec": {**pod_spec, "restartPolicy": "Never"}},
        },
    }


def run_tag() -> str:
    """A fresh tag for a run's labels and names. It starts with a letter: an all-digit tag
    ("002108") is a string to PyYAML and a number to the apiserver's YAML reader."""
    return f"r{uuid.uuid4().hex[:6]}"


# The local cluster's own stages: `quiet_nodes` points the module at a copy of them.
KWOK_STAGES = cluster_module.STAGES_FILE


def stages_with_heartbeat(directory: Path, seconds: float) -> Path:
    """The local cluster's kwok stages with node status posted every `seconds` to 4/3 of
    that, instead of every 15-20 s."""
    docs = list(yaml.safe_load_all(KWOK_STAGES.read_text()))
    for doc in docs:
        if (doc.get("metadata") or {}).get("name") == "node-heartbeat":
            ms = int(seconds * 1000)
            doc["spec"]["delay"] = {
                "durationMilliseconds": ms,
                "jitterDurationMilliseconds": ms * 4 // 3,
            }
    path = directory / "stages.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def quiet_nodes(local: LocalCluster, stages: Path, heartbeat: float, lease: int) -> None:
    """Make the fresh cluster's kwok nodes cheaper to keep alive before it starts.

    A kubelet (and kwok) renews its node's Lease every quarter of the lease duration (10 s
    for 40 s) and kwok posts node status every 15-20 s: at 5,000 nodes that is about 700
    writes a second, more than 2 cores can serve next to anything else. scheduler_perf runs
    with no heartbeats at all; here node status is posted every `heartbeat` seconds, the
    Lease lasts `lease` seconds (renewed every lease/4), and kube-controller-manager waits
    twice the lease before it calls a node unhealthy. kwok's stages are written into
    `stages` (a directory), which kwok reads once, as it starts.
    """
    if heartbeat > 0:
        cluster_module.STAGES_FILE = stages_with_heartbeat(stages, heartbeat)
    if lease <= 0:
        return
    start = local._start
    flags = {
        "kwok": ("--node-lease-duration-seconds", str(lease)),
        "kube-controller-manager": ("--node-monitor-grace-period", f"{2 * lease}s"),
    }

    def patched(
        name: str, argv: list[str], health_url: str | None, env: dict[str, str] | None = None
    ) -> None:
        if name in flags:
            flag, value = flags[name]
            argv = list(argv)
            argv[argv.index(flag) + 1] = value
        start(name, argv, health_url, env)

    local._start = patched  # type: ignore[method-assign]


def make_nodes(
    kc: str,
    kubeconfig: str,
    count: int,
    pool: str,
    reader: Kube,
    *,
    cpu: str,
    memory: str,
    gpu: int = 0,
    labels: Callable[[int], Mapping[str, str]] = lambda i: {},
) -> None:
    """`count` kwok nodes `<pool>-<i>` labelled with the pool (and `labels(i)`), created by 4
    kubectl processes; waits until every one is Ready."""
    docs = [
        node_manifest(f"{pool}-{i}", cpu, memory, gpu, 110, {POOL_LABEL: pool, **labels(i)})
        for i in range(count)
    ]
    create_all(kc, kubeconfig, cast(list[Obj], docs))

    def all_ready() -> bool:
        items, _ = reader.list(NODE, label_selector=f"{POOL_LABEL}={pool}")
        ready = sum(
            1
            for n in items
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (n.get("status") or {}).get("conditions") or []
            )
        )
        return ready >= count

    wait_for(f"{count} nodes of pool {pool} Ready", all_ready, 900, every=2.0)


# --------------------------------------------------------------------------- tracking
class Tracker:
    """When each pod of a run was first seen created, bound and Running, and when each
    Workload of a namespace was first seen admitted: informers in this process, with
    handlers that only note the time."""

    def __init__(self, kube: Kube, tag: str, namespace: str, workloads: bool) -> None:
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.node: dict[str, str] = {}  # the node each pod was bound to
        self.running: dict[str, float] = {}
        self.admitted: dict[str, float] = {}
        # When each pod was first seen deleting (or gone), and the gang its labels name.
        self.gone: dict[str, float] = {}
        self.gang: dict[str, str] = {}
        self.pods = Informer(kube, POD, label_selector=f"{RUN_LABEL}={tag}", name=f"bench-{tag}")
        self.pods.add_handler(self._on_pod)
        self.informers = [self.pods]
        if workloads:
            wl = Informer(kube, WORKLOAD, field_selector=f"metadata.namespace={namespace}")
            wl.add_handler(self._on_workload)
            self.informers.append(wl)

    def start(self) -> None:
        for informer in self.informers:
            informer.start()
        for informer in self.informers:
            informer.wait_synced(60)

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()

    def _on_pod(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        now = time.monotonic()
        if new is None:
            if old is not None:
                self.gone.setdefault(object_key(old), now)
            return
        key = object_key(new)
        self.created.setdefault(key, now)
        self.gang.setdefault(key, ((new["metadata"].get("labels") or {}).get(GANG_LABEL, "")))
        if new["metadata"].get("deletionTimestamp"):
            self.gone.setdefault(key, now)
        node = (new.get("spec") or {}).get("nodeName")
        if node:
            self.bound.setdefault(key, now)
            self.node.setdefault(key, node)
        if (new.get("status") or {}).get("phase") == "Running":
            self.running.setdefault(key, now)

    def _on_workload(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is not None and wls.is_true(new, wls.ADMITTED):
            self.admitted.setdefault(object_key(new), time.monotonic())

    def live_pods(self) -> int:
        return len(self.pods)

    def path_figures(self, started: float, jobs: int) -> dict[str, Any]:
        """How far the whole path got and when, from `started`, for `jobs` Jobs: what a
        Muster scenario and its floor report alike."""
        all_bound = last(self.bound, started)
        all_running = last(self.running, started)
        return {
            "admitted": len(self.admitted),
            "bound": len(self.bound),
            "all_admitted_seconds": last(self.admitted, started),
            "all_pods_created_seconds": last(self.created, started),
            "all_bound_seconds": all_bound,
            "all_running_seconds": all_running,
            "pods_bound_per_second": round(len(self.bound) / all_bound, 1) if all_bound else None,
            "steady_pods_bound_per_second": steady_rate(self.bound.values()),
            "steady_admissions_per_second": steady_rate(self.admitted.values()),
            "jobs_running_per_second": round(jobs / all_running, 1) if all_running else None,
        }


def last(times: Mapping[str, float], started: float) -> float | None:
    return round(max(times.values()) - started, 2) if times else None


def steady_rate(times: Iterable[float]) -> float | None:
    """Events per second between the 10th and the 90th percentile of their times: the rate
    once the stream is going, without the ramp-up and the tail."""
    ordered = sorted(times)
    if len(ordered) < 20:
        return None
    a, b = ordered[len(ordered) // 10], ordered[len(ordered) * 9 // 10]
    return round((len(ordered) * 8 // 10) / (b - a), 1) if b > a else None


# --------------------------------------------------------------------------- metrics
def scheduler_metrics(cluster: Cluster, *prefixes: str) -> metrics.Scrape:
    """kube-scheduler's metrics whose names start with `prefixes` (only on a local cluster,
    whose admin certificate reads them)."""
    return metrics.fetch(
        cluster.metrics_url("kube-scheduler"), cluster.ssl_context(), metrics.starting(*prefixes)
    )


def apiserver_metrics(cluster: Cluster) -> metrics.Scrape:
    """Webhook latency, and the latency of every request."""
    return metrics.fetch(
        cluster.metrics_url("kube-apiserver"),
        cluster.ssl_context(),
        metrics.starting(WEBHOOK_METRIC, REQUEST_METRIC),
    )


def histogram(before: metrics.Scrape, after: metrics.Scrape, name: str) -> list[dict[str, Any]]:
    """Per label set (without `le`): count, mean and estimated p50/p99 of what a
    Prometheus histogram recorded between two scrapes."""
    out = []
    for labels, h in sorted(metrics.histograms(before, after, name).items()):
        count = int(h.count)
        if count <= 0:
            continue
        out.append(
            {
                "labels": ",".join(f"{k}={v}" for k, v in labels),
                "count": count,
                "mean_ms": round(1000 * h.sum / count, 2),
                "p50_ms": h.quantile_ms(0.5),
                "p99_ms": h.quantile_ms(0.99),
            }
        )
    return out


def api_latency(before: metrics.Scrape, after: metrics.Scrape) -> dict[str, Any]:
    """Admission webhook calls and write requests (by resource and verb, 20 or more) that the
    apiserver served between two scrapes: count, mean, p50, p99."""
    out: dict[str, Any] = {}
    for row in histogram(before, after, WEBHOOK_METRIC):
        labels = dict(kv.split("=", 1) for kv in row.pop("labels").split(",") if kv)
        out[f"webhook {labels.get('name', '?')} {labels.get('operation', '')}"] = row
    for row in histogram(before, after, REQUEST_METRIC):
        labels = dict(kv.split("=", 1) for kv in row.pop("labels").split(",") if kv)
        if row["count"] < 20 or labels.get("verb") not in WRITE_VERBS:
            continue
        what = labels.get("resource", "?")
        if labels.get("group") not in ("", None, "batch", "coordination.k8s.io"):
            what += "." + labels["group"]  # muster.dev and scheduling.k8s.io both have PodGroups
        if labels.get("subresource"):
            what += "/" + labels["subresource"]
        key = f"{labels.get('verb', '?')} {what}"
        if key in out:  # the same request under another label (scope, version)
            continue
        out[key] = row
    return out


def writes_per_group(cpu: Mapping[str, Any], groups: int) -> float | None:
    """Write requests the apiserver served per group during the scenario, by anyone (node
    Leases and node status left out: they are the nodes', not the workload's)."""
    api = cpu.get("api_latency") or {}
    writes = sum(
        row["count"]
        for key, row in api.items()
        if not key.startswith("webhook") and "leases" not in key and "nodes" not in key
    )
    return round(writes / groups, 1) if api and groups else None


@dataclass
class CpuMeter:
    """CPU seconds spent during a scenario: cluster processes, this process by thread, and
    the kubectl processes this one ran."""

    cluster: Cluster
    started: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    threads: dict[str, float] = field(default_factory=dict)
    process: float = 0.0
    children: float = 0.0
    api: metrics.Scrape = field(default_factory=dict)

    def start(self) -> None:
        self.api = apiserver_metrics(self.cluster)
        self.started = time.monotonic()
        self.components = meter.processes_cpu(self.cluster.component_pids())
        self.threads = meter.thread_cpu()
        self.process = time.process_time()
        self.children = meter.children_cpu()

    def stop(self) -> dict[str, Any]:
        wall = time.monotonic() - self.started
        components = {
            k: round(v - self.components.get(k, 0.0), 1)
            for k, v in meter.processes_cpu(self.cluster.component_pids()).items()
        }
        process = time.process_time() - self.process
        threads = {k: v - self.threads.get(k, 0.0) for k, v in meter.thread_cpu().items()}
        threads = {k: round(v, 1) for k, v in threads.items() if v >= 0.05}
        threads["(threads that ended: webhook requests, ...)"] = round(
            max(0.0, process - sum(threads.values())), 1
        )
        api = api_latency(self.api, apiserver_metrics(self.cluster))
        return {
            "api_latency": api,
            "wall_seconds": round(wall, 1),
            "cluster_processes": components,
            "kubectl": round(meter.children_cpu() - self.children, 1),
            "this_process": round(process, 1),
            "this_process_threads": dict(sorted(threads.items(), key=lambda kv: -kv[1])),
        }


# --------------------------------------------------------------------------- Muster timers
class Timers:
    """Durations of the controller's loop steps, by wrapping them in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.samples: defaultdict[str, list[float]] = defaultdict(list)
        self.counts: Counter[str] = Counter()

    def reset(self) -> None:
        with self._lock:
            self.samples.clear()
            self.counts.clear()

    def wrap(self, name: str, fn: F, count: Callable[..., int] | None = None) -> F:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                with self._lock:
                    self.samples[name].append(elapsed)
                    if count is not None:
                        self.counts[name] += count(*args, **kwargs)

        return cast(F, timed)

    def install(self, manager: Manager) -> None:
        """Scheduler loop: one pass (collect the groups, build the node view, decide each
        group, bind, tell); admission loop: one cycle (view, engine, writes)."""
        # The loops call these through their modules' names: wrap them there.
        for module, attr, label in (
            (scheduler_loop, "decide", "scheduler: decide (per group)"),
            (scheduler_loop, "collect", "scheduler: collect groups"),
            (scheduler_loop, "build_view", "scheduler: build node view"),
            (admission_loop, "admission_cycle", "admission: engine cycle"),
        ):
            setattr(module, attr, self.wrap(label, getattr(module, attr)))
        sched = manager.scheduler
        assert sched is not None
        # Each loop's pacer holds the bound method it runs: wrap it there.
        sched.pacer.run_once = self.wrap("scheduler: pass", sched.pacer.run_once)
        sched.binds.bind = self.wrap(  # type: ignore[method-assign]
            "scheduler: bind (per pass)",
            sched.binds.bind,
            count=lambda binds, *_a, **_k: len(binds),
        )
        sched._tell = self.wrap("scheduler: tell", sched._tell)  # type: ignore[method-assign]
        loop = manager.loop
        loop.pacer.run_once = self.wrap("admission: cycle", loop.pacer.run_once)
        loop.views.build = self.wrap("admission: build view", loop.views.build)  # type: ignore[method-assign]
        loop.writer.carry_out = self.wrap("admission: carry out", loop.writer.carry_out)  # type: ignore[method-assign]

    def summary(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for name, values in sorted(self.samples.items()):
                ordered = sorted(values)
                row = {
                    "calls": len(values),
                    "total_s": round(sum(values), 2),
                    "median_ms": round(1000 * statistics.median(ordered), 3),
                    "p99_ms": round(1000 * percentile(ordered, 99), 3),
                    "max_ms": round(1000 * ordered[-1], 1),
                }
                if name in self.counts:
                    row["items"] = self.counts[name]
                out[name] = row
        return out


# --------------------------------------------------------------------------- profiler
# Innermost frames that mean the thread is blocked (waiting on a lock, a queue or a socket).
_WAITING_FILES = (
    "threading.py",
    "socket.py",
    "ssl.py",
    "selectors.py",
    "queue.py",
    "thread.py",
    "util/wait.py",
)


class Sampler:
    """A stack sampler over this process's threads: every `interval`, for each thread that
    is not blocked (its innermost frame is not a wait in threading/socket/ssl/queue), count
    the repository functions on its stack (inclusive) and the innermost frame (self)."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.inclusive: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.leaf: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.samples: Counter[str] = Counter()
        self.busy: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            names = {t.ident: meter.thread_group(t.name) for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                group = names.get(ident, "?")
                if group.startswith(("bench", "MainThread")):
                    continue
                self.samples[group] += 1
                if frame.f_code.co_filename.endswith(_WAITING_FILES):
                    continue
                self.busy[group] += 1
                self.leaf[group][_where(frame)] += 1
                seen: set[str] = set()
                f: FrameType | None = frame
                while f is not None:
                    filename = f.f_code.co_filename
                    if "/controllers/" in filename or "/quota/" in filename:
                        seen.add(_where(f))
                    f = f.f_back
                for name in seen:
                    self.inclusive[group][name] += 1

    def report(self, top: int = 25) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for group, busy in self.busy.most_common():
            if busy < 10:
                continue
            out[group] = {
                "busy_share": round(busy / self.samples[group], 2),
                "inclusive": {
                    k: round(v / busy, 3) for k, v in self.inclusive[group].most_common(top)
                },
                "self": {k: round(v / busy, 3) for k, v in self.leaf[group].most_common(top)},
            }
        return out


def _where(frame: FrameType) -> str:
    path = frame.f_code.co_filename
    for root in ("/controllers/", "/quota/", "/site-packages/", "/lib/python3"):
        if root in path:
            path = path.split(root, 1)[1]
            if root in ("/controllers/", "/quota/"):
                path = root.strip("/") + "/" + path
            break
    return f"{path}:{frame.f_code.co_name}"


# --------------------------------------------------------------------------- scenarios
@dataclass
class Env:
    args: argparse.Namespace
    cluster: Cluster
    reader: Kube
    manager: Manager | None = None
    timers: Timers | None = None
    profile: bool = False

    @property
    def kc(self) -> str:
        return self.cluster.kc

    @property
    def kubeconfig(self) -> str:
        return self.cluster.kubeconfig


def delete_and_wait(env: Env, tracker: Tracker, namespace: str) -> float:
    """Delete the scenario's objects and namespace; wait until its pods are gone. The Jobs
    first, so that no pod is made again, then every pod in one request (the namespace
    controller alone takes minutes for thousands of pods). Returns seconds."""
    started = time.monotonic()
    root = logging.getLogger()
    level = root.level
    # The controller's writes into the terminating namespace are refused: expected, unlogged.
    root.setLevel(logging.CRITICAL)
    api = env.reader.api_client
    steps: list[Callable[[], Any]] = [
        lambda: client.BatchV1Api(api).delete_collection_namespaced_job(
            namespace, propagation_policy="Background", _preload_content=False
        ),
        lambda: client.CoreV1Api(api).delete_collection_namespaced_pod(
            namespace, grace_period_seconds=0, _preload_content=False
        ),
        lambda: client.CoreV1Api(api).delete_namespace(namespace, _preload_content=False),
    ]
    try:
        for step in steps:
            try:
                step()
            except ApiException as error:
                # A collection of thousands may outlast the request's timeout (504) while
                # the apiserver goes on deleting; the wait below is what counts.
                print(f"warning: cleanup of {namespace}: HTTP {error.status}", file=sys.stderr)
        wait_or_warn(
            f"pods of {namespace} to go", lambda: tracker.live_pods() == 0, env.args.timeout
        )
    finally:
        root.setLevel(level)
    return round(time.monotonic() - started, 1)


def delete_nodes(env: Env, pool: str) -> float:
    """Delete the pool's nodes and wait until they are gone. Returns seconds.

    One deletecollection request per round: the apiserver stops deleting when the request
    times out (504 after 60 s, about 4,000 nodes here), so rounds go on until none is left."""
    started = time.monotonic()
    selector = f"{POOL_LABEL}={pool}"
    core = client.CoreV1Api(env.reader.api_client)

    def gone() -> bool:
        if not env.reader.list(NODE, label_selector=selector)[0]:
            return True
        try:
            core.delete_collection_node(label_selector=selector, _preload_content=False)
        except ApiException as error:
            print(f"warning: deleting nodes of {pool}: HTTP {error.status}", file=sys.stderr)
        return False

    wait_or_warn(f"nodes of {pool} to go", gone, env.args.timeout, every=2.0)
    return round(time.monotonic() - started, 1)


def guarded(name: str, scenario: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a scenario; a failure is reported in its place and the next one still runs."""
    try:
        return scenario()
    except Exception as error:
        print(f"scenario {name} failed: {repr(error)[:2000]}", file=sys.stderr)
        return {"scenario": name, "error": repr(error)[:500]}


def done(result: dict[str, Any]) -> dict[str, Any]:
    """Print a finished scenario's figures at once, to stderr (a later failure keeps them)."""
    print(json.dumps(result), file=sys.stderr, flush=True)
    return result


def open_namespace(env: Env, namespace: str, queue: Sequence[Obj] | None) -> None:
    """A scenario's namespace: bare for kube-scheduler (no `queue`); for Muster made with its
    queue objects, the controller started first."""
    if queue is None:
        kubectl(env.kc, env.kubeconfig, "create", "namespace", namespace)
        return
    if env.manager is None:
        env.manager = start_manager(env)
    env.cluster.apply(queue)
    time.sleep(2.0)  # the queues reach the caches


def run_native(env: Env, pool: str, *, cleanup: bool = True) -> dict[str, Any]:
    args = env.args
    tag = run_tag()
    namespace = f"bench-native-{tag}"
    open_namespace(env, namespace, None)
    tracker = Tracker(env.reader, tag, namespace, workloads=False)
    tracker.start()
    docs = native_docs(args.gangs, namespace, tag, pool)
    pods = args.gangs * GANG_SIZE
    cpu_meter = CpuMeter(env.cluster)
    before = scheduler_metrics(env.cluster, *PODGROUP_METRICS)
    cpu_meter.start()
    started = time.monotonic()
    create_all(env.kc, env.kubeconfig, docs)
    created = time.monotonic() - started
    wait_or_warn("native pods bound", lambda: len(tracker.bound) >= pods, args.timeout)
    wait_or_warn("native pods Running", lambda: len(tracker.running) >= pods, 120)
    cpu = cpu_meter.stop()
    after = scheduler_metrics(env.cluster, *PODGROUP_METRICS)
    podgroups = {name: histogram(before, after, name) for name in PODGROUP_METRICS}
    all_bound = last(tracker.bound, started)
    result = {
        "scenario": "native",
        "scheduler": "kube-scheduler 1.37 (GenericWorkload, PodGroup gang minCount 3)",
        "groups": args.gangs,
        "pods": pods,
        "bound": len(tracker.bound),
        "create_seconds": round(created, 2),
        "all_pods_created_seconds": last(tracker.created, started),
        "all_bound_seconds": all_bound,
        "all_running_seconds": last(tracker.running, started),
        "pods_bound_per_second": round(len(tracker.bound) / all_bound, 1) if all_bound else None,
        "steady_pods_bound_per_second": steady_rate(tracker.bound.values()),
        "api_writes_per_group": writes_per_group(cpu, args.gangs),
        "scheduler_metrics": podgroups
        if env.cluster.metrics_url("kube-scheduler")
        else "not available (kube-scheduler's /metrics is read only on a local cluster)",
        "cpu": cpu,
    }
    done(result)
    if cleanup:
        result["cleanup_seconds"] = delete_and_wait(env, tracker, namespace)
    tracker.stop()
    return result


def start_manager(env: Env) -> Manager:
    setup_logging("warning")
    # Events to a namespace being deleted (each scenario's cleanup) are refused: expected.
    logging.getLogger("controllers.runtime.events").setLevel(logging.ERROR)
    env.timers = Timers()
    return start_controller(
        api_client(env.kubeconfig),
        prepare=env.timers.install,
        settle=2.0,
        workers=env.args.workers,
        bind_workers=env.args.bind_workers,
    )


SCENARIO_PATHS = {
    "muster": "Muster (webhook, admission with placement, Job controller, scheduler loop, "
    "pods/binding)",
    "muster-pg": "Muster (PodGroup intake, admission with placement, scheduler loop, pods/binding)",
}
# What a Muster scenario creates, given its namespace and run tag.
Docs = Callable[[str, str], list[Obj]]


def run_muster(
    env: Env,
    name: str,
    pool: str,
    jobs: int,
    pods_per_job: int,
    quota: Mapping[str, str],
    make_docs: Docs,
    *,
    cleanup: bool = True,
) -> dict[str, Any]:
    """`jobs` groups of `pods_per_job` pods (`make_docs`) through the whole path: Workload,
    admission, the Job controller (for Jobs), Muster's scheduler loop, kwok. Without
    `cleanup` the objects are left for the cluster's deletion to take."""
    args = env.args
    tag = run_tag()
    namespace = f"bench-{name}-{tag}"
    open_namespace(env, namespace, queue_docs(pool, namespace, quota))
    assert env.manager is not None and env.timers is not None
    timers = env.timers
    tracker = Tracker(env.reader, tag, namespace, workloads=True)
    tracker.start()
    docs = make_docs(namespace, tag)
    pods = jobs * pods_per_job
    bound_before = env.manager.scheduler.bound if env.manager.scheduler else 0
    passes_before = env.manager.scheduler.passes if env.manager.scheduler else 0
    cycles_before = env.manager.loop.cycles
    timers.reset()
    cpu_meter = CpuMeter(env.cluster)
    cpu_meter.start()
    sampler = Sampler() if env.profile else None
    if sampler is not None:
        sampler.start()
    started = time.monotonic()
    create_all(env.kc, env.kubeconfig, docs)
    created = time.monotonic() - started
    wait_or_warn(f"{name} Jobs admitted", lambda: len(tracker.admitted) >= jobs, args.timeout)
    wait_or_warn(f"{name} pods bound", lambda: len(tracker.bound) >= pods, args.timeout)
    wait_or_warn(f"{name} pods Running", lambda: len(tracker.running) >= pods, 300)
    cpu = cpu_meter.stop()
    profile = None
    if sampler is not None:
        sampler.stop()
        profile = sampler.report()
    sched = env.manager.scheduler
    loop_times = timers.summary()
    decide = loop_times.get("scheduler: decide (per group)", {})
    result = {
        "scenario": name,
        "scheduler": SCENARIO_PATHS.get(name, SCENARIO_PATHS["muster"]),
        "groups": jobs,
        "pods": pods,
        "create_seconds": round(created, 2),
        **tracker.path_figures(started, jobs),
        "api_writes_per_group": writes_per_group(cpu, jobs),
        "decide_median_ms": decide.get("median_ms"),
        "decide_p99_ms": decide.get("p99_ms"),
        "scheduler_passes": (sched.passes if sched else 0) - passes_before,
        "scheduler_bound": (sched.bound if sched else 0) - bound_before,
        "admission_cycles": env.manager.loop.cycles - cycles_before,
        "loop_steps": loop_times,
        "cpu": cpu,
    }
    if profile is not None:
        result["profile"] = profile
    done(result)
    if cleanup:
        result["cleanup_seconds"] = delete_and_wait(env, tracker, namespace)
    tracker.stop()
    return result


# --------------------------------------------------------------------------- preemption
# scheduler_perf's GangPreemption shape: nodes of NODE_CPU cpu full of low-priority gangs of
# one-cpu pods, then one high-priority gang that fits only once enough of them are gone.
NODE_CPU = 4
LOW_PRIORITY = 1000
HIGH_PRIORITY = 9999999
PREEMPTION_METRICS = ("scheduler_podgroup_preemption", "scheduler_preemption_")


def priority_class_docs(tag: str) -> tuple[str, str, list[Obj]]:
    """The low and the high class; only the high one may preempt."""
    low, high = f"bench-low-{tag}", f"bench-high-{tag}"
    docs: list[Obj] = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "preemptionPolicy": policy,
        }
        for name, value, policy in (
            (low, LOW_PRIORITY, "Never"),
            (high, HIGH_PRIORITY, "PreemptLowerPriority"),
        )
    ]
    return low, high, docs


def one_cpu_pod_spec(priority_class: str) -> Obj:
    spec = pod_spec(cpu="1")
    spec["priorityClassName"] = priority_class
    return spec


def conditions(obj: Obj | None) -> list[dict[str, Any]]:
    return [
        {k: c.get(k) for k in ("type", "status", "reason", "message") if c.get(k)}
        for c in ((obj or {}).get("status") or {}).get("conditions") or []
    ]


def get_json(env: Env, *args: str) -> Obj:
    found = kubectl(env.kc, env.kubeconfig, "get", *args, "-o", "json", check=False)
    if found.returncode != 0:
        return {"error": found.stderr.strip()[:500]}
    return cast(Obj, json.loads(found.stdout))


def group_conditions(env: Env, native: bool, namespace: str, gang: str) -> Any:
    """What the scheduler says about a gang: its PodGroup's conditions (kube-scheduler) or its
    Job's Workload's (Muster), or why they could not be read."""
    found = (
        get_json(env, "podgroups.scheduling.k8s.io", gang, "-n", namespace)
        if native
        else get_json(
            env, "workloads.muster.dev", "-n", namespace, "-l", f"{JOB_NAME_LABEL}={gang}"
        )
    )
    items = found.get("items")
    return conditions(items[0] if items else found) or found.get("error")


def run_preemption(env: Env, native: bool, pool: str) -> dict[str, Any]:
    """Fill the pool with low gangs, then time one high gang from its create to every pod
    bound, and count the victims: by kube-scheduler (native PodGroups, bare pods) or by
    Muster (queued Jobs, a queue that preempts within itself)."""
    args = env.args
    name = "preemption-native" if native else "preemption-muster"
    tag = run_tag()
    namespace = f"bench-{name}-{tag}"
    low, high, classes = priority_class_docs(tag)
    create_all(env.kc, env.kubeconfig, classes)
    nodes = args.preemption_nodes
    size = args.low_gang_pods
    low_gangs = nodes * NODE_CPU // size
    # Preemption within the queue by priority; quota ten times the nodes never binds.
    quota = {"cpu": str(10 * nodes * NODE_CPU), "memory": "10Ti"}
    open_namespace(
        env,
        namespace,
        None if native else queue_docs(pool, namespace, quota, {"withinQueue": "LowerPriority"}),
    )

    def make(name: str, pods: int, priority_class: str) -> list[Obj]:
        spec = one_cpu_pod_spec(priority_class)
        if not native:
            return [muster_job(name, pods, namespace, tag, spec)]
        group = {"disruptionMode": {"all": {}}, "priorityClassName": priority_class}
        return native_gang_docs(name, pods, namespace, tag, pool, spec, group)

    tracker = Tracker(env.reader, tag, namespace, workloads=False)
    tracker.start()
    gangs = [f"low-{g:03d}" for g in range(low_gangs)]

    def bound_of(prefix: str) -> int:
        return sum(1 for k in tracker.bound if tracker.gang.get(k, "").startswith(prefix))

    t = time.monotonic()
    create_all(
        env.kc,
        env.kubeconfig,
        [d for g in gangs for d in make(g, size, low)],
    )
    if not wait_or_warn("low gangs", lambda: bound_of("low-") >= low_gangs * size, args.timeout):
        raise TimeoutError(f"{bound_of('low-')} of {low_gangs * size} low-priority pods bound")
    filled = round(time.monotonic() - t, 1)
    low_pods = {k for k in tracker.bound if tracker.gang.get(k, "").startswith("low-")}
    before = scheduler_metrics(env.cluster, *PREEMPTION_METRICS)
    cpu_meter = CpuMeter(env.cluster)
    cpu_meter.start()
    started = time.monotonic()
    create_all(env.kc, env.kubeconfig, make("high", args.preemptor_pods, high))
    all_bound = wait_or_warn(
        "the preemptor gang bound",
        lambda: bound_of("high") >= args.preemptor_pods,
        args.preemption_timeout,
    )
    preemptor_bound = [t for k, t in tracker.bound.items() if tracker.gang.get(k) == "high"]
    time.sleep(5.0)  # victims' controllers (if any) make their pods again, if they would
    cpu = cpu_meter.stop()
    after = scheduler_metrics(env.cluster, *PREEMPTION_METRICS)
    lost = Counter(tracker.gang[k] for k in low_pods if tracker.gone.get(k, 0.0) >= started)
    live = tracker.pods.objects()
    pending_low = sum(
        1
        for p in live
        if tracker.gang.get(object_key(p), "").startswith("low-")
        and not p["metadata"].get("deletionTimestamp")
        and not (p.get("spec") or {}).get("nodeName")
    )
    recreated = sum(
        1
        for k, t in tracker.created.items()
        if t >= started and tracker.gang.get(k, "").startswith("low-")
    )
    result: dict[str, Any] = {
        "scenario": name,
        "scheduler": "kube-scheduler 1.37 (GenericWorkload, PodGroup gang, disruptionMode all)"
        if native
        else "Muster (queued Jobs, withinQueue LowerPriority)",
        "nodes": f"{nodes} x {NODE_CPU} cpu",
        "low_gangs": f"{low_gangs} x {size} pods x 1 cpu, priority {LOW_PRIORITY}",
        "preemptor": f"1 x {args.preemptor_pods} pods x 1 cpu, priority {HIGH_PRIORITY}",
        "low_gangs_bound_seconds": filled,
        "preemptor_pods_bound": len(preemptor_bound),
        "preemptor_all_bound_seconds": round(max(preemptor_bound) - started, 2)
        if all_bound and preemptor_bound
        else None,
        "victim_gangs": len(lost),
        "victim_gangs_partly_evicted": sorted(g for g, n in lost.items() if n < size),
        "victim_pods_evicted": sum(lost.values()),
        "low_pods_pending_after": pending_low,
        "low_pods_recreated_after": recreated,
        "cpu": cpu,
    }
    if env.cluster.metrics_url("kube-scheduler") and native:
        result["kube_scheduler_preemption_metrics"] = metrics.counter_deltas(before, after)
    if native:
        groups = get_json(env, "podgroups.scheduling.k8s.io", "-n", namespace)
        result["podgroups_with_disruption_target"] = sorted(
            g["metadata"]["name"]
            for g in groups.get("items") or []
            if any(c.get("type") == "DisruptionTarget" for c in conditions(g))
        )
    if not all_bound:
        # What the scheduler says about the preemptor: its group and one pod still waiting.
        waiting = next(
            (
                p
                for p in live
                if tracker.gang.get(object_key(p)) == "high"
                and not (p.get("spec") or {}).get("nodeName")
            ),
            None,
        )
        result["preemptor_not_bound"] = {
            "timeout_seconds": args.preemption_timeout,
            "group_conditions": group_conditions(env, native, namespace, "high"),
            "waiting_pod": object_key(waiting) if waiting else None,
            "waiting_pod_conditions": conditions(waiting),
        }
    done(result)
    result["cleanup_seconds"] = delete_and_wait(env, tracker, namespace)
    tracker.stop()
    kubectl(env.kc, env.kubeconfig, "delete", "priorityclass", low, high, check=False)
    return result


def preemption_table(report: Mapping[str, Any]) -> str:
    header = (
        "scheduler",
        "victim gangs",
        "partly evicted",
        "pods evicted",
        "preemptor bound",
        "all bound s",
        "low pending after",
        "low recreated",
    )

    def row(r: Mapping[str, Any]) -> tuple[str, ...]:
        return (
            r["scenario"],
            str(r["victim_gangs"]),
            ", ".join(r["victim_gangs_partly_evicted"]) or "none",
            str(r["victim_pods_evicted"]),
            str(r["preemptor_pods_bound"]),
            str(r["preemptor_all_bound_seconds"]),
            str(r["low_pods_pending_after"]),
            str(r["low_pods_recreated_after"]),
        )

    return scenario_table(header, report, row)


def topology_table(report: Mapping[str, Any]) -> str:
    header = (
        "scheduler",
        "gangs (pods)",
        "whole in one rack",
        "over several racks",
        "racks used / untouched",
        "create s",
        "every pod created s",
        "every pod bound s",
        "steady bound/s",
        "per group (ms)",
    )

    def row(r: Mapping[str, Any]) -> tuple[str, ...]:
        if "decide" in r:
            d = r["decide"]
            per_group = f"decide median {d.get('median_ms')}, p99 {d.get('p99_ms')}"
        else:
            seen = r["kube_scheduler_metrics"]
            scheduled = [h for h in seen["attempt"] if "result=scheduled" in h["labels"]]
            feasible = [h for h in seen["placement_evaluation"] if "result=feasible" in h["labels"]]
            per_group = ", ".join(
                [f"attempt mean {h['mean_ms']}" for h in scheduled]
                + [f"one rack evaluated mean {h['mean_ms']}" for h in feasible]
            )
        return (
            r["scenario"],
            f"{r['groups']} ({r['pods']})",
            f"{r['gangs_in_one_rack']} ({100 * r['share_in_one_rack']:.0f} %)",
            str(r["gangs_over_several_racks"]),
            f"{r['racks_used']} / {r['racks_untouched']}",
            str(r["create_seconds"]),
            str(r["all_pods_created_seconds"]),
            str(r["all_bound_seconds"]),
            str(r["steady_pods_bound_per_second"]),
            per_group or "n/a",
        )

    return scenario_table(header, report, row)


def scenario_table(
    header: Sequence[str],
    report: Mapping[str, Any],
    row: Callable[[Mapping[str, Any]], Sequence[str]],
) -> str:
    """A row per scenario (a failed one says so, and why)."""
    rows = [
        (r["scenario"], "failed", r["error"][:60], *[""] * (len(header) - 3))
        if "error" in r
        else row(r)
        for r in report["scenarios"]
    ]
    return render(header, rows)


# --------------------------------------------------------------------------- topology
# Issue 30's side by side: blocks of racks of 8-GPU nodes, and one stream of gangs each of
# which must have all its pods inside one rack.
BLOCK_LABEL = "muster-bench/block"
RACK_LABEL = "muster-bench/rack"
NODE_GPUS = 8
POD_GPUS = 2
TOPOLOGY_METRICS = (
    "scheduler_podgroup_scheduling_attempt_duration_seconds",
    "scheduler_placement_evaluation_duration_seconds",
    "scheduler_generated_placements_total",
    "scheduler_placement_evaluations_total",
)


@dataclass(frozen=True)
class Fabric:
    """`blocks` x `racks` (per block) x `nodes` (per rack) nodes of 8 GPUs, 64 cpu, 512Gi;
    node i is in rack i // nodes."""

    blocks: int
    racks: int
    nodes: int

    @property
    def count(self) -> int:
        return self.blocks * self.racks * self.nodes

    def labels(self, i: int) -> dict[str, str]:
        """Node i's block and rack labels."""
        rack = i // self.nodes
        block = rack // self.racks
        return {BLOCK_LABEL: f"b{block}", RACK_LABEL: f"b{block}-r{rack % self.racks}"}

    def gang_sizes(self, fill: float) -> list[int]:
        """Pods of POD_GPUS GPUs per gang: an eighth, a quarter and half of a rack in turn,
        until the next would take the gangs past `fill` of the cluster's GPUs."""
        per_rack = self.nodes * NODE_GPUS // POD_GPUS
        cycle = [max(1, per_rack // 8), max(1, per_rack // 4), max(1, per_rack // 2)]
        room = fill * self.count * NODE_GPUS / POD_GPUS
        sizes: list[int] = []
        while sum(sizes) + cycle[len(sizes) % 3] <= room:
            sizes.append(cycle[len(sizes) % 3])
        return sizes


def rack_spread(
    gangs: Mapping[str, int],
    gang_of: Mapping[str, str],
    node_of: Mapping[str, str],
    rack_of: Mapping[str, str],
) -> dict[str, Any]:
    """Where the gangs landed: how many had every pod bound, how many of those inside one
    rack, how many had bound pods in more than one, and the racks they used."""
    racks: defaultdict[str, set[str]] = defaultdict(set)
    bound: Counter[str] = Counter()
    for pod, node in node_of.items():
        gang = gang_of.get(pod, "")
        racks[gang].add(rack_of[node])
        bound[gang] += 1
    whole = [g for g, pods in gangs.items() if bound[g] >= pods]
    in_one = sum(1 for g in whole if len(racks[g]) == 1)
    used = set().union(*racks.values())
    return {
        "gangs": len(gangs),
        "gangs_all_bound": len(whole),
        "gangs_in_one_rack": in_one,
        "share_in_one_rack": round(in_one / len(gangs), 3) if gangs else None,
        "gangs_over_several_racks": sum(1 for g in gangs if len(racks[g]) > 1),
        "most_racks_of_one_gang": max((len(r) for r in racks.values()), default=0),
        "racks_used": len(used),
        "racks_untouched": len(set(rack_of.values()) - used),
    }


def run_topology(
    env: Env, native: bool, pool: str, fabric: Fabric, topology: str
) -> dict[str, Any]:
    """One stream of gangs, each requiring one rack, created at once and timed from the
    first create to every pod bound; then where each gang landed. kube-scheduler: native
    PodGroups (gang minCount = pods, `schedulingConstraints.topology` on the rack label) and
    bare pods. Muster: Jobs whose pod template asks for one rack
    (`muster.dev/podset-required-topology`) in a queue whose flavor names the Topology."""
    args = env.args
    name = "topology-native" if native else "topology-muster"
    tag = run_tag()
    namespace = f"bench-{name}-{tag}"
    n = fabric.count
    quota = {GPU: str(n * NODE_GPUS), "cpu": str(n * 64), "memory": f"{n * 512}Gi"}
    open_namespace(
        env, namespace, None if native else queue_docs(pool, namespace, quota, topology=topology)
    )
    spec = pod_spec(cpu=args.pod_cpu, memory=args.pod_memory, gpu=POD_GPUS)
    gangs = {f"gang-{g:04d}": size for g, size in enumerate(fabric.gang_sizes(args.fill))}
    if native:
        group = {"schedulingConstraints": {"topology": [{"key": RACK_LABEL}]}}
        docs = [
            doc
            for gang, size in gangs.items()
            for doc in native_gang_docs(gang, size, namespace, tag, pool, spec, group)
        ]
    else:
        ask = {REQUIRED_TOPOLOGY_ANNOTATION: RACK_LABEL}
        docs = [muster_job(gang, size, namespace, tag, spec, ask) for gang, size in gangs.items()]
    pods = sum(gangs.values())
    tracker = Tracker(env.reader, tag, namespace, workloads=not native)
    tracker.start()
    if env.timers is not None:
        env.timers.reset()
    before = scheduler_metrics(env.cluster, *TOPOLOGY_METRICS)
    cpu_meter = CpuMeter(env.cluster)
    cpu_meter.start()
    started = time.monotonic()
    create_all(env.kc, env.kubeconfig, docs)
    created = time.monotonic() - started
    all_bound = wait_or_warn(
        f"{name}: every pod bound", lambda: len(tracker.bound) >= pods, args.topology_timeout
    )
    cpu = cpu_meter.stop()
    after = scheduler_metrics(env.cluster, *TOPOLOGY_METRICS)
    rack_of = {f"{pool}-{i}": fabric.labels(i)[RACK_LABEL] for i in range(n)}
    result: dict[str, Any] = {
        "scenario": name,
        "scheduler": "kube-scheduler 1.37 (TopologyAwareWorkloadScheduling, PodGroup gang)"
        if native
        else "Muster (Jobs, required-topology annotation, flavor naming the Topology)",
        "fabric": f"{fabric.blocks} blocks x {fabric.racks} racks x {fabric.nodes} nodes",
        "pod": f"{POD_GPUS} GPUs, {args.pod_cpu} cpu, {args.pod_memory}",
        "groups": len(gangs),
        "pods": pods,
        "bound": len(tracker.bound),
        **rack_spread(gangs, tracker.gang, tracker.node, rack_of),
        "create_seconds": round(created, 2),
        "all_admitted_seconds": None if native else last(tracker.admitted, started),
        "all_pods_created_seconds": last(tracker.created, started),
        "all_bound_seconds": last(tracker.bound, started) if all_bound else None,
        "steady_pods_bound_per_second": steady_rate(tracker.bound.values()),
        "api_writes_per_group": writes_per_group(cpu, len(gangs)),
        "cpu": cpu,
    }
    if native:
        # The apiserver drops the constraint on create when its gate is off: say so.
        first = get_json(env, "podgroups.scheduling.k8s.io", next(iter(gangs)), "-n", namespace)
        kept = (first.get("spec") or {}).get("schedulingConstraints")
        result["constraint_as_stored"] = kept or "dropped by the apiserver"
        result["kube_scheduler_metrics"] = {
            "attempt": histogram(before, after, TOPOLOGY_METRICS[0]),
            "placement_evaluation": histogram(before, after, TOPOLOGY_METRICS[1]),
            "counters": metrics.counter_deltas(before, after),
        }
    else:
        assert env.timers is not None
        result["decide"] = env.timers.summary().get("scheduler: decide (per group)", {})
    if not all_bound:
        result["waiting"] = waiting_gangs(env, native, namespace, gangs, tracker)
    done(result)
    result["cleanup_seconds"] = delete_and_wait(env, tracker, namespace)
    tracker.stop()
    return result


def waiting_gangs(
    env: Env, native: bool, namespace: str, gangs: Mapping[str, int], tracker: Tracker
) -> dict[str, Any]:
    """The gangs not wholly bound, and what the scheduler says about the first of them."""
    bound = Counter(tracker.gang.get(k, "") for k in tracker.bound)
    waiting = [g for g, pods in gangs.items() if bound[g] < pods]
    if not waiting:
        return {}
    return {
        "gangs": len(waiting),
        "first": waiting[0],
        "first_conditions": group_conditions(env, native, namespace, waiting[0]),
    }


@contextlib.contextmanager
def cluster_env(args: argparse.Namespace) -> Iterator[Env]:
    """The cluster of `--kubeconfig`, or a fresh local one (deleted at the end, objects and
    all: no scenario's clean-up is needed for it), with Muster's CRDs; the controller, if a
    scenario started it, is stopped at the end."""
    quiet = partial(quiet_nodes, heartbeat=args.node_heartbeat, lease=args.node_lease)
    with (
        tempfile.TemporaryDirectory(prefix="muster-sched-bench-stages-") as stages,
        running_cluster(
            args.kubeconfig,
            prefix="muster-sched-bench-",
            prepare=partial(quiet, stages=Path(stages)),
            keep=args.keep,
        ) as cluster,
    ):
        env = Env(
            args,
            cluster,
            Kube(api_client(cluster.kubeconfig, pool_size=8)),
            profile=args.profile,
        )
        cluster.install_crds()
        try:
            yield env
        finally:
            if env.manager is not None:
                stop_manager(env.manager)


def timed_setup(setup: dict[str, float], what: str, step: Callable[[], object]) -> None:
    started = time.monotonic()
    step()
    setup[what] = round(time.monotonic() - started, 1)


def run_cpu_shapes(
    env: Env, scenarios: Sequence[str], setup: dict[str, float], keep_last: bool
) -> list[dict[str, Any]]:
    """preemption, topology, native, muster-pg and muster, in that order, on nodes made for
    them. The last scenario cleans up only when `keep_last` (the cluster outlives it)."""
    args, kc, kubeconfig = env.args, env.kc, env.kubeconfig
    results: list[dict[str, Any]] = []
    tag = run_tag()
    if "preemption" in scenarios:
        pool = f"pre-{tag}"
        count = args.preemption_nodes
        timed_setup(
            setup,
            f"{count} nodes created and Ready (s)",
            lambda: make_nodes(
                kc, kubeconfig, count, pool, env.reader, cpu=str(NODE_CPU), memory="32Gi"
            ),
        )
        # kube-scheduler first, before the controller starts: it costs it nothing.
        results.append(guarded("preemption-native", lambda: run_preemption(env, True, pool)))
        results.append(guarded("preemption-muster", lambda: run_preemption(env, False, pool)))
    if "topology" in scenarios:
        fabric = Fabric(args.blocks, args.racks, args.rack_nodes)
        pool = f"topo-{tag}"
        timed_setup(
            setup,
            f"{fabric.count} nodes created and Ready (s)",
            lambda: make_nodes(
                kc,
                kubeconfig,
                fabric.count,
                pool,
                env.reader,
                cpu="64",
                memory="512Gi",
                gpu=NODE_GPUS,
                labels=fabric.labels,
            ),
        )
        topology = f"fabric-{tag}"
        env.cluster.apply([objects.topology(topology, (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL))])
        # kube-scheduler first, before the controller starts: it costs it nothing.
        for name, native in (("topology-native", True), ("topology-muster", False)):
            results.append(
                guarded(name, partial(run_topology, env, native, pool, fabric, topology))
            )
    gangs = [s for s in ("native", "muster-pg", "muster") if s in scenarios]
    if not gangs:
        return results
    pool = f"cpu-{tag}"
    timed_setup(
        setup,
        f"{args.nodes} nodes created and Ready (s)",
        lambda: make_nodes(kc, kubeconfig, args.nodes, pool, env.reader, cpu="32", memory="256Gi"),
    )
    quota = {"cpu": str(args.nodes * 32), "memory": f"{args.nodes * 256}Gi"}
    for name in gangs:
        cleanup = keep_last or name != gangs[-1]
        if name == "native":
            results.append(guarded(name, partial(run_native, env, pool, cleanup=cleanup)))
            continue

        docs: Docs = (
            partial(muster_podgroup_docs, args.gangs, pool=pool)
            if name == "muster-pg"
            else partial(job_docs, args.gangs, GANG_SIZE)
        )
        results.append(
            guarded(
                name,
                partial(
                    run_muster, env, name, pool, args.gangs, GANG_SIZE, quota, docs, cleanup=cleanup
                ),
            )
        )
    if keep_last:  # the KAI shape follows on this cluster: its GPU nodes alone
        setup[f"{args.nodes} CPU nodes deleted (s)"] = delete_nodes(env, pool)
    return results


def gpu_pool(env: Env, nodes: int, setup: dict[str, float]) -> str:
    """`nodes` fresh 8-GPU kwok nodes; returns their pool."""
    pool = f"gpu-{uuid.uuid4().hex[:6]}"
    timed_setup(
        setup,
        f"{nodes} GPU nodes created and Ready (s)",
        lambda: make_nodes(
            env.kc, env.kubeconfig, nodes, pool, env.reader, cpu="64", memory="512Gi", gpu=NODE_GPUS
        ),
    )
    return pool


def gpu_quota(nodes: int, share: float = 1.0) -> dict[str, str]:
    """`share` of what `nodes` 8-GPU nodes hold."""
    return {
        GPU: str(int(nodes * NODE_GPUS * share)),
        "cpu": str(int(nodes * 64 * share)),
        "memory": f"{int(nodes * 512 * share)}Gi",
    }


def run_kai(env: Env, shape: str, setup: dict[str, float], cleanup: bool) -> dict[str, Any]:
    """One of KAI-Scheduler's scale-test shapes on its own 8-GPU nodes: `kai` fills them with
    one-GPU Jobs, `kai-distributed` with Jobs of `--distributed-pods` whole-node pods,
    `kai-reclaim` reclaims half of them for one large Job."""
    args = env.args
    if shape == "kai-reclaim":
        return guarded(shape, partial(run_reclaim, env, setup, cleanup=cleanup))
    if shape == "kai-floor":
        return guarded(shape, partial(run_kai_floor, env, setup))
    pool = gpu_pool(env, args.gpu_nodes, setup)
    quota = gpu_quota(args.gpu_nodes)
    if shape == "kai":
        jobs, pods, gpus = args.gpu_jobs, 1, 1
    else:
        pods, gpus = args.distributed_pods, NODE_GPUS
        jobs = args.gpu_nodes // pods
    docs: Docs = partial(job_docs, jobs, pods, gpu=gpus)
    result = guarded(
        shape, partial(run_muster, env, shape, pool, jobs, pods, quota, docs, cleanup=cleanup)
    )
    if cleanup:
        setup[f"{args.gpu_nodes} GPU nodes deleted (s)"] = delete_nodes(env, pool)
    return result


def run_kai_floor(env: Env, setup: dict[str, float]) -> dict[str, Any]:
    """The write floor of the `kai` fill, in a cluster of its own with no Muster: the same
    one-GPU Jobs created suspended, and, as each is created, the thinnest client there is
    (`bench/raw_client_loop.py --follow`, a process of its own) makes the writes Muster
    makes for it: its Workload, its admission, `suspend: false`. No decisions, no Events;
    the Job controller makes the pods and kube-scheduler binds them, as for Muster the Job
    controller and its scheduler loop do."""
    args = env.args
    pool = gpu_pool(env, args.gpu_nodes, setup)
    tag = run_tag()
    namespace = f"bench-kai-floor-{tag}"
    env.cluster.apply([objects.namespace(namespace)])
    tracker = Tracker(env.reader, tag, namespace, workloads=True)
    tracker.start()
    count = args.gpu_jobs
    docs = job_docs(count, 1, namespace, tag, gpu=1)
    for doc in docs:
        doc["spec"]["suspend"] = True
        doc["spec"]["template"]["spec"]["nodeSelector"] = {POOL_LABEL: pool}
    loop = [sys.executable, str(Path(__file__).resolve().parent / "raw_client_loop.py")]
    loop += ["--kubeconfig", env.kubeconfig, "--namespace", namespace, "--follow", str(count)]
    cpu_meter = CpuMeter(env.cluster)
    cpu_meter.start()
    raw = subprocess.Popen(loop, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = time.monotonic()
    create_all(env.kc, env.kubeconfig, docs)
    created = time.monotonic() - started
    wait_or_warn("floor Jobs admitted", lambda: len(tracker.admitted) >= count, args.timeout)
    wait_or_warn("floor pods bound", lambda: len(tracker.bound) >= count, args.timeout)
    wait_or_warn("floor pods Running", lambda: len(tracker.running) >= count, 300)
    cpu = cpu_meter.stop()
    _, status, usage = os.wait4(raw.pid, 0)
    out, err = raw.stdout.read(), raw.stderr.read()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"raw client loop failed: {err.decode()[-2000:]}")
    result = {
        "scenario": "kai-floor",
        "scheduler": "raw client loop (3 writes a Job), Job controller, kube-scheduler",
        "groups": count,
        "pods": count,
        "create_seconds": round(created, 2),
        **tracker.path_figures(started, count),
        "api_writes_per_group": writes_per_group(cpu, count),
        "loop": json.loads(out),
        "loop_cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "cpu": cpu,
    }
    done(result)
    tracker.stop()
    return result


def run_reclaim(env: Env, setup: dict[str, float], *, cleanup: bool) -> dict[str, Any]:
    """KAI's reclaim shape: `--reclaim-nodes` 8-GPU nodes full of one-GPU Jobs of a queue with
    no GPU quota of its own (it borrows all of it), then one Job of a whole node per pod for
    half the nodes, in a sibling queue whose quota is that half (reclaim Any, evicting at
    once, as KAI reclaims). Timed from creating that Job to its last pod bound; reported with
    the one-GPU Jobs it evicted (half of them is the least that frees half the nodes)."""
    args = env.args
    nodes = args.reclaim_nodes
    pool = gpu_pool(env, nodes, setup)
    tag = run_tag()
    fill_ns, claim_ns = f"bench-fill-{tag}", f"bench-reclaim-{tag}"
    parent, filler, claimer = f"{pool}-all", f"{pool}-borrower", f"{pool}-owner"
    none = {resource: "0" for resource in gpu_quota(nodes)}
    env.cluster.apply(
        [
            objects.namespace(fill_ns),
            objects.namespace(claim_ns),
            objects.flavor(pool, {POOL_LABEL: pool}),
            objects.cluster_queue(parent, pool, gpu_quota(nodes)),
            objects.cluster_queue(filler, pool, none, parent=parent),
            objects.cluster_queue(
                claimer,
                pool,
                gpu_quota(nodes, 0.5),
                parent=parent,
                preemption={"reclaim": "Any", "waitBeforeEvicting": "0s"},
            ),
            objects.local_queue(fill_ns, filler),
            objects.local_queue(claim_ns, claimer),
        ]
    )
    if env.manager is None:
        env.manager = start_manager(env)
    time.sleep(2.0)  # the queues reach the caches
    fill_tag, claim_tag = f"{tag}f", f"{tag}c"
    fillers = Tracker(env.reader, fill_tag, fill_ns, workloads=True)
    fillers.start()
    count = nodes * NODE_GPUS
    started = time.monotonic()
    create_all(env.kc, env.kubeconfig, job_docs(count, 1, fill_ns, fill_tag, gpu=1))
    wait_or_warn("fillers Running", lambda: len(fillers.running) >= count, args.timeout)
    filled = time.monotonic() - started
    pods = nodes // 2
    claim = Tracker(env.reader, claim_tag, claim_ns, workloads=True)
    claim.start()
    cpu_meter = CpuMeter(env.cluster)
    cpu_meter.start()
    started = time.monotonic()
    create_all(
        env.kc,
        env.kubeconfig,
        [muster_job("large", pods, claim_ns, claim_tag, pod_spec(gpu=NODE_GPUS))],
    )
    wait_or_warn("the large Job bound", lambda: len(claim.bound) >= pods, args.timeout)
    cpu = cpu_meter.stop()
    result = {
        "scenario": "kai-reclaim",
        "scheduler": "Muster (reclaim: admission with placement, eviction, scheduler loop)",
        "nodes": nodes,
        "fillers": count,
        "fillers_running": len(fillers.running),
        "fill_seconds": round(filled, 1),
        "groups": 1,
        "pods": pods,
        "admitted": len(claim.admitted),
        "bound": len(claim.bound),
        "all_admitted_seconds": last(claim.admitted, started),
        "all_bound_seconds": last(claim.bound, started),
        # One pod each: the one-GPU Jobs evicted (their pods deleted).
        "victim_pods": len(fillers.gone),
        "least_victims": pods * NODE_GPUS,
        "cpu": cpu,
    }
    done(result)
    for tracker, namespace in ((fillers, fill_ns), (claim, claim_ns)):
        if cleanup:
            result[f"cleanup_seconds_{namespace}"] = delete_and_wait(env, tracker, namespace)
        tracker.stop()
    if cleanup:
        setup[f"{nodes} GPU nodes deleted (s)"] = delete_nodes(env, pool)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Each scenario's figures. A fresh local cluster for the CPU shapes and another for the
    KAI shape, each deleted whole at the end; with `--kubeconfig`, that one cluster for all,
    cleaned up object by object between scenarios."""
    scenarios = args.scenario
    shared = args.kubeconfig is not None
    setup: dict[str, float] = {}
    results: list[dict[str, Any]] = []
    cpu = [s for s in scenarios if s not in KAI_SHAPES]
    if cpu:
        with cluster_env(args) as env:
            results += run_cpu_shapes(env, cpu, setup, keep_last=shared)
    for shape in (s for s in scenarios if s in KAI_SHAPES):
        with cluster_env(args) as env:
            results.append(run_kai(env, shape, setup, cleanup=shared))
    return {"setup": setup, "load_average_after": os.getloadavg(), "scenarios": results}


# --------------------------------------------------------------------------- output
def table(report: Mapping[str, Any]) -> str:
    header = (
        "scenario",
        "scheduler",
        "groups x pods",
        "create s",
        "admitted s",
        "bound s",
        "running s",
        "pods bound/s",
        "steady bound/s",
        "per group (ms)",
    )

    def row(r: Mapping[str, Any]) -> tuple[str, ...]:
        if r["scenario"] == "native":
            attempts = r["scheduler_metrics"]
            per_group = "n/a"
            if isinstance(attempts, dict):
                scheduled = [
                    h
                    for h in attempts.get(PODGROUP_METRICS[0], [])
                    if "result=scheduled" in h["labels"] or not h["labels"]
                ]
                if scheduled:
                    h = scheduled[0]
                    per_group = f"attempt mean {h['mean_ms']} (n={h['count']})"
            who = "kube-scheduler"
        else:
            per_group = f"decide median {r.get('decide_median_ms')}, p99 {r.get('decide_p99_ms')}"
            who = "Muster"
        if r["scenario"] == "kai-floor":
            who = "raw loop + kube-scheduler"
            per_group = f"loop: {r['loop']['writes']} writes, {r['loop']['refused']} refused"
        if r["scenario"] == "kai-reclaim":
            per_group = (
                f"evicted {r['victim_pods']} of {r['fillers']} one-GPU Jobs "
                f"(least: {r['least_victims']})"
            )
        return (
            r["scenario"],
            who,
            f"{r['groups']} x {r['pods'] // max(1, r['groups'])}",
            str(r.get("create_seconds", "-")),
            str(r.get("all_admitted_seconds", "-")),
            str(r["all_bound_seconds"]),
            str(r.get("all_running_seconds", "-")),
            str(r.get("pods_bound_per_second", "-")),
            str(r.get("steady_pods_bound_per_second", "-")),
            per_group,
        )

    return scenario_table(header, report, row)


def cpu_table(report: Mapping[str, Any]) -> str:
    """Where the machine's CPU went during each scenario (CPU seconds)."""
    names = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")
    header = (
        "scenario",
        "wall s",
        *names,
        "kubectl",
        "this process",
        "cores busy",
        "API writes/group",
    )
    rows: list[tuple[Any, ...]] = []
    for r in report["scenarios"]:
        cpu = r.get("cpu")
        if not cpu:
            continue
        procs = cpu["cluster_processes"]
        total = sum(procs.values()) + cpu["kubectl"] + cpu["this_process"]
        rows.append(
            (
                r["scenario"],
                str(cpu["wall_seconds"]),
                *(str(procs.get(n, "-")) for n in names),
                str(cpu["kubectl"]),
                str(cpu["this_process"]),
                f"{total / cpu['wall_seconds']:.2f}" if cpu["wall_seconds"] else "-",
                str(r.get("api_writes_per_group")),
            )
        )
    return render(header, rows)


KAI_SHAPES = ("kai", "kai-floor", "kai-distributed", "kai-reclaim")
SCENARIOS = (
    "native",
    "muster-pg",
    "muster",
    *KAI_SHAPES,
    "all",
    "kai-all",
    "preemption",
    "topology",
)


def scenario_list(text: str) -> list[str]:
    """`--scenario`: names, comma-separated; `all` is the four side-by-side shapes."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown scenario {', '.join(unknown) or text!r}: choose from {', '.join(SCENARIOS)}"
        )
    groups = {"all": ["native", "muster-pg", "muster", "kai"], "kai-all": list(KAI_SHAPES)}
    names = [x for n in names for x in groups.get(n, [n])]
    return list(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000, help="CPU nodes (native, muster)")
    parser.add_argument("--gangs", type=int, default=1000, help="gangs of 3 pods")
    parser.add_argument("--gpu-nodes", type=int, default=500, help="8-GPU nodes (kai)")
    parser.add_argument("--gpu-jobs", type=int, default=4000, help="one-GPU Jobs (kai)")
    parser.add_argument(
        "--distributed-pods",
        type=int,
        default=8,
        help="whole-node pods per Job (kai-distributed: as many Jobs as fill --gpu-nodes)",
    )
    parser.add_argument(
        "--reclaim-nodes",
        type=int,
        default=100,
        help="8-GPU nodes (kai-reclaim): as many one-GPU Jobs as GPUs, then one Job of a "
        "whole node per pod for half of them",
    )
    parser.add_argument(
        "--scenario",
        type=scenario_list,
        default="all",
        help="one or more of " + ", ".join(SCENARIOS) + " (comma-separated); all = native, "
        "muster-pg, muster, kai; preemption (not in all) = kube-scheduler's and "
        "Muster's gang preemption, one after the other, on --preemption-nodes nodes; "
        "topology (not in all) = a stream of gangs each requiring one rack, by kube-scheduler "
        "and by Muster, on --blocks x --racks x --rack-nodes nodes",
    )
    parser.add_argument("--blocks", type=int, default=4, help="blocks (topology)")
    parser.add_argument("--racks", type=int, default=8, help="racks per block (topology)")
    parser.add_argument(
        "--rack-nodes", type=int, default=16, help="8-GPU nodes per rack (topology)"
    )
    parser.add_argument(
        "--fill",
        type=float,
        default=0.75,
        help="the gangs ask for this share of the fabric's GPUs (topology)",
    )
    # By default cpu and memory in proportion to the GPUs (an eighth of a node's 64 cpu and
    # 512Gi per GPU): kube-scheduler scores a rack by cpu and memory only (NodeResourcesFit's
    # default resources), Muster by every resource the pods ask.
    parser.add_argument(
        "--pod-cpu", default=str(8 * POD_GPUS), help=f"cpu of a {POD_GPUS}-GPU pod (topology)"
    )
    parser.add_argument(
        "--pod-memory",
        default=f"{64 * POD_GPUS}Gi",
        help=f"memory of a {POD_GPUS}-GPU pod (topology)",
    )
    parser.add_argument(
        "--topology-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for every pod of the stream to be bound (topology)",
    )
    parser.add_argument(
        "--preemption-nodes", type=int, default=100, help="4-cpu nodes (preemption)"
    )
    parser.add_argument(
        "--low-gang-pods",
        type=int,
        default=20,
        help="pods per low-priority gang; as many gangs as fill the nodes (preemption)",
    )
    parser.add_argument(
        "--preemptor-pods", type=int, default=100, help="pods of the high gang (preemption)"
    )
    parser.add_argument(
        "--preemption-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for the preemptor gang to be bound (preemption)",
    )
    parser.add_argument("--kubeconfig", default=None, help="use this cluster, not a fresh one")
    parser.add_argument("--workers", type=int, default=4, help="controller Job workers")
    parser.add_argument("--bind-workers", type=int, default=16, help="controller bind workers")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per wait, seconds")
    parser.add_argument("--profile", action="store_true", help="sample the controller's stacks")
    parser.add_argument(
        "--node-heartbeat",
        type=float,
        default=300.0,
        help="fresh cluster only: seconds between kwok's node status posts (a kubelet's "
        "nodeStatusReportFrequency is 300; 0 keeps the local cluster's 15-20)",
    )
    parser.add_argument(
        "--node-lease",
        type=int,
        default=600,
        help="fresh cluster only: node Lease duration in seconds, renewed every quarter "
        "(a kubelet's is 40; 0 keeps it)",
    )
    parser.add_argument("--keep", action="store_true", help="leave the fresh cluster running")
    parser.add_argument("--json", action="store_true", help="also print every figure as JSON")
    args = parser.parse_args(argv)
    report = run(args)
    if args.scenario == ["preemption"]:
        print(preemption_table(report))
    elif args.scenario == ["topology"]:
        print(topology_table(report))
    else:
        print(table(report))
    print()
    print("CPU seconds during each scenario (this process: the controller, and the watches")
    print("that time the pods):")
    print(cpu_table(report))
    for name, value in report["setup"].items():
        print(f"{name}: {value}")
    print("load average after: " + ", ".join(f"{x:.1f}" for x in report["load_average_after"]))
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
