"""Why on a cloud model's requests, in Chromium (issue 41 item 2, in part): the page says the model ran on ollama.com
and sets none of its requests against this machine's ceilings. Screenshot ``why_cloud.png`` goes to
``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import Page

from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import run_app, screenshot, wait_ready, wait_until
from tests.support.records import make_record

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_why_says_a_cloud_model_ran_on_ollama_com(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    w = StoreWriter(db_path(data))
    try:
        w.write(PutRequest(make_record("cloud", time.time() - 60, model="gpt-oss:120b-cloud")))
    finally:
        w.close()
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(f"{url}/why")
        wait_ready(page)
        wait_until(lambda: page.get_by_text("is a cloud model: it runs on ollama.com").count() > 0, 90, "the cloud note")
        body = page.inner_text("body")
        assert "decode_above_ceiling" not in body and "above its ceiling" not in body.lower(), body[:3000]
        screenshot(page, "why_cloud")
