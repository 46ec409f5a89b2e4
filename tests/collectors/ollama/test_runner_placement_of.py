"""The collector asks its runner reader where a model sits (for the ceiling ratio it observes): the runner's own
load lines of the runner serving that model, read from the H200 run's log (tests/support/real_gpu.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from analysis.runner_load_words import SOURCE_RUNNER_WORDS, placement_in_use
from collectors.ollama.discovery import Runner
from collectors.ollama.log import LogTail
from collectors.ollama.runner_state import RunnerState
from collectors.ollama.runners import RunnerReader
from tests.support.real_gpu import LOG, MODEL


def test_placement_of_the_model_a_runner_serves(tmp_path: Path) -> None:
    r = RunnerReader(
        "http://127.0.0.1:1",
        cast(Any, None),
        in_flight=list,
        loaded_models=list,
        log_source=LogTail(LOG, from_start=True),
        clock=lambda: 0.0,
    )
    # its process started as the log was read (the runner Ollama started: a start line it confirms)
    r.runners[1] = RunnerState(Runner(1, 48613, "/model.gguf"), model=MODEL, started_unix_s=0.0)
    r._read_log([])
    placement = r.placement_of(MODEL)
    assert placement is not None and (placement.layers_offloaded, placement.layers_total) == (49, 49)
    assert r.placement_of("another:1b") is None
    # /api/ps said size_vram 0 (sim's llama-server engine): the runner's words are used, and the two disagree.
    used = placement_in_use(placement, 22_700_000_000, 0)
    assert used.gpu_fraction == 1.0 and used.source == SOURCE_RUNNER_WORDS and used.disagreement
