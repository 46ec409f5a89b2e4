"""The Requests page (AppTest) on a thinking reply, a non-streamed reply, a /v1 stream and an embed batch,
written with the collector's own StoreWriter: the right first-token headline for each, the thinking split,
and where each number came from ("—" where it is not known, never 0)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
MS = 1_000_000
T0 = 50_000 * MS


def _rec(id: str, started: float, **kw: Any) -> RequestRecord:
    base: dict[str, Any] = dict(id=id, started_at_unix_s=started, client_addr="127.0.0.1:1", endpoint="/api/generate",
                                model="qwen3:0.6b", stream=True, received_ns=T0, forwarded_ns=T0 + MS, first_byte_ns=T0 + 2 * MS,
                                outcome=Outcome.OK, status_code=200)  # fmt: skip
    base.update(kw)
    return RequestRecord(**base)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, RequestRecord]:
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    monkeypatch.delenv("PHASEWATCH_DEMO", raising=False)
    return write_records(tmp_path, time.time())


def write_records(data_dir: Path, now: float) -> dict[str, RequestRecord]:
    """The four requests, written as the collector writes them."""
    chunks = [T0 + (200 + 10 * i) * MS for i in range(40)]  # 15 thinking, then 25 answer
    final = chunks[-1] + MS
    metrics = FinalMetrics(total_duration_ns=final - T0 - MS, load_duration_ns=5 * MS, prompt_eval_count=100,
                           prompt_eval_cached_count=0, prompt_eval_duration_ns=150 * MS, eval_count=40,
                           eval_duration_ns=chunks[-1] - chunks[0], done_reason="stop")  # fmt: skip
    recs = {
        "thinking": _rec("thinking", now - 40, token_chunk_ns=chunks, first_token_ns=chunks[0], final_chunk_ns=final,
                         closed_ns=final, thinking_chunks=15, last_thinking_ns=chunks[14], first_answer_ns=chunks[15],
                         metrics=metrics),
        "whole": _rec("whole", now - 30, stream=False, model="qwen2.5:0.5b", final_chunk_ns=final, closed_ns=final,
                      metrics=metrics),
        "v1": _rec("v1", now - 20, endpoint="/v1/chat/completions", model="qwen2.5:0.5b", token_chunk_ns=chunks,
                   first_token_ns=chunks[0], final_chunk_ns=final, closed_ns=final, first_answer_ns=chunks[0],
                   metrics=FinalMetrics(done_reason="stop")),
        "embed": _rec("embed", now - 10, endpoint="/api/embed", kind=RequestKind.EMBED, stream=False, batch_size=3,
                      model="qwen2.5:0.5b", final_chunk_ns=T0 + 300 * MS, closed_ns=T0 + 300 * MS,
                      metrics=FinalMetrics(total_duration_ns=290 * MS, load_duration_ns=40 * MS, prompt_eval_count=500)),
    }  # fmt: skip
    w = StoreWriter(db_path(data_dir))
    for rec in recs.values():
        w.write(PutRequest(rec))
    w.close()
    return recs


def _detail(request_id: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/requests/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    at.selectbox(key="req_pick").set_value(request_id).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _frame(at: AppTest, *columns: str) -> Any:
    return next(d.value for d in at.dataframe if tuple(d.value.columns) == columns)


def test_thinking_reply(store: dict[str, RequestRecord]) -> None:
    at = _detail("thinking")
    m = _metrics(at)
    assert m["First token"] == "200 ms" and m["First answer token"] == "350 ms"
    thinking = _frame(at, "part", "tokens", "time", "tok/s").set_index("part")
    assert thinking.loc["thinking", "tokens"] == 15 and thinking.loc["answer", "tokens"] == 25
    waterfall = next(json.loads(el.proto.spec) for el in at.get("plotly_chart") if "Where the time went" in el.proto.spec)
    names = {t["name"] for t in waterfall["data"]}
    assert {"thinking", "answer", "streaming thinking", "streaming answer"} <= names and "decode" not in names


def test_whole_body_shows_a_server_side_first_token(store: dict[str, RequestRecord]) -> None:
    m = _metrics(_detail("whole"))
    assert "First token" not in m and m["First token (server side)"] == "200 ms"  # total 590 − decode 390


def test_v1_stream_unknowns_are_dashes_with_their_reason(store: dict[str, RequestRecord]) -> None:
    at = _detail("v1")
    m = _metrics(at)
    assert m["Load"] == m["Prefill"] == m["Queue"] == "—" and m["Decode"] == "390 ms"
    sources = _frame(at, "phase", "value", "from").set_index("phase")
    assert sources.loc["load", "from"] == "not known" and sources.loc["load", "value"] == "—"
    assert sources.loc["decode", "from"] == "the stream's timing (proxy)"
    assert sources.loc["output tokens", "value"] == "40" and sources.loc["output tokens", "from"] == "chunks counted by the proxy"


def test_embed_batch(store: dict[str, RequestRecord]) -> None:
    at = _detail("embed")
    m = _metrics(at)
    assert m["Inputs"] == "3" and m["Prefill"] == "250 ms" and m["Load"] == "40 ms" and "Decode" not in m
    rates = next(t.value for t in at.table if "why they differ" in t.value.columns)
    assert rates.loc["embedding (prompt)", "ours (tok/s)"] == "2,000 tok/s"
