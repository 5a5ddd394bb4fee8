"""Alembic migrations produce exactly the schema the models declare (both databases)."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from service.db.migrate import include_name
from service.db.models import Base


def test_models_and_migrations_agree(db_url: str) -> None:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_name": include_name}
        )
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diff == []
