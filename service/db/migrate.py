"""Apply Alembic migrations programmatically (start-up and tests)."""

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
    script = ScriptDirectory.from_config(alembic_config(url))
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_heads()
    return set(current) == set(script.get_heads())
