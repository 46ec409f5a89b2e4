"""A request not streamed to its client, decoding on the real llama-server, on the Live page in Chromium (issue 40
item 2): the proxy sees no chunk until the reply ends, so the card's phase and token count come from the runner's
own ``/slots`` (``n_decoded``): "writing the reply (decode)", tokens so far rising, the runner's count, not "reading
the prompt (prefill)". Screenshot ``live_engine_unstreamed_decode.png`` goes to ``$PHASEWATCH_ARTIFACTS``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from tests.e2e.engine_stack import OPTIONS, engine_stack
from tests.e2e.support import cards_state, quick_shot, tokens_so_far, wait_ready, wait_until
from tests.support.engine_process import MODEL, words_prompt

pytestmark = [pytest.mark.browser, pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]
__all__ = ["engine_stack"]  # the fixture (tests/e2e/engine_stack.py), used by name

NUM_PREDICT = 600  # two shared cores decode Gemma 270M at tens of tok/s: a reply of 10 s or more
DECODE_SEEN_S = 180  # from sending to the decode card (prompt of ~300 tokens): the margin for a loaded machine


def generate_whole(proxy: str, out: dict[str, Any]) -> None:
    """A non-streamed generate through the proxy: one JSON body at the end."""
    body = {
        "model": MODEL,
        "prompt": words_prompt(300, seed=3),
        "stream": False,
        "options": {**OPTIONS, "num_predict": NUM_PREDICT},
    }
    req = urllib.request.Request(f"http://{proxy}/api/generate", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        out["final"] = json.load(r)


def test_a_request_not_streamed_shows_decode_with_the_runners_count(engine_stack: tuple[str, str, Path], page: Page) -> None:
    app_url, proxy, _data = engine_stack
    page.goto(app_url)
    wait_ready(page)
    wait_until(lambda: "finished" not in str(cards_state(page)["text"]), 60, "the warm-up's card to go")
    out: dict[str, Any] = {}
    errors: list[BaseException] = []

    def send() -> None:
        try:
            generate_whole(proxy, out)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threading.Thread(target=send, daemon=True).start()

    def decode_card() -> str | None:
        text = str(cards_state(page)["text"])
        return text if "writing the reply (decode)" in text else None

    text = str(wait_until(decode_card, DECODE_SEEN_S, "the decode card of the request not streamed"))
    counts: list[int] = []
    shot: Path | None = None
    while "writing the reply (decode)" in text and "final" not in out and not errors:
        n = tokens_so_far(text)
        if n is not None and (not counts or n > counts[-1]):
            counts.append(n)
            assert "(the runner's count)" in text and "reading the prompt" not in text, text
            if len(counts) == 3:
                shot = quick_shot(page, "live_engine_unstreamed_decode")
        time.sleep(0.3)
        text = str(cards_state(page)["text"])
    print(f"\ndecode card token counts: {counts}")
    assert not errors, errors
    assert len(counts) >= 3 and counts == sorted(counts), f"the runner's count must rise on the card: {counts}"
    assert shot is not None
    wait_until(lambda: "final" in out, 300, "the reply")
    assert counts[-1] <= int(out["final"]["eval_count"])  # the runner's count, never more than the reply's
