"""The Why page in Chromium on a copy of the H200 run's store (tests/support/real_gpu.py), opened days later on this
machine (no GPU, no collector) with the sidebar's default window, as a person opening a copied data folder would:
the ceilings are the H200's, no reading is called impossible, and the tiles, charts and verdicts come from the same
requests. Screenshot: ``why_stored_h200.png`` under ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.e2e.support import run_app, screenshot, wait_ready, wait_until
from tests.support.real_gpu import real_gpu_store

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_why_judges_the_stored_readings_against_the_h200(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    real_gpu_store(data, with_placement=True, with_waits=True)
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(url)
        wait_ready(page)
        page.locator('[data-testid="stSidebarNav"] a', has_text="Why").click()
        wait_ready(page)
        main = page.locator('[data-testid="stMain"]')
        wait_until(lambda: "faster than decode." in main.inner_text(), 60, "the ratio sentence")
        wait_until(lambda: page.locator('[data-testid="stPlotlyChart"]').count() >= 2, 60, "both charts")
        shot = screenshot(page, "why_stored_h200")
        text = main.inner_text()
    assert shot.stat().st_size > 20_000
    assert page.locator('[data-testid="stException"]').count() == 0
    # The sidebar's default window (5 min) holds none of the run's requests: the page says so and moves.
    assert "No request of gemma3:12b-random finished in the last 5 min" in text and "last period with activity" in text
    hardware = next(line for line in text.splitlines() if "memory bandwidth" in line)
    assert hardware.startswith("NVIDIA H200 · table row h200"), hardware
    assert "These readings ran on NVIDIA H200" in text and "No GPU was found" not in text
    assert "cannot be true" not in text and "above the ceiling" not in text
    # Tiles, charts and verdicts from the same 13 requests.
    tiles = dict(re.findall(r"(Prefill, tok/s \(median\)|Decode, tok/s \(median\))\n+([\d,.—]+)", text))
    assert "—" not in tiles.values() and len(tiles) == 2, tiles
    assert "13 prefill and 13 decode points from the requests of the 5 min up to" in text
    assert "Over the 13 finished requests of the 5 min up to" in text
    assert "On your NVIDIA H200, gemma3:12b-random read prompts at " + tiles["Prefill, tok/s (median)"] in text
