"""The Requests detail in a real browser on the store of the run on a real NVIDIA H200 (tests/support/real_gpu.py):
it says where the runner put the model (49/49 layers on CUDA0) with /api/ps's 0% beside it and which one it used,
and no advice about offloading. Screenshot: ``requests_placement.png`` under ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.e2e.support import UI_TIMEOUT_MS, run_app, screenshot, wait_ready, wait_until
from tests.support.real_gpu import real_gpu_store

pytestmark = [pytest.mark.browser, pytest.mark.slow]

AFTER_16K = "945a35dea41142cab2de21d57f4c8a92"


def test_the_detail_names_the_runners_placement(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    real_gpu_store(data, with_placement=True, with_waits=True)
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(f"{url}/requests?request={AFTER_16K}")
        wait_ready(page)
        box = page.locator('[data-testid="stSelectbox"]', has_text="Time window")
        box.locator("input").click(force=True)
        page.get_by_role("option", name="24 h").click(timeout=UI_TIMEOUT_MS)
        wait_ready(page)
        wait_until(lambda: page.get_by_text("49/49 layers on CUDA0 (NVIDIA H200)").count() > 0, 60, "the placement")
        assert page.get_by_text("sits in system memory").count() == 0
        assert page.get_by_text("above the", exact=False).filter(has_text="cannot be true").count() == 0
        screenshot(page, "requests_placement")
