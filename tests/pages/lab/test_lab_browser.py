"""The whole Lab path in a real browser: sim → proxy (collector) → Lab run → page, with screenshots.

Debian's Chromium (/usr/bin/chromium) driven by Playwright; screenshots of a run in progress
and of its results go to ``$PHASEWATCH_ARTIFACTS`` (default ``artifacts/``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from collectors.lab.results import DONE, list_results
from collectors.lock import read_lock
from store.schema import db_path
from tests.support.ports import free_port
from tests.support.sim_process import REPO_ROOT, start_sim
from tests.support.waiting import wait_until

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
MODEL = "llama3.1:8b"
ARTIFACTS = Path(os.environ.get("PHASEWATCH_ARTIFACTS", REPO_ROOT / "artifacts"))


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))}
    return {**env, "PHASEWATCH_DATA": str(data), "PHASEWATCH_COLLECTOR": "off", "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/_stcore/health", timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """sim, the collector recording through its proxy, and the dashboard; yields (app URL, data folder)."""
    data = tmp_path / "data"
    data.mkdir()
    env = _env(data)
    port = free_port()
    with (
        start_sim("--hardware", "rtx-3090", "--num-parallel", "2") as sim,
        process(
            [
                sys.executable,
                "-m",
                "collectors",
                "--data",
                str(data),
                "--listen",
                "127.0.0.1:0",
                "--interval",
                "0.5",
                "--ollama",
                sim.base_url,
            ],
            env,
            tmp_path / "collector.log",
        ) as coll,
        process(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                "app.py",
                "--server.port",
                str(port),
                "--server.address",
                "127.0.0.1",
                "--server.headless",
                "true",
                "--browser.gatherUsageStats",
                "false",
                "--server.fileWatcherType",
                "none",
            ],
            env,
            tmp_path / "streamlit.log",
        ) as app,
    ):
        wait_until(
            lambda: (info := read_lock(data)) is not None and info.pid == coll.pid and bool(info.listen), 30, "the collector"
        )
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: healthy(url) or app.poll() is not None, 30, "streamlit")
        assert app.poll() is None, (tmp_path / "streamlit.log").read_text()
        yield url, data


def settled(page: Page) -> None:
    page.wait_for_selector('[data-testid="stApp"]', timeout=30_000)
    expect(page.get_by_role("heading", name="Lab", exact=True)).to_be_visible(timeout=30_000)
    # app.py's sidebar (the sources) is there: the page runs inside the app, not on its own.
    expect(page.get_by_role("heading", name="Sources")).to_be_visible(timeout=30_000)


def test_lab_run_in_the_browser(stack: tuple[str, Path]) -> None:
    url, data = stack
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2600})
            # In through the front door: app.py's navigation, as a user arrives.
            page.goto(url)
            # Until app.py has run once, Streamlit lists every module of pages/ as a page of its own
            # (a "lab" link that runs pages/lab/page.py without app.py): wait for app.py's navigation.
            expect(page.get_by_role("heading", name="Live", exact=True)).to_be_visible(timeout=30_000)
            page.get_by_role("link", name="Lab", exact=True).click()
            settled(page)
            expect(page.get_by_text("No runs yet")).to_be_visible()
            page.get_by_label("Model", exact=True).fill(MODEL)
            page.get_by_label("Model", exact=True).press("Enter")
            page.get_by_text("Parameters", exact=True).click()
            num_predict = page.get_by_label("num predict", exact=True)
            num_predict.fill("150")
            num_predict.press("Enter")
            # The cost follows the parameters before anything runs: 150 tokens per probe, over a thousand in all.
            expect(page.get_by_text(re.compile(r"\b1,\d{3} output tokens"))).to_be_visible(timeout=15_000)
            page.get_by_role("button", name="Run experiment").click()

            # In progress: the bar, the cancel button, and the first points charted as they arrive.
            expect(page.get_by_role("button", name="Cancel")).to_be_visible(timeout=30_000)
            wait_until(lambda: any(len(r.points) >= 2 for r in list_results(data)), 30, "two points")
            expect(page.locator('[data-testid="stProgress"]')).to_be_visible()
            expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=15_000)
            page.wait_for_timeout(1200)  # one more fragment refresh, so the chart holds the points
            page.screenshot(path=str(ARTIFACTS / "lab_running.png"), full_page=True)

            # Done: the conclusion, the chart with the ceilings, the points and the history.
            expect(page.get_by_role("heading", name="Results")).to_be_visible(timeout=60_000)
            expect(page.get_by_text("Time to first token grew", exact=False)).to_be_visible(timeout=15_000)
            expect(page.locator(".js-plotly-plot").first).to_be_visible()
            # sim plays an RTX 3090 while the collector finds no GPU here: draw that card's ceilings.
            hw = page.get_by_label("Ceilings for", exact=True)
            hw.click()
            hw.fill("RTX 3090")
            hw.press("Enter")
            expect(page.get_by_text("Ceilings for NVIDIA GeForce RTX 3090.")).to_be_visible(timeout=15_000)
            expect(page.get_by_text("ceiling (memory, then compute)").first).to_be_visible()
            page.wait_for_timeout(1000)
            page.screenshot(path=str(ARTIFACTS / "lab_results.png"), full_page=True)
        finally:
            browser.close()
    (run,) = list_results(data)
    assert run.state == DONE and len(run.points) >= 5
    # Every probe went through the proxy and was recorded like any other request.
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    try:
        wait_until(
            lambda: (
                conn.execute("SELECT COUNT(*) FROM requests WHERE model = ? AND outcome = 'ok'", (MODEL,)).fetchone()[0]
                >= 1 + len(run.points)
            ),
            10,
            "the proxy's records",
        )
    finally:
        conn.close()
