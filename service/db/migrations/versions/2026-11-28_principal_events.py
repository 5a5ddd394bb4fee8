"""principal events: an append-only, hash-chained record of each principal's account changes

Revision ID: e7b3c9d1a4f6
Revises: c5e9a1d7f3b2
Create Date: 2026-11-28 06:30:00

``principal_event`` records creation, disable, enable and key replacement with the caller who
made the change (``service.auth.events``); the principal row holds the chain's head
(``event_count``, ``last_event_hash``). Principals created before this revision get one
``created`` event from their stored ``created_at`` and ``created_by`` (the hash is computed here
exactly as ``service.auth.events.row_hash`` does, so ``verify`` accepts it); their earlier
disables and key replacements were not recorded and cannot be recovered.
"""

import hashlib
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e7b3c9d1a4f6"
down_revision: str | None = "c5e9a1d7f3b2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Only the 8 characters a listing shows (older rows store 10: the 2 more would be guessable
# from the hash, as service.auth.events.record).
KEY_PREFIX_SHOWN = 8
HASHED_FIELDS = ("principal_id", "seq", "event", "actor_id", "key_prefix", "created_at")


def _hash(prev: str, fields: dict[str, object]) -> str:
    body = json.dumps(
        {k: fields[k] for k in HASHED_FIELDS},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256((prev + "\n" + body).encode()).hexdigest()


def upgrade() -> None:
    op.create_table(
        "principal_event",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("principal_id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("actor_id", sa.String(length=32), nullable=False),
        sa.Column("key_prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.String(length=40), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("row_hash", sa.String(length=64), nullable=False),
        sa.CheckConstraint(
            "event IN ('created', 'disabled', 'enabled', 'key_replaced')",
            name=op.f("ck_principal_event_event_valid"),
        ),
        sa.ForeignKeyConstraint(
            ["principal_id"],
            ["principal.id"],
            name=op.f("fk_principal_event_principal_id_principal"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_principal_event")),
        sa.UniqueConstraint("principal_id", "seq", name="uq_principal_event_principal_seq"),
    )
    with op.batch_alter_table("principal", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("event_count", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("last_event_hash", sa.String(length=64), nullable=True))

    conn = op.get_bind()
    principals = conn.execute(
        sa.text("SELECT id, key_prefix, created_at, created_by FROM principal")
    ).all()
    for pid, key_prefix, created_at, created_by in principals:
        prev = hashlib.sha256(f"dp-curator-principal:{pid}".encode()).hexdigest()
        fields: dict[str, object] = {
            "principal_id": pid,
            "seq": 1,
            "event": "created",
            "actor_id": created_by or "admin",
            "key_prefix": key_prefix[:KEY_PREFIX_SHOWN],
            "created_at": created_at,
        }
        digest = _hash(prev, fields)
        conn.execute(
            sa.text(
                "INSERT INTO principal_event (principal_id, seq, event, actor_id, key_prefix, "
                "created_at, prev_hash, row_hash) VALUES (:principal_id, :seq, :event, "
                ":actor_id, :key_prefix, :created_at, :prev_hash, :row_hash)"
            ),
            {**fields, "prev_hash": prev, "row_hash": digest},
        )
        conn.execute(
            sa.text("UPDATE principal SET event_count = 1, last_event_hash = :h WHERE id = :id"),
            {"h": digest, "id": pid},
        )


def downgrade() -> None:
    # The events first (they point at principal); then plain ALTER TABLE … DROP COLUMN: a batch
    # rebuild of principal on SQLite would drop a table that datasets and grants point at.
    op.drop_table("principal_event")
    with op.batch_alter_table("principal", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("last_event_hash")
        batch_op.drop_column("event_count")
