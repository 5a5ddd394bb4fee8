"""The console and docs pages: served locally, with security headers and a CSP without inline
script; the vendored assets are the pinned ones; nothing is loaded from a CDN."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from fastapi.testclient import TestClient

from service.console.headers import API_CSP, CONSOLE_CSP, DOCS_CSP
from service.console.router import STATIC
from tests.conftest import Api


def _directives(csp: str) -> dict[str, list[str]]:
    out = {}
    for part in csp.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


def _check_page(client: TestClient, path: str, csp: str) -> str:
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == csp
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    html = r.text
    # No inline script: every <script> has a src on this server; no inline event handlers.
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert re.search(r'\bsrc="/static/', tag), tag
    assert [
        body for body in re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S) if body.strip()
    ] == []
    assert not re.search(r"\son[a-z]+=", html)
    assert not re.search(r'(src|href)="(https?:)?//', html), "nothing from another origin"
    return html


def test_console_page_headers(client: TestClient) -> None:
    html = _check_page(client, "/console", CONSOLE_CSP)
    csp = _directives(CONSOLE_CSP)
    assert csp["script-src"] == ["'self'"]
    assert csp["style-src"] == ["'self'"]
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["form-action"] == ["'none'"]
    assert 'src="/static/vendor/chart.js/chart.umd.min.js"' in html
    # The key field is never submitted with a form (no name) and never autocompleted.
    key_input = re.search(r'<input id="api-key"[^>]*>', html, re.S)
    assert key_input
    assert "name=" not in key_input.group(0)
    assert 'autocomplete="off"' in key_input.group(0)
    assert client.get("/console/", follow_redirects=False).headers["location"] == "/console"


def test_docs_page_is_local(client: TestClient) -> None:
    html = _check_page(client, "/docs", DOCS_CSP)
    csp = _directives(DOCS_CSP)
    assert csp["script-src"] == ["'self'"]  # Swagger UI's inline styles only, never scripts
    assert csp["frame-ancestors"] == ["'none'"]
    assert 'src="/static/vendor/swagger-ui/swagger-ui-bundle.js"' in html
    assert 'href="/static/vendor/swagger-ui/swagger-ui.css"' in html
    assert "cdn" not in html.lower()
    assert client.get("/redoc").status_code == 404  # CDN-only: not served
    for path in ("/docs", "/console", "/static/console.js"):
        assert path not in client.get("/openapi.json").json()["paths"]


def test_static_assets_are_the_pinned_ones(client: TestClient) -> None:
    sums = (STATIC / "vendor" / "SHA256SUMS").read_text().split("\n")
    checked = 0
    for line in filter(None, sums):
        digest, name = line.split()
        assert hashlib.sha256((STATIC / "vendor" / name).read_bytes()).hexdigest() == digest
        r = client.get(f"/static/vendor/{name}")
        assert r.status_code == 200
        assert hashlib.sha256(r.content).hexdigest() == digest
        checked += 1
    assert checked >= 5
    js = client.get("/static/console.js")
    assert js.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert js.headers["x-content-type-options"] == "nosniff"
    assert client.get("/static/../service/main.py").status_code == 404


def test_console_script_writes_no_html() -> None:
    """Every value reaches the page as text: the scripts never assign HTML."""
    for script in ("console.js", "docs.js"):
        source = Path(STATIC / script).read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in source, f"{script} uses {sink}"


def test_api_answers_carry_security_headers(api: Api, client: TestClient) -> None:
    owner = api.principal("owner")
    for r in (
        client.get("/v1/datasets", headers=api.auth(owner["api_key"])),
        client.get("/v1/datasets"),  # a problem answer too
        client.get("/openapi.json"),
    ):
        assert r.headers["content-security-policy"] == API_CSP
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["cache-control"] == "no-store"
