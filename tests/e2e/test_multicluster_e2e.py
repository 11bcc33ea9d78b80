"""Many clusters, end to end (issue 29): the session's cluster manages, two more local
clusters (each a real apiserver with kwok nodes and its own Muster) are its workers. Jobs
labelled in the management cluster run, whole, in the worker where they fit; a worker that
stops answering has its never-started copies sent elsewhere and its running ones left alone;
no Job ever runs in two clusters (a checker polls all three the whole time); a restarted
manager creates no second copy."""

from __future__ import annotations

import base64
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controllers.localcluster.binaries import ensure_binaries
from controllers.localcluster.cluster import LocalCluster
from quota.api.names import (
    DISPATCH_MANAGED_BY,
    DISPATCHED_TO_ANNOTATION,
    ORIGIN_UID_LABEL,
)
from tests.conftest import REPO, ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    events_on,
    finished,
    flavor,
    get,
    job,
    local_queue,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
MUSTER_NAMESPACE = "muster-system"  # where the manager looks for the kubeconfig Secrets


@dataclass
class WorkerCluster:
    name: str
    handle: ClusterHandle
    controller: Controller
    pool: str

    def pid(self, component: str) -> int:
        state = self.handle.local.state
        assert state is not None
        return next(c.pid for c in state.components if c.name == component)

    def copies(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = get(self.handle, "jobs", "-A", "-l", ORIGIN_UID_LABEL)[
            "items"
        ]
        return items


@pytest.fixture(scope="module")
def workers(
    cluster: ClusterHandle,
    controller: Controller,  # noqa: F811 - the manager: it makes its namespace, for the Secrets
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[WorkerCluster]]:
    """Two worker clusters of two nodes of 8 GPUs each; each runs Muster with a
    flavor `gpu` and a ClusterQueue of 64 GPUs."""
    binaries = ensure_binaries(build=True)
    # One flavor across the fleet: the manager's ResourceFlavor selects the workers' nodes.
    pool = unique("fleet-gpu")
    made: list[WorkerCluster] = []
    locals_: list[LocalCluster] = []
    try:
        for name in ("w1", "w2"):
            local = LocalCluster(tmp_path_factory.mktemp(f"worker-{name}"), binaries)
            locals_.append(local)
            local.up()
            handle = ClusterHandle(local, str(local.kubeconfig), binaries["kubectl"])
            handle.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
            handle.kubectl(
                "wait", "--for", "condition=Established", "crd", "--all", "--timeout=60s"
            )
            handle.nodes(2, prefix=f"{name}-gpu", gpu=8, labels={"muster-e2e/pool": pool})
            apply(
                handle,
                flavor("gpu", pool),
                cq_manifest("team", [{"name": "gpu", "quota": {GPU: "64", "cpu": "512"}}]),
            )
            ctl = Controller(handle, tmp_path_factory.mktemp(f"ctl-{name}"), f"ctl-{name}")
            ctl.start()
            ctl.wait_leading()
            made.append(WorkerCluster(name, handle, ctl, pool))
        for w in made:
            config = Path(w.handle.kubeconfig).read_bytes()
            apply(
                cluster,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": f"kubeconfig-{w.name}", "namespace": MUSTER_NAMESPACE},
                    "data": {"kubeconfig": base64.b64encode(config).decode()},
                },
                {
                    "apiVersion": "muster.dev/v1alpha1",
                    "kind": "WorkerCluster",
                    "metadata": {"name": w.name, "labels": {"muster-e2e/fleet": "gpus"}},
                    "spec": {"kubeconfig": {"name": f"kubeconfig-{w.name}"}, "lostAfter": "10s"},
                },
            )
        yield made
    finally:
        cluster.kubectl("delete", "workerclusters.muster.dev", "w1", "w2", check=False)
        for w in made:
            w.controller.stop()
        for local in locals_:
            local.down()


def _mirrored(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, Any]:
    return get(cluster, "job", "-n", namespace, name).get("status") or {}


def _dispatched_to(cluster: ClusterHandle, namespace: str, name: str) -> str | None:
    wls = workloads_of(cluster, namespace, name)
    if not wls:
        return None
    return (wls[0]["metadata"].get("annotations") or {}).get(DISPATCHED_TO_ANNOTATION)


class TwoCopiesChecker:
    """Polls every worker the whole test: no Job may run (be unsuspended) in two clusters."""

    def __init__(self, workers: list[WorkerCluster]) -> None:
        self.workers = workers
        self.running_in: dict[str, set[str]] = {}
        self.violations: list[str] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TwoCopiesChecker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            seen: dict[str, set[str]] = {}
            for w in self.workers:
                try:
                    copies = w.copies()
                except Exception:
                    copies = [
                        {"metadata": {"labels": {ORIGIN_UID_LABEL: uid}}, "spec": {}}
                        for uid, where in self.running_in.items()
                        if w.name in where
                    ]
                for c in copies:
                    if c["spec"].get("suspend"):
                        continue
                    uid = c["metadata"]["labels"][ORIGIN_UID_LABEL]
                    seen.setdefault(uid, set()).add(w.name)
            for uid, where in seen.items():
                if len(where) > 1:
                    self.violations.append(f"{uid} runs in {sorted(where)}")
            self.running_in = seen
            self.polls += 1


