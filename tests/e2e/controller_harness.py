"""Running `muster controller` as a user would, for the controller's end-to-end tests: a
subprocess against the local cluster's kubeconfig, with its JSON log kept for assertions,
plus small builders for the flavors, queues and Jobs a test drives with kubectl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers.localcluster.cluster import free_port
from tests.conftest import REPO, ClusterHandle

MUSTER = str(REPO / ".venv" / "bin" / "muster")
# One Lease for every controller any e2e test starts: two controllers alive at once (a test
# that forgot to stop one, or the two-replica test) can never both act.
LEASE = "muster-controller-e2e"


class Controller:
    """One `muster controller` process."""

    def __init__(self, cluster: ClusterHandle, log_dir: Path, name: str, *extra: str) -> None:
        self.cluster = cluster
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.port = free_port()
        self.metrics_port = free_port()
        self.extra = list(extra)
        if "--database-url" not in self.extra and "--no-history" not in self.extra:
            # Keep each test session's history in its own file, not the user's default store.
            self.extra += ["--database-url", f"sqlite:///{log_dir / 'history.db'}"]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Controller:
        argv = [
            MUSTER,
            "controller",
            "--kubeconfig",
            self.cluster.kubeconfig,
            "--webhook-port",
            str(self.port),
            "--lease-name",
            LEASE,
            "--identity",
            self.name,
            "--lease-duration",
            "6",
            "--renew-deadline",
            "4",
            "--retry-period",
            "1",
            "--metrics-port",
            str(self.metrics_port),
            *self.extra,
        ]
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=log, env=os.environ.copy())
        return self

    def logs(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        if not self.log_path.exists():
            return records
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                records.append({"msg": line})
        return records

    def logged(self, msg: str) -> list[dict[str, Any]]:
        return [r for r in self.logs() if r.get("msg") == msg]

    def wait_leading(self, timeout: float = 60) -> None:
        self.cluster.wait_for(
            f"controller {self.name} to lead", lambda: self._alive() and self.leading(), timeout
        )
        # The webhook configuration points at the leader once it leads.
        self.cluster.wait_for(
            f"webhooks registered for {self.name}",
            lambda: (
                str(self.port)
                in self.cluster.kubectl(
                    "get",
                    "validatingwebhookconfiguration",
                    "muster-webhooks",
                    "-o",
                    "jsonpath={.webhooks[0].clientConfig.url}",
                    check=False,
                ).stdout
            ),
            timeout,
        )

    def leading(self) -> bool:
        return bool(self.logged("became leader"))

    def _alive(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
            raise AssertionError(f"controller {self.name} exited:\n{tail}")
        return True

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM and wait (graceful shutdown)."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def kill(self) -> None:
        """SIGKILL: the controller dies mid-work, as in a node failure."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture(scope="session")
def crds(cluster: ClusterHandle) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    cluster.kubectl("wait", "--for", "condition=Established", "crd", "--all", "--timeout=60s")


@pytest.fixture(scope="module")
def controller(
    cluster: ClusterHandle,
    crds: None,
    before_controller: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Controller]:
    """One controller for a test module, stopped (SIGTERM) at its end."""
    ctl = Controller(cluster, tmp_path_factory.mktemp("controller"), "ctl-" + uuid.uuid4().hex[:6])
    ctl.start()
    try:
        ctl.wait_leading()
        yield ctl
    finally:
        ctl.stop()


def token_kubeconfig(
    cluster: ClusterHandle, namespace: str, account: str, path: Path, *, home: str | None = None
) -> str:
    """A kubeconfig that holds nothing but a token (TokenRequest) of the ServiceAccount
    `namespace/account`; `home`: its context's namespace (kubectl's default otherwise)."""
    token = cluster.kubectl(
        "create", "token", account, "--namespace", namespace, "--duration", "2h"
    ).stdout.strip()
    server = yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]
    context: dict[str, str] = {"cluster": "local", "user": account}
    if home:
        context["namespace"] = home
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": context}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


# ------------------------------------------------------------------ builders


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def apply(cluster: ClusterHandle, *docs: Mapping[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(list(docs), sort_keys=False))


def create(cluster: ClusterHandle, doc: Mapping[str, Any]) -> dict[str, Any]:
    """`kubectl create`, returning the object as the apiserver stored it (after webhooks)."""
    out = cluster.kubectl("create", "-f", "-", "-o", "json", input=yaml.safe_dump(dict(doc)))
    created: dict[str, Any] = json.loads(out.stdout)
    return created


def flavor(name: str, pool: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": {"muster-e2e/pool": pool}, **spec},
    }


def cluster_queue(name: str, flavors: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A ClusterQueue that evicts at once (waitBeforeEvicting 0s) unless told otherwise: the
    tests follow what an eviction does, and the wait before it is the unit tests' to check."""
    preemption = {"waitBeforeEvicting": "0s", **(spec.pop("preemption", None) or {})}
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {"flavors": flavors, "preemption": preemption, **spec},
    }


def local_queue(name: str, namespace: str, cq: str) -> dict[str, Any]:
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cq},
    }


