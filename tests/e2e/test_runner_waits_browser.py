"""The runner's own waits on the pages, in a real browser, on the store of the run on a real NVIDIA H200
(tests/support/real_gpu.py): the Requests waterfall of the 272-token prompt sent after a 16k one names the 1,362 MiB
prompt-cache save before its prefill, and Why gives the verdict on it, not a queue for a slot. Screenshots:
``runner_waits_request.png`` and ``runner_waits_why.png`` under ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.e2e.support import UI_TIMEOUT_MS, run_app, screenshot, wait_ready, wait_until
from tests.support.real_gpu import real_gpu_store

pytestmark = [pytest.mark.browser, pytest.mark.slow]

AFTER_16K = "945a35dea41142cab2de21d57f4c8a92"


def _widest_window(page: Page) -> None:
    """The sidebar's time window at its widest: the run's requests are older than the default 5 minutes."""
    box = page.locator('[data-testid="stSelectbox"]', has_text="Time window")
    box.locator("input").click(force=True)
    page.get_by_role("option", name="24 h").click(timeout=UI_TIMEOUT_MS)
    wait_ready(page)


def test_the_waits_are_named_on_requests_and_why(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    real_gpu_store(data, with_placement=True, with_waits=True)
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(f"{url}/requests?request={AFTER_16K}")
        wait_ready(page)
        _widest_window(page)
        wait_until(lambda: page.get_by_text("runner: prompt-cache save 1,362 MiB").count() > 0, 60, "the named wait")
        assert page.get_by_text("waiting for a free slot").count() == 0
        screenshot(page, "runner_waits_request")

        page.goto(f"{url}/why")
        wait_ready(page)
        _widest_window(page)
        wait_until(lambda: page.get_by_text("into its prompt cache in system memory").count() > 0, 60, "the wait's verdict")
        assert page.get_by_text("waiting for a free slot").count() == 0
        screenshot(page, "runner_waits_why")
