"""Client-side exceptions: one class per problem type (docs/problems.md), raised from problem+json.

Branch on the class (or on ``.slug``), never on ``.detail`` wording::

    try:
        client.request_release(dataset_id, "ate", {"epsilon": 5.0})
    except BudgetExhausted as exc:
        print(exc.status, exc.detail)
"""

from __future__ import annotations

from typing import Any, ClassVar

TYPE_BASE = "https://dp-curator.dev/problems/"


class CuratorError(Exception):
    """Base of every error this client raises."""


class TransportError(CuratorError):
    """The server could not be reached (after the retries), or its answer was not HTTP."""


class WaitTimeout(CuratorError):
    """A release did not finish within the time the caller was willing to wait."""

    def __init__(self, release_id: str, timeout: float) -> None:
        super().__init__(f"release {release_id} did not finish within {timeout:g} s")
        self.release_id = release_id
        self.timeout = timeout


class ProblemError(CuratorError):
    """An RFC 9457 problem returned by the server (or a non-problem HTTP error).

    Attributes:
        type: the problem type URI (``https://dp-curator.dev/problems/<slug>``).
        slug: the last path segment of ``type``.
        title: fixed per type.
        status: the HTTP status.
        detail: about this occurrence (may be None).
        errors: validation errors, ``[{"pointer": "#/params/epsilon", "detail": "..."}]``.
        instance: the request path, when the server sent it.
        extensions: every other member of the problem document (e.g. ``request_id``).
        partial: where a call sent several requests and a later one was refused, what the
            earlier ones returned (``CuratorClient.evaluate_function``); else None.
    """

    slug: ClassVar[str] = ""
    partial: Any = None

    def __init__(
        self,
        *,
        type: str,
        title: str,
        status: int,
        detail: str | None = None,
        errors: list[dict[str, Any]] | None = None,
        instance: str | None = None,
        extensions: dict[str, Any] | None = None,
    ) -> None:
        self.type = type
        self.title = title
        self.status = status
        self.detail = detail
        self.errors = list(errors or [])
        self.instance = instance
        self.extensions = dict(extensions or {})
        super().__init__(self.one_line())

    @property
    def problem_slug(self) -> str:
        """The slug of this occurrence's ``type`` (also for types this client does not know)."""
        return self.type.removeprefix(TYPE_BASE)

    def one_line(self) -> str:
        """``slug (status): title: detail [pointer: detail; ...]`` on one line."""
        text = f"{self.problem_slug} ({self.status}): {self.title}"
        if self.detail and self.detail != self.title:
            text += f": {self.detail}"
        # the server's detail names the first error ("#/params/epsilon: ..."): list the rest,
        # and for an error whose words the detail already has, only where it is
        said = self.detail or ""
        rest = []
        for error in self.errors:
            pointer = str(error.get("pointer", ""))
            detail = str(error.get("detail", ""))
            if detail and detail in said:
                if pointer not in ("", "#", "#/params") and pointer not in said:
                    rest.append(f"at {pointer}")
                continue
            if _error_text(error) not in said:
                rest.append(_error_text(error))
        if rest:
            text += " [" + "; ".join(rest) + "]"
        if "request_id" in self.extensions:
            text += f" (request id {self.extensions['request_id']})"
        return " ".join(text.split())


def _error_text(error: dict[str, Any]) -> str:
    pointer = str(error.get("pointer", ""))
    detail = str(error.get("detail", ""))
    return f"{pointer}: {detail}" if pointer not in ("", "#") else detail


class Unauthenticated(ProblemError):
    slug = "unauthenticated"


class Forbidden(ProblemError):
    slug = "forbidden"


class NotFound(ProblemError):
    slug = "not-found"


class ValidationFailed(ProblemError):
    slug = "validation-failed"


class InvalidSchema(ProblemError):
    slug = "invalid-schema"


class InvalidCsv(ProblemError):
    slug = "invalid-csv"


class PayloadTooLarge(ProblemError):
    slug = "payload-too-large"


