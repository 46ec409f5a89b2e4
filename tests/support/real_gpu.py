"""The store and Ollama log of a run on a real NVIDIA H200 (llama.cpp's llama-server built with CUDA, a Gemma 3
12B-shaped Q4_0 GGUF, sim in Ollama's place; tests/data/real_gpu_h200/), as the collector of the time wrote it
(schema v11: no runner placement), and the same store with the runner's placement recorded the way today's
collector records it: its runner reader reads the log's load lines and the writer stores them; with ``with_waits``,
the runner's own waits before each prompt too (its prompt-cache saves, context checkpoints: analysis.runner_wait_lines),
joined to the requests as the collector joins them once /slots has shown each request's task."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, cast

from analysis.runner_wait_tasks import waits_row
from collectors.ollama.discovery import Runner
from collectors.ollama.log import LogTail, parse_line
from collectors.ollama.runner_state import RunnerState
from collectors.ollama.runners import RunnerReader
from store import queries
from store.ops import PutRequestWaits, PutRunnerPlacement
from store.schema import connect_writer, db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

DATA = REPO / "tests" / "data" / "real_gpu_h200"
LOG = DATA / "ollama.log"
MODEL = "gemma3:12b-random"
MEASURED_DECODE_TOK_S = (59.0, 124.0)  # the runner's own timings over the run (tests/data/real_gpu_h200/README.md)


def task_of_request(path: Path) -> dict[int, str]:
    """Which runner task served each stored request, as the collector's /slots join would have found it: a direct
    record's id carries its task; the proxied ones are the remaining tasks in order, matched by prompt size."""
    reader = queries.open_readonly(path)
    rows = sorted(queries.requests_in_window(reader, 0.0, 4e9, limit=1000), key=lambda s: s.record.received_ns)
    reader.close()
    tasks = [
        (e.task_id, e.tokens)
        for line in LOG.read_text().splitlines()
        if (e := parse_line(line, 0.0)) is not None and e.kind == "new_prompt" and e.task_id is not None
    ]
    out: dict[int, str] = {}
    direct = {int(s.record.id.split("-")[3]): s.record.id for s in rows if s.record.id.startswith("direct-")}
    out.update(direct)
    proxied = [s.record for s in rows if not s.record.id.startswith("direct-")]
    free = [(t, n) for t, n in tasks if t not in direct]
    for rec in proxied:
        prompt = rec.metrics.prompt_eval_count if rec.metrics is not None else None
        for i, (task, n) in enumerate(free):
            if n == prompt:
                out[task] = rec.id
                del free[: i + 1]
                break
    return out


def real_gpu_store(data_dir: Path, *, with_placement: bool, with_waits: bool = False) -> Path:
    """A copy of the H200 store in ``data_dir`` (migrated to the current schema); ``with_placement``: the runner's
    placement read from the run's log and stored. Returns the store's path."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = db_path(data_dir)
    shutil.copyfile(DATA / "phasewatch.sqlite3", path)
    path.chmod(0o644)
    connect_writer(path).close()  # migrates, as the collector does when it starts
    if with_placement or with_waits:
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
            # The runner's process started after Ollama's start line for it was read (the replay reads the whole log
            # at the runner's first sighting): what confirms the start sequence as its own (collectors.ollama.runners).
            state = RunnerState(Runner(f.pid, f.port, "/model.gguf"), digest=f.digest, model=f.model, started_unix_s=f.ts_unix_s)
            r.runners[f.pid] = state
        if with_waits:
            pid = runners[0].pid
            r._tasks.update({(pid, task): rid for task, rid in task_of_request(path).items() if not rid.startswith("direct-")})
        r._read_log([])
        w = StoreWriter(path)
        if with_placement:
            for port, rows in r.placement_rows(runners[0].ts_unix_s).items():
                w.write(PutRunnerPlacement(port, rows))
        if with_waits:
            waits = r.drain_waits()
            # Direct generations: the collector tracks their tasks from /slots, which a replay cannot; their ids
            # carry the task.
            direct = {task: rid for task, rid in task_of_request(path).items() if rid.startswith("direct-")}
            joiner = next(iter(r._waits.values()))
            waits += [waits_row(rid, joiner.tasks[t], ts_unix_s=0.0, port=runners[0].port) for t, rid in direct.items()]
            w.write(PutRequestWaits(waits))
        w.close()
    return path
