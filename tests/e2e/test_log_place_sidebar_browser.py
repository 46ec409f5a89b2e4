"""The sidebar says which Ollama log the collector reads (issue 45): ``HOME`` holds ``.ollama/logs/server.log``
(sim writing there, as the macOS app's Ollama does) and the collector, given no ``--ollama-log``, reads it.
Screenshot: ``sidebar-log-place.png`` under ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.e2e.support import _stop, run_app, screenshot, wait_ready, wait_until
from tests.support.paths import REPO
from tests.support.sim_process import free_port, start_sim
from tests.support.stripped_python import listen_address

pytestmark = pytest.mark.browser


def test_sidebar_names_the_log_read_where_ollama_keeps_it(page: Page, tmp_path: Path) -> None:
    home = tmp_path / "home"
    log = home / ".ollama" / "logs" / "server.log"
    data = tmp_path / "data"
    err_path = tmp_path / "collector.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))} | {"HOME": str(home)}
    proxy = f"127.0.0.1:{free_port()}"
    with start_sim("--log-file", str(log), "--log-rotate") as sim, open(err_path, "wb") as err:
        cmd = [sys.executable, "-m", "collectors", "--ollama", sim.base_url, "--listen", proxy, "--data", str(data)]
        collector = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=err, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: listen_address(err_path), 60, "the collector")
            with run_app(data, tmp_path / "app.log", {"OLLAMA_HOST": sim.base_url, "PHASEWATCH_LISTEN": proxy}) as app_url:
                page.goto(app_url)
                wait_ready(page)
                sidebar = page.locator('[data-testid="stSidebar"]')
                wait_until(lambda: "Ollama's log: reads" in sidebar.inner_text(), 60, "the sidebar's log line")
                assert f"Ollama's log: reads {log}" in sidebar.inner_text()
                screenshot(page, "sidebar-log-place")
        finally:
            _stop(collector)
    assert collector.returncode == 0, err_path.read_text()[-2000:]
