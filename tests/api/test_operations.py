"""Operations endpoints: health, readiness, metrics (and what metrics must not carry)."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from fastapi.testclient import TestClient

from service.config import get_settings
from tests.conftest import ADMIN_KEY, RCT_SCHEMA, Api
from tests.live import ROOT, free_port


def test_health_ready_metrics(api: Api, client: TestClient) -> None:
    from service import __version__

    assert client.get("/healthz").json() == {"status": "ok", "version": __version__}
    assert client.get("/readyz").json() == {"status": "ready", "version": __version__}
    owner = api.principal("owner")
    ds = api.dataset(owner["api_key"], n=50)
    client.get(f"/v1/datasets/{ds['id']}", headers=api.auth(owner["api_key"]))
    text = client.get("/metrics").text
    assert "curator_http_requests_total" in text
    assert 'route="/v1/datasets/{dataset_id}"' in text  # route templates, never ids
    assert ds["id"] not in text
    assert "release_seconds" not in text  # no job durations (a timing side channel)


def test_metrics_need_a_key_unless_local_development(
    configured: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off loopback, in production or with a token configured, ``/metrics`` takes the metrics
    token or the admin key (a 401 problem otherwise); the development default stays open."""
    from service.main import create_app

    def scrape(headers: dict[str, Any] | None = None, **env: str) -> Any:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        with TestClient(create_app(), raise_server_exceptions=False) as c:
            return c.get("/metrics", headers=headers or {})

    assert scrape().status_code == 200  # loopback, test environment, no token
    # ...but not to a request from off this machine (uvicorn --host) or through a proxy, with
    # real secrets too (then nothing else refuses it)
    monkeypatch.setenv("CURATOR_STATE_KEY", base64.b64encode(b"m" * 32).decode())
    get_settings.cache_clear()
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        assert c.get("/metrics").status_code == 200
        assert c.get("http://192.0.2.10/metrics").status_code == 401
        assert c.get("/metrics", headers={"X-Forwarded-For": "198.51.100.7"}).status_code == 401
    monkeypatch.delenv("CURATOR_STATE_KEY")
    r = scrape(CURATOR_METRICS_TOKEN="scrape-secret-0001")
    assert r.status_code == 401
    assert r.headers["content-type"].startswith("application/problem+json")
    assert scrape(Api.auth("scrape-secret-0001")).status_code == 200
    assert scrape(Api.auth(ADMIN_KEY)).status_code == 200
    assert scrape(Api.auth("scrape-secret-0002")).status_code == 401
    non_ascii = {"Authorization": "Bearer \u00e9t\u00e9".encode()}  # sent as raw bytes
    assert scrape(non_ascii).status_code == 401
    monkeypatch.setenv("CURATOR_METRICS_TOKEN", "short-token")
    get_settings.cache_clear()
    with pytest.raises(ValueError, match="at least 16 characters"):
        get_settings()
    monkeypatch.setenv("CURATOR_METRICS_TOKEN", "scrape-secret-0001")
    # no token, but listening off loopback (with real secrets): the admin key only
    monkeypatch.delenv("CURATOR_METRICS_TOKEN")
    off = {"CURATOR_HOST": "0.0.0.0", "CURATOR_STATE_KEY": base64.b64encode(b"k" * 32).decode()}
    assert scrape(**off).status_code == 401
    assert scrape(Api.auth(ADMIN_KEY)).status_code == 200
    get_settings.cache_clear()


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


