"""Settings: the only reader of the environment."""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from functools import lru_cache
from typing import Literal

from pydantic import AliasChoices, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

DEFAULT_ADMIN_KEY = "change-me"
# /metrics is reachable from wherever the service listens: a token short enough to guess is none.
METRICS_TOKEN_MIN_LENGTH = 16
# Development-only key for sealing released functions' secret state (refused in production).
DEFAULT_STATE_KEY = "ZGV2ZWxvcG1lbnQtb25seS1zdGF0ZS1rZXktMzJieXQ="


def _is_aes256_key(value: str) -> bool:
    try:
        return len(base64.b64decode(value.strip(), validate=True)) == 32
    except ValueError:
        return False


class DatabaseSettings(BaseSettings):
    """The database URL alone: what commands that need nothing else read (migrations by
    hand ask for no secrets); ``Settings`` extends it."""

    # hide_input_in_errors: a refused setting's message must not echo the environment (it held
    # the admin key, or the tail of the state key or the metrics token, in a start-up traceback)
    model_config = SettingsConfigDict(
        env_prefix="CURATOR_", extra="ignore", hide_input_in_errors=True
    )

    # SQLite file by default (embedded, no setup); PostgreSQL in production.
    database_url: str = Field(
        default="sqlite:///./data/curator.sqlite3",
        validation_alias=AliasChoices("DATABASE_URL", "CURATOR_DATABASE_URL"),
    )


