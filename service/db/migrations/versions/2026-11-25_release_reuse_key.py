"""release reuse key: one live reusable release per identical request

Revision ID: b482caa6b127
Revises: 7c3e1f2a9b40
Create Date: 2026-11-25 12:00:00

A release requested without ``fresh`` stores its request hash in ``reuse_key``; a partial
unique index admits one such release per (dataset, principal, reuse_key) among the releases
that have not failed, so concurrent identical requests cannot each be charged. Rows written
before this revision keep a NULL key: the reuse lookup matches on ``request_hash`` and still
serves them, and the key only arbitrates between new inserts, so no backfill is needed (and a
backfill could collide on duplicates the old race already created).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b482caa6b127"
down_revision: str | None = "7c3e1f2a9b40"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REUSABLE = sa.text("reuse_key IS NOT NULL AND status != 'failed'")


def upgrade() -> None:
    with op.batch_alter_table("release", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reuse_key", sa.String(length=64), nullable=True))
        batch_op.create_index(
            "uq_release_reuse_key",
            ["dataset_id", "principal_id", "reuse_key"],
            unique=True,
            sqlite_where=REUSABLE,
            postgresql_where=REUSABLE,
        )


def downgrade() -> None:
    with op.batch_alter_table("release", schema=None) as batch_op:
        batch_op.drop_index("uq_release_reuse_key")
        batch_op.drop_column("reuse_key")
