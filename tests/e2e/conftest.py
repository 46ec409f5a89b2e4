"""Fixtures of the real-browser tests: the whole stack on free loopback ports, and Debian's Chromium.

``stack`` starts ``python -m sim`` (a simulated RTX 4090, two slots), ``python -m collectors``
(``--demo --record-text``) and ``streamlit run app.py``; every process is stopped afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from collectors.lock import read_lock
from store.schema import db_path
from tests.e2e.support import CHROMIUM, CHROMIUM_ARGS, REPO, START_TIMEOUT_S, Stack, _stop, run_app, wait_until
from tests.support.ports import free_port
from tests.support.sim_process import start_sim


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("phasewatch-data")
    logs = tmp_path_factory.mktemp("logs")
    with start_sim("--hardware", "rtx-4090", "--num-parallel", "2") as sim:
        proxy = f"127.0.0.1:{free_port()}"
        with open(logs / "collector.log", "wb") as log:
            collector = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "collectors",
                    "--ollama",
                    sim.base_url,
                    "--listen",
                    proxy,
                    "--data",
                    str(data_dir),
                    "--demo",
                    "--record-text",
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            info = wait_until(
                lambda: (i := read_lock(data_dir)) is not None and i.listen == proxy and i,
                START_TIMEOUT_S,
                "the collector's lock",
            )
            wait_until(lambda: db_path(data_dir).exists(), START_TIMEOUT_S, "the store")
            env = {"OLLAMA_HOST": sim.base_url, "PHASEWATCH_LISTEN": proxy}
            with run_app(data_dir, logs / "app.log", env) as url:
                yield Stack(url, sim.base_url, proxy, data_dir, int(info.pid))
        finally:
            _stop(collector)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():  # scripts/test.sh installs it
        message = f"{CHROMIUM} is not installed (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must run the browser tests, never skip them
        pytest.skip(message)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 3400})
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield p
        assert not errors, f"JavaScript errors in the page: {errors}"
    finally:
        context.close()
