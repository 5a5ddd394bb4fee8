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


def test_authentication_and_idempotency_are_declared_for_client_generators() -> None:
    """An HTTP-only consumer (R, openapi-generator) found bearer auth only in prose and the
    required Idempotency-Key marked optional; every authenticated operation now names the
    bearer scheme, and every operation the 500 and 503 problems it may answer."""
    doc = document()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, item in doc["paths"].items():
        for method, op in item.items():
            names = [p["name"] for p in op.get("parameters", [])]
            assert "authorization" not in names, (method, path)
            if path.startswith("/v1/"):
                assert op["security"] == [{"bearer": []}], (method, path)
            assert {"500", "503"} <= set(op["responses"]), (method, path)
    create = doc["paths"]["/v1/datasets/{dataset_id}/releases"]["post"]
    (key,) = [p for p in create["parameters"] if p["name"] == "idempotency-key"]
    assert key["required"] is True
    replay = create["responses"]["200"]
    assert replay["content"]["application/json"]["schema"]["$ref"].endswith("/ReleaseRead")
    assert "Location" in replay["headers"]
    assert {"Location", "Retry-After"} <= set(create["responses"]["202"]["headers"])
    # every operation with a body declares the 413 its size limit answers
    for path, method in (
        ("/v1/functions/{function_id}/evaluate", "post"),
        ("/v1/releases/{release_id}/predict", "post"),
        ("/v1/datasets/{dataset_id}/releases", "post"),
    ):
        assert "413" in doc["paths"][path][method]["responses"], path
    assert "413" not in doc["paths"]["/v1/releases/{release_id}"]["get"]["responses"]
    read = doc["paths"]["/v1/releases/{release_id}"]["get"]["responses"]["200"]
    assert "Retry-After" in read["headers"]
    assert "Retry-After" in create["responses"]["503"]["headers"]
