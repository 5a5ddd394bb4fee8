"""Operations endpoints: health, readiness, metrics (and what metrics must not carry)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import Api


def test_health_ready_metrics(api: Api, client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    owner = api.principal("owner")
    ds = api.dataset(owner["api_key"], n=50)
    client.get(f"/v1/datasets/{ds['id']}", headers=api.auth(owner["api_key"]))
    text = client.get("/metrics").text
    assert "curator_http_requests_total" in text
    assert 'route="/v1/datasets/{dataset_id}"' in text  # route templates, never ids
    assert ds["id"] not in text
    assert "release_seconds" not in text  # no job durations (a timing side channel)


def test_unhandled_error_is_problem_without_text(client: TestClient) -> None:
    from service.main import create_app  # noqa: F401

    app = client.app

    @app.get("/boom")  # type: ignore[attr-defined, untyped-decorator]
    def boom() -> None:
        raise RuntimeError("secret value 42.137 from a row")

    r = client.get("/boom")
    assert r.status_code == 500
    body = r.json()
    assert body["type"].endswith("/internal-error")
    assert "request_id" in body
    assert "42.137" not in r.text
    assert "RuntimeError" not in r.text
