"""A long prompt moving through its phases on the Live page, in Chromium, on the simulator's slow CPU profile.

``python -m sim --hardware cpu`` reads an 8,000-token prompt into qwen2.5:0.5b in about 20 s. The collector
(no recorded text) writes an estimated prefill progress each second from the prompt's characters; the
page's card must show a progress bar that moves at least 3 times before the first token, then a decode
card whose token count rises, then the finished card with its link to Requests. Screenshots
(``live_prefill.png``, ``live_decode.png``, ``live_finished.png``) go to ``$PHASEWATCH_ARTIFACTS``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from collectors.lock import read_lock
from sim.tokens import make_prompt
from store.schema import db_path
from tests.e2e.support import (
    REPO,
    START_TIMEOUT_S,
    _stop,
    cards_state,
    quick_shot,
    run_app,
    screenshot,
    tokens_so_far,
    wait_ready,
    wait_until,
)
from tests.support.ports import free_port
from tests.support.sim_process import start_sim

pytestmark = pytest.mark.browser

MODEL = "qwen2.5:0.5b"
OPTIONS = {"num_ctx": 16384}  # the same context for both requests: no reload between them


def generate(proxy: str, prompt: str, num_predict: int, stream: bool) -> None:
    body = {"model": MODEL, "prompt": prompt, "stream": stream, "options": {**OPTIONS, "num_predict": num_predict}}
    req = urllib.request.Request(f"http://{proxy}/api/generate", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=180) as r:
        while r.read(65536):
            pass


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    data_dir = tmp_path_factory.mktemp("phasewatch-live")
    logs = tmp_path_factory.mktemp("logs")
    with start_sim("--hardware", "cpu") as sim:
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
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: (i := read_lock(data_dir)) is not None and i.listen == proxy, START_TIMEOUT_S, "the collector")
            wait_until(lambda: db_path(data_dir).exists(), START_TIMEOUT_S, "the store")
            # One short request first: loads the model and gives the estimate this model's tokens per character
            # and prefill rate.
            generate(proxy, make_prompt(500, seed=1), 20, stream=False)
            with run_app(data_dir, logs / "app.log", {"OLLAMA_HOST": sim.base_url, "PHASEWATCH_LISTEN": proxy}) as url:
                yield url, proxy
        finally:
            _stop(collector)


def test_long_prompt_moves_through_prefill_decode_and_finish(slow_stack: tuple[str, str], page: Page) -> None:
    app_url, proxy = slow_stack
    page.goto(app_url)
    wait_ready(page)
    errors: list[BaseException] = []

    def send() -> None:
        try:
            generate(proxy, make_prompt(8000, seed=8), 500, stream=True)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sent_at = time.monotonic()
    sender.start()

    # Prefill: the bar's value, each time it changes, until the decode card appears.
    values: list[int] = []
    seen_at: list[float] = []  # seconds after sending, for the failure message
    shot_prefill: Path | None = None
    deadline = time.monotonic() + 90
    text = ""
    while time.monotonic() < deadline:
        state = cards_state(page)
        text = str(state["text"])
        if "writing the reply (decode)" in text:
            break
        bars = [int(v) for v in state["bars"]]  # type: ignore[attr-defined]
        if bars and (not values or bars[0] != values[-1]):
            values.append(bars[0])
            seen_at.append(round(time.monotonic() - sent_at, 1))
            if len(values) == 3 and shot_prefill is None:
                assert "reading the prompt (prefill)" in text and "estimated" in text, text
                shot_prefill = quick_shot(page, "live_prefill")
        time.sleep(0.3)
    assert not errors, errors
    assert "writing the reply (decode)" in text, f"no decode card within 90 s; bar values seen: {values}"
    assert len(values) >= 3 and values == sorted(values), f"the bar must advance at least 3 times: {values} at {seen_at} s"
    assert "of 8," in text or shot_prefill is not None

    # Decode: the token count rises while it runs.
    counts: list[int] = []
    shot_decode = None
    while len(counts) < 3 and "writing the reply (decode)" in text:
        n = tokens_so_far(text)
        if n is not None and (not counts or n > counts[-1]):
            counts.append(n)
            if len(counts) == 2:
                shot_decode = quick_shot(page, "live_decode")
        time.sleep(0.3)
        text = str(cards_state(page)["text"])
    assert len(counts) >= 2 and counts == sorted(counts), f"the decode card's token count must rise: {counts}"
    assert shot_decode is not None

    # Finished: the card stays with its phases and a link to the request's detail.
    sender.join(120)
    assert not errors, errors
    wait_until(lambda: "Details in Requests" in str(cards_state(page)["text"]), 30, "the finished card")
    finished = str(cards_state(page)["text"])
    assert "finished" in finished and "prefill" in finished and "decode" in finished, finished
    screenshot(page, "live_finished")
    link = page.get_by_role("link", name="Details in Requests").first.get_attribute("href") or ""
    assert "request=" in link
