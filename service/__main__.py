"""``python -m service``: migrate the configured database, then serve with uvicorn."""

from __future__ import annotations

import uvicorn

from service.config import get_settings
from service.db import migrate, preflight


def main() -> None:
    settings = get_settings()
    problem = preflight.unreachable(settings.database_url)
    if problem is not None:
        raise SystemExit(problem)
    if settings.run_migrations_on_start:
        # Once, before the workers start, so that worker processes never race on migrations.
        migrate.upgrade(settings.database_url)
    uvicorn.run(
        "service.main:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
