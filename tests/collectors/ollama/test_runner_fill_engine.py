"""Issue 16's leftover, through the whole collector: a ``/v1/chat/completions`` stream (no durations in the reply,
no ``usage``) in front of sim's real llama-server engine, a ~2,000-token prompt.

The stored record's prompt tokens equal llama-server's, its prefill lands within 10% of llama-server's own
``prompt_ms`` (sim's ``GET /sim/engine``), both with source ``slots``; load and queue stay unknown.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from analysis.phases import PhaseSource
from collectors.proxy.recording import RECORD_ID_HEADER
from store import queries
from store.schema import db_path
from tests.support.collector_process import collector, listen_url, query
from tests.support.engine_process import MODEL, engine_log, start_server_engine, words_prompt

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PREFILL_TOLERANCE = 0.10  # of llama-server's prompt_ms


def _chat(base_url: str, prompt: str) -> tuple[str, str]:
    """One streamed /v1 chat completion; (the proxy's record id, sim's request id)."""
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 48,
        "temperature": 0,
        "seed": 7,
        "messages": [{"role": "user", "content": prompt}],
    }
    with httpx.Client(timeout=600) as client, client.stream("POST", base_url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        rid, sim_id = r.headers[RECORD_ID_HEADER], r.headers["X-Sim-Request-Id"]
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert lines[-1].strip() == "data: [DONE]"
    assert not any("usage" in json.loads(line[5:]) for line in lines[:-1]), "no include_usage: no counts in the reply"
    return rid, sim_id


def test_v1_prefill_from_slots(tmp_path: Path) -> None:
    with start_server_engine() as sim, collector(tmp_path, "--ollama", sim.base_url) as proc:
        base = listen_url(tmp_path)
        # Start the runner (sim starts it on first use, as Ollama does) and wait until the collector has found it and
        # read its /slots for a request: finding it takes a discovery, the model file's digest and an /api/ps poll.
        for seed in range(1, 9):
            _chat(base, words_prompt(400, seed=seed))
            time.sleep(0.5)
            if query(tmp_path, "SELECT 1 FROM progress_samples WHERE source = 'slots' LIMIT 1"):
                break
        else:
            raise AssertionError("the collector never read the runner's /slots")
        rid, sim_id = _chat(base, words_prompt(2000, seed=16))
        truth = engine_log(sim)[sim_id]
        deadline = time.monotonic() + 10
        while True:  # the readings drained after the reply ended split the row again
            with queries.open_reader(db_path(tmp_path)) as conn:
                assert conn is not None
                stored = queries.request_detail(conn, rid)
                rows = queries.progress_samples(conn, [rid]).get(rid, [])
            if (stored is not None and stored.phases.prefill_s is not None) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert proc.poll() is None

    assert stored is not None
    ph = stored.phases
    timings = truth["timings"]
    prompt_ms = float(timings["prompt_ms"])
    engine_prompt = int(timings["prompt_n"]) + int(timings["cache_n"])
    print(
        f"\nllama-server: {engine_prompt} prompt tokens ({timings['cache_n']} cached), prompt_ms {prompt_ms:.0f}; "
        f"record: {ph.prompt_tokens} ({ph.prompt_tokens_source}), cached {ph.cached_tokens}, "
        f"prefill {ph.prefill_s and round(ph.prefill_s * 1e3)} ms ({ph.prefill_source}), "
        f"{ph.prefill_tok_s and round(ph.prefill_tok_s)} tok/s; flags {ph.flags}; readings "
        f"{[(round(s.ts_unix_s - stored.record.started_at_unix_s, 2), s.processed_tokens, s.decoded_tokens) for s in rows]}; "
        f"client TTFT {ph.ttft_s} s"
    )
    assert 1800 < engine_prompt < 2300
    assert (ph.prompt_tokens, ph.prompt_tokens_source) == (engine_prompt, PhaseSource.SLOTS)
    assert ph.cached_tokens == int(timings["cache_n"])
    assert ph.prefill_s is not None and ph.prefill_source is PhaseSource.SLOTS
    assert abs(ph.prefill_s * 1e3 - prompt_ms) <= PREFILL_TOLERANCE * prompt_ms
    assert ph.prefill_tok_s is not None
    assert (ph.load_s, ph.queue_s, ph.load_source, ph.queue_source) == (None, None, None, None), "not bounded by readings"
    assert ph.decode_source is PhaseSource.STREAM
