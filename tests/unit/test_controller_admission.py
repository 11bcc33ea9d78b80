"""The admission loop against an in-memory apiserver: snapshot from the caches, the
engine's decisions written to Workload status, queue status, and no decision taken on a
stale view."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from controllers.admission.loop import AdmissionLoop
from controllers.admission.view import ViewBuilder
from controllers.runtime.events import EventRecorder
from controllers.runtime.resources import (
    CLUSTER_QUEUE,
    LOCAL_QUEUE,
    RESOURCE_FLAVOR,
    WORKLOAD,
)
from controllers.state import workloads as wls
from controllers.state.caches import Caches, Context
from quota.model.decisions import CycleResult
from tests.unit.controller_fakes import FakeKube

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Harness:
    def __init__(self, cpu_quota: str = "4", limit: str | None = None, **cq_spec: Any) -> None:
        self.kube = FakeKube()
        self.caches = Caches.create(self.kube)
        self.ctx = Context(
            kube=self.kube,
            caches=self.caches,
            events=EventRecorder(None, "test"),
            identity="test",
            now=lambda: NOW,
        )
        self.loop = AdmissionLoop(self.ctx, use_node_capacity=False)
        self.put(
            RESOURCE_FLAVOR,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "ResourceFlavor",
                "metadata": {"name": "pool"},
                "spec": {"nodeLabels": {"pool": "a"}},
            },
        )
        quota: dict[str, Any] = {"name": "pool", "quota": {"cpu": cpu_quota}}
        if limit:
            quota["limit"] = {"cpu": limit}
        self.put(
            CLUSTER_QUEUE,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "ClusterQueue",
                "metadata": {"name": "cq"},
                "spec": {"flavors": [quota], **cq_spec},
            },
        )
        self.put(
            LOCAL_QUEUE,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "LocalQueue",
                "metadata": {"name": "team", "namespace": "ns"},
                "spec": {"clusterQueue": "cq"},
            },
        )

    def cache(self, kind: Any) -> Any:
        return {
            "Workload": self.caches.workloads,
            "ClusterQueue": self.caches.cluster_queues,
            "LocalQueue": self.caches.local_queues,
            "ResourceFlavor": self.caches.flavors,
        }[kind.name]

    def cycle(self) -> CycleResult:
        """One admission cycle, and the writes it queued (they run in the background)."""
        result = self.loop.cycle()
        assert self.loop.writer.wait_written(), "the cycle's writes did not finish"
        return result

    def put(self, kind: Any, obj: dict[str, Any]) -> dict[str, Any]:
        stored = self.kube.put(kind, obj)
        self.cache(kind).write_through(stored)
        return stored

    def workload(
        self, name: str, cpu: int, *, priority: int = 0, queue: str = "team", created: int = 0
    ) -> dict[str, Any]:
        stamp = (NOW - timedelta(minutes=60 - created)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return self.put(
            WORKLOAD,
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "Workload",
                "metadata": {"name": name, "namespace": "ns", "creationTimestamp": stamp},
                "spec": {
                    "queueName": queue,
                    "priority": priority,
                    "podSets": [{"name": "main", "count": cpu, "requests": {"cpu": "1"}}],
                },
            },
        )

    def get(self, name: str) -> dict[str, Any]:
        found = self.kube.get(WORKLOAD, "ns", name)
        assert found is not None
        return found


def test_cycle_admits_what_fits_and_says_why_the_rest_waits() -> None:
    h = Harness(cpu_quota="4", limit="4")
    h.workload("first", 3, created=1)
    h.workload("second", 3, created=2)
    h.workload("lost", 1, queue="nope", created=3)
    result = h.cycle()
    assert [a.workload for a in result.admit] == ["ns/first"]
    first = h.get("first")
    assert wls.has_quota(first)
    assignment = first["status"]["admission"]["podSetAssignments"][0]
    assert assignment == {
        "name": "main",
        "count": 3,
        "flavors": {"cpu": "pool"},
        "resourceUsage": {"cpu": "3"},
    }
    h.loop.pending_writer.flush_due()
    second = wls.condition(h.get("second"), "QuotaReserved")
    assert second is not None and second["reason"] == "Pending" and "limit" in second["message"]
    lost = wls.condition(h.get("lost"), "QuotaReserved")
    assert lost is not None and lost["reason"] == "Inadmissible"
    assert "LocalQueue nope does not exist" in lost["message"]

    # Status is published from the cycle's snapshot; the admission's own write starts the
    # next cycle, which publishes it.
    h.cycle()
    h.loop.queue_status.writer.flush_due()
    cq = h.kube.get(CLUSTER_QUEUE, None, "cq")
    assert cq is not None
    assert cq["status"]["usage"] == {"pool": {"cpu": "3"}}
    assert cq["status"]["admittedWorkloads"] == 1 and cq["status"]["pendingWorkloads"] == 1
    assert "muster.dev/resource-in-use" in cq["metadata"]["finalizers"]


def test_an_admitted_workload_is_never_admitted_again() -> None:
    h = Harness(cpu_quota="8")
    h.workload("w", 2)
    assert len(h.cycle().admit) == 1
    writes = len(h.kube.writes)
    assert h.cycle().admit == ()
    assert len(h.kube.writes) == writes, "a second cycle writes nothing for it"


def test_a_decision_on_a_resized_workload_is_not_written() -> None:
    h = Harness(cpu_quota="4", limit="4")
    wl = h.workload("w", 2)
    view = h.loop.views.build()
    from quota.admission.cycle import admission_cycle
    from quota.fairness.fairshare import fair_share

    result = admission_cycle(view.snapshot, fair_share(view.snapshot))
    # The Job was resized after the snapshot: the Workload now asks for 6 cpu.
    grown = copy.deepcopy(wl)
    grown["spec"]["podSets"][0]["count"] = 6
    h.kube.patch(WORKLOAD, "ns", "w", {"spec": grown["spec"]})
    h.loop.writer.carry_out(view, result)
    assert not wls.has_quota(h.get("w")), "admitted for 2 cpu, but it now wants 6"


def test_preemption_within_a_queue_evicts_the_lower_priority_workload() -> None:
    h = Harness(cpu_quota="4", limit="4", preemption={"withinQueue": "LowerPriority"})
    h.workload("low", 4, priority=1)
    h.cycle()
    h.workload("high", 4, priority=100, created=5)
    result = h.cycle()
    assert [v.workload for p in result.preempt for v in p.victims] == ["ns/low"]
    low = h.get("low")
    assert (wls.condition(low, "Evicted") or {}).get("reason") == "Preempted"
    assert (wls.condition(low, "Preempted") or {}).get("reason") == "WithinQueue"
    assert wls.has_quota(low), "quota is released only once its pods are gone"
    assert not wls.has_quota(h.get("high"))


def test_backoff_keeps_a_requeued_workload_out_until_it_expires() -> None:
    h = Harness(cpu_quota="4")
    wl = h.workload("w", 1)
    status = copy.deepcopy(wl)
    wls.status_of(status)["requeueState"] = {"count": 1, "requeueAt": "2026-01-01T12:00:30Z"}
    h.cache(WORKLOAD).write_through(
        h.kube.patch(WORKLOAD, "ns", "w", {"status": status["status"]}, status=True)
    )
    assert h.cycle().admit == ()
    h.ctx.now = lambda: NOW + timedelta(seconds=31)
    assert [a.workload for a in h.cycle().admit] == ["ns/w"]


def test_what_a_vanished_or_invalid_queue_admitted_still_counts() -> None:
    # Quota-only: the root amount is the sum of root quotas (4 cpu, from "cq").
    h = Harness(cpu_quota="4")
    h.workload("first", 4)
    assert [a.workload for a in h.cycle().admit] == ["ns/first"]
    # The admission names a queue that is gone (deleted before its finalizer was added).
    first = copy.deepcopy(h.get("first"))
    first["status"]["admission"]["clusterQueue"] = "gone"
    h.cache(WORKLOAD).write_through(
        h.kube.patch(WORKLOAD, "ns", "first", {"status": first["status"]}, status=True)
    )
    h.workload("second", 4, created=5)
    view = h.loop.views.build()
    assert not view.snapshot.queues["gone"].active
    assert h.cycle().admit == (), "4 cpu more on a 4-cpu root"

    # A queue the model refuses (written while the queue webhook was away) counts too.
    cq = copy.deepcopy(h.kube.get(CLUSTER_QUEUE, None, "cq"))
    assert cq is not None
    first["status"]["admission"]["clusterQueue"] = "cq"
    h.cache(WORKLOAD).write_through(
        h.kube.patch(WORKLOAD, "ns", "first", {"status": first["status"]}, status=True)
    )
    cq["spec"]["flavors"][0]["quota"] = {"cpu": "4000500u"}
    h.cache(CLUSTER_QUEUE).write_through(
        h.kube.patch(CLUSTER_QUEUE, None, "cq", {"spec": cq["spec"]})
    )
    view = h.loop.views.build()
    assert "invalid" in view.snapshot.queues["cq"].inactive_reason
    assert [w.key for w in view.snapshot.admitted] == ["ns/first"]


def test_the_view_follows_each_new_version_of_a_workload_and_forgets_deleted_ones() -> None:
    """What a cycle reads off a Workload is kept per version: a later cycle must see every
    change to the Workload, to its LocalQueue, and nothing of a Workload that is gone."""
    h = Harness(cpu_quota="4")
    h.put(
        CLUSTER_QUEUE,
        {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "ClusterQueue",
            "metadata": {"name": "other"},
            "spec": {"flavors": [{"name": "pool", "quota": {"cpu": "4"}}]},
        },
    )
    h.workload("w", 8)  # more than the queue holds: stays pending
    views = h.loop.views
    first = views.build()
    assert [(w.key, w.queue) for w in first.snapshot.pending] == [("ns/w", "cq")]

    # The LocalQueue points elsewhere; the Workload itself did not change.
    lq = h.kube.get(LOCAL_QUEUE, "ns", "team")
    assert lq is not None
    h.cache(LOCAL_QUEUE).write_through(
        h.kube.patch(LOCAL_QUEUE, "ns", "team", {"spec": {"clusterQueue": "other"}})
    )
    assert [(w.key, w.queue) for w in views.build().snapshot.pending] == [("ns/w", "other")]

    # Made invalid (a negative count, written past the webhook): blocked, every cycle.
    bad = copy.deepcopy(h.get("w"))
    bad["spec"]["podSets"][0]["count"] = -1
    h.cache(WORKLOAD).write_through(h.kube.put(WORKLOAD, bad))
    for _ in range(2):
        view = views.build()
        assert view.snapshot.pending == ()
        assert [(key, reason) for key, reason, _ in view.blocked] == [("ns/w", "Inadmissible")]
        assert "invalid Workload" in view.blocked[0][2]

    # Finished: neither pending nor admitted; deleted: forgotten.
    done = copy.deepcopy(h.get("w"))
    done["spec"]["podSets"][0]["count"] = 1
    wls.set_condition(done, wls.FINISHED, "True", "Succeeded", "done", NOW)
    h.cache(WORKLOAD).write_through(h.kube.put(WORKLOAD, done))
    view = views.build()
    assert view.snapshot.pending == () and view.snapshot.admitted == () and view.blocked == []
    h.cache(WORKLOAD).forget("ns/w")
    views.build()
    assert views._facts == {}


def test_a_bound_pod_counts_for_its_jobs_admitted_workload_only_while_it_is_admitted() -> None:
    h = Harness(cpu_quota="4")
    views = ViewBuilder(h.ctx, use_node_capacity=True)
    h.caches.nodes.write_through(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "resourceVersion": "1", "labels": {"pool": "a"}},
            "status": {"allocatable": {"cpu": "8", "pods": "110"}},
        }
    )
    h.caches.node_pods.write_through(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "resourceVersion": "1",
                "labels": {"controller-uid": "job-uid"},
            },
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
            },
            "status": {"phase": "Running"},
        }
    )
    wl = copy.deepcopy(h.workload("w", 1))
    wl["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "job", "uid": "job-uid"}
    ]
    h.cache(WORKLOAD).write_through(h.kube.put(WORKLOAD, wl))
    assert [p.workload for p in views.build().snapshot.pods] == [None], "pending: not its pod"
    assert [a.workload for a in h.cycle().admit] == ["ns/w"]
    h.cache(WORKLOAD).write_through(h.get("w"))
    for _ in range(2):
        assert [p.workload for p in views.build().snapshot.pods] == ["ns/w"]
    # The Job's next Workload (an elastic Job's new slice) takes over its pods once the
    # first one is finished, and then nothing does.
    second = copy.deepcopy(h.workload("w2", 1, created=1))
    second["metadata"]["ownerReferences"] = wl["metadata"]["ownerReferences"]
    h.cache(WORKLOAD).write_through(h.kube.put(WORKLOAD, second))
    assert [a.workload for a in h.cycle().admit] == ["ns/w2"]
    h.cache(WORKLOAD).write_through(h.get("w2"))
    for name in ("w", "w2"):
        done = copy.deepcopy(h.get(name))
        wls.set_condition(done, wls.FINISHED, "True", "Succeeded", "done", NOW)
        h.cache(WORKLOAD).write_through(h.kube.put(WORKLOAD, done))
        still = "ns/w2" if name == "w" else None
        assert [p.workload for p in views.build().snapshot.pods] == [still]
    h.caches.node_pods.forget("ns/p")
    assert views.build().snapshot.pods == ()
    assert views._pods == {}


def test_a_workload_queued_again_after_an_eviction_says_so_and_competes_after_its_backoff() -> None:
    """Issue 25: once its pods are gone and its quota released, an evicted Workload's
    conditions and `kubectl muster explain` say it is queued (since when, after what
    eviction, from when it competes), not evicted; Requeued turns True within one cycle of
    the backoff's end; it is admitted again when there is room."""
    from controllers.plugin.explain import state_of

    h = Harness(cpu_quota="4", limit="4", preemption={"withinQueue": "LowerPriority"})
    h.workload("low", 4, priority=1)
    h.cycle()
    h.workload("high", 4, priority=100, created=5)
    h.cycle()
    assert state_of(h.get("low"))[0] == "evicted (its pods are being stopped)"

    # The Job reconciler saw its pods go and released the quota (controllers/jobs).
    released_at = NOW + timedelta(seconds=3)
    low = copy.deepcopy(h.get("low"))
    assert wls.release_quota(low, released_at)
    h.cache(WORKLOAD).write_through(
        h.kube.patch(WORKLOAD, "ns", "low", {"status": low["status"]}, status=True)
    )
    low = h.get("low")
    evicted, requeued = wls.condition(low, "Evicted"), wls.condition(low, "Requeued")
    assert evicted is not None and requeued is not None
    assert (evicted["status"], evicted["reason"]) == ("False", "QuotaReleased")
    assert (requeued["status"], requeued["reason"]) == ("False", "Preempted")
    story = "since 12:00:03, after an eviction by preemption for ns/high; competes for quota"
    assert state_of(low)[0] == f"queued ({story} from 12:00:04)"

    h.ctx.now = lambda: released_at  # a cycle within the backoff keeps the same words
    h.cycle()
    h.loop.pending_writer.flush_due()
    low = h.get("low")
    assert (wls.condition(low, "QuotaReserved") or {})["message"] == f"queued {story} from 12:00:04"
    assert (wls.condition(low, "Requeued") or {})["status"] == "False"

    h.ctx.now = lambda: released_at + timedelta(seconds=2)  # the 1 s backoff is over
    h.cycle()
    h.loop.pending_writer.flush_due()
    low = h.get("low")
    requeued = wls.condition(low, "Requeued")
    assert requeued is not None
    assert (requeued["status"], requeued["reason"]) == ("True", "BackoffFinished")
    assert state_of(low)[0] == f"queued ({story} since 12:00:04)"
    assert "exceeds limit of queue cq" in state_of(low)[1], "the current reason"

    high = copy.deepcopy(h.get("high"))
    assert wls.mark_finished(high, "Succeeded", "done", released_at)
    h.cache(WORKLOAD).write_through(
        h.kube.patch(WORKLOAD, "ns", "high", {"status": high["status"]}, status=True)
    )
    assert [a.workload for a in h.cycle().admit] == ["ns/low"]
    assert state_of(h.get("low"))[0] == "admitted"


