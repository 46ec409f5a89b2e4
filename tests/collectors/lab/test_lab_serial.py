"""Against a server that serves one request at a time (sim --num-parallel 1, Ollama's default),
the Lab says so from the timings instead of reporting a slowdown or a stall."""

from __future__ import annotations

import asyncio

import pytest

from collectors.lab.results import DONE
from collectors.lab.runner import run_experiment
from tests.support.sim_process import SimProcess

MODEL = "llama3.1:8b"

pytestmark = pytest.mark.sim_args("--hardware", "rtx-4090", "--num-parallel", "1")


def test_concurrency_detects_a_serial_server(sim: SimProcess) -> None:
    r = asyncio.run(run_experiment("concurrency", sim.base_url, MODEL, {"max_streams": 4, "num_predict": 16}))
    assert r.state == DONE, r.error
    by_n = {p["streams"]: p for p in r.points}
    assert by_n[4]["mean_active_streams"] < 1.1  # decode windows do not overlap
    assert by_n[4]["total_tok_s"] < 1.3 * by_n[1]["total_tok_s"]  # total throughput flat
    # The last of 4 waited about 3 whole generations before its first token.
    assert r.summary["waited_generations"] == pytest.approx(3.0, abs=0.8)
    assert r.summary["served_serially"] is True
    assert "one stream at a time" in r.conclusion and "OLLAMA_NUM_PARALLEL" in r.conclusion


def test_interference_on_a_serial_server_reports_the_wait_not_a_stall(sim: SimProcess) -> None:
    r = asyncio.run(run_experiment("interference", sim.base_url, MODEL, {"long_prompt_tokens": 1024, "chat_max_tokens": 2000}))
    assert r.state == DONE, r.error
    s = r.summary
    assert s["served_serially"] is True
    # The Lab stopped the chat rather than let 2,000 tokens run: the long prompt then started.
    assert s["chat_tokens"] < 1000
    assert s["long_prompt_wait_s"] >= 1.5
    assert "one request at a time" in r.conclusion
    assert not any(p["phase"] == "during" and p["gap_ms"] > 50 for p in r.points)
