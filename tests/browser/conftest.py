"""End-to-end fixtures: a live server on loopback, Debian's headless Chromium driven by
Playwright, and the API fixtures (principals, a dataset, releases) every console test starts from.

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it); Playwright's own browser
downloads are not used. Without ``/usr/bin/chromium`` (or the playwright package) the tests are
skipped with a message, unless ``CURATOR_REQUIRE_BROWSER=1`` (CI), which makes that a failure.
The browser's network is closed: any request that leaves loopback is aborted and recorded, and
each test checks that none was attempted.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx2 as httpx
import pytest

from tests.conftest import ADMIN_KEY, RCT_SCHEMA, _truncate, synthetic_csv
from tests.live import live_server

CHROMIUM = os.environ.get("CURATOR_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
FAST_ENV = {"CURATOR_LATENCY_BUCKETS": "[0.1]", "CURATOR_JOB_POLL_SECONDS": "0.05"}
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
# Where the screenshots of each view go (docs/console in scripts/console_screenshots); unset:
# the test's temporary directory.
SCREENSHOTS = os.environ.get("CURATOR_CONSOLE_SCREENSHOTS")


def _missing_browser() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (bash scripts/test installs the dev extra)"
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does this)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing_browser()
    here = Path(__file__).parent
    for item in items:
        if here not in Path(str(item.fspath)).parents:
            continue
        item.add_marker(pytest.mark.browser)
        # Required (CI): no skip; the browser fixture fails instead.
        if reason is not None and not _required():
            item.add_marker(pytest.mark.skip(reason=f"browser tests skipped: {reason}"))


def _required() -> bool:
    return os.environ.get("CURATOR_REQUIRE_BROWSER", "") == "1"


# ---- the live server ------------------------------------------------------------------------


@dataclass
class Live:
    base: str
    db_url: str


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live(request: pytest.FixtureRequest) -> Iterator[Live]:
    """A live server on a fresh database of the backend ``request.param``."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        path = factory.mktemp("console") / "curator.sqlite3"
        shutil.copy(template, path)
        url = f"sqlite:///{path}"
    else:
        url = request.getfixturevalue("postgres_database")
        _truncate(url)
    with live_server(url, admin_key=ADMIN_KEY, extra_env=FAST_ENV) as base:
        yield Live(base, url)


# ---- the browser ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    reason = _missing_browser()
    if reason:
        if _required():
            pytest.fail(f"CURATOR_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    from playwright.sync_api import expect, sync_playwright

    # The machine is shared (2 cores): be patient with assertions, as with actions.
    expect.set_options(timeout=15_000)
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@dataclass
class Watch:
    """What a page did that it should not: requests off loopback, console errors (CSP)."""

    offsite: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert self.offsite == [], f"requests left loopback: {self.offsite}"
        assert self.errors == [], f"console errors: {self.errors}"


@pytest.fixture
def watch() -> Watch:
    return Watch()


@pytest.fixture
def page(browser: Any, watch: Watch) -> Iterator[Any]:
    """A fresh browser context and page; the network off loopback is closed."""
    context = browser.new_context(
        accept_downloads=True, viewport={"width": 1280, "height": 900}, locale="en-GB"
    )
    context.set_default_timeout(15_000)

    def route(r: Any) -> None:
        host = urlparse(r.request.url).hostname or ""
        if r.request.url.startswith(("blob:", "data:")) or host in LOOPBACK:
            r.continue_()
        else:
            watch.offsite.append(r.request.url)
            r.abort("internetdisconnected")

    context.route("**/*", route)
    p = context.new_page()

    def on_console(msg: Any) -> None:
        # The browser logs every 4xx answer; the console shows those as problems on purpose.
        # Anything else (a CSP violation: "Refused to ...", a script error) is a failure.
        expected = msg.text.startswith(
            "Failed to load resource: the server responded with a status of 4"
        )
        if msg.type == "error" and not expected:
            watch.errors.append(msg.text)

    p.on("console", on_console)
    p.on("pageerror", lambda exc: watch.errors.append(f"page error: {exc}"))
    yield p
    context.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: CURATOR_CONSOLE_SCREENSHOTS (docs/console) or a temp directory."""
    path = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path / "shots"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---- fixtures through the API (nothing uploaded by hand) ---------------------------------------


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass
class Study:
    """An owner's RCT dataset with a budget (ε 5, δ 1e-4), two analysts (the first capped at
    ε 2), a client, and three finished ATE releases (ε 1 and 0.5 by the first analyst, ε 1 by
    the second): what the console shows. Seven ledger entries; a charge at seq 5."""

    base: str
    owner: dict[str, Any]
    analyst: dict[str, Any]
    second: dict[str, Any]
    client: dict[str, Any]
    dataset: dict[str, Any]
    releases: list[dict[str, Any]]


def _principal(base: str, role: str, name: str) -> dict[str, Any]:
    r = httpx.post(
        f"{base}/v1/principals", json={"name": name, "role": role}, headers=auth(ADMIN_KEY)
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def _release(
    base: str,
    key: str,
    dataset_id: str,
    epsilon: float = 1.0,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An ``ate`` release (``params``; default: no nuisance model), waited for."""
    r = httpx.post(
        f"{base}/v1/datasets/{dataset_id}/releases",
        json={"kind": "ate", "params": params or {"epsilon": epsilon, "nuisance": "none"}},
        headers=auth(key) | {"Idempotency-Key": uuid.uuid4().hex},
    )
    assert r.status_code == 202, r.text
    deadline = time.time() + 120
    while time.time() < deadline:
        body: dict[str, Any] = httpx.get(
            f"{base}/v1/releases/{r.json()['id']}", headers=auth(key)
        ).json()
        if body["status"] in ("done", "failed"):
            assert body["status"] == "done", body
            return body
        time.sleep(0.05)
    raise AssertionError("release did not finish")


