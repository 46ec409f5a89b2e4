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

from analysis.records import RequestRecord
from tests.support.requests_page import open_request, write_records


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, RequestRecord]:
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    monkeypatch.delenv("PHASEWATCH_DEMO", raising=False)
    return write_records(tmp_path, time.time())


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _frame(at: AppTest, *columns: str) -> Any:
    return next(d.value for d in at.dataframe if tuple(d.value.columns) == columns)


@pytest.mark.slow
def test_thinking_reply(store: dict[str, RequestRecord]) -> None:
    at = open_request("thinking")
    m = _metrics(at)
    assert m["First token"] == "200 ms" and m["First answer token"] == "350 ms"
    thinking = _frame(at, "part", "tokens", "time", "tok/s").set_index("part")
    assert thinking.loc["thinking", "tokens"] == 15 and thinking.loc["answer", "tokens"] == 25
    waterfall = next(json.loads(el.proto.spec) for el in at.get("plotly_chart") if "Where the time went" in el.proto.spec)
    names = {t["name"] for t in waterfall["data"]}
    assert {"thinking", "answer", "streaming thinking", "streaming answer"} <= names and "decode" not in names


@pytest.mark.slow
def test_whole_body_shows_a_server_side_first_token(store: dict[str, RequestRecord]) -> None:
    m = _metrics(open_request("whole"))
    assert "First token" not in m and m["First token (server side)"] == "200 ms"  # total 590 − decode 390


@pytest.mark.slow
def test_v1_stream_unknowns_are_dashes_with_their_reason(store: dict[str, RequestRecord]) -> None:
    at = open_request("v1")
    m = _metrics(at)
    assert m["Load"] == m["Prefill"] == m["Queue"] == "—" and m["Decode"] == "390 ms"
    sources = _frame(at, "phase", "value", "from").set_index("phase")
    assert sources.loc["load", "from"] == "not known" and sources.loc["load", "value"] == "—"
    assert sources.loc["decode", "from"] == "the stream's timing (proxy)"
    assert sources.loc["output tokens", "value"] == "40" and sources.loc["output tokens", "from"] == "chunks counted by the proxy"


@pytest.mark.slow
def test_embed_batch(store: dict[str, RequestRecord]) -> None:
    at = open_request("embed")
    m = _metrics(at)
    assert m["Inputs"] == "3" and m["Prefill"] == "250 ms" and m["Load"] == "40 ms" and "Decode" not in m
    rates = next(t.value for t in at.table if "why they differ" in t.value.columns)
    assert rates.loc["embedding (prompt)", "ours (tok/s)"] == "2,000 tok/s"
