"""released functions: who added each batch of points, and a per-caller share of the capacity

Revision ID: a9c3e5f7b2d4
Revises: f4a8d2c6b1e3
Create Date: 2026-11-28 10:30:00

``cate_function.points_per_principal``: an exact function's most new distinct points any one
caller may add (null: only ``t_max``, as every function released before this revision).
``cate_function_batch.principal_id``: who asked for a batch's new points (null: the reference
points drawn at release time, and batches stored before this revision, which count towards no
caller's share).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a9c3e5f7b2d4"
down_revision: str | None = "f4a8d2c6b1e3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cate_function", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("points_per_principal", sa.Integer(), nullable=True))
    with op.batch_alter_table("cate_function_batch", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("principal_id", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cate_function_batch", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("principal_id")
    with op.batch_alter_table("cate_function", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("points_per_principal")
