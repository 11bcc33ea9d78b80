"""Muster and Kueue side by side on one local cluster, and the apiserver's own limit.

One fresh local cluster (etcd, kube-apiserver with an audit log of writes, the
controller-manager, kube-scheduler, kwok nodes). The controllers run one at a time, each
out of cluster as a process of its own with a client certificate of its own, so that the
audit log tells its writes apart and /proc tells its CPU seconds and peak RSS:

- Muster: `muster controller` as shipped (webhooks at 127.0.0.1, history store in SQLite),
  with `--scheduler-name ""` so that kube-scheduler, not Muster's scheduler loop, places the
  pods: the same placer for both, since Kueue has none of its own.
- Kueue v0.19.2: its manager built from the Go module proxy, with the Configuration in
  bench/kueue/config.yaml (batch/v1 Jobs only, only labelled Jobs, our certificates), CRDs
  and webhook configurations from its own module (config/components), the webhooks of the
  integrated kinds registered with `clientConfig.url` at 127.0.0.1.

For each: `stream` (N labelled one-pod Jobs created with kubectl, 4 processes, timed from
the first create) and `backlog` (N Jobs created into held ClusterQueues, timed from lifting
the hold): creation time, time to all admitted, to all running (every Job's pod Ready), API
writes per Job (the controller's own, from the audit log), controller CPU seconds and peak
RSS. Then `raw`, the physical limit: bench/raw_client_loop.py makes Muster's three writes
per Job (create Workload, patch its status, patch the Job) for N suspended Jobs as fast as
the apiserver takes them. Then `trace`: the shape of Kueue's own baseline performance test
(30 ClusterQueues in 5 cohorts; small/medium/large Workloads with Kueue's sizes, priorities,
run times and arrival intervals), scaled by `--trace-scale`, Workloads created and finished
by this runner as Kueue's test runner does: wall time, ClusterQueue usage, average time to
admission per class.

    python bench/kueue_bench.py [--jobs 1000] [--trace-scale 0.1]
        [--parts muster,kueue,raw] [--scenarios stream,backlog,trace] [--json PATH]

Prints figures; never fails on time.
"""

from __future__ import annotations

import abc
import argparse
import base64
import contextlib
import copy
import datetime as dt
import heapq
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from kubernetes.client.exceptions import ApiException

from bench.harness import objects
from bench.harness.audit import AuditedCluster, AuditLog, client_kubeconfig
from bench.harness.cluster import Cluster, running_cluster
from bench.harness.controller import controller_argv
from bench.harness.create import create_all
from bench.harness.process import Process
from bench.harness.spy import Spy, usage_by_role, usage_since
from bench.harness.tables import render
from bench.harness.waits import http_ok, wait_for
from controllers.localcluster.binaries import cache_root
from controllers.localcluster.cluster import free_port
from controllers.localcluster.nodes import create_nodes
from controllers.runtime.client import api_client
from controllers.runtime.resources import JOB, WORKLOAD, Kind, Kube
from controllers.state import workloads as wls
from controllers.webhooks.certs import issue_serving, new_ca
from quota.api.meta import INT32_MAX

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "kueue"
KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_VERSION = "v0.19.2"
# The checksum database answers 404 for this one dependency of Kueue; it alone is exempted.
KUEUE_NOSUMDB = "sigs.k8s.io/scheduler-library"
# Kueue's metrics server reads its certificate from this fixed path when Kueue's own
# certificate management is off (cmd/kueue/main.go), even with metrics turned off.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")

KUEUE_API = "kueue.x-k8s.io/v1beta2"
KUEUE_WORKLOAD = Kind(
    "Workload", True, group="kueue.x-k8s.io", version="v1beta2", plural="workloads"
)
KUEUE_CQ = Kind(
    "ClusterQueue", False, group="kueue.x-k8s.io", version="v1beta2", plural="clusterqueues"
)
MUSTER_CQ = Kind(
    "ClusterQueue", False, group="muster.dev", version="v1alpha1", plural="clusterqueues"
)
JOB_POOL = "jobs"
TRACE_POOL = "trace"
POOL_LABEL = "kueue-bench/pool"
TRACE_LABEL = "kueue-bench/trace"
CLASS_LABEL = "kueue-bench/class"

# --------------------------------------------------------------------------- Kueue's baseline shape


@dataclass(frozen=True)
class TraceClass:
    name: str
    count: int  # per ClusterQueue at scale 1
    interval: float  # seconds between two arrivals in one ClusterQueue
    runtime: float  # seconds from admission to finish
    priority: int
    cpu: int


# Kueue's test/performance/scheduler/configs/baseline/generator.yaml.
BASELINE_CLASSES = (
    TraceClass("small", 350, 0.1, 0.2, 50, 1),
    TraceClass("medium", 100, 0.5, 0.5, 100, 5),
    TraceClass("large", 50, 1.2, 1.0, 200, 20),
)
BASELINE_COHORTS = 5
BASELINE_QUEUES = 6  # per cohort
BASELINE_NOMINAL = 20  # cpu per ClusterQueue
BASELINE_BORROWING = 100  # cpu a ClusterQueue may borrow from its cohort


@dataclass(frozen=True)
class TraceItem:
    at: float  # seconds from the start of the trace
    name: str
    queue: str  # ClusterQueue (and namespace suffix)
    cls: TraceClass


def baseline_trace(
    scale: float, cohorts: int = BASELINE_COHORTS, queues: int = BASELINE_QUEUES
) -> list[TraceItem]:
    """Kueue's baseline arrivals with every class count multiplied by `scale` (at least one
    each), per ClusterQueue `cq-<cohort>-<queue>`: one class's k-th Workload arrives after
    k intervals, as Kueue's generator waits an interval before each create."""
    items: list[TraceItem] = []
    for c in range(cohorts):
        for q in range(queues):
            queue = f"cq-{c}-{q}"
            for set_index, cls in enumerate(BASELINE_CLASSES):
                for k in range(max(1, round(cls.count * scale))):
                    name = f"{cls.name}-{set_index}-{k}"
                    items.append(TraceItem(round((k + 1) * cls.interval, 3), name, queue, cls))
    items.sort(key=lambda i: (i.at, i.queue, i.name))
    return items


