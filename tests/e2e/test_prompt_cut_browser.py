"""A cut prompt in the browser: the Requests page's detail says "your 6,000-token prompt … was cut to 1,027
tokens: num_ctx is 2,048 (set by …)" with the fix, from a row the collector's own StoreWriter wrote."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from playwright.sync_api import Page

from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import run_app, screenshot, wait_ready, wait_until
from tests.support.records import make_record

pytestmark = pytest.mark.browser

CUT_ID = "c0700000000000000000000000000cut"


def test_requests_says_the_prompt_was_cut_with_the_fix(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    base = make_record(CUT_ID, time.time() - 30, model="llama3.2")
    assert base.metrics is not None
    cut = replace(
        base,
        metrics=replace(base.metrics, prompt_eval_count=1027),
        num_ctx=2048,
        prompt_sent_tokens=6000,
        prompt_sent_source="log",
        prompt_kept_tokens=1027,
        num_ctx_in_force=2048,
        num_ctx_source="request",
    )
    w = StoreWriter(db_path(data))
    w.write(PutRequest(cut))
    w.close()
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(f"{url}/requests?request={CUT_ID}")
        wait_ready(page)
        said = "your 6,000-token prompt (Ollama's log) was cut to 1,027 tokens: num_ctx is 2,048"
        wait_until(lambda: page.get_by_text(said, exact=False).count() > 0, 60, "the cut prompt's warning")
        assert page.get_by_text("raise options.num_ctx to 8,192", exact=False).count() > 0
        page.wait_for_function("document.fonts.status === 'loaded'", timeout=120_000)
        screenshot(page, "requests_prompt_truncated")
