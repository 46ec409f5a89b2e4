"""Helpers for the real-browser tests: start the app, wait for Streamlit, read what the page shows.

Fixtures built on these (``stack``, ``browser``, ``page``) live in ``tests/e2e/conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

from tests.support import waiting
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"]
ARTIFACTS = Path(os.environ.get("PHASEWATCH_ARTIFACTS", REPO / "artifacts"))
START_TIMEOUT_S = 60.0
UI_TIMEOUT_MS = 45_000


def wait_until(check: Callable[[], object], timeout_s: float, what: str) -> Any:
    """``waiting.wait_until`` for pages: an exception while the page is still loading means "not yet"."""
    return waiting.wait_until(check, timeout_s, what, interval_s=0.2, ignoring=(Exception,))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def run_app(data_dir: Path, log_path: Path, extra_env: dict[str, str]) -> Iterator[str]:
    """``streamlit run app.py`` on a free port; yields its URL once /_stcore/health answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHASEWATCH_")}
    env.update(PHASEWATCH_DATA=str(data_dir), PYTHONUNBUFFERED="1", **extra_env)
    cmd = [
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
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-2000:]
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                return bool(r.status == 200)

        wait_until(healthy, START_TIMEOUT_S, "the Streamlit server")
        yield url
    finally:
        _stop(proc)


@dataclass
class Stack:
    """sim → collector (demo mode, text recording on) → ``streamlit run app.py``, all on free loopback ports."""

    app_url: str
    sim_url: str
    proxy: str  # host:port
    data_dir: Path
    collector_pid: int


def wait_ready(page: Page) -> None:
    """Streamlit's own e2e rule: the app is connected and its script is not running.

    Checked inside the page every 50 ms: with a fragment refreshing every second the app is
    "not running" only between refreshes, which a slower poll from outside can miss.
    """
    page.wait_for_selector('[data-testid="stApp"][data-test-connection-state="CONNECTED"]', timeout=UI_TIMEOUT_MS)
    page.wait_for_function(
        """() => document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state') === 'notRunning'""",
        polling=50,
        timeout=UI_TIMEOUT_MS,
    )


def page_report(page: Page, log_path: Path | None = None) -> str:
    """What the page shows and what the app logged last, for a failure's message (CI keeps no screenshots)."""
    parts = []
    with contextlib.suppress(Exception):
        parts.append("page: " + page.locator('[data-testid="stMain"]').inner_text(timeout=5000)[:2000])
    with contextlib.suppress(Exception):
        errors = page.locator('[data-testid="stException"]').all_inner_texts()
        parts.append(f"exceptions shown: {errors[:3]!r}")
    if log_path is not None and log_path.exists():
        parts.append("app log: " + log_path.read_text(errors="replace")[-2000:])
    return "\n".join(parts)


def screenshot(page: Page, name: str) -> Path:
    """Save a full-page screenshot under $PHASEWATCH_ARTIFACTS once every chart is drawn."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    # A refreshed figure is remounted hidden and drawn again: wait for a moment when all are visible.
    with contextlib.suppress(Exception):
        page.wait_for_function(
            """() => Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"]')).every(c => {
                   const gd = c.querySelector('.js-plotly-plot');
                   return gd && gd.querySelector('.main-svg') && getComputedStyle(gd).visibility !== 'hidden'
                          && gd.getBoundingClientRect().height > 0; })""",
            polling=30,
            timeout=20_000,
        )
    page.screenshot(path=str(path), full_page=True)
    return path


def metric(page: Page, label: str) -> str | None:
    """The value of the metric with this label right now (None when it is not on the page)."""
    values: dict[str, str] = page.evaluate("""() => Object.fromEntries(
        Array.from(document.querySelectorAll('[data-testid="stMetric"]')).map(m => [
            m.querySelector('[data-testid="stMetricLabel"]')?.innerText.trim(),
            m.querySelector('[data-testid="stMetricValue"]')?.innerText.trim()]))""")
    return values.get(label)


def live_snapshot(page: Page) -> tuple[str | None, list[str]]:
    """One consistent look at the Live page: the "Generations in flight" metric and the in-flight bands' models (one
    per bar: each trace names its model once, in ``meta``)."""
    value, models = page.evaluate("""() => {
        const m = Array.from(document.querySelectorAll('[data-testid="stMetric"]'))
            .find(m => m.querySelector('[data-testid="stMetricLabel"]')?.innerText.trim() === 'Generations in flight');
        const models = Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot'))
            .flatMap(gd => (gd.data || []).filter(t => t.name === 'in flight')
                .flatMap(t => Array(t.y?.length ?? 0).fill(t.meta)));
        return [m ? m.querySelector('[data-testid="stMetricValue"]').innerText.trim() : null, models];
    }""")
    return value, list(models)


def in_flight_bands(page: Page) -> list[str]:
    """Models of the "in flight" bands drawn under the GPU timeline, one per bar (read from Plotly's own data: each
    trace's ``meta``)."""
    return list(
        page.evaluate("""() => Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot'))
        .flatMap(gd => (gd.data || []).filter(t => t.name === 'in flight').flatMap(t => Array(t.y?.length ?? 0).fill(t.meta)))""")
    )


def no_injection(page: Page) -> None:
    """None of the hostile text became markup: no script ran, no image or link was made from it."""
    assert page.evaluate("() => window.__pw_xss === undefined")
    assert page.locator('img[src="x"]').count() == 0
    assert page.locator('a[href="http://evil.example"], a[href^="javascript:"]').count() == 0
    assert page.locator("script", has_text="__pw_xss").count() == 0
    assert page.locator("b", has_text="not bold").count() == 0


def post_json(url: str, body: object) -> None:
    """POST a JSON body (e.g. a one-shot fault switch of the simulator)."""
    import json

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200, r.status


def pick_request(page: Page, request_id: str) -> None:
    """Choose a request in the "Request to inspect" box by typing its short id and clicking it, as a user would."""
    pick = page.locator('[data-testid="stSelectbox"]', has_text="Request to inspect")
    pick.locator("input").click(force=True)
    pick.locator("input").press_sequentially(request_id[:8], delay=30)
    page.get_by_role("option").filter(has_text=request_id[:8]).first.click(timeout=UI_TIMEOUT_MS)
    wait_until(lambda: request_id[:8] in pick.locator("input").input_value(), 30, f"request {request_id[:8]} to be picked")
    wait_ready(page)


def quick_shot(page: Page, name: str) -> Path:
    """A screenshot now, without waiting for charts to settle (the phase would be over by then)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def cards_state(page: Page) -> dict[str, object]:
    """The progress bars' values and the cards' text right now."""
    state: dict[str, object] = page.evaluate("""() => ({
        bars: Array.from(document.querySelectorAll('[data-testid="stProgress"] [role="progressbar"]'))
                 .map(b => Number(b.getAttribute('aria-valuenow'))),
        text: Array.from(document.querySelectorAll('[class*="st-key-card_"]'))
                 .map(c => c.innerText).join('\\n----\\n'),
    })""")
    return state


def tokens_so_far(text: str) -> int | None:
    m = re.search(r"([\d,]+) tokens so far", text)
    return None if m is None else int(m.group(1).replace(",", ""))
