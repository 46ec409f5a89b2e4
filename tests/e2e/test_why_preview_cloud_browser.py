"""Why's preview with a cloud model installed, in Chromium (issue 41): the model Ollama lists with a manifest's size is
not offered for a preview on this GPU, and the page says it was left out and why. Screenshot
``why_preview_cloud.png`` goes to ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import Page

from analysis.records import InstalledModel
from bench.pages_fixture import gpu_sample, status_rows
from sim.catalog import BY_NAME
from store.ops import PutGpuSamples, PutInstalledModels, PutLoadedModels
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import page_report, run_app, screenshot, wait_ready, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CLOUD = "gpt-oss:120b-cloud"
LOCAL = "llama3.2:latest"


def test_why_preview_leaves_a_cloud_model_out_and_says_so(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    now = time.time()
    local = BY_NAME[LOCAL]
    models = [
        InstalledModel(now, CLOUD, CLOUD, "c" * 64, 384, None, None, None, now, ("completion",)),
        InstalledModel(
            now, LOCAL, LOCAL, local.digest, local.size_bytes, local.parameter_size, local.quantization, "llama", now - 10
        ),
    ]
    w = StoreWriter(db_path(data))
    try:
        w.write(PutGpuSamples([gpu_sample(now - i, 2.0) for i in range(5)]))
        w.write(PutInstalledModels(models))
        w.write(PutLoadedModels(now - 1, []))
        status_rows(w, now, data)
    finally:
        w.close()
    app_log = tmp_path / "app.log"
    with run_app(data, app_log, {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(f"{url}/why")
        wait_ready(page)
        try:
            wait_until(lambda: page.get_by_text("so no ceiling of this GPU applies").count() > 0, 90, "the cloud model left out")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{page_report(page, app_log)}") from None
        screenshot(page, "why_preview_cloud")
