"""ledger settings entries: the owner's paper-mode changes in the chain

Revision ID: d3f5a7c9e1b2
Revises: b6d8f0a2c4e7
Create Date: 2026-11-29 12:30:00

A ``settings`` entry records each change of a dataset's ``allow_paper_mode`` (and a new
dataset's ``create`` entry its initial value), so that the setting a paper-mode charge relied on
is in the hash chain: a security audit turned it on in the database for one paper release and
off again, unseen by every check. Entries already written are unchanged; a ledger whose
``create`` entry does not record the setting is not checked for it.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "d3f5a7c9e1b2"
down_revision: str | None = "b6d8f0a2c4e7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "entry_type IN ('create', 'budget', 'grant', 'charge', 'rows_deleted')"
NEW = "entry_type IN ('create', 'budget', 'grant', 'charge', 'rows_deleted', 'settings')"


def upgrade() -> None:
    with op.batch_alter_table("ledger_entry") as batch:
        batch.drop_constraint(op.f("ck_ledger_entry_entry_type_valid"), type_="check")
        batch.create_check_constraint("entry_type_valid", NEW)


def downgrade() -> None:
    with op.batch_alter_table("ledger_entry") as batch:
        batch.drop_constraint(op.f("ck_ledger_entry_entry_type_valid"), type_="check")
        batch.create_check_constraint("entry_type_valid", OLD)