@dataclass
class WorkloadRecord:
    """What one trace Workload went through, in seconds from the start of the trace."""

    queue: str
    cls: str
    cpu: int
    created: float | None = None
    admitted: float | None = None  # first admission
    finished: float | None = None
    holding_since: float | None = None
    cpu_seconds: float = 0.0  # quota held x time
    evictions: int = 0


def trace_summary(records: Sequence[WorkloadRecord], nominal: Mapping[str, int]) -> dict[str, Any]:
    """Kueue's figures for a run: wall time (first arrival to last finish), the usage of the
    ClusterQueue class (quota held over time / (nominal quota x wall time), in %, Kueue's
    `clusterQueueClassesMinUsage`), the lowest single ClusterQueue's usage, and the average
    time from creation to admission per Workload class (ms)."""
    created = [r.created for r in records if r.created is not None]
    finished = [r.finished for r in records if r.finished is not None]
    if not created or not finished:
        return {"workloads": len(records), "finished": len(finished)}
    start, end = min(created), max(finished)
    wall = end - start
    held: dict[str, float] = dict.fromkeys(nominal, 0.0)
    for r in records:
        held[r.queue] = held.get(r.queue, 0.0) + r.cpu_seconds
    total_nominal = sum(nominal.values())
    per_queue = {q: 100 * held[q] / (n * wall) for q, n in nominal.items() if n and wall > 0}
    by_class: dict[str, list[float]] = {}
    for r in records:
        if r.admitted is not None and r.created is not None:
            by_class.setdefault(r.cls, []).append(r.admitted - r.created)
    return {
        "workloads": len(records),
        "finished": len(finished),
        "wall_seconds": round(wall, 2),
        "cq_usage_percent": round(100 * sum(held.values()) / (total_nominal * wall), 1)
        if total_nominal and wall > 0
        else None,
        "min_cq_usage_percent": round(min(per_queue.values()), 1) if per_queue else None,
        "avg_time_to_admission_ms": {
            cls: round(1000 * sum(v) / len(v)) for cls, v in sorted(by_class.items())
        },
        "evictions": sum(r.evictions for r in records),
    }


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new` (lists replaced whole)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before:
            patch[key] = value
    return patch


# --------------------------------------------------------------------------- Kueue build


def kueue_dir() -> Path:
    return cache_root() / f"kueue-{KUEUE_VERSION}"


def ensure_kueue(log: Path) -> tuple[Path, Path]:
    """Kueue's manager binary and its module's config/components, built once into the cache:
    by the peer builder (`muster local-cluster build --peers kueue`) when this tree has it,
    otherwise by the recipe in the notes (a wrapper module, `go get` + `go build`)."""
    try:
        from controllers.localcluster import peers
    except ImportError:
        peers = None  # type: ignore[assignment]
    if peers is not None and "kueue" in getattr(peers, "PEERS", {}):
        peer = peers.PEERS["kueue"]
        peers.build(peer, log)
        return peer.binary_path, peer.manifest_dir
    out = kueue_dir()
    binary, manifests = out / "bin" / "kueue", out / "manifests"
    if binary.exists() and manifests.is_dir():
        return binary, manifests
    go = shutil.which("go") or "/usr/local/go/bin/go"
    env = dict(os.environ, GONOSUMDB=KUEUE_NOSUMDB, GOFLAGS="-mod=mod", CGO_ENABLED="0")
    work = Path(tempfile.mkdtemp(prefix="kueue-build-"))
    try:
        (work / "go.mod").write_text("module muster.dev/kueue-bench-build\n\ngo 1.25\n")
        with open(log, "ab") as out_log:

            def run(*argv: str) -> None:
                result = subprocess.run(
                    argv, cwd=work, env=env, stdout=out_log, stderr=subprocess.STDOUT
                )
                if result.returncode != 0:
                    raise RuntimeError(
                        f"`{' '.join(argv)}` failed (exit {result.returncode}); see {log}"
                    )

            run(go, "get", f"{KUEUE_MODULE}/cmd/kueue@{KUEUE_VERSION}")
            (out / "bin").mkdir(parents=True, exist_ok=True)
            run(
                "nice",
                "-n",
                "10",
                go,
                "build",
                "-trimpath",
                "-ldflags",
                "-s -w",
                "-o",
                str(binary) + ".tmp",
                f"{KUEUE_MODULE}/cmd/kueue",
            )
            os.replace(str(binary) + ".tmp", binary)
            info = subprocess.run(
                [go, "mod", "download", "-json", f"{KUEUE_MODULE}@{KUEUE_VERSION}"],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            source = Path(json.loads(info.stdout)["Dir"]) / "config" / "components"
            shutil.copytree(source, str(manifests) + ".tmp", dirs_exist_ok=True)
            subprocess.run(["chmod", "-R", "u+w", str(manifests) + ".tmp"], check=True)
            os.replace(str(manifests) + ".tmp", manifests)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return binary, manifests


def kueue_crds(manifests: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((manifests / "crd" / "bases").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    return docs


def kueue_webhooks(manifests: Path, url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's own webhook configurations, kept to the webhooks of what this configuration
    integrates (batch Jobs) and of Kueue's own kinds, each pointing at `url` + its path.
    The others (pods, Deployments, ...) would be answered by no-op handlers: left out, they
    do not add a webhook call to every pod the Job controller creates."""
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in yaml.safe_load_all((manifests / "webhook" / "manifests.yaml").read_text()):
        if not isinstance(doc, dict) or not doc.get("webhooks"):
            continue
        hooks = []
        for hook in doc["webhooks"]:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups & {"batch", "kueue.x-k8s.io"}:
                continue
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path") or "/"
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": bundle}
            # As Kueue's kustomization does for its Job webhooks.
            hook["namespaceSelector"] = {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": ["kube-system", "kueue-system"],
                    }
                ]
            }
            hooks.append(hook)
        doc["metadata"] = {"name": f"kueue-bench-{doc['metadata']['name']}"}
        doc["webhooks"] = hooks
        out.append(doc)
    return out


# --------------------------------------------------------------------------- the systems


@dataclass
class Bench:
    args: argparse.Namespace
    cluster: Cluster  # a local one, its apiserver keeping an audit log
    audit: AuditLog
    kube: Kube
    workdir: Path
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def local(self) -> AuditedCluster:
        assert isinstance(self.cluster.local, AuditedCluster)
        return self.cluster.local

    def kubectl(self, *argv: str, input: str | None = None, timeout: float = 600) -> str:
        return self.cluster.kubectl(*argv, input=input, timeout=timeout).stdout

    def apply(self, docs: list[dict[str, Any]]) -> None:
        self.cluster.apply(docs, server_side=True)

    def delete_cluster_objects(self, docs: list[dict[str, Any]]) -> None:
        """Delete the cluster-scoped queue objects among `docs` (children first)."""
        by_kind: dict[str, list[str]] = {}
        for d in docs:
            if d["kind"] in ("ClusterQueue", "ResourceFlavor"):
                resource = f"{d['kind'].lower()}s.{d['apiVersion'].split('/')[0]}"
                by_kind.setdefault(resource, []).insert(0, d["metadata"]["name"])
        for resource, names in by_kind.items():
            self.kubectl("delete", resource, *names, "--ignore-not-found", "--wait=false")

    def delete_namespaces(self, namespaces: list[str]) -> None:
        if namespaces:
            self.kubectl(
                "delete",
                "namespace",
                *namespaces,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=600s",
                timeout=700,
            )


def trace_workload(
    api_version: str, tag: str, item: TraceItem, namespace: str, pod_set: dict[str, Any]
) -> dict[str, Any]:
    """One bare Workload of the trace, in its class, with `pod_set` as its only pod set."""
    return {
        "apiVersion": api_version,
        "kind": "Workload",
        "metadata": {
            "name": item.name,
            "namespace": namespace,
            "labels": {TRACE_LABEL: tag, CLASS_LABEL: item.cls.name},
        },
        "spec": {"queueName": "q", "priority": item.cls.priority, "podSets": [pod_set]},
    }


class System(abc.ABC):
    """One admission manager under test."""

    name: str
    user: str
    queue_label: str
    workload_kind: Kind
    cq_kind: Kind

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.kubeconfig = client_kubeconfig(bench.local, self.user)
        self.process: Process | None = None

    @abc.abstractmethod
    def start(self) -> None:
        """Start the controller and wait until its webhooks answer."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop it and take its webhooks out of the apiserver's path."""

    @abc.abstractmethod
    def queue_objects(
        self, tag: str, namespaces: list[str], quota: int, parent_quota: int, pool: str
    ) -> list[dict[str, Any]]:
        """Flavor, a ClusterQueue and LocalQueue `q` per namespace, under one parent."""

    def hold(self, cq: str, held: bool) -> dict[str, Any]:
        return {"spec": {"stopPolicy": "Hold" if held else "None"}}

    @abc.abstractmethod
    def trace_objects(self, tag: str, queues: list[str]) -> list[dict[str, Any]]:
        """The queues of Kueue's baseline shape."""

    @abc.abstractmethod
    def trace_workload(self, tag: str, item: TraceItem, namespace: str) -> dict[str, Any]:
        """One bare Workload of the trace."""

    @abc.abstractmethod
    def finished_status(self, wl: dict[str, Any]) -> dict[str, Any] | None:
        """The Workload marked Finished (None: nothing to write)."""

    @abc.abstractmethod
    def released_status(self, wl: dict[str, Any]) -> dict[str, Any] | None:
        """An evicted Workload's quota released (None: nothing to write)."""


def _cond(obj: Mapping[str, Any], type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


class Muster(System):
    name = "Muster"
    user = "bench-muster"
    queue_label = "muster.dev/queue-name"
    workload_kind = WORKLOAD
    cq_kind = MUSTER_CQ

    def start(self) -> None:
        home = self.bench.workdir / "muster"
        home.mkdir(exist_ok=True)
        port, metrics = free_port(), free_port()
        argv = controller_argv(
            self.kubeconfig,
            lease="muster-kueue-bench",
            database_url=f"sqlite:///{home / 'history.db'}",
            spool_dir=home / "spool",
            webhook_port=port,
            metrics_port=metrics,
            # kube-scheduler places the pods, as it does for Kueue's.
            flags=("--scheduler-name", ""),
        )
        self.process = Process("muster", argv, home / "controller.log", os.environ.copy())
        process = self.process

        def ready() -> bool:
            process.check()
            url = self.bench.kubectl(
                "get",
                "validatingwebhookconfiguration",
                "muster-webhooks",
                "-o",
                "jsonpath={.webhooks[0].clientConfig.url}",
                "--ignore-not-found",
            )
            return f":{port}" in url and http_ok(f"http://127.0.0.1:{metrics}/readyz")

        wait_for("Muster to lead and register its webhooks", ready, 120)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            self.bench.kubectl("delete", kind, "muster-webhooks", "--ignore-not-found")

    def queue_objects(
        self, tag: str, namespaces: list[str], quota: int, parent_quota: int, pool: str
    ) -> list[dict[str, Any]]:
        docs = [
            objects.flavor(tag, {POOL_LABEL: pool}),
            objects.cluster_queue(f"{tag}-org", tag, {"cpu": str(parent_quota)}),
        ]
        for ns in namespaces:
            docs += [
                objects.cluster_queue(ns, tag, {"cpu": str(quota)}, parent=f"{tag}-org"),
                objects.local_queue(ns, ns),
            ]
        return docs

    def trace_objects(self, tag: str, queues: list[str]) -> list[dict[str, Any]]:
        """examples/kueue-baseline.yaml's mapping: a cohort is a parent queue holding the sum
        of its children's quota, limited to it (cohorts lend nothing to one another)."""
        cohort_quota = {"cpu": str(BASELINE_NOMINAL * BASELINE_QUEUES)}
        docs = [objects.flavor(tag, {POOL_LABEL: TRACE_POOL})]
        for cohort in sorted({q.rsplit("-", 1)[0] for q in queues}):
            name = f"{tag}-{cohort.replace('cq-', 'cohort-')}"
            docs.append(objects.cluster_queue(name, tag, cohort_quota, limit=cohort_quota))
        for q in queues:
            cohort = q.rsplit("-", 1)[0].replace("cq-", "cohort-")
            docs += [
                objects.cluster_queue(
                    f"{tag}-{q}",
                    tag,
                    {"cpu": str(BASELINE_NOMINAL)},
                    limit={"cpu": str(BASELINE_NOMINAL + BASELINE_BORROWING)},
                    parent=f"{tag}-{cohort}",
                    # Kueue ties no priority to preemptibility: every class may borrow
                    # and be evicted, as there (Muster's default makes priority >= 100
                    # non-preemptible).
                    preemption={
                        "withinQueue": "LowerPriority",
                        "reclaim": "Any",
                        "preemptibleBelowPriority": INT32_MAX,
                    },
                ),
                objects.local_queue(f"{tag}-{q}", f"{tag}-{q}"),
            ]
        return docs

    def trace_workload(self, tag: str, item: TraceItem, namespace: str) -> dict[str, Any]:
        pod_set = {"name": "main", "count": 1, "requests": {"cpu": str(item.cls.cpu)}}
        return trace_workload(objects.MUSTER_API, tag, item, namespace, pod_set)

    def finished_status(self, wl: dict[str, Any]) -> dict[str, Any] | None:
        new = copy.deepcopy(wl)
        if not wls.mark_finished(new, "Succeeded", "finished by the trace runner", now_utc()):
            return None
        return new

    def released_status(self, wl: dict[str, Any]) -> dict[str, Any] | None:
        """What Muster's Job reconciler writes once an evicted Job's pods are gone."""
        new = copy.deepcopy(wl)
        return new if wls.release_quota(new, now_utc()) else None


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _rfc3339(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _set_condition(wl: dict[str, Any], type_: str, status: str, reason: str, message: str) -> None:
    """A metav1.Condition, as Kueue's workload.SetConditionAndUpdate writes it."""
    conditions = wl.setdefault("status", {}).setdefault("conditions", [])
    for c in conditions:
        if c.get("type") == type_:
            if c.get("status") != status:
                c["lastTransitionTime"] = _rfc3339(now_utc())
            c.update(status=status, reason=reason, message=message)
            c["observedGeneration"] = wl["metadata"].get("generation", 1)
            return
    conditions.append(
        {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": _rfc3339(now_utc()),
            "observedGeneration": wl["metadata"].get("generation", 1),
        }
    )


def kueue_config(home: Path, ca_name: str) -> tuple[Path, int, int, bytes]:
    """Kueue's serving certificate (a CA of our own) and its Configuration under `home`:
    (the Configuration's path, the webhook port, the health port, the CA's PEM)."""
    certs = home / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca = new_ca(ca_name)
    serving = issue_serving(ca, ["127.0.0.1", "localhost"])
    (certs / "tls.crt").write_bytes(serving.cert_pem)
    (certs / "tls.key").write_bytes(serving.key_pem)
    if not (KUEUE_METRICS_CERTS / "tls.crt").exists():
        KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        (KUEUE_METRICS_CERTS / "tls.crt").write_bytes(serving.cert_pem)
        (KUEUE_METRICS_CERTS / "tls.key").write_bytes(serving.key_pem)
    port, health = free_port(), free_port()
    config = home / "config.yaml"
    config.write_text(
        (HERE / "config.yaml")
        .read_text()
        .replace("{health_port}", str(health))
        .replace("{webhook_port}", str(port))
        .replace("{cert_dir}", str(certs))
    )
    return config, port, health, ca.cert_pem


class Kueue(System):
    name = "Kueue"
    user = "bench-kueue"
    queue_label = "kueue.x-k8s.io/queue-name"
    workload_kind = KUEUE_WORKLOAD
    cq_kind = KUEUE_CQ

    def __init__(self, bench: Bench, binary: Path, manifests: Path) -> None:
        super().__init__(bench)
        self.binary = binary
        self.manifests = manifests
        self.webhook_names: list[str] = []

    def start(self) -> None:
        config, port, health, ca_pem = kueue_config(
            self.bench.workdir / "kueue", "kueue-bench-webhook-ca"
        )
        home = config.parent
        self.bench.apply([objects.namespace("kueue-system")])
        argv = [
            str(self.binary),
            f"--config={config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--zap-log-level={self.bench.args.kueue_log_level}",
        ]
        self.process = Process("kueue", argv, home / "manager.log", os.environ.copy())
        hooks = kueue_webhooks(self.manifests, f"https://127.0.0.1:{port}", ca_pem)
        self.webhook_names = [d["metadata"]["name"] for d in hooks]
        self.bench.apply(hooks)
        process = self.process

        def ready() -> bool:
            process.check()
            return http_ok(f"http://127.0.0.1:{health}/readyz")

        wait_for("Kueue's manager to be ready", ready, 180)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            for name in self.webhook_names:
                self.bench.kubectl("delete", kind, name, "--ignore-not-found")

    def _cq(
        self,
        name: str,
        cohort: str,
        flavor: str,
        nominal: int,
        borrowing: int | None,
        preemption: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        resource: dict[str, Any] = {"name": "cpu", "nominalQuota": str(nominal)}
        if borrowing is not None:
            resource["borrowingLimit"] = str(borrowing)
        spec: dict[str, Any] = {
            "cohortName": cohort,
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": flavor, "resources": [resource]}],
                }
            ],
        }
        if preemption:
            spec["preemption"] = preemption
        return {
            "apiVersion": KUEUE_API,
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": spec,
        }

    def queue_objects(
        self, tag: str, namespaces: list[str], quota: int, parent_quota: int, pool: str
    ) -> list[dict[str, Any]]:
        """The same tree: the parent becomes a Cohort (its ClusterQueues may lend each other
        their unused quota, as Muster's children of one parent do)."""
        docs = [objects.flavor(tag, {POOL_LABEL: pool}, KUEUE_API)]
        for ns in namespaces:
            docs += [
                self._cq(ns, f"{tag}-org", tag, quota, None),
                objects.local_queue(ns, ns, api=KUEUE_API),
            ]
        return docs

    def trace_objects(self, tag: str, queues: list[str]) -> list[dict[str, Any]]:
        """Kueue's generator: ClusterQueues in cohorts, nominal 20 cpu, borrowing limit 100,
        reclaim within the cohort Any, preemption within the queue LowerPriority."""
        docs = [objects.flavor(tag, {POOL_LABEL: TRACE_POOL}, KUEUE_API)]
        for q in queues:
            cohort = f"{tag}-{q.rsplit('-', 1)[0].replace('cq-', 'cohort-')}"
            preemption = {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
            docs += [
                self._cq(
                    f"{tag}-{q}", cohort, tag, BASELINE_NOMINAL, BASELINE_BORROWING, preemption
                ),
                objects.local_queue(f"{tag}-{q}", f"{tag}-{q}", api=KUEUE_API),
            ]
        return docs

    def trace_workload(self, tag: str, item: TraceItem, namespace: str) -> dict[str, Any]:
        """As Kueue's generator builds it (utiltestingapi.MakeWorkload().Request())."""
        container = {
            "name": "c",
            "image": "pause",
            "resources": {"requests": {"cpu": str(item.cls.cpu)}},
        }
        pod_set = {
            "name": "main",
            "count": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        }
        return trace_workload(KUEUE_API, tag, item, namespace, pod_set)

    def finished_status(self, wl: dict[str, Any]) -> dict[str, Any] | None:
        if _cond(wl, "Finished"):
            return None
        new = copy.deepcopy(wl)
        _set_condition(new, "Finished", "True", "ByTest", "By test runner")
        return new

    def released_status(self, wl: dict[str, Any]) -> dict[str, Any] | None:
        """What Kueue's test runner writes for an evicted Workload (no Job integration does
        it for a bare Workload): workload.UnsetQuotaReservationWithCondition."""
        if not _cond(wl, "QuotaReserved") or _cond(wl, "Finished"):
            return None
        new = copy.deepcopy(wl)
        new["status"].pop("admission", None)
        _set_condition(new, "QuotaReserved", "False", "Pending", "Evicted by the test runner")
        if _cond(new, "Admitted"):
            _set_condition(
                new, "Admitted", "False", "NoReservation", "The workload has no reservation"
            )
        return new


# --------------------------------------------------------------------------- watching


class Watcher:
    """Lists and watches one kind, calling `on_object(obj, seconds)` for every state seen."""

    def __init__(
        self,
        kube: Kube,
        kind: Kind,
        on_object: Callable[[dict[str, Any], float], None],
        label_selector: str | None = None,
    ) -> None:
        self.kube, self.kind, self.on_object = kube, kind, on_object
        self.label_selector = label_selector
        self.stop_event = threading.Event()
        self.response: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                items, rv = self.kube.list(self.kind, label_selector=self.label_selector)
                for obj in items:
                    self.on_object(obj, time.monotonic())
                self.response, events = self.kube.watch(
                    self.kind, rv, label_selector=self.label_selector, timeout_seconds=120
                )
                for event in events:
                    if self.stop_event.is_set():
                        return
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self.on_object(event["object"], time.monotonic())
                    elif event.get("type") == "ERROR":
                        break
            except Exception:
                if self.stop_event.is_set():
                    return
                time.sleep(0.5)

    def stop(self) -> None:
        self.stop_event.set()
        with contextlib.suppress(Exception):
            if self.response is not None:
                self.response.close()


# --------------------------------------------------------------------------- Job scenarios


class JobProgress:
    """When each Workload of the scenario's namespaces was admitted and each Job ran."""

    def __init__(self, namespaces: Iterable[str]) -> None:
        self.namespaces = set(namespaces)
        self.lock = threading.Lock()
        self.workloads: set[str] = set()
        self.admitted: dict[str, float] = {}
        self.unsuspended: dict[str, float] = {}
        self.running: dict[str, float] = {}

    def on_workload(self, wl: dict[str, Any], at: float) -> None:
        if wl["metadata"].get("namespace") not in self.namespaces:
            return
        uid = wl["metadata"]["uid"]
        with self.lock:
            self.workloads.add(uid)
            if _cond(wl, "Admitted") and uid not in self.admitted:
                self.admitted[uid] = at

    def on_job(self, job: dict[str, Any], at: float) -> None:
        if job["metadata"].get("namespace") not in self.namespaces:
            return
        uid = job["metadata"]["uid"]
        status = job.get("status") or {}
        with self.lock:
            if not (job.get("spec") or {}).get("suspend") and uid not in self.unsuspended:
                self.unsuspended[uid] = at
            if (status.get("ready") or 0) >= 1 and uid not in self.running:
                self.running[uid] = at


class Usage:
    """A system's process from `start` on: CPU seconds and peak RSS, whole and per process
    (Muster's controller and its webhook server), and, with `--profile` and for Muster,
    where its CPU went (py-spy: by process, by thread, by activity)."""

    def __init__(self, bench: Bench, system: System, scenario: str) -> None:
        assert system.process is not None
        self.process = system.process
        self.out = bench.workdir / f"py-spy-{scenario}.txt"
        self.profile = bench.args.profile and isinstance(system, Muster)
        self.spy: Spy | None = None

    def start(self) -> None:
        """From now on (again, if it had started: the backlog's hold does not count)."""
        if self.spy is not None:
            self.spy.stop()
        self.cpu0 = self.process.cpu_seconds()
        self.roles0 = usage_by_role(self.process.pid)
        self.process.reset_peak_rss()
        if self.profile:
            self.spy = Spy(self.process.pid, self.out)
            self.spy.start()

    def figures(self) -> dict[str, Any]:
        cpu = round(self.process.cpu_seconds() - self.cpu0, 1)
        out: dict[str, Any] = {
            "cpu_seconds": cpu,
            "peak_rss_mib": round(self.process.peak_rss() / 2**20),
            "processes": usage_since(self.process.pid, self.roles0),
        }
        if self.spy is not None:
            out["profile"] = self.spy.stop().seconds(cpu)
            self.spy = None
        return out


def job_scenario(bench: Bench, system: System | None, scenario: str) -> dict[str, Any]:
    """`stream` or `backlog` for a system; `raw` for the raw client loop (system None)."""
    n = bench.args.jobs
    tag = f"{scenario[:2]}{uuid.uuid4().hex[:5]}"
    namespaces = [f"{tag}-{i}" for i in range(bench.args.namespaces)]
    quota = n // 10 // len(namespaces) + 2
    bench.apply([objects.namespace(ns) for ns in namespaces])
    docs_of_queues: list[dict[str, Any]] = []
    if system is not None:
        docs_of_queues = system.queue_objects(tag, namespaces, quota, n // 10 + 10, JOB_POOL)
        if scenario == "backlog":
            for d in docs_of_queues:
                if d["kind"] == "ClusterQueue" and d["metadata"]["name"] in namespaces:
                    d["spec"]["stopPolicy"] = "Hold"
        bench.apply(docs_of_queues)
        time.sleep(2.0)  # the queues reach the controller's caches
    progress = JobProgress(namespaces)
    workload_kind = system.workload_kind if system is not None else WORKLOAD
    watchers = [
        Watcher(bench.kube, workload_kind, progress.on_workload),
        Watcher(bench.kube, JOB, progress.on_job),
    ]
    usage = Usage(bench, system, scenario) if system is not None else None
    user = system.user if system is not None else "bench-raw"
    docs = objects.one_pod_jobs(
        n,
        namespaces,
        prefix="job",
        labels={system.queue_label: "q"} if system else None,
        suspend=system is None,
    )
    try:
        mark = bench.audit.mark()
        if usage:
            usage.start()
        started = time.monotonic()
        create_all(bench.cluster.kc, bench.cluster.kubeconfig, docs)
        created = time.monotonic() - started
        raw: dict[str, Any] = {}
        if scenario == "backlog" and system is not None:
            wait_for(
                "every backlog Job's Workload",
                lambda: len(progress.workloads) >= n,
                bench.args.timeout,
            )
            # The steady state of a hold: the controller has written why each one waits.
            bench.audit.wait_quiet(user, bench.args.settle)
            mark = bench.audit.mark()
            usage.start()  # type: ignore[union-attr]
            started = time.monotonic()
            for ns in namespaces:
                bench.kube.patch(system.cq_kind, None, ns, system.hold(ns, False))
        if system is None:
            wait_for(
                "the raw Jobs",
                lambda: len(progress.unsuspended) == 0 and _count_jobs(bench, namespaces) >= n,
                120,
            )
            raw_kubeconfig = client_kubeconfig(bench.local, "bench-raw")
            mark = bench.audit.mark()
            started = time.monotonic()
            raw = run_raw_loop(bench, raw_kubeconfig, namespaces)
        wait_for(
            "every Job admitted",
            lambda: len(progress.admitted if system else progress.unsuspended) >= n,
            bench.args.timeout,
        )
        wait_for("every Job running", lambda: len(progress.running) >= n, bench.args.timeout)
        bench.audit.wait_quiet(user, bench.args.settle, 120)  # trailing status writes and Events
        writes = bench.audit.writes(mark, user)
        with progress.lock:
            admitted_times = list(
                progress.admitted.values() if system else progress.unsuspended.values()
            )
            running_times = list(progress.running.values())
            unsuspended_times = list(progress.unsuspended.values())
        result: dict[str, Any] = {
            "system": system.name if system else "raw client loop",
            "scenario": scenario,
            "jobs": n,
            "create_seconds": round(created, 2),
            "all_admitted_seconds": round(max(admitted_times) - started, 2),
            "all_unsuspended_seconds": round(max(unsuspended_times) - started, 2),
            "all_running_seconds": round(max(running_times) - started, 2),
            "api_writes": sum(writes.values()),
            "api_writes_per_job": round(sum(writes.values()) / n, 2),
            "writes": dict(sorted(writes.items())),
        }
        if usage:
            result.update(usage.figures())
        if raw:
            result.update(
                cpu_seconds=raw["cpu_seconds"],
                peak_rss_mib=raw["peak_rss_mib"],
                loop=raw["loop"],
                all_admitted_seconds=raw["loop"]["seconds"],
            )
        return result
    finally:
        for w in watchers:
            w.stop()
        bench.delete_namespaces(namespaces)
        if system is not None:
            bench.delete_cluster_objects(docs_of_queues)


def _count_jobs(bench: Bench, namespaces: list[str]) -> int:
    return sum(len(bench.kube.list(JOB, ns)[0]) for ns in namespaces)


def run_raw_loop(bench: Bench, kubeconfig: Path, namespaces: list[str]) -> dict[str, Any]:
    argv = [
        sys.executable,
        str(REPO / "bench" / "raw_client_loop.py"),
        "--kubeconfig",
        str(kubeconfig),
        "--concurrency",
        str(bench.args.raw_concurrency),
    ]
    for ns in namespaces:
        argv += ["--namespace", ns]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    if proc.returncode != 0:
        raise RuntimeError(f"raw client loop failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {
        "loop": json.loads(out),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
    }


# --------------------------------------------------------------------------- the trace


class TraceRunner:
    """Creates the trace's Workloads on time, finishes each `runtime` after its admission,
    and completes evictions (what the Job integration would do for a Job), as Kueue's
    test runner does for bare Workloads."""

    def __init__(self, bench: Bench, system: System, tag: str, items: list[TraceItem]) -> None:
        self.bench, self.system, self.tag, self.items = bench, system, tag, items
        self.kube = Kube(api_client(bench.cluster.kubeconfig, pool_size=32))
        self.records: dict[str, WorkloadRecord] = {
            f"{tag}-{i.queue}/{i.name}": WorkloadRecord(i.queue, i.cls.name, i.cls.cpu)
            for i in items
        }
        self.runtime = {f"{tag}-{i.queue}/{i.name}": i.cls.runtime for i in items}
        self.latest: dict[str, dict[str, Any]] = {}
        self.epoch: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.due: list[tuple[float, int, str, str]] = []  # (when, epoch, action, key)
        self.wake = threading.Condition(self.lock)
        self.t0 = 0.0
        self.done = threading.Event()
        self.errors: list[str] = []
        self.evicting: set[str] = set()
        self.unfinished = len(self.records)

    def on_workload(self, wl: dict[str, Any], at: float) -> None:
        key = f"{wl['metadata']['namespace']}/{wl['metadata']['name']}"
        record = self.records.get(key)
        if record is None:
            return
        t = at - self.t0
        finished = _cond(wl, "Finished")
        holding = _cond(wl, "QuotaReserved") and not finished
        with self.lock:
            rv = int(wl["metadata"].get("resourceVersion") or 0)
            seen = self.latest.get(key)
            if seen is not None and int(seen["metadata"].get("resourceVersion") or 0) > rv:
                return  # a relist can replay an older state
            self.latest[key] = wl
            if record.created is None:
                record.created = t
            if holding and record.holding_since is None:
                record.holding_since = t
                self.epoch[key] += 1
                self._queue(at + self.runtime[key], "finish", key)
            elif not holding and record.holding_since is not None:
                record.cpu_seconds += record.cpu * (t - record.holding_since)
                record.holding_since = None
                self.epoch[key] += 1  # whatever was queued for that admission is moot
                self.evicting.discard(key)
            if holding and record.admitted is None and _cond(wl, "Admitted"):
                record.admitted = t
            if holding and _cond(wl, "Evicted") and key not in self.evicting:
                self.evicting.add(key)
                record.evictions += 1
                self.epoch[key] += 1  # it will not finish in this admission
                self._queue(at, "release", key)
            if finished and record.finished is None:
                record.finished = t
                self.unfinished -= 1
                if self.unfinished == 0:
                    self.done.set()
                    self.wake.notify_all()

    def _queue(self, when: float, action: str, key: str) -> None:
        heapq.heappush(self.due, (when, self.epoch[key], action, key))
        self.wake.notify()

    def _worker(self) -> None:
        while not self.done.is_set():
            with self.lock:
                while not self.due or self.due[0][0] > time.monotonic():
                    timeout = (self.due[0][0] - time.monotonic()) if self.due else 0.5
                    self.wake.wait(max(0.001, min(timeout, 0.5)))
                    if self.done.is_set():
                        return
                _when, epoch, action, key = heapq.heappop(self.due)
                if epoch != self.epoch[key]:
                    continue
                wl = self.latest[key]
            self._write(action, key, wl)

    def _write(self, action: str, key: str, wl: dict[str, Any]) -> None:
        namespace, name = key.split("/", 1)
        for _ in range(10):
            new = (
                self.system.finished_status if action == "finish" else self.system.released_status
            )(wl)
            if new is None:
                return
            patch = merge_patch(
                {"status": wl.get("status") or {}}, {"status": new.get("status") or {}}
            )
            patch["metadata"] = {"resourceVersion": wl["metadata"]["resourceVersion"]}
            try:
                self.kube.patch(self.system.workload_kind, namespace, name, patch, status=True)
                return
            except ApiException as error:
                if error.status != 409:
                    self.errors.append(f"{action} {key}: {error.status} {str(error.body)[:300]}")
                    return
                fresh = self.kube.get(self.system.workload_kind, namespace, name)
                if fresh is None:
                    return
                wl = fresh

    def _creator(self, queue: list[TraceItem]) -> None:
        while True:
            with self.lock:
                if not queue:
                    return
                item = queue.pop()
            delay = self.t0 + item.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            body = self.system.trace_workload(self.tag, item, f"{self.tag}-{item.queue}")
            try:
                self.kube.create(self.system.workload_kind, f"{self.tag}-{item.queue}", body)
            except ApiException as error:
                self.errors.append(
                    f"create {item.queue}/{item.name}: {error.status} {str(error.body)[:300]}"
                )

    def run(self, timeout: float) -> None:
        pending = list(reversed(self.items))  # popped from the end: earliest first
        self.t0 = time.monotonic()
        watcher = Watcher(
            self.bench.kube,
            self.system.workload_kind,
            self.on_workload,
            label_selector=f"{TRACE_LABEL}={self.tag}",
        )
        threads = [
            threading.Thread(target=self._creator, args=(pending,), daemon=True)
            for _ in range(self.bench.args.trace_creators)
        ]
        threads += [threading.Thread(target=self._worker, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        try:
            if not self.done.wait(timeout):
                left = sum(1 for r in self.records.values() if r.finished is None)
                raise TimeoutError(
                    f"trace: {left} Workloads not finished after {timeout:.0f}s; "
                    f"errors: {self.errors[:3]}"
                )
        finally:
            self.done.set()
            with self.lock:
                self.wake.notify_all()
            watcher.stop()


def trace_scenario(bench: Bench, system: System) -> dict[str, Any]:
    items = baseline_trace(bench.args.trace_scale)
    tag = f"t{uuid.uuid4().hex[:5]}"
    queues = sorted({i.queue for i in items})
    namespaces = [f"{tag}-{q}" for q in queues]
    bench.apply([objects.namespace(ns) for ns in namespaces])
    queues_docs = system.trace_objects(tag, queues)
    bench.apply(queues_docs)
    time.sleep(2.0)
    runner = TraceRunner(bench, system, tag, items)
    usage = Usage(bench, system, "trace")
    try:
        mark = bench.audit.mark()
        usage.start()
        runner.run(bench.args.timeout)
        writes = bench.audit.writes(mark, system.user)
        summary = trace_summary(
            list(runner.records.values()), {q: BASELINE_NOMINAL for q in queues}
        )
        summary.update(
            system=system.name,
            scenario="trace",
            scale=bench.args.trace_scale,
            controller_writes=sum(writes.values()),
            runner_errors=runner.errors[:5],
        )
        summary.update(usage.figures())
        return summary
    finally:
        bench.delete_namespaces(namespaces)
        bench.delete_cluster_objects(queues_docs)


# --------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> dict[str, Any]:
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="kueue-bench-"))
    commit = _commit()  # what the controller process will load, before anyone commits more
    kueue_build: tuple[Path, Path] | None = None
    if "kueue" in parts:
        kueue_build = ensure_kueue(workdir / "kueue-build.log")
    with running_cluster(
        fresh_in=workdir / "cluster", kind=AuditedCluster, keep=args.keep
    ) as cluster:
        assert isinstance(cluster.local, AuditedCluster)
        bench = Bench(
            args,
            cluster,
            AuditLog(cluster.local.audit_log),
            Kube(api_client(cluster.kubeconfig, pool_size=8)),
            workdir,
        )
        cluster.install_crds(*(kueue_crds(kueue_build[1]) if kueue_build is not None else ()))
        create_nodes(
            cluster.kc,
            cluster.kubeconfig,
            max(2, args.jobs // 100 + 1),
            prefix="jobs",
            cpu="32",
            memory="256Gi",
            pods=110,
            labels={POOL_LABEL: JOB_POOL},
        )
        if "trace" in scenarios:
            create_nodes(
                cluster.kc,
                cluster.kubeconfig,
                8,
                prefix="trace",
                cpu="128",
                memory="1Ti",
                pods=250,
                labels={POOL_LABEL: TRACE_POOL},
            )
        results: list[dict[str, Any]] = []

        def report(result: dict[str, Any]) -> None:
            """Each figure as soon as it is measured: a later failure loses nothing."""
            print(json.dumps(result), file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps({"partial": True, "results": results}, indent=2))

        for part in parts:
            if part == "raw":
                results.append(job_scenario(bench, None, "raw"))
                report(results[-1])
                continue
            system: System = Muster(bench) if part == "muster" else Kueue(bench, *kueue_build)  # type: ignore[misc]
            system.start()
            try:
                for scenario in scenarios:
                    if scenario == "trace":
                        results.append(trace_scenario(bench, system))
                    else:
                        results.append(job_scenario(bench, system, scenario))
                    report(results[-1])
            finally:
                system.stop()
        return {
            "jobs": args.jobs,
            "trace_scale": args.trace_scale,
            "commit": commit,
            "results": results,
        }


def _commit() -> str:
    """The commit Muster ran from, and whether the tree had changes on top of it."""
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "controllers", "quota"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"{head}{' (+ uncommitted changes)' if dirty else ''}"


def tables(report: dict[str, Any]) -> str:
    rows, trace_rows = [], []
    raw = next((r for r in report["results"] if r["scenario"] == "raw"), None)
    for r in report["results"]:
        if r["scenario"] == "trace":
            adm = r.get("avg_time_to_admission_ms", {})
            trace_rows.append(
                [
                    r["system"],
                    r["workloads"],
                    r.get("wall_seconds"),
                    r.get("cq_usage_percent"),
                    r.get("min_cq_usage_percent"),
                    adm.get("small"),
                    adm.get("medium"),
                    adm.get("large"),
                    r.get("evictions"),
                    r["cpu_seconds"],
                    r["peak_rss_mib"],
                ]
            )
            continue
        share = None
        if raw and r["scenario"] == "backlog" and r["all_unsuspended_seconds"]:
            # Both times end when every Job's last write (unsuspend) is done; in the backlog
            # window the Workloads exist already, so two of the raw loop's three writes count.
            raw_two = raw["all_admitted_seconds"] * 2 / 3
            share = f"{100 * raw_two / r['all_unsuspended_seconds']:.0f} %"
        rows.append(
            [
                r["system"],
                r["scenario"],
                r["jobs"],
                r["create_seconds"],
                r["all_admitted_seconds"],
                r["all_running_seconds"],
                r["api_writes_per_job"],
                r.get("cpu_seconds"),
                r.get("peak_rss_mib"),
                share,
            ]
        )
    out = render(
        [
            "system",
            "scenario",
            "Jobs",
            "create s",
            "all admitted s",
            "all running s",
            "API writes / Job",
            "controller CPU s",
            "peak RSS MiB",
            "share of the raw loop's rate",
        ],
        rows,
    )
    if trace_rows:
        out += "\n\n" + render(
            [
                "system",
                "workloads",
                "wall s",
                "CQ usage %",
                "min CQ usage %",
                "avg to admission small ms",
                "medium ms",
                "large ms",
                "evictions",
                "controller CPU s",
                "peak RSS MiB",
            ],
            trace_rows,
        )
    for r in report["results"]:
        out += _breakdown(r)
    return out


def _breakdown(r: Mapping[str, Any]) -> str:
    """One scenario's figures per process and, when profiled, by thread and activity."""
    if r["system"] != "Muster" or "processes" not in r:
        return ""
    lines = [f"\n\nMuster, {r['scenario']}, per process:"]
    lines += [
        f"  {role}: {v['cpu_seconds']} CPU s, peak RSS {v['peak_rss_mib']} MiB"
        for role, v in r["processes"].items()
    ]
    profile = r.get("profile")
    if profile:
        lines.append(f"  where the CPU went ({profile['samples']} py-spy samples), CPU s:")
        for part in ("by_thread", "by_activity"):
            top = list(profile[part].items())[:12]
            lines.append(f"    {part.replace('_', ' ')}: " + "; ".join(f"{k} {v}" for k, v in top))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=4)
    parser.add_argument("--parts", default="muster,kueue,raw", help="muster, kueue, raw, in order")
    parser.add_argument("--scenarios", default="stream,backlog,trace")
    parser.add_argument(
        "--trace-scale",
        type=float,
        default=0.1,
        help="multiplies Kueue's baseline class counts (1: 15,000 Workloads)",
    )
    parser.add_argument("--trace-creators", type=int, default=16)
    parser.add_argument("--raw-concurrency", type=int, default=16)
    parser.add_argument("--kueue-log-level", default="2", help="as Kueue's manager.yaml ships it")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample Muster's processes with py-spy in each scenario: CPU seconds by process, "
        "thread and activity",
    )
    args = parser.parse_args()
    report = run(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(tables(report))


if __name__ == "__main__":
    main()
