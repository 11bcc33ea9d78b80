"""Questions operators ask the history store, answered as plain data for tables or JSON.

- a workload's timeline: every transition, placement and preemption it took part in, with why;
- a queue over a window: what was admitted, preempted or reclaimed, and usage vs fair share;
- the preemptions over a window: who preempted whom and by which rule;
- everything recorded since a moment (the live view of `muster up`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Engine, Row, func, select

from controllers.history.models import (
    PlacementDecisionRow,
    PreemptionDecisionRow,
    QueueSampleRow,
    WorkloadTransitionRow,
)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, *, option: str = "duration") -> timedelta:
    """Turn "90s", "30m", "24h", "7d" or "2w" into a timedelta."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{option}: {text!r} is not a duration (90s, 30m, 24h, 7d, 2w)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def parse_since(text: str, now: datetime | None = None, *, option: str = "--since") -> datetime:
    """Turn "90s", "30m", "24h", "7d", "2w" or an ISO 8601 timestamp into a UTC datetime."""
    now = now or datetime.now(UTC)
    if _DURATION.match(text):
        return now - parse_duration(text, option=option)
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{option}: {text!r} is neither a duration (90s, 30m, 24h, 7d, 2w) "
            "nor an ISO 8601 timestamp"
        ) from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


@dataclass(frozen=True)
class TimelineEntry:
    """One line of a workload's or a queue's history."""

    at: datetime
    event: str
    namespace: str
    name: str
    cluster_queue: str
    reason: str
    actor: str = ""
    local_queue: str = ""
    flavors: dict[str, str] = field(default_factory=dict)
    resources: dict[str, int] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UsageFigure:
    """A queue's use of one flavor/resource over a window, against its fair share."""

    flavor: str
    resource: str
    average_usage: float
    peak_usage: float
    average_fair_share: float
    peak_demand: float
    observed_s: int


@dataclass(frozen=True)
class QueueReport:
    """A queue's activity over a window."""

    cluster_queue: str
    since: datetime
    until: datetime
    counts: dict[str, int]
    events: list[TimelineEntry]
    usage: list[UsageFigure]


@dataclass(frozen=True)
class PreemptionEntry:
    """A preemptor, the queue it was admitted to, the rule, and its victims."""

    at: datetime
    namespace: str
    name: str
    cluster_queue: str
    strategy: str
    reason: str
    victims: list[dict[str, Any]]


def _transition_entry(row: Row[Any]) -> TimelineEntry:
    return TimelineEntry(
        at=row.at,
        event=row.kind,
        namespace=row.namespace,
        name=row.name,
        cluster_queue=row.cluster_queue,
        reason=row.reason,
        actor=row.actor,
        local_queue=row.local_queue,
        flavors=dict(row.flavors),
        resources=dict(row.resources),
        detail={"uid": row.uid, "sequence": row.sequence},
    )


_LIFE_ORDER = {
    kind: i
    for i, kind in enumerate(
        (
            "created",
            "quota_reserved",
            "admitted",
            "evicted",
            "preempted",
            "reclaimed",
            "requeued",
            "slice_replaced",
            "finished",
        )
    )
}


def workload_timeline(engine: Engine, namespace: str, name: str) -> list[TimelineEntry]:
    """Everything recorded about one workload, oldest first.

    A workload deleted and recreated under the same name shows both lives (the operator asks by
    name); each transition's uid tells them apart in the JSON output.
    """
    t, p, d = WorkloadTransitionRow, PlacementDecisionRow, PreemptionDecisionRow
    return _timeline(
        engine,
        (t.namespace == namespace) & (t.name == name),
        (p.namespace == namespace) & (p.name == name),
        (d.namespace == namespace) & (d.name == name),
    )


def recent_timeline(engine: Engine, since: datetime) -> list[TimelineEntry]:
    """Everything recorded about any workload at or after `since`, oldest first."""
    t, p, d = WorkloadTransitionRow, PlacementDecisionRow, PreemptionDecisionRow
    return _timeline(engine, t.at >= since, p.at >= since, d.at >= since)


