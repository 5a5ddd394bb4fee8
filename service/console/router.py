"""Routes of the console page, the offline API docs page and their static files.

Both pages are static HTML: the console fills itself in by calling the public API with the
signed-in key; the docs page loads the vendored Swagger UI, which reads ``/openapi.json``.
None of these routes is part of the API schema.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from service.console.headers import CONSOLE_CSP, DOCS_CSP, SecurityHeadersMiddleware

STATIC = Path(__file__).parent / "static"
STATIC_PREFIX = "/static"

router = APIRouter(include_in_schema=False)


def _page(name: str, csp: str) -> FileResponse:
    return FileResponse(
        STATIC / name,
        media_type="text/html; charset=utf-8",
        headers={"Content-Security-Policy": csp},
    )


@router.get("/console")
def console() -> FileResponse:
    """The owner console: sign in with an API key; owners audit and govern their datasets."""
    return _page("console.html", CONSOLE_CSP)


@router.get("/console/")
def console_slash() -> RedirectResponse:
    return RedirectResponse("/console", status_code=308)


@router.get("/docs")
def docs() -> FileResponse:
    """Swagger UI over ``/openapi.json``, from the vendored swagger-ui-dist (works offline)."""
    return _page("docs.html", DOCS_CSP)


def install(app: FastAPI) -> None:
    """Mount the console, the docs page, their static files and the security headers."""
    app.include_router(router)
    app.mount(STATIC_PREFIX, StaticFiles(directory=STATIC), name="static")
    app.add_middleware(SecurityHeadersMiddleware)