def test_readyz_says_why_it_is_not_ready(client: TestClient, db_url: str) -> None:
    """An operator told only "not ready" could not tell an outage from a missing migration."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    with engine.begin() as conn:
        head = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
        conn.execute(text("UPDATE alembic_version SET version_num = 'older'"))
    try:
        body = client.get("/readyz")
        assert body.status_code == 503
        assert body.json()["reason"] == "schema not at the current migration"
    finally:  # the PostgreSQL database is the session's: put its version back
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": head})
        engine.dispose()
    assert client.get("/readyz").status_code == 200


def test_a_database_that_does_not_answer_is_a_retryable_503_without_a_traceback(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A database outage used to answer 500 internal-error (which the client does not retry)
    while /readyz said 503, and uvicorn logged ~180 lines of traceback per request, the
    failing statement's parameters included. Now: 503 database-unavailable with Retry-After,
    the no-store header, and one log line with the exception's type only."""
    import logging

    from sqlalchemy.exc import OperationalError

    app = client.app

    @app.get("/down")  # type: ignore[attr-defined, untyped-decorator]
    def down() -> None:
        raise OperationalError("SELECT 42.137", {"value": "42.137"}, Exception("refused"))

    @app.get("/boom2")  # type: ignore[attr-defined, untyped-decorator]
    def boom() -> None:
        raise RuntimeError("secret value 42.137 from a row")

    with caplog.at_level(logging.DEBUG):
        r = client.get("/down")
        other = client.get("/boom2")
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "5"
    assert r.headers["Cache-Control"] == "no-store"
    body = r.json()
    assert body["type"].endswith("/database-unavailable")
    assert "request_id" in body
    assert "42.137" not in r.text
    assert other.status_code == 500
    assert other.headers["Cache-Control"] == "no-store"
    logged = "\n".join(
        record.getMessage() + (str(record.exc_info) if record.exc_info else "")
        for record in caplog.records
    )
    assert "OperationalError" in logged
    assert "RuntimeError" in logged
    assert "42.137" not in logged
    assert "Traceback" not in logged
    assert not any(record.exc_info for record in caplog.records)


def test_development_secrets_are_served_on_loopback_only(
    configured: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``uvicorn service.main:app --host 0.0.0.0`` does not go through ``CURATOR_HOST``'s check:
    with a development default secret every request that arrives on another address is refused
    (503 problem), whatever its route; with both secrets set nothing is refused."""
    from service.main import create_app, is_loopback_address

    def get(url: str) -> Any:
        get_settings.cache_clear()
        with TestClient(create_app(), raise_server_exceptions=False) as c:
            return c.get(url, headers=Api.auth(ADMIN_KEY))

    assert get_settings().development_secrets  # the default state key
    for url in ("http://127.0.0.1/healthz", "http://[::1]/v1/principals", "http://localhost/"):
        assert get(url).status_code != 503, url
    for url in ("http://192.0.2.10/healthz", "http://[2001:db8::1]/v1/principals"):
        r = get(url)
        assert r.status_code == 503, url
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["type"].endswith("/development-secrets-exposed")
        assert ADMIN_KEY not in r.text
    # a reverse proxy on this machine connects over loopback for anyone
    for header in ("Forwarded", "X-Forwarded-For", "X-Real-IP"):
        get_settings.cache_clear()
        with TestClient(create_app(), raise_server_exceptions=False) as c:
            proxied = c.get("http://127.0.0.1/healthz", headers={header: "for=198.51.100.7"})
        assert proxied.status_code == 503, header
    monkeypatch.setenv("CURATOR_STATE_KEY", base64.b64encode(b"k" * 32).decode())
    get_settings.cache_clear()
    assert not get_settings().development_secrets
    assert get("http://192.0.2.10/healthz").status_code == 200
    get_settings.cache_clear()
    # the addresses a server reports
    assert is_loopback_address(("::ffff:127.0.0.1", 80))
    assert is_loopback_address(None)  # a Unix socket
    assert not is_loopback_address(("::ffff:10.1.2.3", 80))
    assert not is_loopback_address(("0.0.0.0", 80))


@pytest.mark.parametrize("access_log", [True, False])
def test_the_server_logs_one_access_line_per_request(tmp_path: Path, access_log: bool) -> None:
    """``python -m service`` writes uvicorn's access line per request to standard output,
    timestamped, without the request's headers (an operator walkthrough found no access log at
    all); ``CURATOR_ACCESS_LOG=false`` turns it off. uvicorn's own start-up chatter stays off."""
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'access.sqlite3'}",
        "CURATOR_PORT": str(port),
        "CURATOR_ACCESS_LOG": str(access_log).lower(),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "service"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "the server exited"
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.2)
        secret = "k-" + uuid.uuid4().hex
        answer = httpx.get(base + "/v1/datasets", headers={"authorization": f"Bearer {secret}"})
        assert answer.status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    log = out.decode()
    lines = [line for line in log.splitlines() if '"GET /v1/datasets HTTP/1.1" 401' in line]
    assert secret not in log
    assert "Started server process" not in log
    if not access_log:
        assert lines == [], log
        return
    assert len(lines) == 1, log
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", lines[0]), lines[0]


