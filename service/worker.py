"""``python -m service.worker``: run release jobs, on any machine that reaches the database.

    python -m service.worker [--concurrency N]

On PostgreSQL this is a procrastinate worker (queue ``releases``) running N jobs at once; start
as many processes, on as many machines, as there are cores to fit on. On SQLite it runs the
embedded runner (the same one ``bash scripts/serve`` runs inside the API process), which polls
the release table. Either way the job code is ``service.jobs.execute.execute_release_job``.

The worker does not migrate: it waits (up to ``--wait`` seconds) for the API to have brought the
schema to head. An unreachable database at start is one line on stderr and exit status 1; once
running, a PostgreSQL worker outlives database outages (``service.jobs.engine.supervise`` starts
it again as the database answers), and SIGTERM / SIGINT stop it after its running jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from types import FrameType

from service import __version__
from service.config import settings_or_exit
from service.db import preflight
from service.functions.keys import state_key_problem
from service.jobs.workers import embedded_runner, procrastinate_app

logger = logging.getLogger("service.worker")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m service.worker", description=__doc__)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="jobs run at once by this process (default: CURATOR_JOB_WORKERS)",
    )
    parser.add_argument("--version", action="version", version=f"dp-curator {__version__}")
    parser.add_argument(
        "--wait",
        type=float,
        default=60.0,
        help="seconds to wait for the database schema to be migrated",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("service").setLevel(logging.INFO)  # job outcomes; libraries stay at WARNING
    settings = settings_or_exit()
    problem = preflight.unreachable(settings.database_url)
    if problem is None and preflight.wait_for_schema(settings.database_url, 0.0) is not None:
        logger.warning(
            "the database schema is not at this version's migration yet: waiting up to %g s "
            "for it (an API process migrates it at start, or python -m service.db.migrate)",
            args.wait,
        )
    if problem is None:
        problem = preflight.wait_for_schema(settings.database_url, args.wait)
    if problem is None:
        problem = state_key_problem(settings.database_url)
    if problem is not None:
        raise SystemExit(problem)
    concurrency = args.concurrency or settings.job_workers
    if settings.is_postgres:
        from service.jobs.engine import supervise, worker_options

        options = worker_options(concurrency, settings.job_stale_seconds)
        app = procrastinate_app(settings)

        async def run() -> None:
            # SIGTERM/SIGINT: finish the running jobs, stop. Any other stop (a database outage
            # stops procrastinate's worker) starts it again (supervise).
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            await supervise(app, options, stop)

        logger.warning("worker: procrastinate, concurrency %d", concurrency)
        asyncio.run(run())
        return

    runner = embedded_runner(settings, concurrency)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        runner.stop(timeout=0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runner.start()
    logger.warning("worker: embedded (SQLite), concurrency %d", concurrency)
    runner.wait()
    runner.stop()


if __name__ == "__main__":
    main()
