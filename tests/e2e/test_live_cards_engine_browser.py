"""A ~4,000-token prompt moving through its phases on the Live page, in Chromium, on the real llama-server.

``python -m sim --engine llama-server`` runs llama.cpp's server as a child, as Ollama does, serving Gemma 3 270M;
``python -m collectors`` in front of it finds that child as Ollama's runner and reads its ``/slots`` while the
prompt is read. The page's card must show a progress bar read from the runner (not marked estimated) that moves
at least 3 times before the first token, then a decode card whose token count rises, then the finished card.
Screenshots (``live_engine_prefill.png``, ``live_engine_decode.png``, ``live_engine_finished.png``) go to
``$PHASEWATCH_ARTIFACTS``. Without the llama-server build or the GGUF it skips, and fails under
``PHASEWATCH_REQUIRE_ENGINE=1``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from analysis.records import ProgressSource
from store import queries
from store.schema import db_path
from tests.e2e.engine_stack import engine_stack, generate
from tests.e2e.support import (
    cards_state,
    quick_shot,
    screenshot,
    tokens_so_far,
    wait_ready,
    wait_until,
)
from tests.support.engine_process import words_prompt

pytestmark = [pytest.mark.browser, pytest.mark.engine, pytest.mark.timeout(900)]
__all__ = ["engine_stack"]  # the fixture (tests/e2e/engine_stack.py), used by name

PROMPT_WORDS = 4000  # about one token per word with Gemma's tokenizer
PREFILL_TIMEOUT_S = 240  # two shared cores read ~4,000 tokens in well under a minute; this is the margin


def test_real_prefill_progress_then_decode_on_the_live_page(engine_stack: tuple[str, str, Path], page: Page) -> None:
    app_url, proxy, data_dir = engine_stack
    page.goto(app_url)
    wait_ready(page)
    # The warm-up request's finished card stays a few seconds: the cards below must be the long prompt's.
    wait_until(lambda: "finished" not in str(cards_state(page)["text"]), 60, "the warm-up's card to go")
    out: dict[str, Any] = {}
    errors: list[BaseException] = []

    def send() -> None:
        try:
            generate(proxy, words_prompt(PROMPT_WORDS, seed=15), 200, out)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()

    # Prefill: the bar's value each time it changes, until the decode card appears.
    values: list[int] = []
    seen_at: list[float] = []  # seconds after sending, for the failure message
    prefill_texts: list[str] = []
    shot_prefill: Path | None = None
    deadline = time.monotonic() + PREFILL_TIMEOUT_S
    text = ""
    while time.monotonic() < deadline and not errors:
        state = cards_state(page)
        text = str(state["text"])
        if "writing the reply (decode)" in text or "finished" in text:
            break
        bars = [int(v) for v in state["bars"]]  # type: ignore[attr-defined]
        if bars and (not values or bars[0] != values[-1]):
            values.append(bars[0])
            seen_at.append(round(time.time() - out.get("sent", time.time()), 1))
            prefill_texts.append(text)
            if len(values) == 3 and shot_prefill is None:
                shot_prefill = quick_shot(page, "live_engine_prefill")
        time.sleep(0.2)
    assert not errors, errors
    assert "writing the reply (decode)" in text, f"no decode card within {PREFILL_TIMEOUT_S} s; bar values seen: {values}"
    print(f"\nbar values before the first token: {values} at {seen_at} s")
    assert len(values) >= 3 and values == sorted(values), f"the bar must advance at least 3 times: {values} at {seen_at} s"
    assert shot_prefill is not None
    for seen in prefill_texts:
        assert "reading the prompt (prefill)" in seen and "prompt tokens read" in seen, seen
        assert "estimated" not in seen, f"a runner reading, not the estimate: {seen}"
    for seen in prefill_texts[2:]:  # two readings of progress: a rate and an ETA, between the runner's steps too
        assert "ETA —" not in seen and " 0.00 tok/s" not in seen, seen

    # Decode: the token count rises while it runs.
    counts: list[int] = []
    shot_decode = None
    while len(counts) < 3 and "writing the reply (decode)" in text:
        n = tokens_so_far(text)
        if n is not None and (not counts or n > counts[-1]):
            counts.append(n)
            if len(counts) == 2:
                shot_decode = quick_shot(page, "live_engine_decode")
        time.sleep(0.2)
        text = str(cards_state(page)["text"])
    print(f"decode card token counts: {counts}")
    assert len(counts) >= 2 and counts == sorted(counts), f"the decode card's token count must rise: {counts}"
    assert shot_decode is not None

    # Finished: the card stays with its phases and a link to the request's detail.
    sender.join(300)
    assert not errors, errors
    wait_until(lambda: "Details in Requests" in str(cards_state(page)["text"]), 30, "the finished card")
    finished = str(cards_state(page)["text"])
    assert "finished" in finished and "prefill" in finished and "decode" in finished, finished
    screenshot(page, "live_engine_finished")

    # What the bar drew: the runner's own readings of this request, the last within one batch of the prompt's size.
    prompt_size = int(out["final"]["prompt_eval_count"])
    assert 3500 < prompt_size < 4500, prompt_size
    with queries.open_reader(db_path(data_dir)) as conn:
        assert conn is not None
        rows = queries.progress_samples(conn, [out["id"]])[out["id"]]
    read = [s.processed_tokens for s in rows if s.source is ProgressSource.SLOTS and not s.decoded_tokens]
    print(f"/slots readings stored: {read} of {prompt_size}")
    assert len(set(read)) >= 3 and max(read) >= prompt_size - 512