def _gpu_job(name: str, namespace: str, pods: int, **kw: Any) -> dict[str, Any]:
    manifest = job(name, namespace, "lq", parallelism=pods, completions=pods, cpu="1", **kw)
    manifest["spec"]["managedBy"] = DISPATCH_MANAGED_BY
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["requests"][GPU] = "8"
    container["resources"]["limits"] = {GPU: "8"}
    return manifest


def _foreign_pod(namespace: str, node: str) -> dict[str, Any]:
    """Someone else's pod in a worker, 8 GPUs on `node`: Muster here never sent it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "someone-elses", "namespace": namespace},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": {GPU: "8"}, "limits": {GPU: "8"}},
                }
            ],
        },
    }


def _complete(cluster: ClusterHandle, namespace: str, name: str) -> bool:
    job = get(cluster, "job", "-n", namespace, name)
    return condition(job, "Complete").get("status") == "True"


def test_jobs_run_whole_where_they_fit_lost_workers_and_a_restarted_manager(
    cluster: ClusterHandle,
    namespace: str,
    workers: list[WorkerCluster],
    controller: Controller,  # noqa: F811
) -> None:
    w1, w2 = workers
    for w in workers:
        w.handle.kubectl("create", "namespace", namespace)
        apply(w.handle, local_queue("lq", namespace, "team"))
    # One of w2's two nodes is taken by a pod Muster never sent: placement counts it.
    apply(w2.handle, _foreign_pod(namespace, "w2-gpu-0"))
    cq, gpu = unique("fleet"), unique("gpu")
    apply(
        cluster,
        flavor(gpu, w1.pool),
        cq_manifest(
            cq,
            [{"name": gpu, "quota": {GPU: "40", "cpu": "64"}}],
            dispatch={"clusterSelector": {"matchLabels": {"muster-e2e/fleet": "gpus"}}},
        ),
        local_queue("lq", namespace, cq),
    )
    cluster.wait_for(
        "both workers to be Active",
        lambda: all(
            condition(get(cluster, "workerclusters.muster.dev", w.name), "Active").get("status")
            == "True"
            for w in workers
        ),
        timeout=60,
    )

    with TwoCopiesChecker(workers) as checker:
        # A gang of 2 x 8 GPUs fits only w1 (w2 has one free node): never split over the two.
        apply(cluster, _gpu_job("gang", namespace, 2))
        cluster.wait_for(
            "the gang to run in w1",
            lambda: _mirrored(cluster, namespace, "gang").get("active") == 2,
            timeout=90,
        )
        assert _dispatched_to(cluster, namespace, "gang") == "w1"
        assert [c["metadata"]["name"] for c in w1.copies()] == ["gang"]
        assert w2.copies() == []
        remote_pods = get(w1.handle, "pods", "-n", namespace)["items"]
        assert {p["spec"]["nodeName"] for p in remote_pods} == {"w1-gpu-0", "w1-gpu-1"}

        # One pod of 8 GPUs: w1 is full, so w2's free node.
        apply(cluster, _gpu_job("single", namespace, 1, runs_for="45s"))
        cluster.wait_for(
            "the single Job to run in w2",
            lambda: _mirrored(cluster, namespace, "single").get("active") == 1,
            timeout=90,
        )
        assert _dispatched_to(cluster, namespace, "single") == "w2"

        # Quota and the fleet's capacity allow a third, but no worker has a free node now:
        # it waits here, saying why, and is sent nowhere.
        apply(cluster, _gpu_job("third", namespace, 1))
        cluster.wait_for(
            "the third Job to wait for a worker cluster",
            lambda: any(
                e["reason"] == "WaitingForWorkerCluster"
                for wl in workloads_of(cluster, namespace, "third")
                for e in events_on(cluster, namespace, "Workload", wl["metadata"]["name"])
            ),
            timeout=60,
        )
        assert _dispatched_to(cluster, namespace, "third") is None
        assert all(c["metadata"]["name"] != "third" for w in workers for c in w.copies())

        # The single Job completes in w2: it completes here too, and the third takes its place.
        cluster.wait_for(
            "the single Job to complete here", lambda: _complete(cluster, namespace, "single"), 90
        )
        assert finished(workloads_of(cluster, namespace, "single")[0])
        cluster.wait_for(
            "the third Job to run in w2",
            lambda: _mirrored(cluster, namespace, "third").get("active") == 1,
            timeout=90,
        )
        assert _dispatched_to(cluster, namespace, "third") == "w2"
        cluster.wait_for(
            "the finished copy to be deleted in w2",
            lambda: "single" not in {c["metadata"]["name"] for c in w2.copies()},
            timeout=60,
        )

        # w2's Muster stops admitting, its other pod goes: a fourth Job is sent to w2 (the
        # fullest that fits) and waits there, never started. Then w2 stops answering.
        w2.controller.stop()
        w2.handle.kubectl("delete", "pod", "-n", namespace, "someone-elses", "--wait=true")
        cluster.kubectl("delete", "job", "-n", namespace, "gang", "--wait=false")
        cluster.wait_for(
            "the gang's copy to leave w1",
            lambda: w1.copies() == [] and get(w1.handle, "pods", "-n", namespace)["items"] == [],
            timeout=90,
        )
        apply(cluster, _gpu_job("fourth", namespace, 1))
        cluster.wait_for(
            "the fourth Job's copy in w2",
            lambda: "fourth" in {c["metadata"]["name"] for c in w2.copies()},
            timeout=60,
        )
        assert _dispatched_to(cluster, namespace, "fourth") == "w2"
        os.kill(w2.pid("kube-apiserver"), signal.SIGSTOP)
        try:
            # Lost after 10s: the never-started copy goes to w1; the started third one stays.
            cluster.wait_for(
                "w2 to be marked lost",
                lambda: (
                    condition(get(cluster, "workerclusters.muster.dev", "w2"), "Active").get(
                        "reason"
                    )
                    == "Lost"
                ),
                timeout=60,
            )
            cluster.wait_for(
                "the fourth Job to run in w1",
                lambda: _mirrored(cluster, namespace, "fourth").get("active") == 1,
                timeout=120,
            )
            assert _dispatched_to(cluster, namespace, "fourth") == "w1"
            assert _dispatched_to(cluster, namespace, "third") == "w2"
        finally:
            os.kill(w2.pid("kube-apiserver"), signal.SIGCONT)
        w2.controller.start()
        # Once w2 answers again, the abandoned copy there is deleted; the third runs on.
        cluster.wait_for(
            "the abandoned copy in w2 to be deleted",
            lambda: "fourth" not in {c["metadata"]["name"] for c in w2.copies()},
            timeout=90,
        )
        assert _mirrored(cluster, namespace, "third").get("active") == 1

        # A restarted manager resumes: no second copy of anything, anywhere.
        before = {w.name: sorted(c["metadata"]["name"] for c in w.copies()) for w in workers}
        controller.stop()
        controller.start()
        controller.wait_leading()
        time.sleep(10)
        after = {w.name: sorted(c["metadata"]["name"] for c in w.copies()) for w in workers}
        assert after == before == {"w1": ["fourth"], "w2": ["third"]}

    assert checker.polls > 20
    assert checker.violations == []


def test_an_elastic_job_scales_up_and_down_in_its_worker(
    cluster: ClusterHandle,
    namespace: str,
    workers: list[WorkerCluster],
    controller: Controller,  # noqa: F811
) -> None:
    for w in workers:
        w.handle.kubectl("create", "namespace", namespace)
        apply(w.handle, local_queue("lq", namespace, "team"))
    cq, gpu = unique("fleet"), unique("gpu")
    apply(
        cluster,
        flavor(gpu, workers[0].pool),
        cq_manifest(
            cq,
            [{"name": gpu, "quota": {GPU: "8", "cpu": "64"}}],
            dispatch={"clusterSelector": {}},
        ),
        local_queue("lq", namespace, cq),
    )
    manifest = job("grow", namespace, "lq", parallelism=1, cpu="1", elastic=True)
    manifest["spec"]["managedBy"] = DISPATCH_MANAGED_BY
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["requests"][GPU] = "1"
    container["resources"]["limits"] = {GPU: "1"}
    apply(cluster, manifest)
    cluster.wait_for(
        "the elastic Job to run with 1 pod",
        lambda: _mirrored(cluster, namespace, "grow").get("active") == 1,
        timeout=90,
    )
    home_name = _dispatched_to(cluster, namespace, "grow")
    home = next(w for w in workers if w.name == home_name)
    elsewhere = next(w for w in workers if w.name != home_name)

    def running_there() -> list[str]:
        pods = get(home.handle, "pods", "-n", namespace, "-l", "job-name=grow")["items"]
        return [
            p["metadata"]["name"]
            for p in pods
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    first = running_there()
    assert len(first) == 1

    cluster.kubectl("patch", "job", "grow", "-n", namespace, "-p", '{"spec":{"parallelism":3}}')
    cluster.wait_for(
        "the scale-up to run 3 pods in the same worker",
        lambda: (
            len(running_there()) == 3 and _mirrored(cluster, namespace, "grow").get("active") == 3
        ),
        timeout=120,
    )
    assert set(first) <= set(running_there()), "the running pod was never restarted"
    assert all(c["metadata"]["name"] != "grow" for c in elsewhere.copies())
    slices = workloads_of(cluster, namespace, "grow")
    assert len(slices) == 2
    assert {
        (s["metadata"].get("annotations") or {}).get(DISPATCHED_TO_ANNOTATION) for s in slices
    } == {home.name}

    cluster.kubectl("patch", "job", "grow", "-n", namespace, "-p", '{"spec":{"parallelism":1}}')
    cluster.wait_for(
        "the scale-down to 1 pod there",
        lambda: (
            len(running_there()) == 1 and _mirrored(cluster, namespace, "grow").get("active") == 1
        ),
        timeout=120,
    )
    copy = next(c for c in home.copies() if c["metadata"]["name"] == "grow")
    assert copy["spec"]["parallelism"] == 1