class Settings(DatabaseSettings):
    """Service configuration, read from ``CURATOR_*`` environment variables."""

    environment: Literal["development", "production", "test"] = "development"
    admin_key: str = DEFAULT_ADMIN_KEY
    # base64 of 32 bytes: AES-256-GCM key for the secret state of released functions.
    state_key: str = DEFAULT_STATE_KEY
    # Rotation: earlier state keys (comma-separated, base64 of 32 bytes each) that still open
    # state sealed before the rotation; new state is always sealed with state_key, and
    # ``python -m service.functions.rotate`` re-seals the old (service.functions.sealing).
    state_key_previous: str = ""
    host: str = "127.0.0.1"
    port: int = 8000
    # uvicorn worker processes (API only on PostgreSQL; see job_runner).
    workers: int = 1
    max_upload_bytes: int = 512 * 1024 * 1024
    # Connections per process: writes (pool + overflow) and single-statement reads (half of
    # each). Mind PostgreSQL's max_connections across all API and worker processes.
    db_pool_size: int = 10
    db_max_overflow: int = 20
    # Who runs release jobs in an API process: ``auto`` = the embedded runner on SQLite (one
    # command, no other server) and none on PostgreSQL (``python -m service.worker`` processes
    # run them); ``inprocess`` = also on PostgreSQL, a procrastinate worker inside the API
    # process (single-process deployments, tests); ``none`` = never.
    job_runner: Literal["auto", "inprocess", "none"] = "auto"
    # Concurrent release jobs per process that runs them (threads).
    job_workers: int = 2
    # A running job whose worker has not beaten for this long is recovered: re-queued if it had
    # not read the rows, else failed with its charge kept.
    job_stale_seconds: float = 30.0
    # How often the recovery task runs (procrastinate periodic task; seconds, integer).
    job_recovery_seconds: int = 5
    # Tests only (``environment=test``): hold every job this long before / after it reads the
    # rows ("before,after" in seconds) so a test can kill its worker at a known point.
    test_job_pause: str = ""
    # Job completion times are padded up to the next of these buckets (seconds), so that
    # when a release finishes does not reveal how long the data-dependent work took.
    latency_buckets: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
    job_poll_seconds: float = 0.5
    # Memory (MiB) per process for the cached exact-mode function paths (each about 4 t^2 bytes
    # plus a page per point at t answered points); the least recently used are dropped beyond
    # it (the next request replays them from the database, O(t^3)).
    function_cache_mb: int = Field(default=1024, ge=1)
    # Bearer token for ``/metrics`` (a Prometheus scraper's). The admin key is accepted too.
    # Unset, ``/metrics`` is open only in development on a loopback host (``metrics_open``).
    metrics_token: str = ""
    run_migrations_on_start: bool = True
    # One uvicorn access-log line per request (client address, request line, status), on the
    # same timestamped handler as the service's own lines; no bodies or headers, so no keys.
    access_log: bool = True
    # False: this process runs no jobs whatever job_runner says (benchmarks, openapi export).
    start_job_runner: bool = True

    @property
    def is_postgres(self) -> bool:
        return self.database_url.startswith("postgresql")

    @property
    def runs_jobs_in_process(self) -> bool:
        if not self.start_job_runner or self.job_runner == "none":
            return False
        return self.job_runner == "inprocess" or not self.is_postgres

    @property
    def job_pause(self) -> tuple[float, float]:
        if self.environment != "test" or not self.test_job_pause:
            return (0.0, 0.0)
        before, _, after = self.test_job_pause.partition(",")
        return (float(before or 0), float(after or 0))

    @property
    def loopback_only(self) -> bool:
        """True when the service listens on this machine only (``localhost`` or a loopback
        address): the one place where the development defaults of the secrets are allowed."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def previous_state_keys(self) -> tuple[str, ...]:
        """``state_key_previous`` split: the keys that still open state sealed before a
        rotation, in the order they are tried after ``state_key``."""
        return tuple(k.strip() for k in self.state_key_previous.split(",") if k.strip())

    @property
    def development_secrets(self) -> bool:
        """True when the admin or the state key is still its development default (allowed only
        on a loopback host; ``service.main`` refuses requests that arrive elsewhere)."""
        return self.admin_key == DEFAULT_ADMIN_KEY or self.state_key == DEFAULT_STATE_KEY

    @property
    def metrics_open(self) -> bool:
        """``/metrics`` without a key: only with no token configured, outside production, on a
        loopback host (request counts by route and latencies are still a record of activity)."""
        return not self.metrics_token and self.environment != "production" and self.loopback_only

    @model_validator(mode="after")
    def _refuse_default_secrets(self) -> Settings:
        exposed = self.environment == "production" or not self.loopback_only
        where = (
            "in production"
            if self.environment == "production"
            else (f"when listening on {self.host} (the defaults are for 127.0.0.1 only)")
        )
        if exposed and self.admin_key == DEFAULT_ADMIN_KEY:
            raise ValueError(f"CURATOR_ADMIN_KEY must be set to a secret value {where}")
        if exposed and self.state_key == DEFAULT_STATE_KEY:
            raise ValueError(f"CURATOR_STATE_KEY must be set to a secret key {where}")
        if len(self.admin_key) < 8:
            raise ValueError("CURATOR_ADMIN_KEY must have at least 8 characters")
        for key in (self.state_key, *self.previous_state_keys):
            if not _is_aes256_key(key):
                raise ValueError(
                    "CURATOR_STATE_KEY and each of CURATOR_STATE_KEY_PREVIOUS must be base64 of "
                    "32 bytes"
                )
        if self.metrics_token and len(self.metrics_token) < METRICS_TOKEN_MIN_LENGTH:
            raise ValueError(
                f"CURATOR_METRICS_TOKEN must have at least {METRICS_TOKEN_MIN_LENGTH} characters"
            )
        return self


@lru_cache
def get_settings() -> Settings:
    return Settings()


def settings_or_exit() -> Settings:
    """``get_settings`` for a command's start: a refused configuration is one line on stderr
    and exit status 1, naming the setting and the rule, never a value."""
    try:
        return get_settings()
    except SettingsError as exc:  # a value that is not JSON where JSON is read (a list)
        field_name = str(exc).split('"')[1] if str(exc).count('"') >= 2 else ""
        where = f"CURATOR_{field_name.upper()}" if field_name.isidentifier() else "a setting"
        raise SystemExit(f"configuration refused: {where}: not valid JSON") from None
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            parts = [str(part) for part in error["loc"]]
            where = ".".join(parts)
            if parts and parts[0] == "database_url":
                where = "DATABASE_URL"
            elif parts and parts[0].isidentifier():
                # the variable the operator sets (and the item of a list: [1])
                where = f"CURATOR_{parts[0].upper()}" + "".join(f"[{p}]" for p in parts[1:])
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"{where}: {message}" if where else message)
        raise SystemExit("configuration refused: " + "; ".join(problems)) from None


# CURATOR_* variables that other programs read, not the service: the dpcurator client's
# (CURATOR_URL, CURATOR_KEY) and the test harness's (and every CURATOR_TEST_*).
OTHER_VARIABLES = frozenset(
    {
        "CURATOR_URL",
        "CURATOR_KEY",
        "CURATOR_REQUIRE_BROWSER",
        "CURATOR_REQUIRE_POSTGRES",
        "CURATOR_CHROMIUM",
        "CURATOR_CONSOLE_SCREENSHOTS",
    }
)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """``CURATOR_*`` variables that name no setting (sorted): a misspelt or invented one is
    otherwise ignored without a word (a walkthrough's CURATOR_DATA_DIR left the database in
    ./data). Names only, never values."""
    known = {f"CURATOR_{name.upper()}" for name in Settings.model_fields}
    known |= {"CURATOR_DATABASE_URL", *OTHER_VARIABLES}
    return sorted(
        k
        for k in environ
        if k.upper().startswith("CURATOR_")
        and k.upper() not in known
        and not k.upper().startswith("CURATOR_TEST_")
    )


def database_url_from_environment() -> str:
    """The database URL alone (``DatabaseSettings``), for commands that need nothing else
    (migrations): they do not ask for the secrets."""
    return DatabaseSettings().database_url
