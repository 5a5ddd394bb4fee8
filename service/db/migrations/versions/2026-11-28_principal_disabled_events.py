"""principal events: a ``disabled`` event for principals disabled before the record existed

Revision ID: f4a8d2c6b1e3
Revises: e7b3c9d1a4f6
Create Date: 2026-11-28 10:00:00

``service.auth.events.verify`` now replays a principal's record against its row: the
``disabled`` flag must be the last ``disabled`` or ``enabled`` event's. Revision e7b3c9d1a4f6
gave principals that existed before it only a ``created`` event, so one disabled then would fail
that check. This revision appends the ``disabled`` event such a principal lacks (actor
``admin``: only the admin disables principals), dated at the upgrade, as
``service.auth.events.record`` would. A principal whose record already holds a ``disabled`` or
``enabled`` event is left alone: its flag was set through the service, and a mismatch there is
what ``verify`` exists to report.
"""

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "f4a8d2c6b1e3"
down_revision: str | None = "e7b3c9d1a4f6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

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
    conn = op.get_bind()
    lacking = conn.execute(
        sa.text(
            "SELECT p.id, p.key_prefix, p.event_count, p.last_event_hash FROM principal p "
            "WHERE p.disabled AND p.event_count > 0 AND NOT EXISTS (SELECT 1 FROM "
            "principal_event e WHERE e.principal_id = p.id AND e.event IN ('disabled', 'enabled'))"
        )
    ).all()
    now = datetime.now(UTC).isoformat(timespec="microseconds")
    for pid, key_prefix, count, head in lacking:
        fields: dict[str, object] = {
            "principal_id": pid,
            "seq": count + 1,
            "event": "disabled",
            "actor_id": "admin",
            "key_prefix": key_prefix[:KEY_PREFIX_SHOWN],
            "created_at": now,
        }
        digest = _hash(head, fields)
        conn.execute(
            sa.text(
                "INSERT INTO principal_event (principal_id, seq, event, actor_id, key_prefix, "
                "created_at, prev_hash, row_hash) VALUES (:principal_id, :seq, :event, "
                ":actor_id, :key_prefix, :created_at, :prev_hash, :row_hash)"
            ),
            {**fields, "prev_hash": head, "row_hash": digest},
        )
        conn.execute(
            sa.text("UPDATE principal SET event_count = :n, last_event_hash = :h WHERE id = :id"),
            {"n": count + 1, "h": digest, "id": pid},
        )


def downgrade() -> None:
    # The appended events are a true record of the principals' state; e7b3c9d1a4f6 and the
    # service accept them, so there is nothing to undo.
    pass
