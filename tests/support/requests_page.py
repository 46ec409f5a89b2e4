"""The Requests page over four kinds of reply (thinking, whole body, a /v1 stream, an embed batch) written
with the collector's own StoreWriter, and the page's detail view of one of them in AppTest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
MS = 1_000_000
T0 = 50_000 * MS


def kind_record(id: str, started: float, **kw: Any) -> RequestRecord:
    base: dict[str, Any] = dict(
        id=id,
        started_at_unix_s=started,
        client_addr="127.0.0.1:1",
        endpoint="/api/generate",
        model="qwen3:0.6b",
        stream=True,
        received_ns=T0,
        forwarded_ns=T0 + MS,
        first_byte_ns=T0 + 2 * MS,
        outcome=Outcome.OK,
        status_code=200,
    )
    base.update(kw)
    return RequestRecord(**base)


def write_records(data_dir: Path, now: float) -> dict[str, RequestRecord]:
    """The four requests, written as the collector writes them."""
    chunks = [T0 + (200 + 10 * i) * MS for i in range(40)]  # 15 thinking, then 25 answer
    final = chunks[-1] + MS
    metrics = FinalMetrics(
        total_duration_ns=final - T0 - MS,
        load_duration_ns=5 * MS,
        prompt_eval_count=100,
        prompt_eval_cached_count=0,
        prompt_eval_duration_ns=150 * MS,
        eval_count=40,
        eval_duration_ns=chunks[-1] - chunks[0],
        done_reason="stop",
    )
    recs = {
        "thinking": kind_record(
            "thinking",
            now - 40,
            token_chunk_ns=chunks,
            first_token_ns=chunks[0],
            final_chunk_ns=final,
            closed_ns=final,
            thinking_chunks=15,
            last_thinking_ns=chunks[14],
            first_answer_ns=chunks[15],
            metrics=metrics,
        ),
        "whole": kind_record(
            "whole", now - 30, stream=False, model="qwen2.5:0.5b", final_chunk_ns=final, closed_ns=final, metrics=metrics
        ),
        "v1": kind_record(
            "v1",
            now - 20,
            endpoint="/v1/chat/completions",
            model="qwen2.5:0.5b",
            token_chunk_ns=chunks,
            first_token_ns=chunks[0],
            final_chunk_ns=final,
            closed_ns=final,
            first_answer_ns=chunks[0],
            metrics=FinalMetrics(done_reason="stop"),
        ),
        "embed": kind_record(
            "embed",
            now - 10,
            endpoint="/api/embed",
            kind=RequestKind.EMBED,
            stream=False,
            batch_size=3,
            model="qwen2.5:0.5b",
            final_chunk_ns=T0 + 300 * MS,
            closed_ns=T0 + 300 * MS,
            metrics=FinalMetrics(total_duration_ns=290 * MS, load_duration_ns=40 * MS, prompt_eval_count=500),
        ),
    }
    w = StoreWriter(db_path(data_dir))
    for rec in recs.values():
        w.write(PutRequest(rec))
    w.close()
    return recs


def open_request(request_id: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/requests/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    at.selectbox(key="req_pick").set_value(request_id).run()
    assert not at.exception, [e.value for e in at.exception]
    return at
