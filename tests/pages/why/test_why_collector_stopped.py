"""Why after the collector stopped (issue 47): real processes (sim with a simulated RTX 4090, ``python -m collectors
--demo`` sampling sim's GPU), real requests through the proxy, then the collector stopped and the page viewed an hour
later. The old readings are still judged against the GPU they ran on, from the requests of one window."""

from __future__ import annotations

import time
from pathlib import Path

import ollama
import pytest

from analysis.story import Status
from pages.shared.window import DEFAULT_WINDOW_S, WINDOWS_S
from pages.why.view import build_why
from store import queries, sample_queries
from store.schema import db_path
from tests.support.collector_process import collector, listen_url
from tests.support.sim_process import start_sim
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # a sim, a collector and eight generations: ~15 s on the shared machine

MODEL = "llama3.2:latest"
PROMPT_WORDS = (60, 200, 600, 1500)
HOUR_S = 3600.0


def _stored(data: Path, n: int) -> bool:
    with queries.open_reader(db_path(data)) as conn:
        return (
            conn is not None and len(queries.rate_rows(conn, MODEL, 0.0)) >= n and bool(sample_queries.gpu_samples(conn, 0, 4e9))
        )


def test_an_hour_after_the_collector_stopped_the_readings_keep_their_gpu(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with start_sim("--hardware", "rtx-4090") as sim, collector(data, "--ollama", sim.base_url, "--demo") as proc:
        client = ollama.Client(host=listen_url(data), timeout=120)
        for words in (*PROMPT_WORDS, *PROMPT_WORDS):
            prompt = "Summarise: " + " ".join(["the quarterly revenue grew in every region"] * (words // 7 + 1))
            client.generate(model=MODEL, prompt=prompt, options={"num_predict": 48, "num_ctx": 8192})
        wait_until(lambda: _stored(data, 2 * len(PROMPT_WORDS)), 30, "the requests and GPU samples in the store")
        proc.terminate()
        proc.wait(15)
    an_hour_later = time.time() + HOUR_S
    for window_s in (DEFAULT_WINDOW_S, WINDOWS_S["24 h"]):
        m = build_why(db_path(data), MODEL, an_hour_later, window_s)
        assert m is not None and m.window is not None
        assert m.window.moved == (window_s < HOUR_S)
        assert m.hardware.spec is not None and m.hardware.spec.key == "rtx-4090", m.hardware
        assert not [r for r in (*m.prefill_points, *m.decode_points) if r.status is Status.IMPOSSIBLE]
        # One window: the tiles, the charts' points and the verdicts' requests are the same eight.
        assert m.requests_total == len(m.prefill_points) == m.diagnosed_requests == 2 * len(PROMPT_WORDS)
        assert m.prefill_median_tok_s is not None and m.decode_median_tok_s is not None
        assert m.story is not None and m.story.ceilings.gpu_bandwidth_bytes_s == m.hardware.bandwidth_bytes_s
