"""``python -m service``: migrate the configured database, then serve with uvicorn."""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

import uvicorn
import uvicorn.config

from service import __version__
from service.config import settings_or_exit
from service.db import migrate, preflight
from service.functions.keys import state_key_problem


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m service",
        description="Migrate the configured database (CURATOR_RUN_MIGRATIONS_ON_START), then "
        "serve the API with uvicorn (CURATOR_HOST, CURATOR_PORT, CURATOR_WORKERS). Every "
        "setting is an environment variable: README.md, 'Configuration'.",
    )
    parser.add_argument("--version", action="version", version=f"dp-curator {__version__}")
    parser.parse_args(argv)
    settings = settings_or_exit()
    problem = preflight.unreachable(settings.database_url)
    if problem is not None:
        raise SystemExit(problem)
    if settings.run_migrations_on_start:
        # Once, before the workers start, so that worker processes never race on migrations.
        problem = preflight.newer_schema(settings.database_url)
        if problem is not None:
            raise SystemExit(problem)
        migrate.upgrade(settings.database_url)
    else:
        # migrations are their own step: an unmigrated database is refused, not served with
        # 500s (an ops walkthrough's API started and failed every request)
        problem = preflight.wait_for_schema(settings.database_url, 0.0)
        if problem is not None:
            raise SystemExit(problem)
    problem = state_key_problem(settings.database_url)
    if problem is not None:
        raise SystemExit(problem)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    base = f"http://{host}:{settings.port}"
    sys.stderr.write(
        f"dp-curator {__version__}: serving {preflight.safe_url(settings.database_url)} on "
        f"{base} (console {base}/console, API docs {base}/docs, health {base}/readyz)\n"
    )
    uvicorn.run(
        "service.main:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=None,  # the levels are log_config's
        log_config=log_config(access=settings.access_log),
        access_log=settings.access_log,
        server_header=False,  # no "server: uvicorn" (a security review's note)
    )


def log_config(*, access: bool = True) -> dict[str, Any]:
    """uvicorn's logging configuration with a timestamp on every line: uvicorn's own lines from
    WARNING, its access log (one line per request) at INFO when ``access``, and the service's
    loggers (``service.*``: failures by exception type and request id, job outcomes) at INFO
    on the same handler."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    for formatter in config["formatters"].values():
        formatter["fmt"] = "%(asctime)s " + formatter["fmt"]
    config["loggers"]["uvicorn.error"]["level"] = "WARNING"
    config["loggers"]["uvicorn.access"]["level"] = "INFO" if access else "WARNING"
    config["loggers"]["service"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


if __name__ == "__main__":
    main()
