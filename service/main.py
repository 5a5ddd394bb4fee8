"""The application: routers, problem handlers, middleware, lifespan (migrations, jobs)."""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import inspect, text
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import __version__
from service.auth.router import router as principals_router
from service.auth.service import (
    INVALID_KEY,
    NO_BEARER_KEY,
    Role,
    bearer_key,
    is_admin_key,
    key_role,
)
from service.config import Settings, get_settings, unknown_variables
from service.console.router import install as install_console
from service.datasets.router import router as datasets_router
from service.datasets.service import RELEASE_ROLES
from service.db import migrate
from service.db.engine import get_engine, get_sessionmaker
from service.db.models import StateKeyCheck
from service.functions import keys
from service.functions.router import router as functions_router
from service.jobs import liveness
from service.jobs.workers import jobs_in_process
from service.mechanisms.cate_function import MAX_BATCH
from service.metrics import Metrics, MetricsMiddleware
from service.problems import (
    MEDIA_TYPE,
    DevelopmentSecretsExposed,
    Forbidden,
    PayloadTooLarge,
    Problem,
    Unauthenticated,
    UnhandledErrorMiddleware,
    ValidationFailed,
    install_handlers,
    problem_response,
)
from service.releases.predict import MAX_POINTS
from service.releases.predict import router as predict_router
from service.releases.router import router as releases_router

logger = logging.getLogger("service")