def test_a_reason_decided_within_the_backoff_never_stands_beside_requeued_true() -> None:
    """A cycle that reads the world just before the backoff's end and writes just after it
    (a loaded machine; seen in CI) keeps Requeued False: it turns True only with a reason
    decided after the backoff, so the conditions never say "competes ... from" beside
    "competes since"."""
    h = Harness(cpu_quota="4", limit="4", preemption={"withinQueue": "LowerPriority"})
    h.workload("low", 4, priority=1)
    h.cycle()
    h.workload("high", 4, priority=100, created=5)
    h.cycle()
    released_at = NOW + timedelta(seconds=3)
    low = copy.deepcopy(h.get("low"))
    assert wls.release_quota(low, released_at)
    h.cache(WORKLOAD).write_through(
        h.kube.patch(WORKLOAD, "ns", "low", {"status": low["status"]}, status=True)
    )
    # The cycle reads the clock first (its snapshot), then every later read is past the
    # 1 s backoff (its writes).
    reads = [released_at + timedelta(milliseconds=500), released_at + timedelta(seconds=2)]
    h.ctx.now = lambda: reads.pop(0) if len(reads) > 1 else reads[0]
    h.cycle()
    h.loop.pending_writer.flush_due()
    low = h.get("low")
    assert (wls.condition(low, "Requeued") or {})["status"] == "False"
    assert (
        "competes for quota from 12:00:04" in (wls.condition(low, "QuotaReserved") or {})["message"]
    )


