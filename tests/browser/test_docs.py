"""``/docs`` renders Swagger UI from the vendored assets with the network closed: no request
leaves loopback, and the page shows the API's operations."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import Live, Watch


@pytest.mark.parametrize("live", ["sqlite"], indirect=True)
def test_docs_render_offline(page: Any, live: Live, watch: Watch) -> None:
    from playwright.sync_api import expect

    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.goto(f"{live.base}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("DP causal curator")
    ledger = page.locator(".opblock-summary-path", has_text="/v1/datasets/{dataset_id}/ledger")
    expect(ledger.first).to_be_visible()
    assert page.locator(".opblock").count() > 20
    # Everything came from this server: the vendored bundle and styles, then /openapi.json.
    assert f"{live.base}/static/vendor/swagger-ui/swagger-ui-bundle.js" in requested
    assert f"{live.base}/openapi.json" in requested
    assert all(url.startswith((live.base, "data:", "blob:")) for url in requested), requested
    watch.assert_clean()
