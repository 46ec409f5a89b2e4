"""The whole path in a real browser: sim → proxy → store → Streamlit pages, seen in Debian's Chromium.

Starts ``python -m sim``, ``python -m collectors`` (``--demo --record-text``) and
``streamlit run app.py`` on free loopback ports, sends three requests through the proxy
with the official ``ollama`` client, and watches them on the Live page while they run
and on the Requests page afterwards, with the phase numbers the store holds.
Screenshots of every page go to ``$PHASEWATCH_ARTIFACTS`` (default ``artifacts/``). The demo test also takes the
README's picture: into ``artifacts/readme-live.png`` by default, into ``docs/img/live.png`` with
``PHASEWATCH_WRITE_README_IMG=1`` (a run of the suite leaves the tracked file alone, so CI and every developer's run
never dirty the tree with a picture that differs at each run; regenerating it is one deliberate command, in
CONTRIBUTING.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import ollama
import pytest
from playwright.sync_api import Browser, Page, ViewportSize

from bench.pages_fixture import XSS_PROMPT, XSS_REPLY, Shape, make_request, status_rows
from collectors.demo import stop_demo
from pages.shared import fmt
from store import queries
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter

# The fixtures (stack, browser, page) live in tests/e2e/conftest.py.
from tests.e2e.support import (
    ARTIFACTS,
    UI_TIMEOUT_MS,
    Stack,
    in_flight_bands,
    live_snapshot,
    metric,
    no_injection,
    page_report,
    pick_request,
    post_json,
    run_app,
    screenshot,
    wait_ready,
    wait_until,
)

pytestmark = pytest.mark.browser

README = Path(__file__).resolve().parents[2] / "README.md"
README_IMAGE = README.parent / "docs" / "img" / "live.png"
README_IMAGE_VIEWPORT: ViewportSize = {"width": 1280, "height": 1100}  # sidebar, metrics, a card, the GPU timeline


def readme_image_path() -> Path:
    """Where the README's picture goes: the tracked file only when asked (PHASEWATCH_WRITE_README_IMG=1)."""
    if os.environ.get("PHASEWATCH_WRITE_README_IMG") == "1":
        return README_IMAGE
    return ARTIFACTS / "readme-live.png"  # CI keeps it beside the other screenshots, to compare by eye


MODEL = "llama3.2:latest"