def _timeline(
    engine: Engine,
    transitions: ColumnElement[bool],
    placements: ColumnElement[bool],
    preemptions: ColumnElement[bool],
) -> list[TimelineEntry]:
    entries: list[TimelineEntry] = []
    with engine.connect() as conn:
        for row in conn.execute(select(WorkloadTransitionRow.__table__).where(transitions)):
            entries.append(_transition_entry(row))
        for p in conn.execute(select(PlacementDecisionRow.__table__).where(placements)):
            entries.append(
                TimelineEntry(
                    at=p.at,
                    # A failed attempt is recorded with no nodes and its reason.
                    event="placed" if p.assignments else "unplaceable",
                    namespace=p.namespace,
                    name=p.name,
                    cluster_queue=p.cluster_queue,
                    reason=p.reason,
                    detail={"pod_group": p.pod_group, "nodes": dict(p.assignments)},
                )
            )
        for d in conn.execute(select(PreemptionDecisionRow.__table__).where(preemptions)):
            victims = ", ".join(f"{v['namespace']}/{v['name']}" for v in d.victims)
            entries.append(
                TimelineEntry(
                    at=d.at,
                    # The preemptor's side; each victim has its own preempted/reclaimed row.
                    event={"preempt": "preempting", "consolidate": "consolidating"}.get(
                        d.strategy, "reclaiming"
                    ),
                    namespace=d.namespace,
                    name=d.name,
                    cluster_queue=d.cluster_queue,
                    reason=d.reason,
                    detail={"victims": victims},
                )
            )
    # Same-instant events keep their causal order: a transition before the placement it led to,
    # and transitions in the order of a workload's life (timestamps read back from a status
    # have whole seconds only).
    after = {"preempting", "reclaiming", "consolidating", "placed", "unplaceable"}
    entries.sort(key=lambda e: (e.at, e.event in after, _LIFE_ORDER.get(e.event, 0)))
    return entries


def queue_report(
    engine: Engine,
    cluster_queue: str,
    since: datetime,
    until: datetime | None = None,
    *,
    max_events: int = 200,
) -> QueueReport:
    """A cluster queue's transitions and usage vs fair share between `since` and `until`."""
    until = until or datetime.now(UTC)
    t = WorkloadTransitionRow
    window = (t.cluster_queue == cluster_queue, t.at >= since, t.at <= until)
    s = QueueSampleRow
    with engine.connect() as conn:
        counts = {
            kind: n
            for kind, n in conn.execute(
                select(t.kind, func.count()).where(*window).group_by(t.kind)
            ).all()
        }
        rows = conn.execute(
            select(t.__table__).where(*window).order_by(t.at.desc(), t.id.desc()).limit(max_events)
        )
        events = [_transition_entry(r) for r in rows][::-1]
        usage = [
            UsageFigure(
                flavor=flavor,
                resource=resource,
                average_usage=(integral or 0.0) / span if span else 0.0,
                peak_usage=peak or 0.0,
                average_fair_share=(fs or 0.0) / covered if covered else 0.0,
                peak_demand=demand or 0.0,
                observed_s=int(covered or 0),
            )
            for flavor, resource, integral, span, peak, fs, covered, demand in conn.execute(
                select(
                    s.flavor,
                    s.resource,
                    func.sum(s.usage * s.resolution_s),
                    func.sum(s.resolution_s),
                    func.max(s.usage),
                    func.sum(s.fair_share * s.covered_s),
                    func.sum(s.covered_s),
                    func.max(s.demand),
                )
                .where(s.cluster_queue == cluster_queue, s.at >= since, s.at <= until)
                .group_by(s.flavor, s.resource)
                .order_by(s.flavor, s.resource)
            ).all()
        ]
    return QueueReport(cluster_queue, since, until, counts, events, usage)


def preemptions(
    engine: Engine,
    since: datetime,
    until: datetime | None = None,
    *,
    cluster_queue: str | None = None,
) -> list[PreemptionEntry]:
    """Preemption and reclaim decisions between `since` and `until`, oldest first.

    With `cluster_queue`, only those where the preemptor or a victim belongs to that queue.
    """
    until = until or datetime.now(UTC)
    d = PreemptionDecisionRow
    stmt = select(d.__table__).where(d.at >= since, d.at <= until).order_by(d.at, d.id)
    with engine.connect() as conn:
        rows = list(conn.execute(stmt))
    out = [
        PreemptionEntry(
            at=r.at,
            namespace=r.namespace,
            name=r.name,
            cluster_queue=r.cluster_queue,
            strategy=r.strategy,
            reason=r.reason,
            victims=list(r.victims),
        )
        for r in rows
    ]
    if cluster_queue is not None:
        out = [
            e
            for e in out
            if e.cluster_queue == cluster_queue
            or any(v.get("cluster_queue") == cluster_queue for v in e.victims)
        ]
    return out


def as_json(value: Any) -> Any:
    """A query result as JSON-ready data (datetimes as ISO 8601 strings)."""
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return as_json(asdict(value))
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value.isoformat()
    return value


__all__ = [
    "PreemptionEntry",
    "QueueReport",
    "TimelineEntry",
    "UsageFigure",
    "as_json",
    "parse_since",
    "preemptions",
    "queue_report",
    "workload_timeline",
]
