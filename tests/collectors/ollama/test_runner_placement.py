"""The runner's placement read from Ollama's log by the collector's runner reader, stored per runner and read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from analysis.runner_load_lines import MIB
from collectors.ollama.discovery import Runner
from collectors.ollama.log import LogTail, parse_line
from collectors.ollama.runner_state import RunnerState
from collectors.ollama.runners import RunnerReader
from store import queries
from store.ops import PutRunnerPlacement
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

H200 = REPO / "tests" / "data" / "runner_load" / "h200_cuda_gemma3_12b.log"
TWO = REPO / "tests" / "data" / "runner_load" / "two_gpus_partial_30_of_49.log"
MODEL = "gemma3:12b-random"
START = (
    'time=2026-12-04T18:31:01.404+00:00 level=INFO source=llama_server.go:431 msg="starting llama-server" '
    'cmd="/bin/llama-server --model /m.gguf --port {port} --host 127.0.0.1 -c 40960 -np 2"'
)


def test_a_load_line_is_an_event_of_the_log() -> None:
    event = parse_line("load_tensors: offloaded 49/49 layers to GPU", 1.0)
    assert event is not None and event.kind == "runner_load" and event.load is not None and event.load.layers == 49


def test_each_runner_gets_the_lines_that_follow_its_start(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    # Two loads: the H200 runner on 48613, then a second runner on 48700 with a partial offload over two GPUs.
    log.write_text(
        "\n".join(
            [START.format(port=48613), *H200.read_text().splitlines(), START.format(port=48700), *TWO.read_text().splitlines()]
        )
        + "\n"
    )
    r = RunnerReader(
        "http://127.0.0.1:1",
        cast(Any, None),
        in_flight=list,
        loaded_models=list,
        log_source=LogTail(log, from_start=True),
        clock=lambda: 7.0,
    )
    # their processes started as the log was read: each start sequence is confirmed as its runner's own
    r.runners[1] = RunnerState(Runner(1, 48613, "/m.gguf"), digest="abc", model=MODEL, started_unix_s=7.0)
    r.runners[2] = RunnerState(Runner(2, 48700, "/n.gguf"), model="other:7b", started_unix_s=7.0)
    r._read_log([])
    rows = r.placement_rows(7.0)
    assert sorted(rows) == [48613, 48700]
    cuda0 = next(x for x in rows[48613] if x.device == "CUDA0")
    assert (cuda0.model, cuda0.digest, cuda0.layers_offloaded, cuda0.layers_total, cuda0.layers) == (MODEL, "abc", 49, 49, 49)
    assert round((cuda0.model_bytes or 0) / MIB) == 6314 and cuda0.description == "NVIDIA H200"
    assert {x.device for x in rows[48700]} == {"CUDA0", "CUDA1", "CPU"}
    assert {x.layers_offloaded for x in rows[48700]} == {30}

    w = StoreWriter(db_path(tmp_path))
    for port, port_rows in rows.items():
        w.write(PutRunnerPlacement(port, port_rows))
    w.close()
    reader = queries.open_readonly(db_path(tmp_path))
    found = queries.runner_placement(reader, MODEL, None)
    by_digest = queries.runner_placement(reader, "another name", "sha256:abc")
    partial = queries.runner_placement(reader, "other:7b", None)
    running_now = queries.runner_placement(reader, MODEL, "sha256:abc", port=48613)
    reloaded = queries.runner_placement(reader, MODEL, "sha256:abc", port=50000)
    reader.close()
    assert running_now is not None and running_now[0].gpu_fraction == 1.0
    assert reloaded is None, "a runner serving it now whose load was not read: an earlier load's figures are not its own"
    assert found is not None and by_digest is not None and partial is not None
    placement, read_at, source = found
    assert (placement.gpu_fraction, read_at, source) == (1.0, 7.0, "runner log")
    assert by_digest[0] == placement
    assert partial[0].gpu_fraction == 30 / 49
