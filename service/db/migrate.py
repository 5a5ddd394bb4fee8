"""Apply Alembic migrations programmatically (start-up and tests), and the migration step of a
deployment that migrates on its own: ``python -m service.db.migrate`` (``DATABASE_URL``; no
secrets needed), which works from an installed copy too."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

# The migrations ship inside the package (package data), so an installed service migrates
# without the repository's alembic.ini (an ops walkthrough's `pip install .` could not).
SCRIPTS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Autogenerate compares our models only: procrastinate's tables are its own schema."""
    return not (type_ == "table" and (name or "").startswith("procrastinate_"))


def upgrade(url: str) -> None:
    command.upgrade(alembic_config(url), "head")


def at_head(engine: Engine, url: str) -> bool:
    return schema_state(engine, url) == "current"


def schema_state(engine: Engine, url: str) -> str:
    """``current`` (at this version's head), ``behind`` (older, or empty: migrate it) or
    ``newer`` (a revision this version does not know: a newer version migrated it)."""
    script = ScriptDirectory.from_config(alembic_config(url))
    with engine.connect() as conn:
        current = set(MigrationContext.configure(conn).get_current_heads())
    if current == set(script.get_heads()):
        return "current"
    known = {revision.revision for revision in script.walk_revisions()}
    return "newer" if current - known else "behind"


NEWER_SCHEMA = (
    "its schema is at a migration this version does not know: a newer version of the service "
    "migrated it; run that version (a database is never migrated back)"
)


def main(argv: list[str] | None = None) -> int:
    """``python -m service.db.migrate``: bring DATABASE_URL's schema to this version's head."""
    import argparse
    import sys

    from service import __version__
    from service.config import database_url_from_environment
    from service.db import preflight
    from service.db.engine import make_engine

    parser = argparse.ArgumentParser(
        prog="python -m service.db.migrate",
        description="Migrate the database at DATABASE_URL to this version's schema (the step "
        "an API with CURATOR_RUN_MIGRATIONS_ON_START=false leaves to you); needs no secrets.",
    )
    parser.add_argument("--version", action="version", version=f"dp-curator {__version__}")
    parser.parse_args(argv)
    url = database_url_from_environment()
    problem = preflight.unreachable(url)
    if problem is not None:
        sys.stderr.write(problem + "\n")
        return 1
    engine = make_engine(url)
    try:
        if schema_state(engine, url) == "newer":
            sys.stderr.write(f"error: database {preflight.safe_url(url)}: {NEWER_SCHEMA}\n")
            return 1
    finally:
        engine.dispose()
    upgrade(url)
    sys.stderr.write(f"migrated {preflight.safe_url(url)} to this version's schema\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
