"""Settings: the only reader of the environment."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_ADMIN_KEY = "change-me"
# Development-only key for sealing released functions' secret state (refused in production).
DEFAULT_STATE_KEY = "ZGV2ZWxvcG1lbnQtb25seS1zdGF0ZS1rZXktMzJieXQ="


class Settings(BaseSettings):
    """Service configuration, read from ``CURATOR_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="CURATOR_", extra="ignore")

    environment: Literal["development", "production", "test"] = "development"
    # SQLite file by default (embedded, no setup); PostgreSQL in production.
    database_url: str = Field(
        default="sqlite:///./data/curator.sqlite3",
        validation_alias=AliasChoices("DATABASE_URL", "CURATOR_DATABASE_URL"),
    )
    admin_key: str = DEFAULT_ADMIN_KEY
    # base64 of 32 bytes: AES-256-GCM key for the secret state of released functions.
    state_key: str = DEFAULT_STATE_KEY
    host: str = "127.0.0.1"
    port: int = 8000
    # uvicorn worker processes; each runs its own job worker threads.
    workers: int = 1
    max_upload_bytes: int = 512 * 1024 * 1024
    # Worker threads per server process that run release jobs.
    job_workers: int = 2
    # Job completion times are padded up to the next of these buckets (seconds), so that
    # when a release finishes does not reveal how long the data-dependent work took.
    latency_buckets: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
    job_poll_seconds: float = 0.5
    run_migrations_on_start: bool = True
    start_job_runner: bool = True

    @model_validator(mode="after")
    def _refuse_default_secrets(self) -> Settings:
        if self.environment == "production" and self.admin_key == DEFAULT_ADMIN_KEY:
            raise ValueError("CURATOR_ADMIN_KEY must be set to a secret value in production")
        if self.environment == "production" and self.state_key == DEFAULT_STATE_KEY:
            raise ValueError("CURATOR_STATE_KEY must be set to a secret key in production")
        if len(self.admin_key) < 8:
            raise ValueError("CURATOR_ADMIN_KEY must have at least 8 characters")
        return self


@lru_cache
def get_settings() -> Settings:
    return Settings()
