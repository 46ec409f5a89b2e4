"""A direct embed call on the Requests page, in Chromium (issue 41): one row for the call of forty inputs, the caption
counting it apart, its detail saying it was gathered from its inputs' runner tasks. Screenshot
``requests_direct_embed.png`` goes to ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import Page

from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import run_app, screenshot, wait_ready, wait_until
from tests.support.direct_records import direct_embed, direct_success

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_direct_embed_call_is_one_request_and_says_how_it_was_gathered(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    now = time.time()
    embed = direct_embed(now - 100)
    w = StoreWriter(db_path(data))
    try:
        w.write(PutRequest(direct_success(now - 200)))
        w.write(PutRequest(embed))
    finally:
        w.close()
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(f"{url}/requests?request={embed.id}")
        wait_ready(page)
        wait_until(lambda: page.get_by_text("each input was its own runner task").count() > 0, 60, "the sentence")
        body = page.inner_text("body")
        assert "2 requests (1 of them embed call)" in body, body[:3000]
        assert "embedgemma:270m · /api/embed · embed" in body, body[:3000]
        charts = page.locator('[data-testid="stPlotlyChart"]')
        wait_until(lambda: charts.count() > 0 and charts.locator(".main-svg").count() >= charts.count(), 90, "the charts drawn")
        screenshot(page, "requests_direct_embed")
