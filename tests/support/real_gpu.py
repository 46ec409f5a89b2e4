"""The store and Ollama log of a run on a real NVIDIA H200 (llama.cpp's llama-server built with CUDA, a Gemma 3
12B-shaped Q4_0 GGUF, sim in Ollama's place; tests/data/real_gpu_h200/), as the collector of the time wrote it
(schema v11: no runner placement), and the same store with the runner's placement recorded the way today's
collector records it: its runner reader reads the log's load lines and the writer stores them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, cast

from collectors.ollama.discovery import Runner
from collectors.ollama.log import LogTail
from collectors.ollama.runners import RunnerReader, RunnerState
from store import queries
from store.ops import PutRunnerPlacement
from store.schema import connect_writer, db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

DATA = REPO / "tests" / "data" / "real_gpu_h200"
LOG = DATA / "ollama.log"
MODEL = "gemma3:12b-random"
MEASURED_DECODE_TOK_S = (59.0, 124.0)  # the runner's own timings over the run (tests/data/real_gpu_h200/README.md)


def real_gpu_store(data_dir: Path, *, with_placement: bool) -> Path:
    """A copy of the H200 store in ``data_dir`` (migrated to the current schema); ``with_placement``: the runner's
    placement read from the run's log and stored. Returns the store's path."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = db_path(data_dir)
    shutil.copyfile(DATA / "phasewatch.sqlite3", path)
    path.chmod(0o644)
    connect_writer(path).close()  # migrates, as the collector does when it starts
    if with_placement:
        reader = queries.open_readonly(path)
        runners = queries.runners(reader)
        reader.close()
        r = RunnerReader(
            "http://127.0.0.1:1",
            cast(Any, None),
            in_flight=list,
            loaded_models=list,
            log_source=LogTail(LOG, from_start=True),
            clock=lambda: runners[0].ts_unix_s,
        )
        for f in runners:
            r.runners[f.pid] = RunnerState(Runner(f.pid, f.port, "/model.gguf"), digest=f.digest, model=f.model)
        r._read_log([])
        w = StoreWriter(path)
        for port, rows in r.placement_rows(runners[0].ts_unix_s).items():
            w.write(PutRunnerPlacement(port, rows))
        w.close()
    return path