DESCRIPTION = """
Sensitive datasets stay on the server; analysts get only differentially private causal
estimates. Every release is charged to the dataset's privacy budget, atomically and before any
data is touched, and recorded in an append-only, hash-chained ledger. Errors are RFC 9457
`application/problem+json`.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    metrics = Metrics(
        version=__version__,
        workers_alive=(lambda: liveness.workers_alive(settings)) if settings.is_postgres else None,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        unknown = unknown_variables(os.environ)
        if unknown:
            logger.warning(
                "ignoring environment variables that name no setting: %s (the settings are "
                "listed in service/config.py; the database is DATABASE_URL)",
                ", ".join(unknown),
            )
        if settings.run_migrations_on_start and settings.workers == 1:
            migrate.upgrade(settings.database_url)
        # uvicorn started directly: the check python -m service makes before it serves
        with get_sessionmaker()() as session:
            if inspect(session.get_bind()).has_table(StateKeyCheck.__tablename__):
                keys.ensure(session)
        runner = jobs_in_process(settings) if settings.runs_jobs_in_process else None
        if runner is not None:
            runner.start()
        app.state.runner = runner
        try:
            yield
        finally:
            if runner is not None:
                runner.stop()

    app = FastAPI(
        title="DP causal curator",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        # /docs is served by service.console from vendored assets (FastAPI's loads them from a
        # CDN: blank offline); ReDoc, CDN-only too, is not served.
        docs_url=None,
        redoc_url=None,
        # "/v1/datasets/" is a 404 naming the path without the slash, not a 307: a redirect
        # built behind a TLS proxy names http://, where a client following it resends its key
        redirect_slashes=False,
    )
    install_handlers(app)

    # Pure ASGI middlewares (the outermost is added last): a few microseconds per request,
    # where ``@app.middleware("http")`` costs a task and a stream per request.
    app.add_middleware(UnhandledErrorMiddleware)  # innermost: its answers get the others' headers
    app.add_middleware(LimitsMiddleware, max_upload_bytes=settings.max_upload_bytes)
    if settings.development_secrets:
        app.add_middleware(LoopbackOnlyMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    # Routes are matched in order: the decision-support hot path (function evaluation) first.
    app.include_router(functions_router)
    app.include_router(principals_router)
    app.include_router(datasets_router)
    app.include_router(releases_router)
    app.include_router(predict_router)
    install_console(app)  # /console, /docs, /static and the security headers (outermost)

    @app.get("/healthz", tags=["operations"])
    def healthz() -> dict[str, str]:
        """The process runs; ``version`` is the service's (the API version)."""
        return {"status": "ok", "version": __version__}

    @app.get("/readyz", tags=["operations"])
    def readyz() -> Any:
        """200 when the database answers and its schema is at this version's migration; else
        503 with the ``reason`` (``database unreachable`` or ``schema not at the current
        migration``: run ``alembic upgrade head``)."""
        try:
            engine = get_engine()
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception:
            reason = "database unreachable"
        else:
            try:
                at_head = migrate.at_head(engine, settings.database_url)
            except Exception:
                at_head = False
            reason = "" if at_head else "schema not at the current migration"
        if reason:
            return JSONResponse(
                {"status": "not ready", "reason": reason, "version": __version__},
                status_code=503,
            )
        return {"status": "ready", "version": __version__}

    @app.get("/metrics", tags=["operations"], response_class=Response)
    def metrics_endpoint(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        """Prometheus metrics. Send ``Authorization: Bearer <CURATOR_METRICS_TOKEN or the admin
        key>``; open without one only in development on a loopback host, to a local request."""
        if not (settings.metrics_open and is_local_request(request.scope)):
            key = bearer_key(authorization)
            token = settings.metrics_token
            if not (
                is_admin_key(key) or (token and hmac.compare_digest(key.encode(), token.encode()))
            ):
                raise Unauthenticated("/metrics needs the metrics token or the admin key")
        return metrics.render()

    _add_problem_schema(app)
    return app


class _BodyTooLarge(Exception):
    """Raised into the application when the body read so far exceeds the upload limit."""


# Every request body but a dataset upload (``POST /v1/datasets``) is JSON that FastAPI reads and
# parses (the middleware below refuses one without a valid key first); this caps what a caller can
# make it parse. The largest legitimate one, a cate_vector request of 5,000 points over 500
# covariates, is about 50 MB.
JSON_BODY_LIMIT = 64 * 1024 * 1024


UPLOAD_PATHS = frozenset({"/v1/datasets", "/v1/datasets/check"})


# The decision-support hot path (POST /v1/functions/{id}/evaluate, /v1/releases/{id}/predict)
# takes a batch of points; its largest legitimate body, 1000 points over 500 covariates or
# 10,000 over 50, is about 8 MB. Parsing JSON holds the event loop (and the GIL): a client's
# 47 MB body of a million points stalled every other caller for 5 s. The Python client sends
# at most 500,000 coordinates a request.
POINTS_BODY_LIMIT = 16 * 1024 * 1024
_POINTS_PATH = re.compile(r"/v1/(functions/[^/]+/evaluate|releases/[^/]+/predict)/?")
# the most points a batch of each route takes (its request model's limit)
_MAX_POINTS = {"functions": MAX_BATCH, "releases": MAX_POINTS}


def body_limit(method: str, path: str, max_upload_bytes: int) -> int:
    """The byte limit of a request's body: the upload limit for a dataset upload,
    ``POINTS_BODY_LIMIT`` for a batch of points to evaluate, else the smaller of the upload
    limit and ``JSON_BODY_LIMIT``."""
    if method == "POST" and path.rstrip("/") in UPLOAD_PATHS:
        return max_upload_bytes
    if _POINTS_PATH.fullmatch(path):
        return min(max_upload_bytes, POINTS_BODY_LIMIT)
    return min(max_upload_bytes, JSON_BODY_LIMIT)


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


# Bodies only an analyst or an owner may send (quotes and releases): the role is checked before
# the body is read. A client's 40 MB cate_vector quote was parsed for 11 s, every other caller
# waiting, only to be told 403.
_RELEASE_REQUEST_PATH = re.compile(r"/v1/datasets/[^/]+/(quotes|releases)/?")


async def _refused_body(scope: Scope, headers: Headers) -> Problem | None:
    """A request to the API (every ``/v1`` route takes a bearer key) that carries a body but no
    valid key, or a quote or release request from a role that may not make one: refused (401,
    403) before its body is read or parsed (one indexed read; the route checks again). A
    security auditor's six 50 MB JSON bodies took 7-20 s each and 500 MB of memory to be told
    401, first without a key, then with 'Bearer junk'. The problem has the routes' own words
    (None: let the route answer)."""
    if scope.get("method") not in BODY_METHODS or not scope["path"].startswith("/v1/"):
        return None
    authorization = headers.get("authorization", "")
    if not authorization.lower().startswith("bearer "):
        return Unauthenticated(NO_BEARER_KEY)
    key = authorization[7:].strip()
    if not key:
        return Unauthenticated(INVALID_KEY)
    try:
        role = await run_in_threadpool(key_role, key)
    except Exception:  # noqa: BLE001 - e.g. the database is down: the route answers (503)
        return None
    if role is None:
        return Unauthenticated(INVALID_KEY)
    if _RELEASE_REQUEST_PATH.fullmatch(scope["path"]) and role not in (Role.ANALYST, Role.OWNER):
        return Forbidden(RELEASE_ROLES)
    return None


def points_prescan(body: bytes, max_points: int) -> ValidationFailed | None:
    """A batch body with more points than its route takes, counted without parsing: every point
    is one ``[`` outside strings (plus the ``points`` list's own and a ``columns`` list's).
    JSON parsing holds the event loop and the GIL: a client's 16 MiB body of 4.2 million
    one-number points took 12 s to parse, every other caller waiting, only to be told it had
    too many. A regular expression removes the strings and ``bytes.count`` counts, about a
    hundred times faster than parsing."""
    lists = _JSON_STRINGS.sub(b'""', body).count(b"[")
    if lists <= max_points + 2:
        return None
    detail = f"List should have at most {max_points} items, not about {lists - 1}"
    return ValidationFailed(detail, pointer="#/points")


_JSON_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')


class LimitsMiddleware:
    """Refuse bodies larger than the limit (413) and mark every response no-store.

    The limit is ``body_limit``'s. A declared Content-Length above it is refused before anything
    is read. A body sent without one (chunked) is counted as it is read: past the limit the read
    fails, and whatever the application would answer to that failure is replaced by the same 413
    problem.
    """

    def __init__(self, app: ASGIApp, max_upload_bytes: int) -> None:
        self.app = app
        self.max_upload_bytes = max_upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope.get("method", ""), scope["path"], self.max_upload_bytes)

        async def refuse() -> None:
            problem = PayloadTooLarge(f"the limit is {limit} bytes")
            await problem_response(problem, scope["path"])(scope, receive, send)

        headers = Headers(scope=scope)
        refused_body = await _refused_body(scope, headers)
        if refused_body is not None:
            await problem_response(refused_body, scope["path"])(scope, receive, send)
            return
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await refuse()
            return
        batch = _POINTS_PATH.fullmatch(scope["path"]) if scope.get("method") == "POST" else None
        if batch is not None:
            # a batch of points (at most POINTS_BODY_LIMIT) is read here and counted before
            # anything parses it, then handed on as it came
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                if size > limit:
                    await refuse()
                    return
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
            too_many = points_prescan(body, _MAX_POINTS[batch.group(1).split("/")[0]])
            if too_many is not None:
                await problem_response(too_many, scope["path"])(scope, receive, send)
                return
            receive = _replay(body, receive)

        received = 0
        exceeded = False  # set before the application answered: its answer is replaced
        answered = False  # the application's response has started
        refused = False  # the 413 was sent instead

        async def receive_limited() -> Message:
            nonlocal received, exceeded
            if exceeded:
                raise _BodyTooLarge
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit and not answered:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def send_no_store(message: Message) -> None:
            nonlocal answered, refused
            if exceeded:
                if message["type"] == "http.response.start" and not refused:
                    refused = True
                    await refuse()
                return  # the application's own answer to the failed read is dropped
            if message["type"] == "http.response.start":
                answered = True
                MutableHeaders(scope=message)["Cache-Control"] = "no-store"
            await send(message)

        try:
            await self.app(scope, receive_limited, send_no_store)
        except _BodyTooLarge:
            # Raised only before the application answered (see receive_limited).
            if not refused:
                refused = True
                await refuse()


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands on a body already read, then the connection's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def is_loopback_address(server: Any) -> bool:
    """Whether an ASGI ``server`` (the local address a connection arrived on) is this machine
    only: a loopback IP (IPv4-mapped too), ``localhost``, a Unix socket (None) or a name that is
    not an address (in-process test transports); a server on a socket reports its IP."""
    if not server or not server[0]:
        return True
    host = str(server[0])
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return True
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