def test_three_requests_live_then_in_history(stack: Stack, page: Page) -> None:
    page.goto(stack.app_url)
    wait_ready(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    wait_until(lambda: f"OLLAMA_HOST={stack.proxy}" in sidebar.inner_text(), 30, "the proxy line in the sidebar")
    # Reused, not started: the app found the collector through its lock (a spawned one would log into the data folder).
    assert f"running (process {stack.collector_pid})" in sidebar.inner_text()
    assert not (stack.data_dir / "collector.log").exists()
    assert "Demo mode" in page.locator('[data-testid="stMain"]').inner_text()  # it watches the simulator, and says so

    # Hold the first generation's batch for a while, so that a loaded test machine still sees them run.
    post_json(stack.sim_url + "/sim/faults", {"stall_ms": 20000, "stall_after_tokens": 20})
    client = ollama.Client(host=f"http://{stack.proxy}", timeout=120)
    long_doc = " ".join(["report revenue growth"] * 1200)
    calls: list[Callable[[], object]] = [
        # One model with two slots: the stall (above) holds its batch, the third request waits for a slot.
        # The first carries markup in its text, recorded with --record-text.
        lambda: list(
            client.chat(
                model=MODEL, messages=[{"role": "user", "content": XSS_PROMPT}], stream=True, options={"num_predict": 600}
            )
        ),
        lambda: list(
            client.chat(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me a long story."}],
                stream=True,
                options={"num_predict": 500},
            )
        ),
        lambda: list(client.generate(model=MODEL, prompt=f"Summarise: {long_doc}", stream=True, options={"num_predict": 400})),
    ]
    failures: list[BaseException] = []

    def call(fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=call, args=(fn,), daemon=True) for fn in calls]
    for t in threads:
        t.start()
        time.sleep(0.3)

    # Live: the generations show up while they run, with their models and phases.
    seen_models: set[str] = set()
    most_in_flight = 0
    readings: list[str | None] = []

    def live_shows_them() -> bool:
        nonlocal most_in_flight
        value, models = live_snapshot(page)
        seen_models.update(models)
        readings.append(value)
        if value is not None and value.isdigit():
            most_in_flight = max(most_in_flight, int(value))
        return MODEL in seen_models and most_in_flight == 3

    try:
        wait_until(live_shows_them, 90, "the three requests on the Live page")
    except AssertionError as exc:
        screenshot(page, "live-FAILED")
        raise AssertionError(
            f"{exc}; models seen in flight: {sorted(seen_models)}, most at once: {most_in_flight}; "
            f"bands: {in_flight_bands(page)}, metric readings: {readings[-40:]}"
        ) from None
    screenshot(page, "live-in-flight")

    for t in threads:
        t.join(180)
    assert not failures, failures
    assert not any(t.is_alive() for t in threads)

    # The store's view of the three requests.
    conn = queries.open_readonly(stack.data_dir)
    try:
        rows = wait_until(
            lambda: (r := [x for x in queries.recent_requests(conn, 0) if x.outcome == "ok"]) and len(r) >= 3 and r,
            30,
            "three finished requests in the store",
        )
    finally:
        conn.close()
    assert len(rows) == 3
    wait_until(lambda: metric(page, "Generations in flight") == "0", 60, "the Live page to see them finish")
    screenshot(page, "live")

    # Requests: the history, and each request's phases as the store holds them.
    page.goto(stack.app_url + "/requests")
    wait_ready(page)
    history_models = wait_until(
        lambda: page.evaluate("""() => Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot'))
            .filter(gd => ((gd.layout.title || {}).text || '').includes('Rates of the requests'))
            .flatMap(gd => gd.data.flatMap(t => Array(t.x?.length ?? 0).fill(t.meta)))"""),
        30,
        "the history chart",
    )  # (each trace names its model once, in meta)
    assert set(history_models) == {r.model for r in rows}  # every request's rates, counted or drawn apart
    for row in rows:
        pick_request(page, row.id)
        expected = {
            "First token": fmt.seconds(row.ttft_s),
            "Load": fmt.seconds(row.load_s),
            "Prefill": fmt.seconds(row.prefill_s),
            "Decode": fmt.seconds(row.decode_s),
        }
        wait_until(
            lambda: all(metric(page, k) == v for k, v in expected.items()),  # noqa: B023 - called at once, inside this iteration
            30,
            f"the phase numbers of {row.id[:8]} ({expected})",
        )
        assert page.locator('[data-testid="stPlotlyChart"]').count() >= 3  # history, waterfall, gaps
    screenshot(page, "requests")

    # The request whose prompt carries markup: shown as text, literally, and nothing injected.
    conn = queries.open_readonly(stack.data_dir)
    try:
        xss_row = next(r for r in rows if "Repeat after me" in (queries.request_detail(conn, r.id).record.prompt_text or ""))  # type: ignore[union-attr]
    finally:
        conn.close()
    pick_request(page, xss_row.id)
    wait_until(
        lambda: page.locator('[data-testid="stCode"]', has_text="<script>alert(1)</script>").count() >= 1,
        30,
        "the prompt shown as code",
    )
    code = page.locator('[data-testid="stCode"]', has_text="Repeat after me").first.inner_text()
    assert XSS_PROMPT in code
    no_injection(page)
    screenshot(page, "requests-text-as-text")

    # Every other page in the navigation (Why and Lab join later) opens without an error.
    links = page.locator('[data-testid="stSidebarNav"] a')
    hrefs = [links.nth(i).get_attribute("href") or "" for i in range(links.count())]
    for href in hrefs:
        name = href.removeprefix(stack.app_url).strip("/")
        if name in ("live", "requests", ""):
            continue
        page.goto(href if href.startswith("http") else stack.app_url + "/" + href.lstrip("/"))
        wait_ready(page)
        assert page.locator('[data-testid="stException"]').count() == 0, name
        screenshot(page, name)


def test_zoom_holds_while_paused(stack: Stack, page: Page) -> None:
    """Each refresh redraws the charts (Streamlit remounts a changed figure), so zoom is kept by pausing."""
    page.goto(stack.app_url)
    wait_ready(page)
    # force: the page redraws every second, so Playwright may never see the toggle "stable".
    page.locator('[data-testid="stSidebar"]').get_by_text("Pause live updates").click(force=True, timeout=UI_TIMEOUT_MS)
    wait_until(lambda: page.get_by_text("Live updates are paused").count() == 1, 30, "the pause to take effect")
    wait_ready(page)
    chart = page.locator('[data-testid="stPlotlyChart"] .js-plotly-plot').first
    chart.wait_for(timeout=UI_TIMEOUT_MS)
    # Zoom with the mouse, as a user does: drag across the recent end of the utilization plot.
    box = chart.bounding_box()
    assert box is not None
    y = box["y"] + 120
    page.mouse.move(box["x"] + box["width"] * 0.6, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.78, y, steps=8)
    page.mouse.up()
    page.wait_for_timeout(500)
    zoomed = chart.evaluate("gd => gd.layout.xaxis.range.join(' ')")
    page.wait_for_timeout(3000)  # three refresh periods
    assert chart.evaluate("gd => gd.layout.xaxis.range.join(' ')") == zoomed
    assert chart.evaluate("gd => gd.layout.xaxis.autorange") is False
    screenshot(page, "live-paused-zoomed")


