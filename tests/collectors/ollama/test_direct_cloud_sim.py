"""A cloud model's chats through a real collector process (its proxy, its runner reader on Ollama's log) into a real
SQLite store, in front of sim playing the cloud model (issue 41, docs/ollama-api.md §15).

Through the proxy, streamed and not: each recorded once, as the proxy's, flagged cloud, the reply's counts and the
client's times (its TTFT and every chunk when streamed), no phase of this machine; its access line never becomes a
second, "direct" record. Sent straight to Ollama: only the access line exists (no runner task, no line naming the
model), which tells nothing apart from a load-only request's or a runner this collector cannot read; so nothing is
recorded of it, and above all no local generation and no failure."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from collectors.ollama.access_failures import FAILED_WAIT_S
from collectors.ollama.direct import GRACE_S, LOG_WAIT_S
from tests.support.collector_process import collector, listen_url, query
from tests.support.sim_process import SimProcess
from tests.support.waiting import wait_until

CLOUD = "gpt-oss:120b-cloud"
# Past this after the last request, any access line left would have been recorded (a failure's wait is the longest).
DECIDED_S = FAILED_WAIT_S + GRACE_S + LOG_WAIT_S + 2.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.sim_args("--disk-gbs", "60", "--cloud-model", CLOUD)]


def chat(base_url: str, text: str, *, stream: bool, num_predict: int) -> tuple[int, dict[str, object]]:
    """(status, final chunk) of one chat to the cloud model."""
    messages = [{"role": "user", "content": text}]
    body = {"model": CLOUD, "messages": messages, "stream": stream, "options": {"num_predict": num_predict}}
    r = httpx.post(base_url + "/api/chat", json=body, timeout=60)
    final = json.loads(r.text.strip().splitlines()[-1])
    return r.status_code, final


def test_proxied_cloud_chats_recorded_once_and_a_direct_one_never_as_local(sim: SimProcess, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with collector(data, "--ollama", sim.base_url, "--ollama-log", str(sim.log_path)):
        streamed = chat(listen_url(data), "through the proxy", stream=True, num_predict=16)
        whole = chat(listen_url(data), "whole, through the proxy", stream=False, num_predict=6)
        direct = chat(sim.base_url, "straight to Ollama", stream=True, num_predict=8)
        assert streamed[0] == whole[0] == direct[0] == 200
        # Three access lines (each written once its request ended), nothing else of them.
        wait_until(lambda: sim.log().count('POST     "/api/chat"') == 3, 10, "the three access lines")

        def finished() -> list:
            return query(data, "SELECT * FROM requests WHERE outcome != 'in_flight' ORDER BY started_at_unix_s")

        wait_until(lambda: len(finished()) >= 2, 30, "the two proxied chats recorded")
        time.sleep(DECIDED_S)  # every access line decided by now
        rows = finished()
        assert [(r["seen_from"], r["stream"]) for r in rows] == [("proxy", 1), ("proxy", 0)], [dict(r) for r in rows]
        for row, (_, final) in zip(rows, (streamed, whole), strict=True):
            assert row["model"] == CLOUD and row["outcome"] == "ok" and "cloud" in json.loads(row["flags"])
            assert (row["prompt_tokens"], row["output_tokens"]) == (final["prompt_eval_count"], final["eval_count"])
            assert row["load_s"] is None and row["queue_s"] is None and row["prefill_s"] is None
        s, w = rows
        assert s["ttft_s"] is not None and s["ttft_s"] > 0.2  # the round trip and ollama.com's queue, as the client saw
        chunks = query(data, "SELECT n_chunks FROM request_tokens WHERE request_id = ?", s["id"])
        assert [c["n_chunks"] for c in chunks] == [16]
        assert w["ttft_s"] is None
        assert query(data, "SELECT count(*) AS n FROM requests")[0]["n"] == 2  # the direct one: nothing, no guess
