"""Requests waiting behind busy slots, on the Live page in Chromium: sim has two slots per model; six proxied
requests sent at once leave four waiting. The per-model line counts them and each waiting card says its place in
line. Screenshot ``live_queue.png`` goes to ``$PHASEWATCH_ARTIFACTS``.

The collector records no text here: six replies redrawn each second make a page too heavy to photograph on a busy
two-core machine.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page

from collectors.lock import read_lock
from store.schema import db_path
from tests.e2e.support import (
    ARTIFACTS,
    REPO,
    START_TIMEOUT_S,
    UI_TIMEOUT_MS,
    _stop,
    cards_state,
    page_report,
    run_app,
    wait_ready,
    wait_until,
)
from tests.support.ports import free_port
from tests.support.sim_process import start_sim

pytestmark = pytest.mark.browser

MODEL = "llama3.2:latest"
SENT, SLOTS = 6, 2
SHOT_TIMEOUT_MS = 120_000  # a full-page screenshot under a load average of 15+ took over 30 s


def generate(proxy: str, num_predict: int) -> None:
    body = {"model": MODEL, "prompt": "Tell me a long story", "stream": True, "options": {"num_predict": num_predict}}
    req = urllib.request.Request(f"http://{proxy}/api/generate", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=300) as r:
        while r.read(65536):
            pass


@pytest.fixture(scope="module")
def queue_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    data_dir = tmp_path_factory.mktemp("phasewatch-queue")
    logs = tmp_path_factory.mktemp("logs")
    with start_sim("--hardware", "rtx-4090", "--num-parallel", str(SLOTS)) as sim:
        proxy = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "collectors", "--ollama", sim.base_url, "--listen", proxy, "--data", str(data_dir), "--demo"]
        with open(logs / "collector.log", "wb") as log:
            collector = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: (i := read_lock(data_dir)) is not None and i.listen == proxy, START_TIMEOUT_S, "the collector")
            wait_until(lambda: db_path(data_dir).exists(), START_TIMEOUT_S, "the store")
            generate(proxy, 4)  # loads the model: the six requests below wait only for slots
            with run_app(data_dir, logs / "app.log", {"OLLAMA_HOST": sim.base_url, "PHASEWATCH_LISTEN": proxy}) as url:
                yield url, proxy
        finally:
            _stop(collector)


def send(proxy: str, num_predict: int) -> None:
    with contextlib.suppress(OSError, http.client.HTTPException):  # cut short when sim stops after the test
        generate(proxy, num_predict)


def queue_text(page: Page) -> str:
    return str(page.evaluate("() => document.querySelector('[class*=\"st-key-live_queues\"]')?.innerText ?? ''"))


def test_live_counts_requests_waiting_behind_busy_slots(queue_stack: tuple[str, str], page: Page) -> None:
    app_url, proxy = queue_stack
    page.goto(app_url)
    wait_ready(page)
    # 12,000 tokens at ~190 tok/s each: the first two run ~60 s while four wait (freezing the page and taking its
    # picture took up to 40 s here). The streams end when sim stops after the test.
    threads = [threading.Thread(target=send, args=(proxy, 12_000), daemon=True) for _ in range(SENT)]
    for t in threads:
        t.start()
    want = f"{SLOTS} running · {SENT - SLOTS} waiting"
    try:
        wait_until(lambda: want in queue_text(page), 60, f"'{want}' on Live")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{page_report(page)}") from exc
    # Frozen while it is read and photographed (the sidebar's pause), so the picture shows this moment.
    page.locator('[data-testid="stSidebar"]').get_by_text("Pause live updates").click(force=True, timeout=UI_TIMEOUT_MS)
    wait_ready(page)
    assert want in queue_text(page), f"the queue moved on before the page froze: {queue_text(page)}"
    text = str(cards_state(page)["text"]).lower()
    for line in ("waiting: next in line, 2 running", "waiting: 1 ahead", "waiting: 2 ahead", "waiting: 3 ahead"):
        assert line in text, text
    assert "waiting: 4 ahead" not in text, text
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "live_queue.png"), full_page=True, timeout=SHOT_TIMEOUT_MS)