def test_model_output_shows_as_text(tmp_path: Path, browser: Browser) -> None:
    """A recorded reply full of markup, read back by the pages: visible literally, nothing injected."""
    now = time.time()
    w = StoreWriter(db_path(tmp_path))
    try:
        status_rows(w, now, tmp_path)
        w.write(
            PutRequest(
                make_request(
                    now - 5,
                    now - 600,
                    model="llama3.2:latest",
                    shape=Shape(output_tokens=20, decode_ms=300),
                    prompt_text=XSS_PROMPT,
                    response_text=XSS_REPLY,
                )
            )
        )
    finally:
        w.close()
    with run_app(tmp_path, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 3400})
        page = context.new_page()
        try:
            for path in ("/", "/requests"):
                page.goto(url + path)
                wait_ready(page)
                no_injection(page)
            reply = page.locator('[data-testid="stCode"]', has_text="onerror").first
            reply.wait_for(timeout=UI_TIMEOUT_MS)
            assert reply.inner_text().strip() == XSS_REPLY
            assert page.get_by_text("[click me](http://evil.example)").count() >= 1  # the Markdown link, literally
            screenshot(page, "requests-reply-as-text")
        finally:
            context.close()


def finished_requests(data_dir: Path) -> int:
    conn = queries.open_readonly(data_dir)  # raises until the collector has created the store: wait_until retries
    try:
        return len([r for r in queries.recent_requests(conn, 0) if r.outcome == "ok"])
    finally:
        conn.close()


def test_demo_mode_fills_every_chart(tmp_path: Path, browser: Browser) -> None:
    """``PHASEWATCH_DEMO=1 streamlit run app.py``: the app starts the simulator, a collector and synthetic users
    itself, into a data folder of their own, and the pages fill with what the proxy recorded."""
    # The data folder is shown in the sidebar, and so in the README's picture: a short name, not pytest's.
    data_dir = Path(tempfile.mkdtemp(prefix="phasewatch-"))
    demo_dir = data_dir / "demo"
    try:
        with run_app(data_dir, tmp_path / "app.log", {"PHASEWATCH_DEMO": "1"}) as url:
            context = browser.new_context(viewport={"width": 1400, "height": 3400})
            page = context.new_page()
            try:
                page.goto(url)
                wait_ready(page)
                assert "Demo mode" in page.locator('[data-testid="stMain"]').inner_text()
                # The demo's user chats every few seconds: wait for finished requests in its own store.
                wait_until(lambda: finished_requests(demo_dir) >= 2, 120, "two requests recorded by the demo")
                assert not db_path(data_dir).exists()  # nothing recorded into the real data folder
                try:
                    titles = wait_until(
                        lambda: (
                            (
                                t := page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot'))
                            .map(gd => (gd.layout.title || {}).text || '')""")
                            )
                            and any("Simulated NVIDIA" in x for x in t)
                            and any("Host" in x for x in t)
                            and t
                        ),
                        60,
                        "the simulated GPU's timeline and the host chart (each part of the page refreshes at its own pace)",
                    )
                except AssertionError as e:
                    screenshot(page, "demo-live-failed")
                    raise AssertionError(f"{e}\n{page_report(page, tmp_path / 'app.log')}") from None
                assert any("Host" in t for t in titles)
                # The GPU the README says the demo simulates is the one its pages show (and its picture, below).
                readme_gpu = re.search(r"a simulated (RTX \d+)", README.read_text())
                assert readme_gpu is not None, "README.md no longer says which GPU the demo simulates"
                assert any(f"Simulated NVIDIA GeForce {readme_gpu[1]}" in t for t in titles), (titles, readme_gpu[1])
                screenshot(page, "demo-live")
                write_readme_image(page, url)
                page.goto(url + "/requests")
                wait_ready(page)
                wait_until(lambda: page.locator('[data-testid="stPlotlyChart"]').count() >= 3, 60, "history and one request")
                assert page.locator('[data-testid="stException"]').count() == 0
                screenshot(page, "demo-requests")
            finally:
                context.close()
    finally:
        stopped = stop_demo(demo_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
        assert stopped, "the demo did not stop"


def _gpu_timeline_on_screen(page: Page) -> bool:
    """The simulated GPU's timeline is drawn, visible, and starts inside the window (so the picture shows it)."""
    return bool(
        page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).some(gd =>
            ((gd.layout && gd.layout.title && gd.layout.title.text) || '').includes('Simulated NVIDIA')
            && gd.querySelector('.main-svg') && getComputedStyle(gd).visibility !== 'hidden'
            && gd.getBoundingClientRect().height > 0 && gd.getBoundingClientRect().top < window.innerHeight)""")
    )


def write_readme_image(page: Page, url: str) -> None:
    """The README's picture of the Live page in the demo: one screen (not the full page), at the README's width."""
    page.set_viewport_size(README_IMAGE_VIEWPORT)
    page.goto(url)  # drawn afresh at this width, not a 1400-wide page squeezed
    wait_ready(page)
    wait_until(lambda: _gpu_timeline_on_screen(page), 60, "the simulated GPU's timeline at the README's width")
    # A generation in flight makes the better picture (its card shows the phase it is in); the demo's users send
    # one every few seconds, but a busy machine may miss it: then the picture shows the last finished one.
    with contextlib.suppress(AssertionError):
        wait_until(
            lambda: metric(page, "Generations in flight") not in (None, "0") and _gpu_timeline_on_screen(page),
            30,
            "a generation in flight",
        )
    target = readme_image_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target), full_page=False)
    assert target.stat().st_size > 50_000, target  # a page with its charts drawn, not a blank one
