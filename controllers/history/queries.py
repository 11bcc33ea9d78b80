"""Questions operators ask the history store, answered as plain data for tables or JSON.

- a workload's timeline: every transition, placement and preemption it took part in, with why;
- a queue over a window: what was admitted, preempted or reclaimed, and usage vs fair share;
- the preemptions over a window: who preempted whom and by which rule;
- everything recorded since a moment (the live view of `muster up`).

A row these questions cannot read (a JSON column that is not JSON or not of its shape, a time
that is not one, an unknown transition kind or preemption rule, a NULL where a value is
required: a store edited by hand or damaged) is skipped, and `skipped` is told which row and
why; the rest of the answer stands. Nothing here writes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    Table,
    and_,
    func,
    not_,
    select,
    type_coerce,
)
from sqlalchemy.types import NullType

from controllers.history.models import (
    PlacementDecisionRow,
    PreemptionDecisionRow,
    QueueSampleRow,
    WorkloadTransitionRow,
)
from controllers.history.records import TransitionKind

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class UnreadableRow:
    """A stored row a question skipped, and why."""

    table: str
    row_id: Any
    problem: str

    def __str__(self) -> str:
        return f"{self.table} row id={self.row_id}: {self.problem}"


Skipped = Callable[[UnreadableRow], None]


def log_skipped(row: UnreadableRow) -> None:
    """The default for callers with no person to tell: a warning in the log."""
    log.warning("history: skipped an unreadable row: %s", row)


# What each JSON column must hold once decoded, and how to say it.
_SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "flavors": (lambda v: isinstance(v, dict), "a JSON object of resource -> flavor"),
    "resources": (
        lambda v: isinstance(v, dict) and all(isinstance(n, int) for n in v.values()),
        "a JSON object of resource -> amount",
    ),
    "assignments": (
        lambda v: isinstance(v, dict) and all(isinstance(n, int) for n in v.values()),
        "a JSON object of node -> pod count",
    ),
    "victims": (
        lambda v: (
            isinstance(v, list)
            and all(isinstance(x, dict) and "namespace" in x and "name" in x for x in v)
        ),
        "a JSON list of victims, each with namespace and name",
    ),
}
_KINDS = frozenset(k.value for k in TransitionKind)
_STRATEGIES = frozenset(("preempt", "reclaim", "consolidate"))


def _rows(
    conn: Connection, stmt: Select[Any], table: Table, skipped: Skipped
) -> Iterator[SimpleNamespace]:
    """The rows `stmt` selects from `table`, each column decoded as the model reads it; a row
    that does not decode, or breaks a rule of its table, is told to `skipped` instead.

    The columns are fetched undecoded and decoded here, one row at a time, so that one bad
    value costs its row and not the whole answer (decoding while fetching raises for all)."""
    columns = list(table.columns)
    raw = stmt.with_only_columns(*(type_coerce(c, NullType()).label(c.name) for c in columns))
    dialect = conn.dialect
    decoders = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]
    for values in conn.execute(raw):
        row: dict[str, Any] = {}
        problem = None
        for column, decode, value in zip(columns, decoders, values, strict=True):
            try:
                value = decode(value) if decode is not None and value is not None else value
            except (ValueError, TypeError) as error:
                problem = f"column {column.name} cannot be read ({str(error)[:120]})"
                break
            if value is None and not column.nullable:
                problem = f"column {column.name} is NULL where a value is required"
                break
            shape = _SHAPES.get(column.name)
            if shape is not None and not shape[0](value):
                problem = f"column {column.name} must be {shape[1]}, got {str(value)[:80]!r}"
                break
            row[column.name] = value
        if problem is None and "kind" in row and row["kind"] not in _KINDS:
            problem = f"column kind {row['kind']!r} is not a transition kind"
        if problem is None and "strategy" in row and row["strategy"] not in _STRATEGIES:
            problem = f"column strategy {row['strategy']!r} is not preempt, reclaim or consolidate"
        if problem is not None:
            skipped(UnreadableRow(table.name, values[0], problem))
            continue
        yield SimpleNamespace(**row)


def _transition_entry(row: Any) -> TimelineEntry:
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


def workload_timeline(
    engine: Engine, namespace: str, name: str, *, skipped: Skipped = log_skipped
) -> list[TimelineEntry]:
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
        skipped,
    )


def recent_timeline(
    engine: Engine, since: datetime, *, skipped: Skipped = log_skipped
) -> list[TimelineEntry]:
    """Everything recorded about any workload at or after `since`, oldest first."""
    t, p, d = WorkloadTransitionRow, PlacementDecisionRow, PreemptionDecisionRow
    return _timeline(engine, t.at >= since, p.at >= since, d.at >= since, skipped)


def _timeline(
    engine: Engine,
    transitions: ColumnElement[bool],
    placements: ColumnElement[bool],
    preemptions: ColumnElement[bool],
    skipped: Skipped,
) -> list[TimelineEntry]:
    entries: list[TimelineEntry] = []
    t, p_, d_ = (
        _table(WorkloadTransitionRow),
        _table(PlacementDecisionRow),
        _table(PreemptionDecisionRow),
    )
    with engine.connect() as conn:
        for row in _rows(conn, select(t).where(transitions), t, skipped):
            entries.append(_transition_entry(row))
        for p in _rows(conn, select(p_).where(placements), p_, skipped):
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
        for d in _rows(conn, select(d_).where(preemptions), d_, skipped):
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
    skipped: Skipped = log_skipped,
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
        table = _table(t)
        latest = select(table).where(*window).order_by(t.at.desc(), t.id.desc()).limit(max_events)
        events = [_transition_entry(r) for r in _rows(conn, latest, table, skipped)][::-1]
        in_window = (s.cluster_queue == cluster_queue, s.at >= since, s.at <= until)
        # A sample whose amounts are not numbers (SQLite keeps whatever it is given) is left
        # out of the sums and told, as a row the events could not read is.
        numbers = [c + 0 == c for c in (s.usage, s.fair_share, s.demand, s.resolution_s)]
        numbers.append(s.covered_s + 0 == s.covered_s)
        valid = and_(*numbers)
        for (row_id,) in conn.execute(select(s.id).where(*in_window, not_(valid)).limit(20)):
            skipped(UnreadableRow(_table(s).name, row_id, "an amount is not a number"))
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
                .where(*in_window, valid)
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
    skipped: Skipped = log_skipped,
) -> list[PreemptionEntry]:
    """Preemption and reclaim decisions between `since` and `until`, oldest first.

    With `cluster_queue`, only those where the preemptor or a victim belongs to that queue.
    """
    until = until or datetime.now(UTC)
    d = PreemptionDecisionRow
    table = _table(d)
    stmt = select(table).where(d.at >= since, d.at <= until).order_by(d.at, d.id)
    with engine.connect() as conn:
        rows = list(_rows(conn, stmt, table, skipped))
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


def _table(model: type[Any]) -> Table:
    table = model.__table__
    assert isinstance(table, Table)
    return table


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
    "UnreadableRow",
    "UsageFigure",
    "as_json",
    "parse_since",
    "preemptions",
    "queue_report",
    "workload_timeline",
]
