"""The committed OpenAPI document matches the app (regenerate: python -m service.openapi)."""

from __future__ import annotations

import json
from pathlib import Path

from service.openapi import document

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_openapi_document_has_not_drifted() -> None:
    committed = json.loads(COMMITTED.read_text())
    assert committed == document(), "openapi/openapi.json is stale: run python -m service.openapi"


def test_every_route_declares_problem_responses() -> None:
    doc = document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if path in ("/healthz", "/readyz", "/metrics"):
                continue
            statuses = {int(s) for s in op["responses"] if s.isdigit()}
            assert any(s >= 400 for s in statuses), f"{method.upper()} {path} declares no problems"


def test_validation_errors_are_documented_as_problems() -> None:
    """Every 422 is served as application/problem+json; the document must not promise FastAPI's
    default application/json HTTPValidationError (schemathesis's ST105, issue 13.9)."""
    doc = document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            response = op["responses"].get("422")
            if response is None:
                continue
            assert set(response["content"]) == {"application/problem+json"}, (method, path)
    assert "HTTPValidationError" not in doc["components"]["schemas"]
