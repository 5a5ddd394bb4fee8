"""ledger charge in one statement: curator_charge_v1 (PostgreSQL only)

Revision ID: c5e9a1d7f3b2
Revises: 8a4b2d6e0f13
Create Date: 2026-11-25 17:10:00

On PostgreSQL a release's whole charge is one call of ``curator_charge_v1`` (issue 14, ledger
throughput): it defers the release's procrastinate job, then charges the budget row (the
conditional update that takes its lock), the principal's grant, appends the hash-chained ledger
entry (SHA-256 computed here from the canonical JSON prepared by
``service.ledger.chain.body_parts``) and inserts the release row. The budget row's lock is then
held for the rest of that one statement and the commit, instead of five statements, their
round trips and the Python between them. Any refusal raises (SQLSTATE ``CU001`` dataset not
found, ``CU002`` budget not set, ``CU003`` budget exhausted, ``CU004`` principal cap), so the
statement writes nothing (the job included). ``service.ledger.service.charge`` is its only
caller; SQLite keeps the statement-by-statement path in Python.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "c5e9a1d7f3b2"
down_revision: str | None = "8a4b2d6e0f13"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = (
    "curator_charge_v1(text, text, bigint, bigint, boolean, text[], text, text, text, text, "
    "text, jsonb, text, text, jsonb)"
)

FUNCTION = r"""
CREATE FUNCTION curator_charge_v1(
    p_dataset_id text,
    p_principal_id text,
    p_epsilon bigint,
    p_delta bigint,
    p_via_grant boolean,
    p_body text[],
    p_release_id text,
    p_guarantee text,
    p_details_json text,
    p_request_hash text,
    p_idempotency_key text,
    p_release jsonb,
    p_job_queue text,
    p_job_task text,
    p_job_args jsonb,
    OUT entry_seq integer,
    OUT entry_created_at text
) LANGUAGE plpgsql AS $$
DECLARE
    v_prev text;
    v_eps_spent bigint;
    v_dlt_spent bigint;
    v_eps_total bigint;
    v_dlt_total bigint;
    v_is_set boolean;
    v_hash text;
BEGIN
    -- The job first: its insert (and its NOTIFY, sent at commit) is not done under the lock.
    IF p_job_args IS NOT NULL THEN
        PERFORM procrastinate_defer_jobs_v1(ARRAY[ROW(
            p_job_queue, p_job_task, 0, NULL::text, NULL::text, p_job_args, NULL::timestamptz
        )]::procrastinate_job_to_defer_v1[]);
    END IF;
    -- The charge: checked and applied in one conditional update, which locks the budget row
    -- to the commit and takes the ledger's next sequence number.
    UPDATE budget AS b
       SET epsilon_spent = b.epsilon_spent + p_epsilon,
           delta_spent = b.delta_spent + p_delta,
           entries = b.entries + 1
     WHERE b.dataset_id = p_dataset_id
       AND b.is_set
       AND b.epsilon_spent + p_epsilon <= b.epsilon_total
       AND b.delta_spent + p_delta <= b.delta_total
    RETURNING b.entries, b.last_hash, b.epsilon_spent, b.delta_spent, b.epsilon_total,
              b.delta_total
         INTO entry_seq, v_prev, v_eps_spent, v_dlt_spent, v_eps_total, v_dlt_total;
    IF NOT FOUND THEN
        SELECT b.is_set INTO v_is_set FROM budget AS b WHERE b.dataset_id = p_dataset_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'dataset not found' USING ERRCODE = 'CU001';
        ELSIF NOT v_is_set THEN
            RAISE EXCEPTION 'budget not set' USING ERRCODE = 'CU002';
        END IF;
        RAISE EXCEPTION 'budget exhausted' USING ERRCODE = 'CU003';
    END IF;
    IF p_via_grant THEN
        UPDATE dataset_grant AS g
           SET epsilon_spent = g.epsilon_spent + p_epsilon,
               delta_spent = g.delta_spent + p_delta
         WHERE g.dataset_id = p_dataset_id
           AND g.principal_id = p_principal_id
           AND NOT g.revoked
           AND (g.epsilon_cap IS NULL OR g.epsilon_spent + p_epsilon <= g.epsilon_cap)
           AND (g.delta_cap IS NULL OR g.delta_spent + p_delta <= g.delta_cap);
        IF NOT FOUND THEN
            RAISE EXCEPTION 'principal cap exceeded' USING ERRCODE = 'CU004';
        END IF;
    END IF;
    -- The entry's timestamp as Python's datetime.isoformat(timespec="microseconds") in UTC.
    entry_created_at := to_char(clock_timestamp() AT TIME ZONE 'UTC',
                          'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"');
    -- The canonical body's holes, in service.ledger.chain.LOCKED_FIELDS order.
    v_hash := encode(sha256(convert_to(
        v_prev || E'\n' || p_body[1] || '"' || entry_created_at || '"' || p_body[2]
        || v_dlt_spent::text || p_body[3] || v_dlt_total::text || p_body[4]
        || v_eps_spent::text || p_body[5] || v_eps_total::text || p_body[6]
        || entry_seq::text || p_body[7],
        'UTF8')), 'hex');
    INSERT INTO ledger_entry (
        dataset_id, seq, entry_type, principal_id, release_id, epsilon, delta, epsilon_spent,
        delta_spent, epsilon_total, delta_total, guarantee, details_json, request_hash,
        idempotency_key, created_at, prev_hash, row_hash
    ) VALUES (
        p_dataset_id, entry_seq, 'charge', p_principal_id, p_release_id, p_epsilon, p_delta,
        v_eps_spent, v_dlt_spent, v_eps_total, v_dlt_total, p_guarantee, p_details_json,
        p_request_hash, p_idempotency_key, entry_created_at, v_prev, v_hash
    );
    UPDATE budget AS b SET last_hash = v_hash WHERE b.dataset_id = p_dataset_id;
    IF p_release IS NOT NULL THEN
        INSERT INTO release
        SELECT * FROM jsonb_populate_record(
            NULL::release,
            p_release
            || jsonb_build_object('ledger_seq', entry_seq, 'created_at', entry_created_at)
        );
    END IF;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
