"""Elastic Jobs end to end: WorkloadSlices on scale-up, in-place scale-down, and scheduling
gates lifted from exactly as many pods as the admitted slice grants.

A watcher thread samples the cluster all along and records any moment at which the Job had
more ungated, unfinished pods than its admitted slice grants (while the Job still asked for
that many), or more than two active slices: the bugs Kueue users hit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controllers.runtime.client import api_client
from controllers.runtime.resources import JOB, POD, WORKLOAD, Kube
from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    LabelledPool,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    cq_status,
    crds,  # noqa: F401 - fixture
    create,
    finished,
    flavor,
    gated,
    get,
    job,
    live,
    local_queue,
    pods_of,
    priority_class,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e


def granted(slices: list[dict[str, Any]]) -> int:
    """Pods the admitted (unfinished) slice grants."""
    counts = [
        min(
            wl["spec"]["podSets"][0]["count"],
            wl["status"]["admission"]["podSetAssignments"][0]["count"],
        )
        for wl in slices
        if admitted(wl)
    ]
    return max(counts, default=0)


class Invariants:
    """Samples one elastic Job until stopped; collects violations."""

    def __init__(self, cluster: ClusterHandle, namespace: str, name: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        # The watcher only observes; it reads through the API client because a kubectl
        # process per read would sample too rarely to catch a short violation.
        self.kube = Kube(api_client(cluster.kubeconfig, pool_size=4))
        self.violations: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                # Pods first: admission only grows until the Job shrinks, and a shrink shows
                # in the Job's parallelism, read last.
                pods, _ = self.kube.list(
                    POD, self.namespace, label_selector=f"batch.kubernetes.io/job-name={self.name}"
                )
                pods = live(pods)
                slices, _ = self.kube.list(
                    WORKLOAD, self.namespace, label_selector=f"muster.dev/job-name={self.name}"
                )
                found = self.kube.get(JOB, self.namespace, self.name)
                spec = (found or {}).get("spec") or {}
            except Exception:
                continue
            self.samples += 1
            ungated = sum(1 for p in pods if not gated(p))
            allowed = granted(slices)
            active = [w for w in slices if not finished(w)]
            if ungated > allowed and ungated <= spec.get("parallelism", 1):
                self.violations.append(f"{ungated} ungated pods but {allowed} admitted")
            if len(active) > 2:
                names = [w["metadata"]["name"] for w in active]
                self.violations.append(f"{len(active)} active slices: {names}")

    def __enter__(self) -> Invariants:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def elastic_queue(cluster: ClusterHandle, namespace: str) -> Iterator[str]:
    """A queue with a 5-cpu limit on a pool of 16 cpus: room for 5 one-cpu pods."""
    pool = unique("elastic")
    cluster.nodes(2, cpu="8", memory="32Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": "5"}, "limit": {"cpu": "5"}}]),
        local_queue("q", namespace, cq),
    )
    yield cq


def _scale(cluster: ClusterHandle, namespace: str, name: str, parallelism: int) -> None:
    cluster.kubectl(
        "patch", "job", name, "-n", namespace, "-p", f'{{"spec":{{"parallelism":{parallelism}}}}}'
    )


def _state(cluster: ClusterHandle, namespace: str, name: str) -> tuple[int, int, int]:
    """(ungated live pods, gated live pods, granted pods)."""
    pods = live(pods_of(cluster, namespace, name))
    ungated = sum(1 for p in pods if not gated(p))
    return ungated, len(pods) - ungated, granted(workloads_of(cluster, namespace, name))


def test_elastic_job_scales_up_within_quota_waits_over_it_and_scales_down(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
    elastic_queue: str,
) -> None:
    created = create(cluster, job("el", namespace, "q", parallelism=2, elastic=True))
    assert created["spec"]["suspend"] is True
    assert {"name": "muster.dev/admission"} in created["spec"]["template"]["spec"][
        "schedulingGates"
    ]

    with Invariants(cluster, namespace, "el") as watch:
        cluster.wait_for(
            "2 pods running ungated",
            lambda: _state(cluster, namespace, "el") == (2, 0, 2),
        )
        first_pods = {p["metadata"]["name"] for p in live(pods_of(cluster, namespace, "el"))}
        [first_slice] = workloads_of(cluster, namespace, "el")

        # 2 -> 5 with enough quota: a new slice for 5 replaces the first; 3 more pods ungated.
        _scale(cluster, namespace, "el", 5)
        cluster.wait_for(
            "5 pods ungated under a slice of 5",
            lambda: _state(cluster, namespace, "el") == (5, 0, 5),
        )
        slices = workloads_of(cluster, namespace, "el")
        old = next(w for w in slices if w["metadata"]["name"] == first_slice["metadata"]["name"])
        assert condition(old, "Finished")["reason"] == "WorkloadSliceReplaced"
        [current] = [w for w in slices if admitted(w)]
        assert current["spec"]["replaces"] == first_slice["metadata"]["name"]
        # The first two pods were never touched: same pods, still running.
        running = {p["metadata"]["name"]: p for p in live(pods_of(cluster, namespace, "el"))}
        assert first_pods <= set(running)
        assert all(running[n]["status"]["phase"] == "Running" for n in first_pods)

        # 5 -> 8 with too little quota: the new pods stay gated, the 5 keep running.
        _scale(cluster, namespace, "el", 8)
        cluster.wait_for(
            "3 new pods gated and a pending slice for 8",
            lambda: (
                _state(cluster, namespace, "el") == (5, 3, 5)
                and any(
                    not admitted(w) and not finished(w) and w["spec"]["podSets"][0]["count"] == 8
                    for w in workloads_of(cluster, namespace, "el")
                )
            ),
        )
        pending = next(
            w for w in workloads_of(cluster, namespace, "el") if not admitted(w) and not finished(w)
        )
        cluster.wait_for(
            "the pending slice to say why it waits",
            lambda: (
                "limit"
                in condition(
                    next(
                        w
                        for w in workloads_of(cluster, namespace, "el")
                        if w["metadata"]["name"] == pending["metadata"]["name"]
                    ),
                    "QuotaReserved",
                ).get("message", "")
            ),
        )
        # Another Job that needs 2 cpu waits too.
        apply(cluster, job("waiter", namespace, "q", parallelism=2))
        cluster.wait_for(
            "waiter to wait",
            lambda: (
                bool(workloads_of(cluster, namespace, "waiter"))
                and condition(workloads_of(cluster, namespace, "waiter")[0], "QuotaReserved").get(
                    "reason"
                )
                == "Pending"
            ),
        )
        assert _state(cluster, namespace, "el") == (5, 3, 5)

        # 8 -> 3: the admitted slice shrinks in place, quota is freed, the waiter gets in.
        _scale(cluster, namespace, "el", 3)
        cluster.wait_for(
            "the slice to shrink to 3 and the waiter to be admitted",
            lambda: (
                _state(cluster, namespace, "el") == (3, 0, 3)
                and admitted(workloads_of(cluster, namespace, "waiter")[0])
            ),
        )
        active = [w for w in workloads_of(cluster, namespace, "el") if not finished(w)]
        assert [w["metadata"]["name"] for w in active] == [current["metadata"]["name"]]
        cluster.wait_for(
            "queue usage of 5 cpu (3 + 2)",
            lambda: (
                cq_status(cluster, elastic_queue).get("usage", {}).values()
                and next(iter(cq_status(cluster, elastic_queue)["usage"].values())) == {"cpu": "5"}
            ),
        )
    assert watch.samples > 10
    assert watch.violations == []


def test_rapid_scale_events_never_ungate_past_quota(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
    elastic_queue: str,
) -> None:
    apply(cluster, job("burst", namespace, "q", parallelism=1, elastic=True))
    with Invariants(cluster, namespace, "burst") as watch:
        cluster.wait_for("1 pod ungated", lambda: _state(cluster, namespace, "burst") == (1, 0, 1))
        for size in (4, 7, 2, 9, 5, 6):
            _scale(cluster, namespace, "burst", size)

        # Settles with 6 pods wanted, every granted pod ungated and no more, within the limit
        # of 5. How many are granted depends on which sizes the controller saw on the way: a
        # scale-up slice is admitted whole or waits, so if it saw 5 before 6 it holds 5 and
        # waits for one more; if it went from 9 to 6 directly, it waits for the whole step.
        def settled() -> bool:
            ungated, gated, granted_pods = _state(cluster, namespace, "burst")
            return ungated == granted_pods and ungated + gated == 6 and 1 <= granted_pods <= 5

        cluster.wait_for("the Job to settle, its granted pods ungated", settled, timeout=90)
        active = [w for w in workloads_of(cluster, namespace, "burst") if not finished(w)]
        assert len(active) == 2, [
            (
                w["metadata"]["name"],
                w["metadata"].get("deletionTimestamp"),
                w["metadata"].get("finalizers"),
                w["spec"].get("replaces"),
                [
                    (c["type"], c["status"], c.get("reason"))
                    for c in w.get("status", {}).get("conditions", [])
                ],
            )
            for w in active
        ]
    assert watch.violations == []


def test_a_degradable_elastic_job_loses_only_the_pods_a_gang_needs_and_gets_them_back(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    """disruptionMode single on an elastic Job: a higher-priority gang takes exactly the two
    pods in its way, as a scale-down of the running Job (never suspended, never restarted);
    the Job asks them back through a slice and runs whole again once there is room."""
    pool = LabelledPool(cluster, namespace, "degr")
    low, high = unique("low"), unique("high")
    apply(cluster, priority_class(low, 10), priority_class(high, 1000))
    try:
        pool.add_nodes(3, cpu="4")
        pool.queue("100", preemption={"withinQueue": "LowerPriority", "waitBeforeEvicting": "0s"})
        train = job(
            "train",
            namespace,
            "lq",
            parallelism=12,
            elastic=True,
            priority_class=low,
            annotations={"muster.dev/disruption-mode": "single"},
        )
        # A loss marked DisruptionTarget (as kube-scheduler marks its preemptions) is not
        # a failure of the Job.
        train["spec"]["podFailurePolicy"] = {
            "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
        }
        create(cluster, train)

        def bound(name: str, count: int) -> bool:
            pods = live(pods_of(cluster, namespace, name))
            return len([p for p in pods if p["spec"].get("nodeName")]) == count

        cluster.wait_for("12 pods of train bound", lambda: bound("train", 12), timeout=120)
        before = {p["metadata"]["uid"]: p for p in live(pods_of(cluster, namespace, "train"))}
        create(cluster, job("urgent", namespace, "lq", parallelism=2, priority_class=high))
        cluster.wait_for("the urgent gang bound", lambda: bound("urgent", 2), timeout=120)

        after = {p["metadata"]["uid"] for p in live(pods_of(cluster, namespace, "train"))}
        lost = sorted(p["metadata"]["name"] for u, p in before.items() if u not in after)
        assert len(lost) == 2, lost
        slices = workloads_of(cluster, namespace, "train")
        assert not any(condition(w, "Evicted").get("status") == "True" for w in slices)
        (current,) = [w for w in slices if admitted(w)]
        assert current["spec"]["disruptionMode"] == "Single"
        assert sorted(current["status"]["preemptedPods"]) == lost
        assert current["status"]["admission"]["podSetAssignments"][0]["count"] == 10
        stored = get(cluster, "job", "train", "-n", namespace)
        assert not stored["spec"].get("suspend") and stored["spec"]["parallelism"] == 12

        def asks_them_back() -> bool:
            pods = live(pods_of(cluster, namespace, "train"))
            waiting = [w for w in workloads_of(cluster, namespace, "train") if not admitted(w)]
            return (
                len([p for p in pods if gated(p)]) == 2
                and len(waiting) == 1
                and waiting[0]["spec"].get("replaces") == current["metadata"]["name"]
            )

        cluster.wait_for("two replacements gated, a slice waiting", asks_them_back, timeout=60)
        cluster.kubectl("delete", "job", "urgent", "-n", namespace, "--wait=false")
        cluster.wait_for("train whole again", lambda: bound("train", 12), timeout=120)
        # Never restarted: the ten pods that were not in the gang's way ran on throughout.
        assert after <= {p["metadata"]["uid"] for p in live(pods_of(cluster, namespace, "train"))}
        assert not (get(cluster, "job", "train", "-n", namespace).get("status") or {}).get("failed")
    finally:
        pool.delete()