def test_a_queued_release_says_when_no_worker_runs_jobs(
    configured: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL API processes run no jobs by default: with no worker beating, a queued release
    says why it waits and /metrics shows 0 workers alive (an operator's alert); once a worker
    runs, the note goes and the release finishes. SQLite: the service cannot tell, no note."""
    from sqlalchemy import create_engine, text

    from service import __version__
    from service.main import create_app
    from tests.api.test_releases import post_release, wait

    postgres = configured.startswith("postgresql")
    if postgres:
        engine = create_engine(configured)
        with engine.begin() as conn:  # other tests' workers in this database
            conn.execute(text("DELETE FROM procrastinate_workers"))
        engine.dispose()
    monkeypatch.setenv("CURATOR_JOB_RUNNER", "none")
    get_settings.cache_clear()
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        api = Api(c)
        owner = api.principal("owner")
        ds = api.dataset(owner["api_key"], n=200, schema=RCT_SCHEMA)
        r = post_release(c, owner["api_key"], ds["id"], {"epsilon": 0.1})
        assert r.status_code == 202, r.text
        release_id = r.json()["id"]
        shown = c.get(f"/v1/releases/{release_id}", headers=api.auth(owner["api_key"])).json()
        listed = c.get(
            f"/v1/datasets/{ds['id']}/releases", headers=api.auth(owner["api_key"])
        ).json()
        metrics = c.get("/metrics").text
    assert shown["status"] == "queued"
    assert f'curator_build_info{{version="{__version__}"}} 1.0' in metrics
    if postgres:
        for body in (r.json(), shown, listed[0]):
            assert "no job worker has been seen in the last 30 s" in body["waiting"]
        assert "curator_job_workers_alive 0.0" in metrics
    else:
        assert shown["waiting"] is None
        assert "curator_job_workers_alive" not in metrics
    monkeypatch.setenv("CURATOR_JOB_RUNNER", "inprocess")
    get_settings.cache_clear()
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        done = wait(c, owner["api_key"], release_id)
        assert done["status"] == "done"
        assert done["waiting"] is None
        if postgres:
            alive = re.search(r"^curator_job_workers_alive (\S+)$", c.get("/metrics").text, re.M)
            assert alive is not None
            assert float(alive.group(1)) >= 1


def test_a_curator_variable_that_names_no_setting_is_named_at_start(
    configured: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A walkthrough set CURATOR_DATA_DIR (no such setting): ignored without a word, the
    database went to ./data. The start now names it (never its value)."""
    from service.config import unknown_variables
    from service.main import create_app

    assert unknown_variables({"CURATOR_DATA_DIR": "x", "CURATOR_PORT": "1", "PATH": "/"}) == [
        "CURATOR_DATA_DIR"
    ]
    assert unknown_variables({"CURATOR_DATABASE_URL": "x", "CURATOR_ADMIN_KEY": "k"}) == []
    monkeypatch.setenv("CURATOR_DATA_DIR", "/secret/place")
    get_settings.cache_clear()
    with caplog.at_level("WARNING", logger="service"), TestClient(create_app()) as c:
        assert c.get("/healthz").status_code == 200
    lines = [r.getMessage() for r in caplog.records if "name no setting" in r.getMessage()]
    assert len(lines) == 1
    assert "CURATOR_DATA_DIR" in lines[0]
    assert "/secret/place" not in lines[0]