def upload_dataset(base: str, owner_key: str, name: str) -> dict[str, Any]:
    """Upload a 600-row RCT (tests.conftest.synthetic_csv) through the API; age and severity are
    its declared adjustment set (the baseline covariates a trial's plan adjusts for); age is in
    years, sex's codes and the arms are labelled, the outcome is in points."""
    schema = json.loads(json.dumps(RCT_SCHEMA))
    for covariate in schema["covariates"][:2]:
        covariate["adjust_for"] = True
    schema["covariates"][0]["unit"] = "years"
    schema["covariates"][2]["code_labels"] = {"0": "female", "1": "male"}
    schema["treatment"]["code_labels"] = {"0": "usual care", "1": "new pathway"}
    schema["outcome"]["unit"] = "points"
    r = httpx.post(
        f"{base}/v1/datasets",
        data={"name": name, "schema": json.dumps(schema)},
        files={"file": ("rows.csv", io.BytesIO(synthetic_csv(600).encode()), "text/csv")},
        headers=auth(owner_key),
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def make_study(base: str, tag: str | None) -> Study:
    """A Study; ``tag`` ends every name (``None``: plain names, for the screenshots)."""
    end = f" {tag}" if tag else ""
    owner = _principal(base, "owner", f"Hospital data office{end}")
    analyst = _principal(base, "analyst", f"Trial statistician{end}")
    second = _principal(base, "analyst", f"Health economist{end}")
    client = _principal(base, "client", f"Ward dashboard{end}")
    dataset = upload_dataset(base, owner["api_key"], f"Trial 2026{end}")
    ds = dataset["id"]
    h = auth(owner["api_key"])
    b = httpx.put(
        f"{base}/v1/datasets/{ds}/budget",
        json={"epsilon_total": 5.0, "delta_total": 1e-4},
        headers=h,
    )
    assert b.status_code == 200, b.text
    for who, caps in ((analyst, {"epsilon_cap": 2.0}), (second, {})):
        g = httpx.put(f"{base}/v1/datasets/{ds}/grants/{who['id']}", json=caps, headers=h)
        assert g.status_code == 200, g.text
    releases = [
        _release(base, who["api_key"], ds, epsilon)
        for who, epsilon in ((analyst, 1.0), (second, 1.0), (analyst, 0.5))
    ]
    return Study(base, owner, analyst, second, client, dataset, releases)
