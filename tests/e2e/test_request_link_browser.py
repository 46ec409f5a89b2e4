"""A ``?request=`` link opens that request whatever the time window, and says so when the id is unknown.

Two requests written with the collector's own StoreWriter: one two hours old (outside the default 5-minute
window), one a minute old. Before, the link to the old one silently showed the newest request instead.
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
from tests.store.test_store_writer import make_record

pytestmark = pytest.mark.browser

OLD_ID = "0ld0000000000000000000000000aaaa"
NEW_ID = "ne50000000000000000000000000bbbb"


def _shot(page: Page, name: str) -> None:
    """``screenshot`` once the page's fonts are in (its icon font can take long to come on a busy machine)."""
    page.wait_for_function("document.fonts.status === 'loaded'", timeout=120_000)
    screenshot(page, name)


def _picked(page: Page) -> str:
    """The text of the "Request to inspect" selectbox (what the detail below shows)."""
    return page.get_by_role("combobox", name="Request to inspect").input_value()


def test_a_link_to_a_request_outside_the_window_opens_it(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    w = StoreWriter(db_path(data))
    w.write(PutRequest(make_record(OLD_ID, time.time() - 2 * 3600, model="old-model")))
    w.write(PutRequest(make_record(NEW_ID, time.time() - 60, model="new-model")))
    w.close()
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(f"{url}/requests?request={OLD_ID}")
        wait_ready(page)
        wait_until(lambda: "old-model" in _picked(page), 30, "the linked request in the picker")
        assert OLD_ID[:8] in _picked(page)
        assert page.get_by_text("Opened from a link").count() == 1
        # Its detail is drawn: the header line names the old request's model.
        wait_until(lambda: page.get_by_text("old-model · /api/chat").count() > 0, 30, "the linked request's detail")
        _shot(page, "request_link_outside_window")

        page.goto(f"{url}/requests?request={NEW_ID}")
        wait_ready(page)
        wait_until(lambda: "new-model" in _picked(page), 30, "the linked in-window request")
        assert page.get_by_text("Opened from a link").count() == 0  # it is in the table: no note

        hostile = "nope**bold**" + "x" * 200
        page.goto(f"{url}/requests?request={hostile}")
        wait_ready(page)
        error = page.locator('[data-testid="stAlert"]', has_text="No request with id")
        wait_until(lambda: error.count() == 1, 30, "the unknown-id error")
        text = error.first.inner_text()
        assert "nope**bold**" in text and "x" * 200 not in text  # literal, and cut
        assert error.first.locator("strong").count() == 0
        wait_until(lambda: "new-model" in _picked(page), 30, "the newest request shown below the error")
        _shot(page, "request_link_unknown")
