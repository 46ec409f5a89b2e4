"""The real runner's placement, through the whole collector: ``python -m sim --engine llama-server`` starts llama.cpp's
``llama-server`` (a CPU build here), its load lines go into sim's Ollama-format log, and the collector reading that log
stores where the runner put the model: no layer on a GPU, the weights in system memory. sim answers /api/ps with
size_vram 0 for it, as Ollama does for a CPU-only model, and passes -ngl 0 (the build lists no GPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import ollama
import pytest

from analysis.runner_load_lines import MIB
from store import queries
from store.schema import StoreError, db_path
from tests.support.collector_process import collector
from tests.support.engine_process import MODEL, engine_state, require_llama_server, start_server_engine
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]


def test_the_cpu_runners_placement_is_stored_from_its_load_lines(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _, gguf = require_llama_server()
    with start_server_engine() as sim, collector(data, "--ollama", sim.base_url, "--ollama-log", str(sim.log_path)):

        def reading_the_log() -> object:
            conn = queries.open_readonly(db_path(data))  # raises until the collector created the store
            try:
                beat = queries.latest_heartbeat(conn)
            finally:
                conn.close()
            return beat is not None and beat.log_problem is None

        # The collector follows the log from its end: the runner must start after it reads it.
        wait_until(reading_the_log, 60, "the collector reading sim's log", ignoring=(StoreError,))
        client = ollama.Client(host=sim.base_url)
        client.generate(model=MODEL, prompt="", keep_alive="5m")
        runner = engine_state(sim)["runner"]
        argv = runner["argv"]
        assert argv[argv.index("--n-gpu-layers") + 1] == "0" and runner["gpu_layers"] == 0

        def stored() -> object:
            conn = queries.open_readonly(db_path(data))
            try:
                return queries.runner_placement(conn, MODEL, None, port=runner["port"])
            finally:
                conn.close()

        placement, _, source = wait_until(stored, 60, "the runner's placement in the store")
        assert source == "runner log"
        assert placement.devices == () and placement.layers_offloaded == 0 and placement.gpu_fraction == 0.0
        assert placement.host_model_bytes is not None and placement.host_model_bytes > 0.9 * gguf.stat().st_size
        (loaded,) = client.ps().models
        assert not loaded.size_vram and loaded.size is not None and loaded.size > gguf.stat().st_size


MAKE_HYBRID = Path(__file__).parents[2] / "data" / "runner_load" / "make_lfm2_gguf.py"
_BUFFER_MIB = re.compile(r"^(?:llama_kv_cache|llama_memory_recurrent): +CPU (KV|RS) buffer size = +([0-9.]+) MiB$")


@pytest.mark.slow
def test_a_hybrid_models_recurrent_state_is_stored_with_its_kv_cache(tmp_path: Path) -> None:
    """Issue 41: a hybrid model (LFM2's shape: convolution layers with a recurrent state, attention layers with a KV
    cache; random weights) served by the real runner through sim: its "RS buffer size" line reaches the store, in
    the KV column as llama.cpp's own memory table counts it ("context")."""
    require_llama_server()
    gguf = tmp_path / "lfm2.gguf"
    subprocess.run([sys.executable, str(MAKE_HYBRID), str(gguf)], check=True, timeout=120)
    data = tmp_path / "data"
    name = "lfm2:tiny"
    with (
        start_server_engine("--gguf", str(gguf), "--model-name", name) as sim,
        collector(data, "--ollama", sim.base_url, "--ollama-log", str(sim.log_path)),
    ):

        def reading_the_log() -> object:
            conn = queries.open_readonly(db_path(data))
            try:
                beat = queries.latest_heartbeat(conn)
            finally:
                conn.close()
            return beat is not None and beat.log_problem is None

        wait_until(reading_the_log, 60, "the collector reading sim's log", ignoring=(StoreError,))
        ollama.Client(host=sim.base_url).generate(model=name, prompt="", keep_alive="5m")
        port = engine_state(sim)["runner"]["port"]

        def stored() -> object:
            conn = queries.open_readonly(db_path(data))
            try:
                return queries.runner_placement(conn, name, None, port=port)
            finally:
                conn.close()

        placement, _, _ = wait_until(stored, 60, "the hybrid runner's placement in the store")
        said = [m.groups() for line in sim.log_path.read_text().splitlines() if (m := _BUFFER_MIB.match(line))]
        kinds = {kind for kind, _ in said}
        assert kinds == {"KV", "RS"}, said
        assert placement.host_kv_bytes == sum(round(float(mib) * MIB) for _, mib in said)
