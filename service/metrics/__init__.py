"""Prometheus metrics. Only request-level counters and latencies, the build and (PostgreSQL) the
job workers alive: nothing about job durations, data sizes or memory, which could be side
channels on private data (threats.md §3, §6)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Metrics:
    """``version``: the service's, as ``curator_build_info``. ``workers_alive``: called at each
    scrape for ``curator_job_workers_alive`` (None: no such gauge, or no value this scrape)."""

    def __init__(
        self, *, version: str = "", workers_alive: Callable[[], int | None] | None = None
    ) -> None:
        self.registry = CollectorRegistry()
        self.build = Gauge(
            "curator_build_info",
            "The running service's version (the value is always 1).",
            ["version"],
            registry=self.registry,
        )
        self.build.labels(version).set(1)
        self._workers_alive = workers_alive
        self.workers = (
            None
            if workers_alive is None
            else Gauge(
                "curator_job_workers_alive",
                "Job worker processes that beat within CURATOR_JOB_STALE_SECONDS (PostgreSQL); "
                "0 while releases are queued means none will run: alert on it.",
                registry=self.registry,
            )
        )
        self.requests = Counter(
            "curator_http_requests_total",
            "HTTP requests by route template, method and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "curator_http_request_seconds",
            "HTTP request handling time by route template (not job time).",
            ["method", "route"],
            registry=self.registry,
        )

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def render(self) -> Response:
        if self.workers is not None and self._workers_alive is not None:
            alive = self._workers_alive()
            if alive is not None:
                self.workers.set(alive)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    """Pure ASGI middleware: count and time every HTTP request by its route template."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            # The router stores the matched route in the scope; ids never become labels.
            template = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.observe(scope["method"], template, status, time.perf_counter() - start)
