"""Chaos run: two controller replicas with leader election on the local cluster and PostgreSQL,
a stream of mixed Jobs, and the failures a production cluster sees, with a checker that polls
the apiserver throughout and reports what Muster promises never happens.

What it does (every choice drawn from `--seed`):
- two `muster controller` processes (out of cluster, one Lease, each with its own history
  spool) record into a fresh PostgreSQL schema; a supervisor restarts any that exits, as a
  kubelet would, under a new identity;
- a stream of Jobs into two ClusterQueues: plain, elastic (with scale events), partial
  admission (`muster.dev/min-parallelism`), high-priority preemptors, deletions mid-flight,
  queue-label removals and elastic-annotation removals (refusals by the webhook are counted);
- the leader is killed with SIGKILL at random moments (the standby takes over); the second
  of every three times it is paused instead (SIGSTOP until the standby leads, then
  SIGCONT): a deposed leader that wakes up with work in hand, which the fence must stop;
- PostgreSQL is stopped for `--pg-outage` seconds and started again (`pg_ctlcluster`);
- the kube-apiserver is restarted once (same flags; its etcd keeps the data).

The checker reports, at any observed instant: (a) admitted usage over a queue's limit or a
flavor's capacity; (b) a Job unsuspended without an admitted Workload; (c) an elastic Job
with more ungated live pods than admitted; and after the run (d) a Workload admitted more
often than it had attempts (from every replica's log); (e) a transition the apiserver showed
(what `controllers.history.transitions.visible` reads off each observed Workload) missing
from the history store once the database is back, or an attempt recorded with two different
eviction kinds.

Lists of different kinds are not one atomic read, so (b) and (c) bracket the Workloads: Jobs
and Pods are read before and again after them, and only objects unchanged across the bracket
(same resourceVersion) are judged — such a Job or Pod was in that state at the instant the
Workloads were read. Anything that changed in between is judged at the next poll. No grace.

    python bench/chaos.py [--seed 7] [--duration 600] [--cluster-dir DIR] [--json PATH]

Without --cluster-dir a fresh local cluster is started in a temporary directory. Prints the
figures; exits 1 if a violation or a lost record was found.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes.client.exceptions import ApiException
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.harness import objects
from bench.harness.cluster import Cluster, running_cluster
from bench.harness.controller import controller_argv
from bench.harness.process import Process
from bench.harness.waits import wait_until
from controllers.history import transitions
from controllers.localcluster.cluster import pid_alive
from controllers.localcluster.nodes import create_nodes
from controllers.runtime.client import api_client
from controllers.runtime.informer import resource_version
from controllers.runtime.resources import (
    CLUSTER_QUEUE,
    JOB,
    LEASE,
    POD,
    WORKLOAD,
    Kube,
    Obj,
)
from controllers.webhooks import policies
from quota.api.names import (
    ADMISSION_GATE,
    ELASTIC_ANNOTATION,
    JOB_NAME_LABEL,
    MIN_PARALLELISM_ANNOTATION,
    QUEUE_LABEL,
    SCHEDULER_NAME,
)
from quota.api.quantity import parse_quantity

REPO = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get(
    "MUSTER_TEST_POSTGRES_URL", "postgresql+psycopg://muster:muster@127.0.0.1:5432/muster_test"
)
POOL_LABEL = "muster-chaos/pool"
EVICTION_KINDS = {"evicted", "preempted", "reclaimed"}


@dataclass
class Settings:
    seed: int = 7
    duration: float = 600.0
    kill_every: tuple[float, float] = (20.0, 45.0)
    pg_outage: float = 30.0
    apiserver_restart: bool = True
    nodes: int = 4
    node_cpu: int = 8
    job_interval: float = 1.5
    drain_timeout: float = 90.0


@dataclass
class Report:
    seed: int
    duration_s: float
    kills: int = 0
    kills_survived: int = 0
    pauses: int = 0
    pauses_survived: int = 0
    replica_restarts: int = 0
    pg_outage_s: float = 0.0
    apiserver_restarted: bool = False
    jobs_created: int = 0
    jobs_refused: int = 0
    jobs_run: int = 0
    jobs_finished: int = 0
    edits: dict[str, int] = field(default_factory=dict)
    polls: int = 0
    violations: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    inconclusive: int = 0  # (b)/(c) judgements skipped because the object changed mid-poll
    transitions_seen: int = 0
    records_lost: int = 0
    records_twice: int = 0
    writes_refused_by_fence: int = 0


# ---------------------------------------------------------------------- the cluster side


class Replica:
    """One controller slot: restarted under a new identity whenever its process is gone."""

    def __init__(self, slot: str, workdir: Path, kubeconfig: str, lease: str, db: str) -> None:
        self.slot = slot
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.lease = lease
        self.db = db
        self.spool = workdir / f"spool-{slot}"
        self.incarnation = 0
        self.identity = ""
        self.process: Process | None = None
        self.logs: list[Path] = []

    def start(self) -> None:
        self.incarnation += 1
        self.identity = f"{self.slot}-{self.incarnation}"
        log_path = self.workdir / f"{self.identity}.log"
        self.logs.append(log_path)
        argv = controller_argv(
            self.kubeconfig,
            lease=self.lease,
            database_url=self.db,
            spool_dir=self.spool,
            lease_seconds=(6, 4, 1),
            flags=("--identity", self.identity),
        )
        self.process = Process(self.identity, argv, log_path)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def pause(self) -> None:
        if self.process is not None:
            self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def log_records(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in self.logs:
            if not path.exists():
                continue
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        out.append(record)
        return out


def restart_apiserver(cluster: Cluster) -> None:
    """Stop the kube-apiserver and start it again with the same flags (etcd keeps the data)."""
    local = cluster.local
    assert local is not None and local.state is not None
    component = next(c for c in local.state.components if c.name == "kube-apiserver")
    argv = Path(f"/proc/{component.pid}/cmdline").read_bytes().split(b"\0")[:-1]
    cwd = os.readlink(f"/proc/{component.pid}/cwd")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(component.pid, signal.SIGTERM)
    wait_until(lambda: not pid_alive(component.pid), 30, every=0.1)
    with open(component.log, "ab") as out:
        proc = subprocess.Popen(
            [a.decode() for a in argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )
    component.pid = proc.pid
    local.state.save()

    def ready() -> bool:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return (
                cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=5).returncode == 0
            )
        return False

    if not wait_until(ready, 60):
        raise RuntimeError("kube-apiserver did not come back within 60 s")


def pg(action: str) -> None:
    subprocess.run(["pg_ctlcluster", "15", "main", action], check=True, timeout=120)


# --------------------------------------------------------------------------- the checker


def _condition(obj: Obj, type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _admitted(wl: Obj) -> bool:
    return _condition(wl, "QuotaReserved") and not _condition(wl, "Finished")


def _job_done(job: Obj) -> bool:
    return _condition(job, "Complete") or _condition(job, "Failed")


class Checker:
    """Polls the apiserver and keeps what (a), (b), (c) and (e) need."""

    def __init__(self, kube: Kube, namespace: str, capacity: dict[str, int]) -> None:
        self.kube = kube
        self.namespace = namespace
        self.capacity = capacity  # cpu millicores per flavor
        self.violations: Counter[str] = Counter()
        self.inconclusive = 0
        self.examples: list[str] = []
        self.polls = 0
        self.expected: dict[tuple[str, str, int], str] = {}  # key -> workload name
        self.attempts: dict[str, int] = {}  # workload key -> highest attempt seen
        self.jobs_run: set[str] = set()
        self.jobs_finished: set[str] = set()
        self._reported: set[tuple[str, str]] = set()  # (rule, object) already counted

    def _violate(self, rule: str, what: str) -> None:
        self.violations[rule] += 1
        if len(self.examples) < 20:
            self.examples.append(f"({rule}) {what}")

    def _judge(self, rule: str, key: str, bad: bool, what: str) -> None:
        """Count a violation once per object and rule while it lasts."""
        ident = (rule, key)
        if not bad:
            self._reported.discard(ident)
        elif ident not in self._reported:
            self._reported.add(ident)
            self._violate(rule, what)

    def poll(self) -> None:
        jobs_before, _ = self.kube.list(JOB, self.namespace)
        pods_before, _ = self.kube.list(POD, self.namespace)
        cqs, _ = self.kube.list(CLUSTER_QUEUE)
        wls, _ = self.kube.list(WORKLOAD, self.namespace)
        jobs, _ = self.kube.list(JOB, self.namespace)
        pods, _ = self.kube.list(POD, self.namespace)
        self.polls += 1
        # Objects unchanged across the Workload read were in that state when it was taken.
        seen_jobs = {j["metadata"]["uid"]: resource_version(j) for j in jobs_before}
        seen_pods = {p["metadata"]["uid"]: resource_version(p) for p in pods_before}
        limits: dict[str, dict[tuple[str, str], int]] = {}
        for cq in cqs:
            per: dict[tuple[str, str], int] = {}
            for fl in (cq.get("spec") or {}).get("flavors") or []:
                caps = {**(fl.get("quota") or {}), **(fl.get("limit") or {})}
                for res, qty in caps.items():
                    per[(fl["name"], res)] = parse_quantity(qty, res)
            limits[cq["metadata"]["name"]] = per
        usage: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
        admitted_by_job: dict[str, int] = Counter()
        has_admitted: set[str] = set()
        for wl in wls:
            meta = wl["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            self.attempts[key] = max(self.attempts.get(key, 0), transitions.attempt(wl))
            for t in transitions.visible(wl):
                self.expected.setdefault((t.uid, t.kind.value, t.sequence), key)
            job = (meta.get("labels") or {}).get(JOB_NAME_LABEL, "")
            if not _admitted(wl):
                continue
            has_admitted.add(job)
            admission = (wl.get("status") or {}).get("admission") or {}
            queue = admission.get("clusterQueue", "")
            for psa in admission.get("podSetAssignments") or []:
                admitted_by_job[job] += int(psa.get("count") or 0)
                flavors = psa.get("flavors") or {}
                for res, qty in (psa.get("resourceUsage") or {}).items():
                    usage[queue][(flavors.get(res, ""), res)] += parse_quantity(qty, res)
        # (a) queue limits and flavor capacity, at this instant
        per_flavor: Counter[str] = Counter()
        for queue, used in usage.items():
            for (flavor, res), amount in used.items():
                cap = limits.get(queue, {}).get((flavor, res))
                if cap is not None and amount > cap:
                    self._violate("a", f"{queue} uses {amount} {res} in {flavor}, limit {cap}")
                if res == "cpu":
                    per_flavor[flavor] += amount
        for flavor, amount in per_flavor.items():
            cap = self.capacity.get(flavor)
            if cap is not None and amount > cap:
                self._violate("a", f"flavor {flavor}: {amount}m cpu admitted, capacity {cap}m")
        # (b) a Job running without an admitted Workload
        live_ungated: Counter[str] = Counter()
        changed_pods: set[str] = set()  # Jobs with a pod that changed across the bracket
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            job_name = labels.get("batch.kubernetes.io/job-name", "")
            if seen_pods.get(pod["metadata"]["uid"]) != resource_version(pod):
                changed_pods.add(job_name)
                continue
            gates = (pod.get("spec") or {}).get("schedulingGates") or []
            if (
                pod["metadata"].get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                or any(g.get("name") == ADMISSION_GATE for g in gates)
            ):
                continue
            live_ungated[job_name] += 1
        for job in jobs:
            name = job["metadata"]["name"]
            labels = job["metadata"].get("labels") or {}
            notes = job["metadata"].get("annotations") or {}
            if _job_done(job):
                self.jobs_finished.add(name)
            if not (job.get("spec") or {}).get("suspend"):
                self.jobs_run.add(name)
            if seen_jobs.get(job["metadata"]["uid"]) != resource_version(job):
                self.inconclusive += 1
                continue
            running = not (job.get("spec") or {}).get("suspend") and not _job_done(job)
            managed = QUEUE_LABEL in labels
            self._judge(
                "b",
                name,
                managed and running and name not in has_admitted,
                f"Job {name} unsuspended without an admitted Workload",
            )
            # (c) an elastic Job's ungated pods within what is admitted
            if notes.get(ELASTIC_ANNOTATION) == "true":
                if name in changed_pods:
                    self.inconclusive += 1
                    continue
                excess = live_ungated[name] - admitted_by_job.get(name, 0)
                self._judge(
                    "c",
                    name,
                    managed and excess > 0,
                    f"elastic Job {name}: {live_ungated[name]} ungated pods, "
                    f"{admitted_by_job.get(name, 0)} admitted",
                )


def double_admissions(replicas: list[Replica], attempts: dict[str, int]) -> list[str]:
    """(d): workloads logged as admitted more often than they had attempts."""
    counts: Counter[str] = Counter()
    for replica in replicas:
        for record in replica.log_records():
            if record.get("msg") == "admitted workload":
                counts[str(record.get("workload"))] += 1
    return [
        f"(d) {key} admitted {n} times in {attempts.get(key, 0) + 1} attempts"
        for key, n in sorted(counts.items())
        if key in attempts and n > attempts[key] + 1
    ]


# ------------------------------------------------------------------------- the stream


def job_manifest(rng: random.Random, name: str, namespace: str, kind: str) -> Obj:
    queue = rng.choice(["lq-a", "lq-b"])
    parallelism = rng.randint(1, 3)
    notes: dict[str, str] = {}
    priority = "chaos-low"
    runs_for = f"{rng.randint(5, 25)}s"
    if kind == "elastic":
        notes[ELASTIC_ANNOTATION] = "true"
        parallelism = rng.randint(2, 4)
        runs_for = f"{rng.randint(20, 40)}s"
    elif kind == "partial":
        parallelism = rng.randint(4, 6)
        notes[MIN_PARALLELISM_ANNOTATION] = "2"
    elif kind == "preemptor":
        priority = "chaos-high"
        parallelism = rng.randint(2, 4)
    meta: Obj = {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: queue}}
    if notes:
        meta["annotations"] = notes
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "parallelism": parallelism,
            # An elastic Job runs until its pods finish, whatever its size by then.
            **({} if kind == "elastic" else {"completions": parallelism}),
            "template": {
                "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": runs_for}},
                "spec": {
                    "restartPolicy": "Never",
                    "priorityClassName": priority,
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"requests": {"cpu": rng.choice(["500m", "1", "2"])}},
                        }
                    ],
                },
            },
        },
    }


class Stream:
    """Creates and edits Jobs at random; every refusal is counted, nothing is retried blind."""

    def __init__(self, kube: Kube, namespace: str, rng: random.Random) -> None:
        self.kube = kube
        self.namespace = namespace
        self.rng = rng
        self.created: list[str] = []
        self.refused = 0
        self.edits: Counter[str] = Counter()

    def step(self) -> None:
        rng = self.rng
        action = rng.choices(
            ["plain", "elastic", "partial", "preemptor", "scale", "delete", "unlabel", "unelastic"],
            weights=[25, 12, 8, 7, 15, 10, 5, 4],
        )[0]
        if action in ("plain", "elastic", "partial", "preemptor"):
            name = f"{action}-{len(self.created)}-{uuid.uuid4().hex[:4]}"
            try:
                self.kube.create(
                    JOB, self.namespace, job_manifest(rng, name, self.namespace, action)
                )
                self.created.append(name)
            except ApiException:
                self.refused += 1
            except Exception:
                self.refused += 1
            return
        if not self.created:
            return
        name = rng.choice(self.created[-10:])
        try:
            job = self.kube.get(JOB, self.namespace, name)
            if job is None or _job_done(job):
                return
            notes = job["metadata"].get("annotations") or {}
            suspended = bool((job.get("spec") or {}).get("suspend"))
            if action == "scale" and notes.get(ELASTIC_ANNOTATION) == "true":
                size = rng.randint(1, 6)
                self.kube.patch(JOB, self.namespace, name, {"spec": {"parallelism": size}})
            elif action == "delete":
                self.kube.delete(JOB, self.namespace, name)
            elif action == "unlabel" and suspended:
                self.kube.patch(
                    JOB, self.namespace, name, {"metadata": {"labels": {QUEUE_LABEL: None}}}
                )
            elif action == "unelastic" and suspended and notes.get(ELASTIC_ANNOTATION):
                patch = {"metadata": {"annotations": {ELASTIC_ANNOTATION: None}}}
                self.kube.patch(JOB, self.namespace, name, patch)
            else:
                return
            self.edits[action] += 1
        except Exception:
            self.edits[f"{action}-refused"] += 1


# ---------------------------------------------------------------------------- the run


def setup(cluster: Cluster, namespace: str, settings: Settings) -> dict[str, int]:
    pool = f"chaos-{uuid.uuid4().hex[:6]}"
    create_nodes(
        cluster.kc,
        cluster.kubeconfig,
        settings.nodes,
        prefix=pool,
        cpu=str(settings.node_cpu),
        memory="64Gi",
        labels={POOL_LABEL: pool},
    )
    half = {"cpu": str(settings.nodes * settings.node_cpu // 2)}
    docs: list[Obj] = [objects.namespace(namespace), objects.flavor(pool, {POOL_LABEL: pool})]
    for value, pc in ((100, "chaos-low"), (1000, "chaos-high")):
        docs.append(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": pc},
                "value": value,
                "preemptionPolicy": "Never",
            }
        )
    for suffix in ("a", "b"):
        cq = f"{namespace}-{suffix}"
        docs += [
            objects.cluster_queue(
                cq, pool, half, limit=half, preemption={"withinQueue": "LowerPriority"}
            ),
            objects.local_queue(namespace, cq, name=f"lq-{suffix}"),
        ]
    cluster.apply(docs)
    return {pool: settings.nodes * settings.node_cpu * 1000}


def fresh_schema() -> tuple[str, str]:
    """A new schema in the test database, and the controller URL that uses it."""
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    admin.dispose()
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    return schema, url.render_as_string(hide_password=False)


def stored(schema: str) -> list[tuple[str, str, int]]:
    engine = create_engine(PG_URL, pool_pre_ping=True)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT uid, kind, sequence FROM {schema}.workload_transitions")
            )
            return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]
    finally:
        engine.dispose()


def leader_of(kube: Kube, lease: str) -> str:
    obj = kube.get(LEASE, "muster-system", lease)
    return str(((obj or {}).get("spec") or {}).get("holderIdentity") or "")


def run(settings: Settings, cluster: Cluster, workdir: Path) -> Report:
    # The stream and the failures draw from generators of their own (they run on two threads).
    rng = random.Random(settings.seed + 1)
    kubeconfig = cluster.kubeconfig
    cluster.install_crds()
    namespace = f"chaos-{settings.seed}-{uuid.uuid4().hex[:4]}"
    capacity = setup(cluster, namespace, settings)
    schema, db = fresh_schema()
    kube = Kube(api_client(kubeconfig, pool_size=8), request_timeout=10)
    lease = f"chaos-{uuid.uuid4().hex[:6]}"
    replicas = [Replica(s, workdir, kubeconfig, lease, db) for s in ("r1", "r2")]
    report = Report(seed=settings.seed, duration_s=settings.duration)
    checker = Checker(kube, namespace, capacity)
    stream = Stream(kube, namespace, random.Random(settings.seed))
    stop = threading.Event()

    def wait_leader(exclude: str = "", timeout: float = 60) -> str:
        """The replica that leads now (not `exclude`); "" if none does within `timeout`."""
        holder = ""

        def led() -> bool:
            nonlocal holder
            with contextlib.suppress(Exception):
                holder = leader_of(kube, lease)
                return holder != exclude and any(r.identity == holder for r in replicas)
            return False

        return holder if wait_until(led, timeout, every=0.2) else ""

    stream_stop = threading.Event()

    def stream_loop() -> None:
        # Jobs keep coming while leaders die and the database is down, as users' do.
        while not stream_stop.is_set():
            stream.step()
            stream_stop.wait(settings.job_interval * stream.rng.uniform(0.5, 1.5))

    def poll_loop() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # the apiserver restarting, say
                checker.poll()
            stop.wait(0.5)

    def supervise() -> None:
        while not stop.is_set():
            for replica in replicas:
                if not replica.alive():
                    replica.start()
                    report.replica_restarts += 1
            stop.wait(1.0)

    pg_stopped = False
    threads = [
        threading.Thread(target=poll_loop, daemon=True),
        threading.Thread(target=supervise, daemon=True),
    ]
    try:
        for replica in replicas:
            replica.start()
        wait_leader()
        for t in threads:
            t.start()
        if policies.served(kube):
            # Jobs come only once the apiserver suspends them itself: a leader registers
            # Muster's policies a moment after it leads, and a labelled Job created before the
            # apiserver acts on them starts unsuspended (a violation this run would report).
            policies.wait_active(kube, "muster-system", SCHEDULER_NAME, timeout=120)
        else:
            time.sleep(2.0)  # the webhooks registered
        streamer = threading.Thread(target=stream_loop, daemon=True)
        streamer.start()

        start = time.monotonic()
        next_kill = start + rng.uniform(*settings.kill_every)
        pg_at = start + settings.duration * 0.3
        api_at = start + settings.duration * 0.7
        pg_down_until: float | None = None
        pg_done = False
        api_done = not settings.apiserver_restart
        print(f"chaos: namespace {namespace}, schema {schema}, seed {settings.seed}", flush=True)
        while time.monotonic() - start < settings.duration:
            now = time.monotonic()
            if now >= next_kill:
                holder = wait_leader(timeout=30)
                victim = next((r for r in replicas if r.identity == holder), None)
                if victim is not None and (report.kills + report.pauses) % 3 == 1:
                    victim.pause()
                    report.pauses += 1
                    print(f"chaos: t={now - start:.0f}s SIGSTOP leader {holder}", flush=True)
                    if wait_leader(exclude=holder, timeout=60):
                        report.pauses_survived += 1
                    victim.resume()  # it wakes up deposed, with whatever it was doing
                elif victim is not None:
                    victim.kill()
                    report.kills += 1
                    print(f"chaos: t={now - start:.0f}s SIGKILL leader {holder}", flush=True)
                    if wait_leader(exclude=holder, timeout=60):
                        report.kills_survived += 1
                next_kill = time.monotonic() + rng.uniform(*settings.kill_every)
            if not pg_done and pg_down_until is None and now >= pg_at:
                print(f"chaos: t={now - start:.0f}s PostgreSQL stopped", flush=True)
                pg("stop")
                pg_stopped = True
                pg_down_until = now + settings.pg_outage
            if pg_down_until is not None and now >= pg_down_until:
                pg("start")
                pg_stopped = False
                report.pg_outage_s = settings.pg_outage
                print(f"chaos: t={now - start:.0f}s PostgreSQL started", flush=True)
                pg_down_until, pg_done = None, True
            if not api_done and now >= api_at:
                print(f"chaos: t={now - start:.0f}s kube-apiserver restarting", flush=True)
                restart_apiserver(cluster)
                report.apiserver_restarted = api_done = True
            time.sleep(0.2)
        stream_stop.set()
        streamer.join(timeout=30)
        if pg_down_until is not None:
            pg("start")
            pg_stopped = False
            report.pg_outage_s = settings.pg_outage

        # Let the last Jobs settle, then check the store once every replica has drained.
        print("chaos: stream stopped; draining", flush=True)
        missing: set[tuple[str, str, int]] = set(checker.expected)
        keys: list[tuple[str, str, int]] = []

        def drained() -> bool:
            nonlocal keys, missing
            with contextlib.suppress(Exception):
                keys = stored(schema)
                missing = set(checker.expected) - set(keys)
            return not missing

        wait_until(drained, settings.drain_timeout, every=3.0)
    finally:
        # Whatever happened, leave no controller running and PostgreSQL up.
        stream_stop.set()
        stop.set()
        if pg_stopped:
            pg("start")
        for t in threads:
            if t.is_alive():
                t.join(timeout=10)
        for replica in replicas:
            replica.resume()
            replica.stop()

    twice: Counter[tuple[str, int]] = Counter(
        (uid, seq) for uid, kind, seq in keys if kind in EVICTION_KINDS
    )
    doubles = double_admissions(replicas, checker.attempts)
    report.jobs_created = len(stream.created)
    report.jobs_refused = stream.refused
    report.jobs_run = len(checker.jobs_run)
    report.jobs_finished = len(checker.jobs_finished)
    report.edits = dict(stream.edits)
    report.polls = checker.polls
    report.violations = dict(checker.violations)
    if doubles:
        report.violations["d"] = len(doubles)
    report.examples = checker.examples + doubles[:10]
    report.inconclusive = checker.inconclusive
    report.transitions_seen = len(checker.expected)
    report.records_lost = len(missing)
    report.records_twice = sum(1 for n in twice.values() if n > 1)
    if report.records_twice:
        report.violations["e"] = report.violations.get("e", 0) + report.records_twice
    report.examples += [f"(e) lost {checker.expected[k]} {k[1]} #{k[2]}" for k in sorted(missing)][
        :10
    ]
    report.writes_refused_by_fence = sum(
        1 for r in replicas for rec in r.log_records() if "does not lead now" in json.dumps(rec)
    )
    with contextlib.suppress(Exception):
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    return report


def render(report: Report) -> str:
    total = sum(report.violations.values())
    lines = [
        f"chaos run, seed {report.seed}, {report.duration_s:.0f} s",
        f"  kills survived      {report.kills_survived}/{report.kills}; pauses survived "
        f"{report.pauses_survived}/{report.pauses} (replica restarts {report.replica_restarts})",
        f"  PostgreSQL outage   {report.pg_outage_s:.0f} s; apiserver restarted: "
        f"{'yes' if report.apiserver_restarted else 'no'}",
        f"  Jobs                {report.jobs_created} created, {report.jobs_refused} refused, "
        f"{report.jobs_run} run, {report.jobs_finished} finished; edits {report.edits}",
        f"  checker polls       {report.polls}",
        f"  violations          {total} {report.violations or ''}",
        f"  inconclusive        {report.inconclusive} judgements of (b)/(c) put off to the "
        "next poll (the object changed while the Workloads were read)",
        f"  transitions seen    {report.transitions_seen}; records lost {report.records_lost}; "
        f"recorded twice {report.records_twice}",
        f"  writes refused by the leader fence: {report.writes_refused_by_fence}",
    ]
    lines += [f"    {e}" for e in report.examples]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--kill-every", type=float, nargs=2, default=(20.0, 45.0))
    parser.add_argument("--pg-outage", type=float, default=30.0)
    parser.add_argument("--no-apiserver-restart", action="store_true")
    parser.add_argument("--job-interval", type=float, default=1.5)
    parser.add_argument("--drain-timeout", type=float, default=90.0)
    parser.add_argument("--cluster-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    settings = Settings(
        seed=args.seed,
        duration=args.duration,
        kill_every=tuple(args.kill_every),
        pg_outage=args.pg_outage,
        apiserver_restart=not args.no_apiserver_restart,
        job_interval=args.job_interval,
        drain_timeout=args.drain_timeout,
    )
    workdir = Path(tempfile.mkdtemp(prefix="muster-chaos-"))
    with running_cluster(
        directory=args.cluster_dir, fresh_in=workdir / "cluster", build=args.cluster_dir is None
    ) as cluster:
        report = run(settings, cluster, workdir)
    print(render(report), flush=True)
    print(f"controller logs and spools: {workdir}")
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    return 1 if sum(report.violations.values()) or report.records_lost else 0


if __name__ == "__main__":
    sys.exit(main())
