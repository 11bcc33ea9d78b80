"""The history store's tables (SQLAlchemy 2.0 declarative), shared by PostgreSQL and SQLite.

Every table has a unique natural key so that writes are idempotent (INSERT ... ON CONFLICT DO
NOTHING), and indexes for the questions operators ask: a workload's timeline, a queue over a
time window, a kind of event over a time window. Migrations in `migrations/` must match these
models exactly; a test runs Alembic's autogenerate comparison to keep them in step.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# Deterministic constraint names keep migrations and models comparable on both engines.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")
# JSONB on PostgreSQL so operators can query inside resources and victims; JSON text elsewhere.
Json = JSON().with_variant(JSONB(), "postgresql")
Name = String(253)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back as an aware UTC datetime.

    SQLite keeps no time zone, so without this a value written aware would come back naive.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"history timestamps must be timezone-aware, got naive {value}")
        value = value.astimezone(UTC)
        # SQLite compares timestamps as text: store them naive UTC so ordering is by time.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of the history store."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: dict[Any, Any] = {datetime: UTCDateTime()}


class WorkloadTransitionRow(Base):
    """A step in a workload's life (created, admitted, preempted, finished, ...)."""

    __tablename__ = "workload_transitions"
    __table_args__ = (
        UniqueConstraint("uid", "kind", "sequence"),
        Index(None, "namespace", "name", "at"),
        Index(None, "cluster_queue", "at"),
        Index(None, "kind", "at"),
        Index(None, "at"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    namespace: Mapped[str] = mapped_column(Name, nullable=False)
    name: Mapped[str] = mapped_column(Name, nullable=False)
    uid: Mapped[str] = mapped_column(String(64), nullable=False)
    sequence: Mapped[int] = mapped_column(BigInteger, nullable=False)
    local_queue: Mapped[str] = mapped_column(Name, nullable=False)
    cluster_queue: Mapped[str] = mapped_column(Name, nullable=False)
    flavors: Mapped[dict[str, str]] = mapped_column(Json, nullable=False)
    resources: Mapped[dict[str, int]] = mapped_column(Json, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    actor: Mapped[str] = mapped_column(String(507), nullable=False)


class PlacementDecisionRow(Base):
    """Where the pods of an admitted pod group were placed."""

    __tablename__ = "placement_decisions"
    __table_args__ = (
        UniqueConstraint("uid", "pod_group", "sequence"),
        Index(None, "namespace", "name", "at"),
        Index(None, "cluster_queue", "at"),
        Index(None, "at"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    namespace: Mapped[str] = mapped_column(Name, nullable=False)
    name: Mapped[str] = mapped_column(Name, nullable=False)
    uid: Mapped[str] = mapped_column(String(64), nullable=False)
    pod_group: Mapped[str] = mapped_column(Name, nullable=False)
    sequence: Mapped[int] = mapped_column(BigInteger, nullable=False)
    cluster_queue: Mapped[str] = mapped_column(Name, nullable=False)
    assignments: Mapped[dict[str, int]] = mapped_column(Json, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)


class PreemptionDecisionRow(Base):
    """A preemptor and the victims evicted for it."""

    __tablename__ = "preemption_decisions"
    __table_args__ = (
        UniqueConstraint("uid", "sequence"),
        Index(None, "cluster_queue", "at"),
        Index(None, "at"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    namespace: Mapped[str] = mapped_column(Name, nullable=False)
    name: Mapped[str] = mapped_column(Name, nullable=False)
    uid: Mapped[str] = mapped_column(String(64), nullable=False)
    sequence: Mapped[int] = mapped_column(BigInteger, nullable=False)
    cluster_queue: Mapped[str] = mapped_column(Name, nullable=False)
    strategy: Mapped[str] = mapped_column(String(16), nullable=False)
    victims: Mapped[list[dict[str, Any]]] = mapped_column(Json, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)


class QueueSampleRow(Base):
    """A queue's usage, fair share and demand of one flavor/resource over a sampling period."""

    __tablename__ = "queue_samples"
    __table_args__ = (
        UniqueConstraint("cluster_queue", "flavor", "resource", "resolution_s", "at"),
        Index(None, "cluster_queue", "at"),
        Index(None, "downsampled", "at"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    cluster_queue: Mapped[str] = mapped_column(Name, nullable=False)
    flavor: Mapped[str] = mapped_column(Name, nullable=False)
    resource: Mapped[str] = mapped_column(Name, nullable=False)
    usage: Mapped[float] = mapped_column(Double, nullable=False)
    fair_share: Mapped[float] = mapped_column(Double, nullable=False)
    demand: Mapped[float] = mapped_column(Double, nullable=False)
    resolution_s: Mapped[int] = mapped_column(Integer, nullable=False)
    covered_s: Mapped[int] = mapped_column(Integer, nullable=False)
    downsampled: Mapped[bool] = mapped_column(Boolean, nullable=False)
