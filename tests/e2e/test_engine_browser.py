"""The whole path in a real browser on the real engine: llama-server → proxy → store → Streamlit, in Chromium.

Starts ``python -m sim --engine llama-server`` (llama.cpp's server as a child, Gemma 3 270M on this CPU), ``python -m collectors``
in front of it (no ``--demo``: it samples this machine, which has no NVIDIA GPU) and ``streamlit
run app.py``, all on free loopback ports; sends one generation through the proxy with the official
``ollama`` client, and watches it on the Live page while it runs and on the Requests page afterwards
with the prefill and decode numbers the store holds. A second test starts the demo on the real
engine from the app (``PHASEWATCH_DEMO=engine``) and checks that every page says so.
Screenshots go to ``$PHASEWATCH_ARTIFACTS`` (``engine_live.png``, ``engine_requests.png``, ``engine_demo.png``).

Without the llama-server build or the GGUF these tests skip, and fail under ``PHASEWATCH_REQUIRE_ENGINE=1``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ollama
import pytest
from playwright.sync_api import Page

from collectors.demo import read_demo_lock, stop_demo
from collectors.lock import read_lock
from pages.shared import fmt
from pages.shared.common import ENGINE_DEMO_LABEL
from pages.shared.settings import DEMO_ENGINE_SUBDIR
from store import queries
from store.schema import db_path
from tests.e2e.support import (
    REPO,
    START_TIMEOUT_S,
    UI_TIMEOUT_MS,
    _stop,
    live_snapshot,
    metric,
    pick_request,
    run_app,
    screenshot,
    wait_ready,
    wait_until,
)
from tests.support.engine_process import GREEDY, MODEL, require_llama_server, start_server_engine, words_prompt

pytestmark = [pytest.mark.browser, pytest.mark.engine]


@dataclass
class EngineStack:
    app_url: str
    engine_url: str
    proxy: str  # host:port
    data_dir: Path


@pytest.fixture(scope="module")
def engine_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineStack]:
    require_llama_server()  # skips, or fails under PHASEWATCH_REQUIRE_ENGINE=1
    data_dir = tmp_path_factory.mktemp("phasewatch-engine-data")
    logs = tmp_path_factory.mktemp("engine-logs")
    with start_server_engine() as engine:
        from tests.support.ports import free_port

        proxy = f"127.0.0.1:{free_port()}"
        with open(logs / "collector.log", "wb") as log:
            collector = subprocess.Popen(
                [sys.executable, "-m", "collectors", "--ollama", engine.base_url, "--listen", proxy, "--data", str(data_dir)],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: (i := read_lock(data_dir)) is not None and i.listen == proxy, START_TIMEOUT_S, "the collector")
            wait_until(lambda: db_path(data_dir).exists(), START_TIMEOUT_S, "the store")
            env = {"OLLAMA_HOST": engine.base_url, "PHASEWATCH_LISTEN": proxy}
            with run_app(data_dir, logs / "app.log", env) as url:
                yield EngineStack(url, engine.base_url, proxy, data_dir)
        finally:
            _stop(collector)


def test_generation_on_the_real_engine_live_then_in_history(engine_stack: EngineStack, page: Page) -> None:
    page.goto(engine_stack.app_url)
    wait_ready(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    wait_until(lambda: f"OLLAMA_HOST={engine_stack.proxy}" in sidebar.inner_text(), 30, "the proxy line in the sidebar")
    # Not a demo: the collector watches the engine like a real Ollama, and no banner claims a simulator.
    assert "Demo mode" not in page.locator('[data-testid="stMain"]').inner_text()

    # Long enough to be caught running on a loaded machine: ~300 prompt tokens, 64 decoded one by one.
    client = ollama.Client(host=f"http://{engine_stack.proxy}", timeout=300)
    prompt = words_prompt(300, seed=11)
    done: list[object] = []
    failures: list[BaseException] = []

    def generate() -> None:
        try:
            done.append(
                list(client.generate(model=MODEL, prompt=prompt, raw=True, stream=True, options={**GREEDY, "num_predict": 64}))
            )
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    worker = threading.Thread(target=generate, daemon=True)
    worker.start()
    seen: list[tuple[str | None, list[str]]] = []

    def live_shows_it() -> bool:
        value, models = live_snapshot(page)
        seen.append((value, models))
        return value == "1" and MODEL in models

    try:
        wait_until(live_shows_it, 120, "the generation in flight on the Live page")
    except AssertionError as exc:
        screenshot(page, "engine_live-FAILED")
        raise AssertionError(f"{exc}; readings: {seen[-20:]}") from None
    screenshot(page, "engine_live")

    worker.join(300)
    assert not worker.is_alive(), "the generation did not finish within 300 s"
    assert not failures, failures
    final = done[0][-1]  # type: ignore[index]
    assert final.done and final.eval_count == 64 and final.prompt_eval_count >= 200

    conn = queries.open_readonly(engine_stack.data_dir)
    try:
        row = wait_until(
            lambda: next((r for r in queries.recent_requests(conn, 0) if r.outcome == "ok"), None),
            30,
            "the finished request in the store",
        )
    finally:
        conn.close()
    assert row.model == MODEL
    assert row.prefill_s > 0 and row.decode_s > 0
    wait_until(lambda: metric(page, "Generations in flight") == "0", 60, "the Live page to see it finish")

    page.goto(engine_stack.app_url + "/requests")
    wait_ready(page)
    pick_request(page, row.id)
    expected = {
        "First token": fmt.seconds(row.ttft_s),
        "Prefill": fmt.seconds(row.prefill_s),
        "Decode": fmt.seconds(row.decode_s),
    }
    wait_until(lambda: all(metric(page, k) == v for k, v in expected.items()), 30, f"the phase numbers {expected}")
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 3  # history, waterfall, gaps
    screenshot(page, "engine_requests")


def test_demo_on_the_real_engine_says_so(tmp_path: Path, page: Page) -> None:
    require_llama_server()
    demo_dir = tmp_path / DEMO_ENGINE_SUBDIR
    try:
        with run_app(tmp_path, tmp_path / "app.log", {"PHASEWATCH_DEMO": "engine"}) as url:
            page.goto(url)
            wait_ready(page)
            main = page.locator('[data-testid="stMain"]')
            wait_until(lambda: ENGINE_DEMO_LABEL in main.inner_text(), 30, "the real-engine demo banner")
            assert "simulator" not in main.inner_text()
            demo = wait_until(lambda: read_demo_lock(demo_dir), 60, "the demo's lock")
            assert demo.engine == "llama-cpp"
            # The demo's synthetic user gets a completion recorded through the proxy.
            wait_until(lambda: db_path(demo_dir).exists(), START_TIMEOUT_S, "the demo's store")

            def recorded() -> bool:
                conn = queries.open_readonly(demo_dir)
                try:
                    return any(r.model == MODEL and r.outcome == "ok" for r in queries.recent_requests(conn, 0))
                finally:
                    conn.close()

            wait_until(recorded, 180, "a demo completion in the store")
            page.goto(url + "/requests")
            wait_ready(page)
            wait_until(lambda: ENGINE_DEMO_LABEL in main.inner_text(), 30, "the banner on the Requests page")
            # The latest request is picked by default: its phase numbers are drawn once the page has settled.
            wait_until(lambda: metric(page, "Prefill") and metric(page, "Decode"), 60, "the demo request's phases")
            page.locator('[data-testid="stPlotlyChart"]').first.wait_for(timeout=UI_TIMEOUT_MS)
            wait_ready(page)
            screenshot(page, "engine_demo")
    finally:
        assert stop_demo(demo_dir, timeout_s=20), "the demo did not stop"
