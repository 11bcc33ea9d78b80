"""History store schema: workload transitions, placement and preemption decisions, queue samples.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Types are spelled out here rather than imported from the models: a migration must keep
# describing the schema of its own revision even after the models move on.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_NAME = sa.String(length=253)


def _id() -> sa.Column[int]:
    return sa.Column("id", _ID, autoincrement=True, nullable=False)


def _at() -> sa.Column[object]:
    return sa.Column("at", sa.DateTime(timezone=True), nullable=False)


def _indexes(table: str, *columns: tuple[str, ...]) -> None:
    for cols in columns:
        op.create_index(op.f(f"ix_{table}_{'_'.join(cols)}"), table, list(cols), unique=False)


def upgrade() -> None:
    op.create_table(
        "workload_transitions",
        _id(),
        _at(),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("namespace", _NAME, nullable=False),
        sa.Column("name", _NAME, nullable=False),
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("local_queue", _NAME, nullable=False),
        sa.Column("cluster_queue", _NAME, nullable=False),
        sa.Column("flavors", _JSON, nullable=False),
        sa.Column("resources", _JSON, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=507), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workload_transitions")),
        sa.UniqueConstraint(
            "uid", "kind", "sequence", name=op.f("uq_workload_transitions_uid_kind_sequence")
        ),
    )
    _indexes(
        "workload_transitions",
        ("at",),
        ("cluster_queue", "at"),
        ("kind", "at"),
        ("namespace", "name", "at"),
    )

    op.create_table(
        "placement_decisions",
        _id(),
        _at(),
        sa.Column("namespace", _NAME, nullable=False),
        sa.Column("name", _NAME, nullable=False),
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("pod_group", _NAME, nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("cluster_queue", _NAME, nullable=False),
        sa.Column("assignments", _JSON, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_placement_decisions")),
        sa.UniqueConstraint(
            "uid",
            "pod_group",
            "sequence",
            name=op.f("uq_placement_decisions_uid_pod_group_sequence"),
        ),
    )
    _indexes("placement_decisions", ("at",), ("cluster_queue", "at"), ("namespace", "name", "at"))

    op.create_table(
        "preemption_decisions",
        _id(),
        _at(),
        sa.Column("namespace", _NAME, nullable=False),
        sa.Column("name", _NAME, nullable=False),
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("cluster_queue", _NAME, nullable=False),
        sa.Column("strategy", sa.String(length=16), nullable=False),
        sa.Column("victims", _JSON, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_preemption_decisions")),
        sa.UniqueConstraint("uid", "sequence", name=op.f("uq_preemption_decisions_uid_sequence")),
    )
    _indexes("preemption_decisions", ("at",), ("cluster_queue", "at"))

    op.create_table(
        "queue_samples",
        _id(),
        _at(),
        sa.Column("cluster_queue", _NAME, nullable=False),
        sa.Column("flavor", _NAME, nullable=False),
        sa.Column("resource", _NAME, nullable=False),
        sa.Column("usage", sa.Double(), nullable=False),
        sa.Column("fair_share", sa.Double(), nullable=False),
        sa.Column("demand", sa.Double(), nullable=False),
        sa.Column("resolution_s", sa.Integer(), nullable=False),
        sa.Column("covered_s", sa.Integer(), nullable=False),
        sa.Column("downsampled", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_queue_samples")),
        sa.UniqueConstraint(
            "cluster_queue",
            "flavor",
            "resource",
            "resolution_s",
            "at",
            name=op.f("uq_queue_samples_cluster_queue_flavor_resource_resolution_s_at"),
        ),
    )
    _indexes("queue_samples", ("cluster_queue", "at"), ("downsampled", "at"))


def downgrade() -> None:
    # Dropping a table drops its indexes and constraints with it, on both engines.
    for table in (
        "queue_samples",
        "preemption_decisions",
        "placement_decisions",
        "workload_transitions",
    ):
        op.drop_table(table)
