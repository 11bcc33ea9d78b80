"""Time-based fair share: a week of recorded usage moves surplus from heavy past users to light."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from controllers.history.jobs import RetentionSettings, apply_retention
from controllers.history.records import QueueSample
from controllers.history.rows import write_records
from controllers.history.usage import FairnessSettings, UsageFigures
from quota.fairness.fairshare import fair_share
from quota.model.snapshot import Flavor, FlavorQuota, PodSet, QueueSpec, Snapshot, Workload
from tests.integration.conftest import Store

NOW = datetime(2026, 3, 9, 0, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"
STEP = timedelta(minutes=10)
WEEK = 7 * 24 * 6  # ten-minute samples


def record_week(store: Store, gpus_used: Callable[[str, datetime], float]) -> None:
    """Ten-minute samples of queues A and B over the past week, then the retention job runs
    (days older than one are folded into hourly averages, as in production)."""
    samples = [
        QueueSample(
            cluster_queue=queue,
            flavor="h100",
            resource=GPU,
            at=NOW - STEP * i,
            usage=gpus_used(queue, NOW - STEP * i),
            fair_share=8,
            demand=16,
            resolution_s=int(STEP.total_seconds()),
        )
        for queue in ("A", "B")
        for i in range(1, WEEK + 1)
    ]
    with store.engine.begin() as conn:
        write_records(conn, samples)
    report = apply_retention(
        store.engine, RetentionSettings(downsample_after=timedelta(days=1)), NOW
    )
    assert report.samples_folded > 0


def figures(store: Store, *, enabled: bool, k: float = 1.0) -> UsageFigures:
    usage = UsageFigures(
        FairnessSettings(
            enabled=enabled, window=timedelta(days=7), half_life=timedelta(days=1), k=k
        )
    )
    usage.refresh(store.engine, NOW)
    return usage


def gpu_fair_shares(usage: UsageFigures) -> dict[str, int]:
    """Fair share of 16 GPUs between A and B (2 guaranteed each, equal weights, both want 16)."""
    queues = {
        name: QueueSpec(
            name=name, over_quota_weight=1.0, flavors=(FlavorQuota("h100", quota={GPU: 2}),)
        )
        for name in ("A", "B")
    }
    pending = tuple(
        Workload(
            key=f"team/{name.lower()}",
            queue=name,
            priority=0,
            arrival=float(i),
            pod_sets=(PodSet(name="main", count=16, per_pod={GPU: 1}),),
        )
        for i, name in enumerate(queues)
    )
    snapshot = Snapshot(
        now=NOW.timestamp(),
        queues=queues,
        flavors={"h100": Flavor("h100")},
        capacity={("h100", GPU): 16},
        pending=pending,
        historical_usage=usage.historical_usage(
            {name: spec.parent for name, spec in queues.items()}
        ),
        usage_fairness_k=usage.k,
    )
    shares = fair_share(snapshot)
    return {name: shares[name].get(("h100", GPU), 0) for name in queues}


def a_heavy_all_week(queue: str, _at: datetime) -> float:
    return 12.0 if queue == "A" else 2.0


def test_a_heavy_past_user_yields_weight_and_surplus_to_a_light_one(migrated: Store) -> None:
    record_week(migrated, a_heavy_all_week)
    usage = figures(migrated, enabled=True)
    past = usage.current()
    assert past["A"][GPU] > 5 * past["B"][GPU]

    weights = usage.adjusted_weights({"A": 1.0, "B": 1.0})
    assert weights["B"] > weights["A"]
    assert weights["A"] + weights["B"] == pytest.approx(2.0)

    shares = gpu_fair_shares(usage)
    assert shares["B"] > shares["A"], shares
    assert shares["A"] >= 2, "the guaranteed quota is never taken away by past usage"
    assert shares["A"] + shares["B"] == 16


def test_disabled_time_based_fair_share_changes_nothing(migrated: Store) -> None:
    record_week(migrated, a_heavy_all_week)
    for usage in (figures(migrated, enabled=False), figures(migrated, enabled=True, k=0.0)):
        assert usage.adjusted_weights({"A": 1.0, "B": 1.0}) == {"A": 1.0, "B": 1.0}
        assert gpu_fair_shares(usage) == {"A": 8, "B": 8}


def test_recent_usage_counts_more_than_old_usage(migrated: Store) -> None:
    # The same GPU-hours: A early in the week, B over the last day and a half.
    def shifted(queue: str, at: datetime) -> float:
        age = NOW - at
        if queue == "A":
            return 14.0 if age > timedelta(days=5, hours=12) else 0.0
        return 14.0 if age <= timedelta(days=1, hours=12) else 0.0

    record_week(migrated, shifted)
    usage = figures(migrated, enabled=True)
    shares = gpu_fair_shares(usage)
    assert shares["A"] > shares["B"], shares