FORWARDING_HEADERS = (b"forwarded", b"x-forwarded-for", b"x-real-ip")


def is_local_request(scope: Scope) -> bool:
    """A request that arrived on a loopback address and carries no proxy forwarding header (a
    reverse proxy on this machine connects over loopback on behalf of remote clients)."""
    if not is_loopback_address(scope.get("server")):
        return False
    return not any(name in FORWARDING_HEADERS for name, _ in scope.get("headers", ()))


class LoopbackOnlyMiddleware:
    """Installed only while a development default secret is in use (``Settings.
    development_secrets``): refuse every request that is not local (``is_local_request``: it
    arrived on a non-loopback address, or through a proxy) with ``development-secrets-exposed``
    (503). ``CURATOR_HOST`` is checked when the settings load, but ``uvicorn --factory
    service.main:create_app --host 0.0.0.0`` binds wherever it is told without it, and a proxy
    forwards from anywhere."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not is_local_request(scope):
            if not self.warned:
                self.warned = True
                logger.error(
                    "refusing requests from off this machine: the development default "
                    "CURATOR_ADMIN_KEY or CURATOR_STATE_KEY is in use; set both to secrets"
                )
            problem = DevelopmentSecretsExposed(
                "this service runs with a development default secret (CURATOR_ADMIN_KEY or "
                "CURATOR_STATE_KEY), allowed on a loopback address only; its operator must set both"
            )
            await problem_response(problem, scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _validation_errors_are_problems(schema: dict[str, Any]) -> None:
    """Every 422 is served as problem+json (``install_handlers``): say so in the document,
    instead of FastAPI's default ``application/json`` HTTPValidationError (found by
    schemathesis, issue 13.9)."""
    problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            response = operation.get("responses", {}).get("422")
            if response is None:
                continue
            content = response.setdefault("content", {})
            if content.pop("application/json", None) is not None:
                content[MEDIA_TYPE] = problem
                if response.get("description") == "Validation Error":
                    response["description"] = "The request is invalid (validation-failed)"
    text = json.dumps(schema.get("paths", {}))
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        if f"#/components/schemas/{name}" not in text:
            components.pop(name, None)


def _declare_http_conventions(schema: dict[str, Any]) -> None:
    """What every client generator needs and the routes' signatures do not say (an HTTP-only
    consumer's walkthrough): bearer authentication as a security scheme (not an optional
    ``authorization`` header parameter), the required ``Idempotency-Key``, the ``Location`` of a
    requested release, and the 500 / 503 problems any route may answer."""
    components = schema.setdefault("components", {})
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key: 'Authorization: Bearer <key>' (the admin key, or a "
            "principal's key from POST /v1/principals).",
        }
    }
    problem = {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            parameters = operation.get("parameters", [])
            kept = [p for p in parameters if p.get("name") != "authorization"]
            if len(kept) != len(parameters):
                operation["security"] = [{"bearer": []}]
                if kept:
                    operation["parameters"] = kept
                else:
                    operation.pop("parameters")
            for parameter in kept:
                if parameter.get("name") == "idempotency-key":
                    parameter["required"] = True
            responses = operation.setdefault("responses", {})
            if path == "/v1/datasets/{dataset_id}/releases" and method == "post":
                for status in ("200", "202"):
                    responses[status].setdefault("headers", {})["Location"] = {
                        "description": "The release: /v1/releases/{id}",
                        "schema": {"type": "string"},
                    }
            if "requestBody" in operation:
                responses.setdefault(
                    "413",
                    {
                        "description": "payload-too-large: the body exceeds its limit",
                        "content": problem,
                    },
                )
            responses.setdefault(
                "500",
                {"description": "internal-error: names a request id", "content": problem},
            )
            responses.setdefault(
                "503",
                {
                    "description": "database-unavailable: retry after Retry-After seconds",
                    "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                    "content": problem,
                },
            )


def _add_problem_schema(app: FastAPI) -> None:
    """Declare the RFC 9457 Problem schema in the OpenAPI document."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = {
            "type": "object",
            "description": "RFC 9457 problem details",
            "properties": {
                "type": {"type": "string", "format": "uri"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "detail": {"type": "string"},
                "instance": {"type": "string"},
                "errors": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "pointer": {"type": "string"},
                            "detail": {"type": "string"},
                        },
                    },
                },
                "request_id": {
                    "type": "string",
                    "description": "internal-error and database-unavailable: the id the "
                    "operator's log names",
                },
                "epsilon_requested": {
                    "type": "number",
                    "description": "budget-exhausted and principal-cap-exceeded: the refused "
                    "release's epsilon",
                },
                "delta_requested": {
                    "type": "number",
                    "description": "budget-exhausted and principal-cap-exceeded: its delta",
                },
            },
            "required": ["type", "title", "status"],
        }
        _validation_errors_are_problems(schema)
        _declare_http_conventions(schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