def test_an_old_style_release_is_settled_by_the_next_pending_write() -> None:
    """A Workload released by a controller before issue 25 (Evicted still True, no quota)
    reads queued after the next cycle: the pending write ends the eviction."""
    h = Harness(cpu_quota="0")
    wl = copy.deepcopy(h.workload("w", 1))
    status = wls.status_of(wl)
    status["requeueState"] = {"count": 1, "requeueAt": "2026-01-01T11:00:00Z"}
    status["conditions"] = [
        {"type": t, "status": s, "reason": r, "message": "m", "lastTransitionTime": at}
        for t, s, r, at in (
            ("Evicted", "True", "Reclaimed", "2026-01-01T10:59:00Z"),
            ("QuotaReserved", "False", "Pending", "2026-01-01T10:59:59Z"),
            ("Requeued", "False", "Reclaimed", "2026-01-01T10:59:59Z"),
        )
    ]
    h.cache(WORKLOAD).write_through(
        h.kube.patch(WORKLOAD, "ns", "w", {"status": status}, status=True)
    )
    h.cycle()
    h.loop.pending_writer.flush_due()
    w = h.get("w")
    assert (wls.condition(w, "Evicted") or {})["status"] == "False"
    assert (wls.condition(w, "Requeued") or {})["reason"] == "BackoffFinished"
    assert wls.queued_story(w) == (
        "since 12:00:00, after an eviction by reclaim; competes for quota since 11:00:00"
    )


