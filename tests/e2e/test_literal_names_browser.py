"""Model names are shown literally: a URL, a www. name or an e-mail address inside one never becomes a link.

Streamlit's Markdown turns bare URLs into links after escapes are resolved (GFM autolink literals), so
backslash escapes alone do not stop it. A store written with the collector's own StoreWriter, the app
with ``PHASEWATCH_COLLECTOR=off``, each page in Chromium.
"""

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

pytestmark = pytest.mark.browser

URL_MODEL = "evil http://evil.example/x?a=1 www.evil.example me@evil.example"
WORD_JOINER = "\u2060"


def _links_to_evil(page: Page) -> list[str]:
    return page.eval_on_selector_all(
        "a", "els => els.map(a => a.getAttribute('href') || '').filter(h => h.includes('evil.example'))"
    )


def test_urls_in_model_names_are_not_links(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    w = StoreWriter(db_path(data))
    w.write(PutRequest(make_record("u1", time.time() - 30, model=URL_MODEL)))
    w.close()
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(url + "/why")
        wait_ready(page)
        info = page.locator('[data-testid="stAlert"]', has_text="No model facts for")
        wait_until(lambda: info.count() > 0, 30, "the Why page's info box about the model")
        shown = info.first.inner_text().replace(WORD_JOINER, "")
        assert f"No model facts for {URL_MODEL} yet" in shown  # the name, literally
        assert info.first.locator("a").count() == 0
        assert _links_to_evil(page) == []
        screenshot(page, "why_url_model_name")
        for path in ("/", "/requests"):
            page.goto(url + path)
            wait_ready(page)
            assert _links_to_evil(page) == [], path
            if path == "/requests":  # the table, its CSV button and the request's detail are drawn
                page.get_by_role("button", name="Download CSV").wait_for(timeout=30_000)
                page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)
                assert _links_to_evil(page) == []
            screenshot(page, f"url_model_name{path.replace('/', '_')}")
