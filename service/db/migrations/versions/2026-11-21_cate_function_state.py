"""cate function state: header, secret fit, answered batches

Revision ID: 7c3e1f2a9b40
Revises: 442a5849c9b7
Create Date: 2026-11-21 13:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7c3e1f2a9b40"
down_revision: str | None = "442a5849c9b7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cate_function",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("basis", sa.String(length=16), nullable=False),
        sa.Column("q", sa.Integer(), nullable=False),
        sa.Column("t_max", sa.Integer(), nullable=False),
        sa.Column("batch_max", sa.Integer(), nullable=False),
        sa.Column("jitter", sa.Float(), nullable=False),
        sa.Column("t", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("public_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.String(length=40), nullable=False),
        sa.Column("closed_at", sa.String(length=40), nullable=True),
        sa.CheckConstraint(
            "status IN ('open', 'closed')", name=op.f("ck_cate_function_status_valid")
        ),
        sa.CheckConstraint(
            "t >= 0 AND t <= t_max AND version >= 0", name=op.f("ck_cate_function_counts_valid")
        ),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["dataset.id"], name=op.f("fk_cate_function_dataset_id_dataset")
        ),
        sa.ForeignKeyConstraint(["id"], ["release.id"], name=op.f("fk_cate_function_id_release")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cate_function")),
    )
    op.create_table(
        "cate_function_secret",
        sa.Column("function_id", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["function_id"],
            ["cate_function.id"],
            name=op.f("fk_cate_function_secret_function_id_cate_function"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("function_id", name=op.f("pk_cate_function_secret")),
    )
    op.create_table(
        "cate_function_batch",
        sa.Column("function_id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["function_id"],
            ["cate_function.id"],
            name=op.f("fk_cate_function_batch_function_id_cate_function"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("function_id", "seq", name=op.f("pk_cate_function_batch")),
    )


def downgrade() -> None:
    op.drop_table("cate_function_batch")
    op.drop_table("cate_function_secret")
    op.drop_table("cate_function")
