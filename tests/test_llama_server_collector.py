"""llama-server behind sim, seen through the collector's recording proxy: the phases it records are the runner's.

For the same requests, the prefill and decode that the proxy records (Ollama's final metrics placed on its
clock by ``analysis.phases.split_record``) agree within 5% with llama-server's own ``timings`` (on
``/sim/engine``); the proxy's own chunk times span the decode llama-server timed; and nobody saw a first
token before prefill could have produced it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from analysis.phases import Phases, split_record
from analysis.records import RequestRecord
from collectors.proxy import RECORD_ID_HEADER
from tests.support.engine_process import GREEDY, MODEL, engine_log, start_server_engine, words_prompt
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.sim_process import SimProcess

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

AGREEMENT = 0.05  # recorded phase vs llama-server's own figure for it
CHUNK_SLACK_S = 0.010  # chunks cross two processes and a relay before the proxy stamps them


@pytest.fixture(scope="module")
def engine() -> Iterator[SimProcess]:
    with start_server_engine() as sim:
        yield sim


@pytest.fixture(scope="module")
def proxy(engine: SimProcess) -> Iterator[ProxyThread]:
    with run_proxy(engine.base_url) as p:
        yield p


@dataclass
class Sent:
    record: RequestRecord
    phases: Phases
    final: dict[str, Any]
    engine: dict[str, Any]  # llama-server's timings for this request
    client_ttft_s: float


def send(proxy: ProxyThread, engine: SimProcess, prompt: str, num_predict: int) -> Sent:
    """One streamed /api/generate through the proxy, timed by the client; its record and llama-server's view of it."""
    body = {"model": MODEL, "prompt": prompt, "stream": True, "options": {**GREEDY, "num_predict": num_predict}}
    first_ns: int | None = None
    final: dict[str, Any] = {}
    with httpx.Client(timeout=180) as client:
        t0 = time.monotonic_ns()
        with client.stream("POST", proxy.base_url + "/api/generate", json=body) as r:
            assert r.status_code == 200
            record_id, sim_id = r.headers[RECORD_ID_HEADER], r.headers["X-Sim-Request-Id"]
            for line in r.iter_lines():
                chunk = json.loads(line)
                if first_ns is None and chunk.get("response"):
                    first_ns = time.monotonic_ns()
                if chunk.get("done"):
                    final = chunk
    assert first_ns is not None and final
    record = proxy.wait_record(record_id, timeout_s=30)
    return Sent(record, split_record(record), final, engine_log(engine)[sim_id], (first_ns - t0) / 1e9)


def within(measured_s: float, reference_s: float, slack_s: float = 0.0) -> bool:
    return abs(measured_s - reference_s) <= AGREEMENT * reference_s + slack_s


def test_recorded_phases_are_llama_servers(proxy: ProxyThread, engine: SimProcess) -> None:
    send(proxy, engine, words_prompt(40, seed=100), 4)  # start the child, warm its buffers
    prompts = [words_prompt(60, seed=101), words_prompt(400, seed=102)]
    rows = [send(proxy, engine, p, 32) for p in prompts]
    rows.append(send(proxy, engine, prompts[1] + " and the garden", 32))  # a prompt-cache hit
    assert rows[2].final["prompt_eval_cached_count"] > 350
    for s in rows:
        p, t = s.phases, s.engine["timings"]
        assert p.prefill_s is not None and p.decode_s is not None and p.ttft_s is not None
        prefill_ref_s, decode_ref_s = t["prompt_ms"] / 1e3, t["predicted_ms"] / 1e3
        chunks = s.record.token_chunk_ns
        proxy_decode_s = (chunks[-1] - chunks[0]) / 1e9
        print(f"\nprefill {p.prefill_s * 1e3:.2f} ms vs llama-server {t['prompt_ms']:.2f} ms ({t['prompt_n']} tokens, "
              f"{t['cache_n']} cached); decode {p.decode_s * 1e3:.2f} ms vs {t['predicted_ms']:.2f} ms, "
              f"proxy's chunk span {proxy_decode_s * 1e3:.2f} ms")
        # The proxy recorded llama-server's counts ...
        assert p.prompt_tokens == t["cache_n"] + t["prompt_n"] and p.cached_tokens == t["cache_n"]
        # ... its durations ...
        assert within(p.prefill_s, prefill_ref_s) and within(p.decode_s, decode_ref_s)
        # ... which its own clock confirms: the chunks it stamped span the decode llama-server timed ...
        assert len(chunks) == t["predicted_n"] == 32
        assert within(proxy_decode_s, decode_ref_s, CHUNK_SLACK_S)
        # ... and nobody saw a first token before prefill could have produced it.
        assert p.ttft_s >= p.prefill_s and s.client_ttft_s >= p.prefill_s
        assert not ({"negative_queue", "phases_exceed_request", "negative_transport"} & set(p.flags)), p.flag_text