def test_the_views_capacity_follows_a_changed_node_and_flavor_and_only_they() -> None:
    h = Harness(cpu_quota="100")
    views = ViewBuilder(h.ctx, use_node_capacity=True)

    def node(name: str, rv: str, cpu: str, ready: str = "True") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "resourceVersion": rv, "labels": {"pool": "a"}},
            "status": {
                "allocatable": {"cpu": cpu, "pods": "110"},
                "conditions": [{"type": "Ready", "status": ready}],
            },
        }

    def cpu() -> int | None:
        capacity = views.build().snapshot.capacity
        return None if capacity is None else capacity[("pool", "cpu")]

    h.caches.nodes.write_through(node("n1", "1", "8"))
    h.caches.nodes.write_through(node("n2", "1", "4"))
    first = views.build().snapshot.capacity
    assert first is not None and first[("pool", "cpu")] == 12000
    assert views.build().snapshot.capacity is first, "nothing changed: the same answer"
    h.caches.nodes.write_through(node("n1", "2", "16"))
    assert cpu() == 20000
    h.caches.nodes.write_through(node("n1", "3", "16", ready="False"))
    assert cpu() == 4000
    flavor = copy.deepcopy(h.cache(RESOURCE_FLAVOR).get("pool"))
    assert flavor is not None
    flavor["spec"]["nodeLabels"] = {"pool": "b"}
    h.cache(RESOURCE_FLAVOR).write_through(h.kube.put(RESOURCE_FLAVOR, flavor))
    assert cpu() is None, "no node of its flavor: quota alone"
