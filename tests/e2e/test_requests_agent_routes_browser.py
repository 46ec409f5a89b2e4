"""The coding agents' routes on the Requests page, in Chromium: a ``/v1/messages`` (Claude Code) and a
``/v1/responses`` (Codex) request are listed with their routes, and the Endpoint filter offers and picks each.
Screenshot ``requests_agent_routes.png`` goes to ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import Page

from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import UI_TIMEOUT_MS, run_app, screenshot, wait_ready, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def proxied(t0: float, rid: str, endpoint: str, prompt: int, output: int) -> RequestRecord:
    """A streamed request the proxy recorded: TTFT 0.4 s, one token every 20 ms, the counts from its usage."""
    base_ns = 10**12
    tokens = [base_ns + 400_000_000 + i * 20_000_000 for i in range(output)]
    return RequestRecord(
        id=rid,
        started_at_unix_s=t0,
        client_addr="127.0.0.1",
        endpoint=endpoint,
        model="qwen2.5:0.5b",
        stream=True,
        kind=RequestKind.GENERATE,
        received_ns=base_ns,
        forwarded_ns=base_ns + 100_000,
        first_byte_ns=tokens[0],
        token_chunk_ns=tokens,
        first_token_ns=tokens[0],
        first_answer_ns=tokens[0],
        final_chunk_ns=tokens[-1],
        closed_ns=tokens[-1] + 1_000_000,
        status_code=200,
        outcome=Outcome.OK,
        metrics=FinalMetrics(prompt_eval_count=prompt, eval_count=output, done_reason="end_turn"),
    )


def test_agent_routes_listed_and_filtered(page: Page, tmp_path: Path) -> None:
    data = tmp_path / "data"
    t0 = time.time() - 120
    w = StoreWriter(db_path(data))
    try:
        w.write(PutRequest(proxied(t0, "a" * 32, "/v1/messages", 812, 64)))
        w.write(PutRequest(proxied(t0 + 5, "b" * 32, "/v1/responses", 433, 32)))
    finally:
        w.close()
    with run_app(data, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(f"{url}/requests")
        wait_ready(page)
        wait_until(lambda: "/v1/responses" in page.inner_text("body"), 60, "the requests listed")
        box = page.locator('[data-testid="stSelectbox"]', has_text="Endpoint")
        box.click(timeout=UI_TIMEOUT_MS)
        options = page.get_by_role("option").all_inner_texts()
        assert "/v1/messages" in options and "/v1/responses" in options, options
        page.get_by_role("option", name="/v1/messages").click(timeout=UI_TIMEOUT_MS)
        # The table is drawn on a canvas: its count, the request picker and the flag's sentence say what it holds.
        wait_until(lambda: "1 request in the last" in page.inner_text("body"), 60, "filtered to one request")
        wait_until(lambda: "the /v1/messages route sends no durations" in page.inner_text("body"), 60, "its route named")
        body = page.inner_text("body")
        assert "qwen2.5:0.5b · /v1/messages · generate" in body and "· /v1/responses ·" not in body, body[:3000]
        screenshot(page, "requests_agent_routes")