class BudgetNotSet(ProblemError):
    slug = "budget-not-set"


class BudgetExhausted(ProblemError):
    slug = "budget-exhausted"


class PrincipalCapExceeded(ProblemError):
    slug = "principal-cap-exceeded"


class BudgetBelowSpent(ProblemError):
    slug = "budget-below-spent"


class DatasetUnavailable(ProblemError):
    slug = "dataset-unavailable"


class Conflict(ProblemError):
    slug = "conflict"


class IdempotencyKeyMissing(ProblemError):
    slug = "idempotency-key-missing"


class IdempotencyKeyReused(ProblemError):
    slug = "idempotency-key-reused"


class IdempotencyKeyInFlight(ProblemError):
    slug = "idempotency-key-in-flight"


class PaperModeDisabled(ProblemError):
    slug = "paper-mode-disabled"


class UnknownReleaseKind(ProblemError):
    slug = "unknown-release-kind"


class ReleaseFailed(ProblemError):
    """The release's job failed after its charge; the charge is kept (raised by ``wait``)."""

    slug = "release-failed"

    def __init__(self, *, release_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release_id = release_id


class FunctionClosed(ProblemError):
    slug = "function-closed"


class FunctionCapacityReached(ProblemError):
    slug = "function-capacity-reached"


class FunctionBatchRejected(ProblemError):
    slug = "function-batch-rejected"


class FunctionBusy(ProblemError):
    slug = "function-busy"


class DevelopmentSecretsExposed(ProblemError):
    slug = "development-secrets-exposed"


class DatabaseUnavailable(ProblemError):
    """503: the server's database did not answer (the client retries it, like any 503)."""

    slug = "database-unavailable"


class HttpError(ProblemError):
    slug = "http-error"


class InternalError(ProblemError):
    slug = "internal-error"


PROBLEM_CLASSES: dict[str, type[ProblemError]] = {
    cls.slug: cls
    for cls in (
        Unauthenticated,
        Forbidden,
        NotFound,
        ValidationFailed,
        InvalidSchema,
        InvalidCsv,
        PayloadTooLarge,
        BudgetNotSet,
        BudgetExhausted,
        PrincipalCapExceeded,
        BudgetBelowSpent,
        DatasetUnavailable,
        Conflict,
        IdempotencyKeyMissing,
        IdempotencyKeyReused,
        IdempotencyKeyInFlight,
        PaperModeDisabled,
        UnknownReleaseKind,
        ReleaseFailed,
        FunctionClosed,
        FunctionCapacityReached,
        FunctionBatchRejected,
        FunctionBusy,
        DevelopmentSecretsExposed,
        DatabaseUnavailable,
        HttpError,
        InternalError,
    )
}

_KNOWN = {"type", "title", "status", "detail", "errors", "instance"}


def problem_from_body(body: Any, *, status: int, reason: str = "") -> ProblemError:
    """Build the exception for a problem document (or any error body) with HTTP ``status``."""
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        title = reason or f"HTTP {status}"
        detail = body if isinstance(body, str) and body.strip() else None
        return ProblemError(
            type="about:blank", title=title, status=status, detail=(detail or "")[:300] or None
        )
    type_uri = str(body["type"])
    slug = type_uri.removeprefix(TYPE_BASE) if type_uri.startswith(TYPE_BASE) else ""
    cls = PROBLEM_CLASSES.get(slug, ProblemError)
    raw_errors = body.get("errors")
    errors = [e for e in raw_errors if isinstance(e, dict)] if isinstance(raw_errors, list) else []
    raw_status = body.get("status")
    detail = body.get("detail")
    instance = body.get("instance")
    return cls(
        type=type_uri,
        title=str(body.get("title") or reason or f"HTTP {status}"),
        status=raw_status if isinstance(raw_status, int) else status,
        detail=str(detail) if detail is not None else None,
        errors=errors,
        instance=str(instance) if instance is not None else None,
        extensions={k: v for k, v in body.items() if k not in _KNOWN},
    )
