"""state key check: one value sealed under the state key in force

Revision ID: b6d8f0a2c4e7
Revises: a9c3e5f7b2d4
Create Date: 2026-11-28 11:00:00

``state_key_check`` holds one value sealed under ``CURATOR_STATE_KEY`` (``service.functions.
keys``): processes whose keys cannot open it refuse to start instead of closing every released
function as corrupt. Empty after this revision; the first process to start seals it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b6d8f0a2c4e7"
down_revision: str | None = "a9c3e5f7b2d4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "state_key_check",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("sealed_at", sa.String(length=40), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_state_key_check")),
    )


def downgrade() -> None:
    op.drop_table("state_key_check")
