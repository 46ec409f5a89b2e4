"""The settings in force, read from the real runner's command line: ``python -m sim --engine llama-server`` starts
llama.cpp's ``llama-server`` with Ollama's flags (here a q8_0 KV cache, flash attention on, two slots), a
collector finds the process, stores what its command line says, and Why's "What if" starts from those settings,
naming the command line (and the runner's pid) as their source.
"""

from __future__ import annotations

from pathlib import Path

import ollama
import pytest

from pages.why import whatif
from pages.why.view import build_why
from store import queries
from store.schema import StoreError, db_path
from tests.support.collector_process import collector
from tests.support.engine_process import MODEL, engine_state, start_server_engine
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

NUM_CTX = 2048  # per request; the runner gets -c NUM_CTX × PARALLEL
PARALLEL = 2


def test_the_runner_command_line_is_the_source_of_the_settings_in_force(tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = ("--num-parallel", str(PARALLEL), "--kv-cache-type", "q8_0", "--flash-attention", "on")
    with start_server_engine(*args) as sim, collector(data, "--ollama", sim.base_url):
        ollama.Client(host=sim.base_url).generate(model=MODEL, prompt="", keep_alive="5m", options={"num_ctx": NUM_CTX})
        argv = engine_state(sim)["runner"]["argv"]
        assert "--cache-type-k" in argv and "--flash-attn" in argv, argv  # sim starts it as Ollama does

        def stored() -> object:
            conn = queries.open_readonly(data)  # raises until the collector created the store: wait_until retries
            try:
                found = queries.runners(conn)
            finally:
                conn.close()
            return found if found and found[0].model else None  # matched to /api/ps's model

        (runner,) = wait_until(stored, 60, "the runner and its settings in the store", ignoring=(StoreError,))
        assert runner.pid == engine_state(sim)["runner"]["pid"]
        assert runner.ctx_size_tokens == NUM_CTX * PARALLEL and runner.parallel == PARALLEL
        assert (runner.cache_type_k, runner.cache_type_v, runner.flash_attn) == ("q8_0", "q8_0", "on")
        assert runner.ubatch_tokens is not None and runner.batch_tokens is not None
        assert runner.gpu_layers == "0" and runner.threads is not None

        m = build_why(db_path(data), MODEL)
        assert m is not None and m.runner == runner
        force = whatif.in_force(m)
        s = force.settings
        assert (s.num_ctx, s.num_parallel, s.kv_type, s.flash_attn) == (NUM_CTX, PARALLEL, "q8_0", True)
        assert s.ubatch_tokens == runner.ubatch_tokens == m.ubatch_tokens  # one figure for the charts and the what-if
        by_name = {r.name: r for r in force.rows}
        for name in ("num_parallel", "KV cache type", "flash attention", "batch / micro-batch", "threads"):
            assert "command line" in by_name[name].source and f"pid {runner.pid}" in by_name[name].source, by_name[name]
        assert by_name["num_ctx"].source == "/api/ps (context_length)"
