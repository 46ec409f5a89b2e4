"""The Requests detail of requests the proxy never saw, in Chromium (issue 40 item 3): a direct success keeps its
route and total and its time axis counts from the runner's task, not from the proxy; a direct chat Ollama answered
500 is listed as a failure with its route. Screenshots ``requests_direct_success.png`` and
``requests_direct_failure.png`` go to ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import Page

from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import run_app, screenshot, wait_ready, wait_until
from tests.support.direct_records import SUCCESS_ID, direct_failure, direct_success

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_direct_requests_say_where_their_times_come_from(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    t0 = time.time() - 120
    failed = direct_failure(t0)
    w = StoreWriter(db_path(data))
    try:
        w.write(PutRequest(direct_success(t0)))
        w.write(PutRequest(failed))
    finally:
        w.close()
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(f"{url}/requests?request={SUCCESS_ID}")
        wait_ready(page)
        wait_until(lambda: page.get_by_text("ms since the runner started the task").count() > 0, 60, "the axis title")
        assert page.get_by_text("since the proxy received").count() == 0
        screenshot(page, "requests_direct_success")
        page.goto(f"{url}/requests?request={failed.id}")
        wait_ready(page)
        wait_until(lambda: page.get_by_text("answered with an error before any runner task").count() > 0, 60, "the sentence")
        body = page.inner_text("body")
        assert "model not known · /api/chat · generate · from 10.0.0.6 (unverified)" in body, body[:3000]
        assert "http_error 500 · direct · Ollama's access line (no runner task)" in body, body[:3000]
        assert "Ollama's access line says it took 28.2 s" in body, body[:3000]
        screenshot(page, "requests_direct_failure")
