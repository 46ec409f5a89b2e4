"""Live's card of a finished generation says when its prompt was cut: "your N-token prompt was cut to M tokens:
num_ctx is K (set by …)", from the stored row (analysis.prompt_fit), and when a prompt too long was refused."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import replace
from pathlib import Path

from analysis.prompt_fit import TOO_LONG_MESSAGE
from analysis.records import Outcome, RequestRecord
from pages.live.cards import Card, finished_cards
from pages.live.ui import finished_line
from store import queries
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.records import make_record


def _stored_cards(data: Path, now: float, *records: RequestRecord) -> dict[str, Card]:
    """Live's finished cards of ``records`` as the page reads them: written to a real store, read back."""
    w = StoreWriter(db_path(data))
    try:
        for rec in records:
            w.write(PutRequest(rec))
    finally:
        w.close()
    conn = sqlite3.connect(db_path(data))
    try:
        rows = queries.recent_requests(conn, now - 60)
    finally:
        conn.close()
    return {c.request_id: c for c in finished_cards(rows, now + 1, keep_s=60)}


def test_the_finished_card_says_the_prompt_was_cut(tmp_path: Path) -> None:
    now = time.time()
    base = make_record("cut", now - 3)
    assert base.metrics is not None
    cut = replace(
        base,
        metrics=replace(base.metrics, prompt_eval_count=1027),
        num_ctx=2048,
        prompt_sent_tokens=6000,
        prompt_sent_source="log",
        prompt_kept_tokens=1027,
        num_ctx_in_force=2048,
        num_ctx_source="request",
    )
    refused = replace(
        make_record("refused", now - 2, n_tokens=0),
        metrics=None,
        status_code=400,
        outcome=Outcome.HTTP_ERROR,
        error=TOO_LONG_MESSAGE,
        num_ctx=2048,
        prompt_chars=24_000,
        num_ctx_in_force=2048,
        num_ctx_source="request",
    )
    plain = make_record("plain", now - 1)
    cards = _stored_cards(tmp_path, now, cut, refused, plain)
    assert cards["cut"].prompt_cut == (
        "your 6,000-token prompt was cut to 1,027 tokens: num_ctx is 2,048 (set by the request's options.num_ctx)"
    )
    assert cards["refused"].prompt_cut == (
        "your prompt was refused (400): longer than the context: num_ctx is 2,048 (set by the request's options.num_ctx)"
    )
    assert cards["plain"].prompt_cut is None


def test_a_card_that_failed_before_any_phase_ends_without_a_dangling_separator(tmp_path: Path) -> None:
    """A request refused before any phase ran has no phase times: its line ends with its tokens, not with " · "."""
    now = time.time()
    refused = replace(make_record("refused", now - 2, n_tokens=0), metrics=None, status_code=500, outcome=Outcome.HTTP_ERROR)
    cards = _stored_cards(tmp_path, now, refused, make_record("plain", now - 1))
    failed, plain = finished_line(cards["refused"]), finished_line(cards["plain"])
    assert not failed.rstrip().endswith("·") and failed.endswith("tokens"), failed
    assert plain.count(" · ") >= 2 and not plain.endswith("·"), plain  # its phases follow its tokens
