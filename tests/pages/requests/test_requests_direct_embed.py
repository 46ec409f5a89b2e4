"""Issue 41: a direct embed call is one request on the Requests page and in usage, counted apart from generations,
and its detail says how it was gathered (its inputs' runner tasks, by Ollama's access line), not a generation's
prefill and decode."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path

from analysis.records import RequestKind
from pages.requests.usage import load_usage, usage_csv, usage_frame
from pages.requests.view import build_history, direct_sentence, history_caption
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.direct_records import EMBED_INPUTS, direct_embed, direct_success


def _store(tmp_path: Path, now: float) -> Path:
    w = StoreWriter(db_path(tmp_path))
    try:
        w.write(PutRequest(direct_success(now - 300)))
        w.write(PutRequest(direct_embed(now - 200)))
    finally:
        w.close()
    return db_path(tmp_path)


def test_usage_counts_the_embed_call_apart(tmp_path: Path) -> None:
    now = time.time()
    db = _store(tmp_path, now)
    rows = load_usage(db, now) or []
    (day,) = [r for r in rows if r.period == "1 day" and r.by == "client" and r.key == "10.0.0.7"]
    assert day.requests == 1 and day.embeddings == 1  # forty inputs: one call
    assert day.prompt_tokens.value == sum(7 + i % 5 for i in range(EMBED_INPUTS)) and day.output_tokens.unknown == 0
    other = next(r for r in rows if r.period == "1 day" and r.by == "client" and r.key == "10.0.0.5")
    assert other.requests == 1 and other.embeddings == 0
    frame = usage_frame(rows, "client", "1 day")
    assert dict(zip(frame["client"], frame["of which embeddings"], strict=True)) == {"10.0.0.7": 1, "10.0.0.5": 0}
    table = list(csv.DictReader(io.StringIO(usage_csv(rows).decode())))
    assert {r["key"]: r["embeddings"] for r in table if r["period"] == "1 day" and r["by"] == "client"} == {
        "10.0.0.7": "1",
        "10.0.0.5": "0",
    }


def test_the_history_lists_one_embed_call_and_says_so(tmp_path: Path) -> None:
    now = time.time()
    db = _store(tmp_path, now)
    history = build_history(db, now - 3600, now)
    assert history is not None
    assert sorted(r.kind for r in history.rows) == [RequestKind.EMBED, RequestKind.GENERATE]
    assert (
        history_caption(history.rows, "1 hour", False, 500)
        == "2 requests (1 of them embed call) in the last 1 hour, newest first."
    )
    assert history_caption(history.rows[:0], "1 hour", False, 500) == "0 requests in the last 1 hour, newest first."
    embed = next(r for r in history.rows if r.kind is RequestKind.EMBED)
    assert embed.batch_size == EMBED_INPUTS
    text = direct_sentence(embed)
    assert text is not None and "each input was its own runner task" in text and "prefill and decode" not in text
