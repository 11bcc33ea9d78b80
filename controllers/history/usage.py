"""Past usage for time-based fair share, read from the queue samples in the history store.

Each queue's usage of a resource over the fairness window, integrated over time and decayed by
age with a half-life (`quota.fairness.usage.decayed_usage`), summed over flavors. The
controller refreshes these figures periodically (see `controllers/history/jobs.py`) and puts
them into the quota engine's snapshot (`Snapshot.historical_usage` from
`UsageFigures.historical_usage(parents)`, `Snapshot.usage_fairness_k` from `UsageFigures.k`);
the engine never queries the database.
`quota.fairness.usage.adjust_weights` turns them into over-quota weights among siblings.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, select

from controllers.history.models import QueueSampleRow
from quota.fairness.usage import adjust_weights, decayed_usage

# queue name -> resource name -> decayed usage in base-unit-seconds.
QueueUsage = Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class FairnessSettings:
    """Time-based fair share: off by default; when on, usage over `window` adjusts weights."""

    enabled: bool = False
    window: timedelta = timedelta(days=7)
    half_life: timedelta = timedelta(days=1)
    # weight' = max(0, w + k (w - u)); 0 leaves the weights as configured.
    k: float = 1.0

    def __post_init__(self) -> None:
        if self.window <= timedelta(0):
            raise ValueError("fairness settings: field 'window' must be a positive duration")
        if self.half_life <= timedelta(0):
            raise ValueError("fairness settings: field 'half_life' must be a positive duration")
        if self.k < 0:
            raise ValueError("fairness settings: field 'k' must not be negative")


def decayed_usage_by_queue(
    engine: Engine,
    *,
    now: datetime,
    window: timedelta,
    half_life: timedelta,
    resources: Iterable[str] | None = None,
) -> dict[str, dict[str, float]]:
    """Each queue's decayed usage per resource over the window ending at `now`.

    Raw and downsampled samples are both used: a sample contributes `usage * resolution_s`
    (what was used over the period it stands for) at its timestamp.
    """
    now = now.astimezone(UTC)
    stmt = select(
        QueueSampleRow.cluster_queue,
        QueueSampleRow.resource,
        QueueSampleRow.at,
        QueueSampleRow.usage,
        QueueSampleRow.resolution_s,
    ).where(
        QueueSampleRow.at > now - window,
        QueueSampleRow.at <= now,
        # A sample whose amounts are not numbers (SQLite keeps whatever it is given; the
        # history questions name such rows) counts for nothing rather than stopping the sum.
        QueueSampleRow.usage + 0 == QueueSampleRow.usage,
        QueueSampleRow.resolution_s + 0 == QueueSampleRow.resolution_s,
    )
    wanted = set(resources) if resources is not None else None
    if wanted is not None:
        stmt = stmt.where(QueueSampleRow.resource.in_(sorted(wanted)))
    series: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    with engine.connect() as conn:
        for queue, resource, at, usage, resolution_s in conn.execute(
            stmt.execution_options(yield_per=5000)
        ):
            series[(queue, resource)].append((at.timestamp(), usage * resolution_s))
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (queue, resource), samples in series.items():
        out[queue][resource] = decayed_usage(samples, now.timestamp(), half_life.total_seconds())
    return dict(out)


def dominant_usage(usage: QueueUsage, queues: Iterable[str] | None = None) -> dict[str, float]:
    """One figure per queue: its largest share of any resource used by `queues` together.

    GPUs, CPU and memory have no common unit, so like dominant-resource fairness each queue is
    measured by the resource it used the most of relative to the others. Queues not in `usage`
    count as having used nothing.
    """
    names = list(queues) if queues is not None else list(usage)
    totals: dict[str, float] = defaultdict(float)
    for name in names:
        for resource, amount in usage.get(name, {}).items():
            totals[resource] += amount
    out: dict[str, float] = {}
    for name in names:
        shares = [
            amount / totals[res] for res, amount in usage.get(name, {}).items() if totals[res] > 0
        ]
        out[name] = max(shares, default=0.0)
    return out


def sibling_usage(usage: QueueUsage, parents: Mapping[str, str | None]) -> dict[str, float]:
    """`dominant_usage` computed within each group of siblings (queues with the same parent).

    `parents` maps every queue to its parent (None for roots). Weights are only ever compared
    among siblings, so shares are taken among siblings too.
    """
    groups: dict[str | None, list[str]] = defaultdict(list)
    for name, parent in parents.items():
        groups[parent].append(name)
    out: dict[str, float] = {}
    for group in groups.values():
        out.update(dominant_usage(usage, group))
    return out


class UsageFigures:
    """The latest decayed usage, refreshed by a background job and read by the controller.

    Reads never touch the database: the admission cycle takes whatever was computed last.
    """

    def __init__(self, settings: FairnessSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._usage: dict[str, dict[str, float]] = {}
        self._computed_at: datetime | None = None

    def refresh(self, engine: Engine, now: datetime | None = None) -> None:
        """Recompute the figures from the history store."""
        now = now or datetime.now(UTC)
        usage = decayed_usage_by_queue(
            engine, now=now, window=self.settings.window, half_life=self.settings.half_life
        )
        with self._lock:
            self._usage, self._computed_at = usage, now

    @property
    def computed_at(self) -> datetime | None:
        """When the figures were last computed (None before the first refresh)."""
        return self._computed_at

    def current(self) -> dict[str, dict[str, float]]:
        """Queue -> resource -> decayed usage; empty while time-based fair share is off."""
        if not self.settings.enabled:
            return {}
        with self._lock:
            return {q: dict(r) for q, r in self._usage.items()}

    @property
    def k(self) -> float:
        """The snapshot's `usage_fairness_k`: 0 while time-based fair share is off."""
        return self.settings.k if self.settings.enabled else 0.0

    def historical_usage(self, parents: Mapping[str, str | None]) -> dict[str, float]:
        """The snapshot's `historical_usage`: per queue, its dominant share among its siblings.

        `parents` maps each queue name to its parent's (None for roots). Empty while time-based
        fair share is off, which the quota engine reads as "weights as configured".
        """
        if not self.settings.enabled:
            return {}
        return sibling_usage(self.current(), parents)

    def adjusted_weights(self, weights: Mapping[str, float]) -> dict[str, float]:
        """Over-quota weights of one set of siblings, adjusted by their recent usage.

        Unchanged when time-based fair share is disabled or nothing has been used.
        """
        if not self.settings.enabled:
            return dict(weights)
        usage = dominant_usage(self.current(), weights)
        return adjust_weights(weights, usage, self.settings.k)
