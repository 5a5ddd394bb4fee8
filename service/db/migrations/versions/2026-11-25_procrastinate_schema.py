"""procrastinate's job-queue schema (PostgreSQL only)

Revision ID: 8a4b2d6e0f13
Revises: 5d1f0c7a2e91
Create Date: 2026-11-25 14:05:00

On PostgreSQL, release jobs are procrastinate jobs in the same database (tables
``procrastinate_jobs``, ``procrastinate_workers``, ``procrastinate_events``, ... and their SQL
functions). This applies the schema of the pinned procrastinate version (3.10.0) as shipped in
the package (``procrastinate schema --apply`` does the same). A later procrastinate upgrade adds
a revision that runs that release's own migration files from ``procrastinate/sql/migrations``.
SQLite has no job-queue schema: the embedded mode claims ``release`` rows directly.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "8a4b2d6e0f13"
down_revision: str | None = "5d1f0c7a2e91"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = (
    "procrastinate_periodic_defers",
    "procrastinate_events",
    "procrastinate_jobs",
    "procrastinate_workers",
)
TYPES = (
    "procrastinate_job_to_defer_v1",
    "procrastinate_job_event_type",
    "procrastinate_job_status",
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    from procrastinate.schema import SchemaManager

    # As procrastinate's own ``apply_schema``: the driver treats % as a placeholder marker.
    op.get_bind().exec_driver_sql(SchemaManager.get_schema().replace("%", "%%"))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    op.execute(
        "DO $$ DECLARE f record; BEGIN FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_proc p "
        "WHERE p.proname LIKE 'procrastinate%' LOOP EXECUTE 'DROP FUNCTION ' || f.sig || ' CASCADE'; "
        "END LOOP; END $$"
    )
    for type_ in TYPES:
        op.execute(f"DROP TYPE IF EXISTS {type_} CASCADE")
