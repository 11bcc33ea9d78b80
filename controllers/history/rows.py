"""The row codec: a history record as the row stored for it, and the batch insert that stores
records once each.

Every table has a natural key (its unique constraint, the record's `key()`); an insert that
meets a stored key leaves the stored row as it is, so replaying a record (after an outage, a
crash between a batch and the spool's clean-up, or a restart that reports the same transition
again) stores it once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from controllers.history.models import (
    PlacementDecisionRow,
    PreemptionDecisionRow,
    QueueSampleRow,
    WorkloadTransitionRow,
)
from controllers.history.records import (
    PlacementDecision,
    PreemptionDecision,
    QueueSample,
    Record,
    WorkloadTransition,
    record_fields,
)

_TABLES: dict[type[Record], Table] = {
    WorkloadTransition: WorkloadTransitionRow.__table__,  # type: ignore[dict-item]
    PlacementDecision: PlacementDecisionRow.__table__,  # type: ignore[dict-item]
    PreemptionDecision: PreemptionDecisionRow.__table__,  # type: ignore[dict-item]
    QueueSample: QueueSampleRow.__table__,  # type: ignore[dict-item]
}
# The natural key of each table: the columns of its unique constraint.
_KEYS: dict[type[Record], list[str]] = {
    WorkloadTransition: ["uid", "kind", "sequence"],
    PlacementDecision: ["uid", "pod_group", "sequence"],
    PreemptionDecision: ["uid", "sequence"],
    QueueSample: ["cluster_queue", "flavor", "resource", "resolution_s", "at"],
}
# A sample's amounts may be ints; their columns are doubles, and an int too large for SQLite's
# INTEGER would fail where the float it stands for fits.
_DOUBLES = ("usage", "fair_share", "demand")


def record_row(record: Record) -> dict[str, Any]:
    """The column values stored for `record`."""
    row = record_fields(record)
    if type(record) is QueueSample:
        for column in _DOUBLES:
            row[column] = float(row[column])
    return row


def write_records(conn: Connection, records: Iterable[Record]) -> None:
    """Insert `records` in `conn`'s transaction; records already stored are left as they are."""
    by_type: dict[type[Record], list[dict[str, Any]]] = {}
    for record in records:
        by_type.setdefault(type(record), []).append(record_row(record))
    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    for cls, rows in by_type.items():
        stmt = insert(_TABLES[cls]).on_conflict_do_nothing(index_elements=_KEYS[cls])
        conn.execute(stmt, rows)
