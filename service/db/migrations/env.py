"""Alembic environment: the URL comes from the config (set by service.db.migrate) or Settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from service.db.engine import make_engine
from service.db.migrate import include_name
from service.db.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    # the URL alone: migrating by hand (alembic upgrade head) needs no secrets
    from service.config import database_url_from_environment

    return database_url_from_environment()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_url())
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            include_name=include_name,
        )
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                # API replicas starting together migrate one after the other: the second
                # waits here, then finds the schema at head and does nothing.
                connection.execute(text("SELECT pg_advisory_xact_lock(7340432113)"))
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
