"""A page opened by its own URL on a fresh server still runs through app.py (sidebar, navigation)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.e2e.support import run_app, screenshot, wait_ready, wait_until

pytestmark = pytest.mark.browser


def test_deep_link_to_why_on_a_fresh_server_runs_through_app(page: Page, tmp_path: Path) -> None:
    # A new server each time: Streamlit's legacy pages/ mode only applies before app.py's first run.
    with run_app(tmp_path / "data", tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(url + "/why")
        wait_ready(page)
        nav = page.locator('[data-testid="stSidebarNav"] a')
        labels = wait_until(lambda: [t.split()[-1] for t in nav.all_inner_texts()] or None, 30, "the sidebar navigation")
        # Only app.py's pages: no helper module of pages/ (charts, common, ...) offered as a page.
        assert labels == ["Live", "Requests", "Why", "Lab"], labels
        assert page.get_by_text("Sources", exact=True).first.is_visible()  # app.py's sidebar ran
        assert page.locator("h1").first.inner_text().strip() == "Why"
        screenshot(page, "deep_link_why")
