"""A requeued Workload's status tells the truth (issue 25), end to end with kubectl and
`kubectl muster explain` against the local cluster (kwok nodes):

- a Workload reclaimed by another queue reads "evicted (its pods are being stopped)" only
  while its pods stop; within one admission cycle of its pods being gone its conditions
  (Evicted False, QuotaReserved "queued since ..., after an eviction by reclaim for ...")
  and explain say it is queued, since when, after what, and from when it competes;
- `Requeued` turns True (BackoffFinished) within one cycle of the backoff's end, while it
  still waits for room, and explain gives the current reason;
- once the reclaimer is gone it is admitted again; the workload within quota never stops.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    condition,
    controller,  # noqa: F401 - fixture
    crds,  # noqa: F401 - fixture
    flavor,
    job,
    live,
    local_queue,
    pods_of,
    priority_class,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest
from tests.e2e.test_plugin_e2e import kubectl_muster

pytestmark = pytest.mark.e2e

# One admission cycle (the loop's resync, 2 s) and the pending writer's interval (1 s),
# with room for a loaded machine.
ONE_CYCLE_S = 10


def _wl(cluster: ClusterHandle, namespace: str, name: str) -> dict[str, Any]:
    found = workloads_of(cluster, namespace, name)
    return found[-1] if found else {}


def _explain(cluster: ClusterHandle, namespace: str, name: str) -> str:
    out = kubectl_muster(cluster, "explain", name, "-n", namespace, "--color", "never").stdout
    return " ".join(out.split())  # rich wraps long lines: compare words


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def test_a_reclaimed_workload_reads_queued_within_a_cycle_and_is_admitted_again(
    cluster: ClusterHandle,
    namespace: str,
    controller: Controller,  # noqa: F811
) -> None:
    pool = unique("requeue")
    cluster.nodes(1, cpu="4", memory="16Gi", labels={"muster-e2e/pool": pool})
    org, team_a, team_b = unique("org"), unique("team-a"), unique("team-b")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(org, [{"name": pool, "quota": {"cpu": "4"}}]),
        cq_manifest(team_a, [{"name": pool, "quota": {"cpu": "2"}}], parent=org),
        cq_manifest(team_b, [{"name": pool, "quota": {"cpu": "2"}}], parent=org),
        local_queue("a", namespace, team_a),
        local_queue("b", namespace, team_b),
    )
    # Team A runs within its quota of 2 cpu, and borrows team B's idle 2 cpu at a lower
    # priority: the borrower is the one a reclaim takes.
    low, high = unique("low"), unique("high")
    apply(cluster, priority_class(low, 10), priority_class(high, 1000))
    apply(cluster, job("base", namespace, "a", parallelism=2, cpu="1", priority_class=high))
    cluster.wait_for("base admitted", lambda: admitted(_wl(cluster, namespace, "base")))
    apply(cluster, job("borrower", namespace, "a", parallelism=2, cpu="1", priority_class=low))
    cluster.wait_for("borrower admitted", lambda: admitted(_wl(cluster, namespace, "borrower")))
    cluster.wait_for(
        "borrower's pods running",
        lambda: len(live(pods_of(cluster, namespace, "borrower"))) == 2,
    )

    # Team B's demand returns: the borrower is reclaimed.
    apply(cluster, job("owner", namespace, "b", parallelism=2, cpu="1"))
    owner_wl = str(_wl(cluster, namespace, "owner")["metadata"]["name"])

    def reclaimed() -> bool:
        # kwok stops pods at once: the eviction may already have ended (Preempted False,
        # QuotaReleased, its reason kept at the head of the message) when we look.
        preempted = condition(_wl(cluster, namespace, "borrower"), "Preempted")
        return preempted.get("reason") == "Reclaim" or (
            preempted.get("reason") == "QuotaReleased"
            and preempted.get("message", "").startswith("Reclaim: by reclaim")
        )

    try:
        cluster.wait_for("borrower evicted by reclaim", reclaimed)
    except AssertionError as error:
        why = condition(_wl(cluster, namespace, "owner"), "QuotaReserved").get("message")
        base = (_wl(cluster, namespace, "base").get("status") or {}).get("conditions")
        raise AssertionError(f"{error}; the owner: {why}; base: {base}") from None
    cluster.wait_for(
        "borrower's pods gone", lambda: not pods_of(cluster, namespace, "borrower"), 60
    )
    gone_at = time.time()

    def queued() -> bool:
        wl = _wl(cluster, namespace, "borrower")
        return (
            condition(wl, "Evicted").get("status") == "False"
            and (wl.get("status") or {}).get("requeueState", {}).get("count") == 1
        )

    cluster.wait_for("the conditions to say queued", queued, timeout=ONE_CYCLE_S)
    assert time.time() - gone_at <= ONE_CYCLE_S
    wl = _wl(cluster, namespace, "borrower")
    assert not admitted(wl)
    evicted, reserved = condition(wl, "Evicted"), condition(wl, "QuotaReserved")
    assert evicted["reason"] == "QuotaReleased"
    assert evicted["message"].startswith("Reclaimed: reclaimed by queue"), evicted
    since = datetime.fromtimestamp(_at(evicted["lastTransitionTime"]), UTC).strftime("%H:%M:%S")
    requeue_at = wl["status"]["requeueState"]["requeueAt"]
    competes = datetime.fromtimestamp(_at(requeue_at), UTC).strftime("%H:%M:%S")
    story = f"since {since}, after an eviction by reclaim for {namespace}/{owner_wl}"
    if condition(wl, "Requeued").get("status") == "False":  # the 1 s backoff still lasts
        assert reserved["message"] == f"queued {story}; competes for quota from {competes}"
    else:  # over: the engine's reason of now
        assert reserved["message"].startswith(("insufficient quota", "exceeds")), reserved

    # Explain (and so `muster up`'s live view) says the same: queued, not evicted.
    explained = _explain(cluster, namespace, "borrower")
    assert f"queued ({story}; competes for quota" in explained, explained
    assert f"{competes})" in explained, explained
    assert "being stopped" not in explained, explained

    # The backoff ended: Requeued True within one cycle, while it still waits for room.
    cluster.wait_for(
        "Requeued True",
        lambda: condition(_wl(cluster, namespace, "borrower"), "Requeued").get("status") == "True",
        timeout=ONE_CYCLE_S,
    )
    requeued = condition(_wl(cluster, namespace, "borrower"), "Requeued")
    assert requeued["reason"] == "BackoffFinished"
    assert _at(requeued["lastTransitionTime"]) - _at(requeue_at) <= ONE_CYCLE_S
    explained = _explain(cluster, namespace, "borrower")
    assert f"queued ({story}; competes for quota since {competes})" in explained, explained
    assert "insufficient quota" in explained or "exceeds" in explained, explained

    # The reclaimer leaves: the borrower is admitted again, and runs.
    cluster.kubectl("delete", "job", "owner", "-n", namespace, "--wait=false")
    cluster.wait_for(
        "borrower admitted again",
        lambda: admitted(_wl(cluster, namespace, "borrower")),
        timeout=60,
    )
    wl = _wl(cluster, namespace, "borrower")
    assert wl["status"]["requeueState"]["count"] == 1
    assert "admitted" in _explain(cluster, namespace, "borrower")
    assert admitted(_wl(cluster, namespace, "base"))
