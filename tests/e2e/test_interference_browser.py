"""One request slowed by another's prompt, on Live and Requests in Chromium: sim (an Apple M1 profile, two slots,
its roofline engine batching as llama-server does, Ollama's log read by the collector: its start line says
OLLAMA_NUM_PARALLEL=2) behind the real collector; a 5,304-token prompt is streamed and
a short chat sent while it is read. Live's card of the short chat says "slowed: another request's … prompt is being
read" while it happens; afterwards its Requests detail draws the other prefill beside it and names it in its
verdict. Screenshots ``interference_live.png`` and ``interference_request.png`` under ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import contextlib
import http.client
import json
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page

from collectors.lock import read_lock
from sim.tokens import make_prompt
from store.schema import db_path
from tests.e2e.support import (
    ARTIFACTS,
    REPO,
    START_TIMEOUT_S,
    _stop,
    cards_state,
    page_report,
    run_app,
    screenshot,
    wait_ready,
    wait_until,
)
from tests.support.ports import free_port
from tests.support.sim_process import start_sim

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MODEL = "llama3.2:latest"
LONG_TOKENS = 12_000  # ~50 s of prefill on the M1 profile: long enough to photograph the stall on a busy machine
SHOT_TIMEOUT_MS = 120_000


def generate(proxy: str, prompt: str, num_predict: int) -> None:
    body = {"model": MODEL, "prompt": prompt, "stream": True, "options": {"num_predict": num_predict, "num_ctx": 16384}}
    req = urllib.request.Request(f"http://{proxy}/api/generate", data=json.dumps(body).encode(), method="POST")
    with contextlib.suppress(OSError, http.client.HTTPException), urllib.request.urlopen(req, timeout=300) as r:
        while r.read(65536):
            pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    data_dir = tmp_path_factory.mktemp("phasewatch-interference")
    logs = tmp_path_factory.mktemp("logs")
    ollama_log = logs / "ollama.log"  # sim writes Ollama's log; its start line says OLLAMA_NUM_PARALLEL=2
    with start_sim("--hardware", "m1", "--num-parallel", "2", "--log-file", str(ollama_log)) as sim:
        proxy = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "collectors", "--ollama", sim.base_url, "--listen", proxy, "--data", str(data_dir)]
        cmd += ["--demo", "--ollama-log", str(ollama_log)]
        with open(logs / "collector.log", "wb") as log:
            collector = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: (i := read_lock(data_dir)) is not None and i.listen == proxy, START_TIMEOUT_S, "the collector")
            wait_until(lambda: db_path(data_dir).exists(), START_TIMEOUT_S, "the store")
            generate(proxy, "warm up", 2)  # loads the model
            with run_app(data_dir, logs / "app.log", {"OLLAMA_HOST": sim.base_url, "PHASEWATCH_LISTEN": proxy}) as url:
                yield url, proxy, str(db_path(data_dir))
        finally:
            _stop(collector)


def in_flight(db: str) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM requests WHERE outcome = 'in_flight'").fetchone()[0])
    finally:
        conn.close()


def short_request_id(db: str) -> str | None:
    """The newest request (the short chat), once it finished."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT id, outcome FROM requests ORDER BY started_at_unix_s DESC LIMIT 1").fetchone()
    finally:
        conn.close()
    return str(row[0]) if row and row[1] != "in_flight" else None


def test_the_short_chat_is_told_slowed_on_live_and_requests(stack: tuple[str, str, str], page: Page) -> None:
    app_url, proxy, db = stack
    page.goto(app_url)
    wait_ready(page)
    long = threading.Thread(target=generate, args=(proxy, make_prompt(LONG_TOKENS, seed=46), 8), daemon=True)
    long.start()
    wait_until(lambda: in_flight(db) == 1, 30, "the long prompt in flight")
    time.sleep(2.0)  # into its prefill
    short = threading.Thread(target=generate, args=(proxy, "Say hello.", 24), daemon=True)
    short.start()
    want = "slowed: another request's"
    try:
        wait_until(lambda: want in str(cards_state(page)["text"]), 60, f"'{want}' on Live")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{page_report(page)}") from exc
    # The card photographed at once, while it happens (pausing the page, or a full-page picture, took longer than
    # the stall on this busy machine).
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    slowed = page.locator('[class*="st-key-card_"]', has_text=want).first
    slowed.screenshot(path=str(ARTIFACTS / "interference_live.png"), timeout=SHOT_TIMEOUT_MS)
    long.join(timeout=120)
    short.join(timeout=120)
    wait_until(lambda: short_request_id(db) is not None, 30, "the short chat stored")
    rid = short_request_id(db)
    page.goto(f"{app_url}/requests?request={rid}")
    wait_ready(page)
    try:
        wait_until(
            lambda: page.get_by_text("Another request's prompt, read on the same runner, cost this one").count() > 0,
            60,
            "the verdict",
        )
    except AssertionError:
        screenshot(page, "interference_request_failed")
        raise
    assert page.get_by_text("went to reading the").count() == 0  # not its own prompt
    # Two slots (Ollama's start line): its wait was for the other prompt's batches, drawn so, not a queue.
    wait_until(lambda: page.get_by_text("waiting for another request's batches").count() > 0, 30, "the batch wait bar")
    screenshot(page, "interference_request")
