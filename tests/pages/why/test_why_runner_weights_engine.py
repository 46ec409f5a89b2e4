"""Why's decode ceiling on the real CPU runner (issue 40 item 4): ``python -m sim --engine llama-server`` runs Gemma 3
270M on llama.cpp's CPU build, the collector reads its load lines from sim's log, and the page's ceiling reads the
weights the runner printed (its system-memory model buffer), not the catalogue's estimate from the parameter count."""

from __future__ import annotations

from pathlib import Path

import ollama
import pytest

from pages.shared.window import DEFAULT_WINDOW_S
from pages.why.view import build_why
from store import queries
from store.schema import StoreError, db_path
from tests.support.collector_process import collector, listen_url
from tests.support.engine_process import GREEDY, MODEL, engine_state, start_server_engine, words_prompt
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT_WORDS = (40, 120, 300)


def _reading_the_log(data: Path) -> bool:
    conn = queries.open_readonly(db_path(data))  # raises until the collector created the store
    try:
        beat = queries.latest_heartbeat(conn)
    finally:
        conn.close()
    return beat is not None and beat.log_problem is None


def test_the_cpu_decode_ceiling_reads_the_runners_weights(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with start_server_engine() as sim, collector(data, "--ollama", sim.base_url, "--ollama-log", str(sim.log_path)):
        wait_until(lambda: _reading_the_log(data), 60, "the collector reading sim's log", ignoring=(StoreError,))
        client = ollama.Client(host=listen_url(data), timeout=300)  # through the proxy
        for i, words in enumerate(PROMPT_WORDS):
            client.generate(model=MODEL, prompt=words_prompt(words, seed=i), options={**GREEDY, "num_predict": 40})
        port = engine_state(sim)["runner"]["port"]

        def stored() -> object:
            conn = queries.open_readonly(db_path(data))
            try:
                said = queries.runner_placement(conn, MODEL, None, port=port)
                return said if said is not None and len(queries.rate_rows(conn, MODEL, 0.0)) >= len(PROMPT_WORDS) else None
            finally:
                conn.close()

        placement, _, _ = wait_until(stored, 60, "the runner's placement and the requests in the store")
    host = placement.host_model_bytes
    assert host is not None and placement.layers_offloaded == 0
    m = build_why(db_path(data), MODEL, window_s=DEFAULT_WINDOW_S)
    assert m is not None and m.facts is not None and m.story is not None and m.hardware.kind == "cpu"
    # The ceiling's weights are the runner's own figure (within 5% of its load line: here exactly it).
    assert abs(m.facts.weights_bytes / host - 1) < 0.05 and not m.facts.weights_bytes_estimated
    c = m.story.ceilings
    print(
        f"runner's system-memory model buffer {host / 2**20:,.0f} MiB; ceiling weights {m.facts.weights_bytes / 2**20:,.0f} "
        f"MiB; decode ceiling {c.decode_ceiling_tok_s:,.1f} tok/s at {c.context_tokens:,} tokens of context, "
        f"{m.hardware.bandwidth_bytes_s} B/s; measured median {m.decode_median_tok_s} tok/s"
    )
    assert m.hardware.bandwidth_bytes_s is not None
    assert c.decode_ceiling_tok_s == pytest.approx(
        m.hardware.bandwidth_bytes_s / (host + c.kv_bytes_per_tok * c.context_tokens), rel=1e-9
    )
    assert any("from the runner's own load lines" in n and "in system memory" in n for n in m.notes), m.notes
    assert m.sentences and m.sentences[0].startswith("On this computer's CPU, "), m.sentences[0]