def job(
    name: str,
    namespace: str,
    queue: str | None,
    *,
    parallelism: int = 1,
    completions: int | None = None,
    cpu: str = "1",
    runs_for: str | None = None,
    priority_class: str | None = None,
    elastic: bool = False,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A batch/v1 Job; `runs_for` makes its pods complete after that long (kwok)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if queue:
        meta["labels"] = {"muster.dev/queue-name": queue}
    notes = dict(annotations or {})
    if elastic:
        notes["muster.dev/elastic-job"] = "true"
    if notes:
        meta["annotations"] = notes
    pod_meta: dict[str, Any] = {}
    if runs_for:
        pod_meta["annotations"] = {"pod-complete.stage.kwok.x-k8s.io/delay": runs_for}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
        ],
    }
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    spec: dict[str, Any] = {
        "parallelism": parallelism,
        "template": {"metadata": pod_meta, "spec": pod_spec},
    }
    if completions is not None:
        spec["completions"] = completions
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": "Never",
    }


# ------------------------------------------------------------------- reading


def get(cluster: ClusterHandle, *args: str) -> dict[str, Any]:
    return cluster.get_json(*args)


def workloads_of(cluster: ClusterHandle, namespace: str, job_name: str) -> list[dict[str, Any]]:
    data = get(
        cluster, "workloads.muster.dev", "-n", namespace, "-l", f"muster.dev/job-name={job_name}"
    )
    return sorted(data["items"], key=lambda w: w["metadata"]["creationTimestamp"])


def condition(obj: Mapping[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


def preempting_queue(
    cluster: ClusterHandle, namespace: str, pool: str, cpu: str, *more: Mapping[str, Any]
) -> tuple[str, str]:
    """A flavor on `pool`'s nodes, a ClusterQueue of `cpu` on it whose higher priorities
    preempt lower ones, LocalQueue `team` in `namespace`, and two PriorityClasses: returns
    their names (low, high). `more` is applied with them."""
    low, high = unique("low"), unique("high")
    cq = unique("cq")
    apply(
        cluster,
        priority_class(low, 10),
        priority_class(high, 1000),
        flavor(pool, pool),
        cluster_queue(
            cq,
            [{"name": pool, "quota": {"cpu": cpu}, "limit": {"cpu": cpu}}],
            preemption={"withinQueue": "LowerPriority"},
        ),
        local_queue("team", namespace, cq),
        *more,
    )
    return low, high


def wait_told_missing_queue(
    cluster: ClusterHandle, namespace: str, name: str, queue: str
) -> dict[str, Any]:
    """Wait until the Workload of the object `name` says its LocalQueue `queue` does not
    exist (Inadmissible); returns that Workload."""
    cluster.wait_for(
        "the Workload to say its LocalQueue is missing",
        lambda: (
            "does not exist"
            in condition((workloads_of(cluster, namespace, name) or [{}])[0], "QuotaReserved").get(
                "message", ""
            )
        ),
    )
    wl = workloads_of(cluster, namespace, name)[0]
    assert condition(wl, "QuotaReserved")["reason"] == "Inadmissible"
    assert queue in condition(wl, "QuotaReserved")["message"]
    return wl


def eviction_reason(wl: Mapping[str, Any]) -> str:
    """Why the Workload was last evicted ("" if never): Evicted's reason while its pods stop,
    and the head of its message once the eviction ended (QuotaReleased: "Reclaimed: ...")."""
    evicted = condition(wl, "Evicted")
    if evicted.get("status") == "True":
        return str(evicted.get("reason") or "")
    if evicted.get("reason") == "QuotaReleased":
        return str(evicted.get("message") or "").split(":", 1)[0]
    return ""


def admitted(wl: Mapping[str, Any]) -> bool:
    return condition(wl, "QuotaReserved").get("status") == "True" and not finished(wl)


def finished(wl: Mapping[str, Any]) -> bool:
    return condition(wl, "Finished").get("status") == "True"


def pods_of(cluster: ClusterHandle, namespace: str, job_name: str) -> list[dict[str, Any]]:
    data = get(cluster, "pods", "-n", namespace, "-l", f"batch.kubernetes.io/job-name={job_name}")
    items: list[dict[str, Any]] = data["items"]
    return items


def gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g["name"] == "muster.dev/admission" for g in gates)


def live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if p["status"].get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    ]


def events_on(cluster: ClusterHandle, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    """The Events on one object."""
    data = get(
        cluster,
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.kind={kind},involvedObject.name={name}",
    )
    items: list[dict[str, Any]] = data["items"]
    return items


def events_for(cluster: ClusterHandle, namespace: str, kind: str, name: str) -> list[str]:
    return [e["reason"] for e in events_on(cluster, namespace, kind, name)]


def cq_status(cluster: ClusterHandle, name: str) -> dict[str, Any]:
    return get(cluster, "clusterqueues.muster.dev", name).get("status") or {}


class LabelledPool:
    """Nodes with a label of their own (`muster-e2e/pool`, which the flavor selects) and a
    queue over them: ClusterQueue `cq`, LocalQueue `lq` in `namespace`. Deleted by `delete`."""

    def __init__(self, cluster: ClusterHandle, namespace: str, prefix: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = unique(prefix)
        self.cq = unique("cq")
        self.nodes: list[str] = []

    def add_nodes(self, count: int, cpu: str = "1") -> None:
        self.nodes += self.cluster.nodes(
            count, cpu=cpu, memory="64Gi", gpu=0, labels={"muster-e2e/pool": self.name}
        )

    def queue(self, cpu: str, lq: str = "lq", **spec: Any) -> None:
        quota = {"cpu": cpu}
        apply(
            self.cluster,
            flavor(self.name, self.name),
            cluster_queue(self.cq, [{"name": self.name, "quota": quota, "limit": quota}], **spec),
            local_queue(lq, self.namespace, self.cq),
        )

    def delete(self) -> None:
        if self.nodes:
            self.cluster.kubectl("delete", "node", *self.nodes, "--wait=false", check=False)
