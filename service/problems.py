"""RFC 9457 problem details: one exception class per problem type, one handler renders them.

``type`` is a stable URI listed in ``docs/problems.md``; ``title`` is fixed per type; ``detail``
describes this occurrence and may quote the request or the public schema, never the data.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from service.ledger.amounts import InvalidAmount
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled

logger = logging.getLogger("service")

TYPE_BASE = "https://dp-curator.dev/problems/"
MEDIA_TYPE = "application/problem+json"


class Problem(Exception):
    """Base class: subclasses fix ``slug``, ``title`` and ``status``."""

    slug: ClassVar[str] = "about:blank"
    title: ClassVar[str] = "Error"
    status: ClassVar[int] = 500

    def __init__(
        self, detail: str | None = None, *, status_code: int | None = None, **extensions: Any
    ) -> None:
        super().__init__(detail or self.title)
        self.detail = detail
        self.status_code = status_code or self.status
        self.extensions = extensions

    @classmethod
    def type_uri(cls) -> str:
        return TYPE_BASE + cls.slug

    def body(self, instance: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type_uri(),
            "title": self.title,
            "status": self.status_code,
        }
        if self.detail:
            out["detail"] = self.detail
        if instance:
            out["instance"] = instance
        out.update(self.extensions)
        return out


class Unauthenticated(Problem):
    slug, title, status = "unauthenticated", "Missing or invalid API key", 401


class Forbidden(Problem):
    slug, title, status = "forbidden", "Your role does not allow this", 403


class NotFound(Problem):
    slug, title, status = "not-found", "Resource not found", 404


class ValidationFailed(Problem):
    """422. Always carries ``errors`` (docs/problems.md): given, or one entry at ``pointer``
    (``#``, the whole request, unless named) with the detail."""

    slug, title, status = "validation-failed", "The request is invalid", 422

    def __init__(
        self,
        detail: str | None = None,
        *,
        pointer: str = "#",
        errors: list[dict[str, str]] | None = None,
        **extensions: Any,
    ) -> None:
        if errors is None:
            errors = [{"pointer": pointer, "detail": detail or self.title}]
        super().__init__(detail, errors=errors, **extensions)


class InvalidCsv(Problem):
    slug, title, status = "invalid-csv", "The uploaded CSV does not match the schema", 422


class InvalidSchema(Problem):
    slug, title, status = "invalid-schema", "The public schema is invalid", 422


class PayloadTooLarge(Problem):
    slug, title, status = "payload-too-large", "The request body exceeds its size limit", 413


class BudgetExhausted(Problem):
    slug, title, status = "budget-exhausted", "Not enough privacy budget left", 409


class BudgetNotSet(Problem):
    slug, title, status = "budget-not-set", "The dataset has no privacy budget yet", 409


class PrincipalCapExceeded(Problem):
    slug, title, status = "principal-cap-exceeded", "Your per-principal budget cap is reached", 409


class BudgetBelowSpent(Problem):
    slug, title, status = "budget-below-spent", "A budget cannot be set below what is spent", 409


class DatasetUnavailable(Problem):
    slug, title, status = "dataset-unavailable", "The dataset's rows were deleted", 409


class Conflict(Problem):
    slug, title, status = "conflict", "The request conflicts with the resource's state", 409


class IdempotencyKeyMissing(Problem):
    slug, title, status = "idempotency-key-missing", "An Idempotency-Key header is required", 400


class IdempotencyKeyReused(Problem):
    slug, title, status = (
        "idempotency-key-reused",
        "The Idempotency-Key was used with a different request",
        422,
    )


class IdempotencyKeyInFlight(Problem):
    slug, title, status = (
        "idempotency-key-in-flight",
        "A request with this Idempotency-Key is still being processed",
        409,
    )


class PaperModeNotEnabled(Problem):
    slug, title, status = "paper-mode-disabled", "Paper mode is not enabled for this dataset", 403


class UnknownKind(Problem):
    slug, title, status = "unknown-release-kind", "Unknown release kind", 422


class ReleaseFailedProblem(Problem):
    slug, title, status = "release-failed", "The release failed; its charge is kept", 500


class FunctionClosed(Problem):
    slug, title, status = "function-closed", "This function can no longer answer new points", 409


class FunctionCapacityReached(Problem):
    slug, title, status = (
        "function-capacity-reached",
        "The function's public capacity of distinct points is reached",
        409,
    )


class FunctionBatchRejected(Problem):
    slug, title, status = (
        "function-batch-rejected",
        "The batch could not be conditioned numerically; nothing was stored",
        422,
    )


class DevelopmentSecretsExposed(Problem):
    slug, title, status = "development-secrets-exposed", "Service misconfigured", 503


class FunctionBusy(Problem):
    slug, title, status = (
        "function-busy",
        "The function is drawing other callers' new points; retry shortly",
        503,
    )


class DatabaseUnavailable(Problem):
    slug, title, status = (
        "database-unavailable",
        "The database is not answering; retry shortly",
        503,
    )


class HttpError(Problem):
    slug, title, status = "http-error", "HTTP error", 400


class InternalError(Problem):
    slug, title, status = "internal-error", "Internal server error", 500


ALL_PROBLEMS: tuple[type[Problem], ...] = (
    Unauthenticated,
    Forbidden,
    NotFound,
    ValidationFailed,
    InvalidCsv,
    InvalidSchema,
    PayloadTooLarge,
    BudgetExhausted,
    BudgetNotSet,
    PrincipalCapExceeded,
    BudgetBelowSpent,
    DatasetUnavailable,
    Conflict,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    IdempotencyKeyInFlight,
    PaperModeNotEnabled,
    UnknownKind,
    ReleaseFailedProblem,
    FunctionClosed,
    FunctionCapacityReached,
    FunctionBatchRejected,
    FunctionBusy,
    DevelopmentSecretsExposed,
    DatabaseUnavailable,
    HttpError,
    InternalError,
)

# Seconds a client is asked to wait before retrying a request the database could not answer.
DATABASE_RETRY_AFTER_SECONDS = 5


def problem_response(
    problem: Problem, instance: str | None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The problem as an ``application/problem+json`` response: no-store, a 401 with its
    ``WWW-Authenticate: Bearer`` challenge (RFC 9110 §15.5.2), and ``headers`` (e.g. a 405's
    ``Allow``)."""
    extra = {"WWW-Authenticate": "Bearer"} if problem.status_code == 401 else {}
    return JSONResponse(
        problem.body(instance),
        status_code=problem.status_code,
        media_type=MEDIA_TYPE,
        headers={"Cache-Control": "no-store", **extra, **(headers or {})},
    )


def _pointer(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    if not parts:
        return "#"  # the whole body ('#/' would be a member named '')
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def validation_error(
    error: Any, *, json_body: bool = True, field: str | None = None
) -> dict[str, str]:
    """One of pydantic's validation errors as ``{"pointer", "detail"}``, in words a caller can
    act on: a JSON syntax error names the character and the reason (its location is an offset,
    not a pointer), pydantic's "Value error, " prefix is dropped, and an object expected where
    the body was not sent as JSON says how to send it. ``field``: the form field whose JSON was
    validated (its errors point inside it); None: the request body."""
    loc = tuple(error.get("loc", ()))
    message = str(error.get("msg", ""))
    kind = error.get("type", "")
    if kind == "json_invalid":
        reason = str((error.get("ctx") or {}).get("error", "")) or "JSON decode error"
        at = next((p for p in loc if isinstance(p, int)), None)
        where = f" at character {at}" if at is not None else ""
        what = f"the {field}" if field else "the body"
        pointer = _pointer((field,)) if field else "#"
        return {"pointer": pointer, "detail": f"{what} is not valid JSON{where}: {reason}"}
    message = message.removeprefix("Value error, ")
    if kind in ("model_attributes_type", "dict_type") and loc == ("body",) and not json_body:
        message = "send a JSON object with 'Content-Type: application/json'"
    if kind == "string_type" and loc == ("body", "schema"):
        # curl's -F schema=@file sends a file part; the upload's schema is a text field
        message = "the schema is a text field: send it with -F 'schema=<schema.json' ('<', not '@')"
    if loc == ("body", "file") and "UploadFile" in message:
        # curl's -F file=<rows.csv sends the file's text as a field; the rows are a file part
        message = "the rows are a file part: send them with -F 'file=@rows.csv' ('@', not '<')"
    if kind.startswith("int_") and len(loc) >= 2 and loc[-2] == "codes":
        # a categorical covariate declared with its labels ("male", "female")
        message += (
            ": a categorical covariate's codes are integers; recode its values as 0, 1, ... "
            "in the CSV and list those"
        )
    return {"pointer": _pointer((field, *loc) if field else loc), "detail": message}


def validation_summary(errors: list[dict[str, str]]) -> str | None:
    """The problem's detail: the first error with where it is, and how many more."""
    if not errors:
        return None
    first = errors[0]
    where = "" if first["pointer"] == "#" else f"{first['pointer']}: "
    more = len(errors) - 1
    return f"{where}{first['detail']}" + (f" (and {more} more)" if more else "")


def responses(*problems: type[Problem]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entry declaring the problems a route may return."""
    out: dict[int | str, dict[str, Any]] = {}
    for p in problems:
        entry = out.setdefault(p.status, {"description": "", "content": {MEDIA_TYPE: {}}})
        entry["description"] = (entry["description"] + "; " if entry["description"] else "") + (
            f"{p.title} ({p.type_uri()})"
        )
        entry["content"][MEDIA_TYPE] = {"schema": {"$ref": "#/components/schemas/Problem"}}
    return out


def install_handlers(app: FastAPI) -> None:
    """Register the problem+json handlers on ``app``."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        response = problem_response(exc, request.url.path)
        if isinstance(exc, DatabaseUnavailable | FunctionBusy):
            response.headers["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        return response

    @app.exception_handler(InvalidParameters)
    async def _invalid(request: Request, exc: InvalidParameters) -> JSONResponse:
        # a mechanism refuses the request's params (quotes and releases) or its points
        # (predict); its message names the field
        path = request.url.path
        pointer = "#/points" if path.endswith(("/predict", "/evaluate")) else "#/params"
        return problem_response(ValidationFailed(str(exc), pointer=pointer), path)

    @app.exception_handler(InvalidAmount)
    async def _amount(request: Request, exc: InvalidAmount) -> JSONResponse:
        # Request models refuse amounts the ledger cannot hold; this is the backstop for any
        # other path (the message names the amount, never data).
        return problem_response(ValidationFailed(str(exc)), request.url.path)

    @app.exception_handler(PaperModeDisabled)
    async def _paper(request: Request, exc: PaperModeDisabled) -> JSONResponse:
        return problem_response(PaperModeNotEnabled(str(exc)), request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        json_body = "json" in request.headers.get("content-type", "").lower()
        errors = [validation_error(e, json_body=json_body) for e in exc.errors()]
        return problem_response(
            ValidationFailed(validation_summary(errors), errors=errors), request.url.path
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            path = request.url.path
            if len(path) > 1 and path.endswith("/") and _is_route(request, path.rstrip("/")):
                # no redirect (create_app: redirect_slashes=False): behind a TLS proxy it would
                # name an http:// URL, and a client following it could resend its key in clear
                hint = f"no such path: the API's paths have no trailing slash ({path.rstrip('/')})"
                return problem_response(NotFound(hint), path)
            return problem_response(NotFound(), path)
        allowed = [v for k, v in (exc.headers or {}).items() if k.lower() == "allow"]
        allow = {"Allow": allowed[0]} if allowed else None
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            # a JSON body the parser gave up on (a 5000-digit integer, nesting past Python's
            # recursion limit, bytes that are not UTF-8): the 422 docs/problems.md promises
            failed = ValidationFailed(
                "the body is not valid JSON: it could not be parsed",
                errors=[{"pointer": "#", "detail": "the body could not be parsed as JSON"}],
            )
            return problem_response(failed, request.url.path)
        return problem_response(
            HttpError(str(exc.detail), status_code=exc.status_code), request.url.path, allow
        )

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        return unhandled_response(exc, request.url.path)


def _is_route(request: Request, path: str) -> bool:
    """Whether ``path`` matches one of the application's routes (any method)."""
    from starlette.routing import Match

    scope = {**request.scope, "path": path}
    return any(route.matches(scope)[0] != Match.NONE for route in request.app.router.routes)


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` is the database not answering (a lost or refused connection, a server
    shutting down, a lock or statement timeout): transient, so a client should retry."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def unhandled_response(exc: BaseException, instance: str | None) -> JSONResponse:
    """The response to an exception no handler answered: ``database-unavailable`` (503,
    ``Retry-After``) where the database did not answer, else ``internal-error`` (500) with a
    request id. The exception's text may contain data (SQL parameters, values): the operator
    log gets its type and the request id only, and no traceback."""
    request_id = uuid.uuid4().hex
    if database_unavailable(exc):
        logger.warning("database unavailable: %s (request %s)", type(exc).__name__, request_id)
        response = problem_response(DatabaseUnavailable(request_id=request_id), instance)
        response.headers["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        return response
    logger.error("unhandled error %s (request %s)", type(exc).__name__, request_id)
    return problem_response(InternalError(request_id=request_id), instance)


class UnhandledErrorMiddleware:
    """Answers an exception that passed every handler itself (``unhandled_response``), inside
    the other middlewares (so its response gets their headers).

    Starlette's own catch-all answers too, but then re-raises, and uvicorn logs the traceback
    (about 180 lines per failed request during a database outage, with the failing statement's
    parameters). Pure ASGI."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # the response is under way: nothing else can be sent
                raise
            await unhandled_response(exc, scope.get("path"))(scope, receive, send)
