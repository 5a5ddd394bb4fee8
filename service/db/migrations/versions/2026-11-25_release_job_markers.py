"""release job markers: data_read_at (resume or fail after a crash) and a public failure reason

Revision ID: 5d1f0c7a2e91
Revises: b482caa6b127
Create Date: 2026-11-25 14:00:00

``data_read_at`` is written by the claiming worker just before it reads the rows. A job whose
worker died before that moment is re-queued (no private data was read, no noise drawn); after
it, the job is failed and its charge kept. ``failure`` is a public reason code shown in the
release's problem+json error. A release already running when this revision is applied was
claimed by an older worker that may have read the rows: it gets the marker now (the old,
conservative rule: if its worker dies it fails, it is never re-run).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5d1f0c7a2e91"
down_revision: str | None = "b482caa6b127"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("release", schema=None) as batch_op:
        batch_op.add_column(sa.Column("data_read_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("failure", sa.String(length=32), nullable=True))
    op.execute(sa.text("UPDATE release SET data_read_at = 0 WHERE status = 'running'"))


def downgrade() -> None:
    with op.batch_alter_table("release", schema=None) as batch_op:
        batch_op.drop_column("failure")
        batch_op.drop_column("data_read_at")
