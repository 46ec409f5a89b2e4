"""Why's settings in force after the runner that served the requests has exited (issue 34 item 4).

A collector that starts while no runner runs, or whose runner exits when the model unloads, writes the runners
it finds now; the settings the requests were served with must stay readable, with when they were read."""

from __future__ import annotations

import time
from pathlib import Path

from analysis.records import RunnerFlags
from pages.shared import fmt
from pages.why import whatif
from pages.why.view import build_why
from sim.catalog import BY_NAME
from store import queries
from store.ops import PutLoadedModels, PutRunners
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.why_page import MODEL, build_store


def _runner(read_unix_s: float, pid: int, parallel: int) -> RunnerFlags:
    """The runner as the fixture of a real H200 run holds it: -np 2, -ngl 999, -b/-ub 512, flash attention auto."""
    digest = BY_NAME[MODEL].digest.removeprefix("sha256:")
    return RunnerFlags(
        read_unix_s, pid, 48613, "llama-server", digest, MODEL, 40960, parallel, 512, 512, "f16", "f16", "auto", "999", 8
    )


def test_the_runner_that_served_the_requests_is_used_after_it_has_gone(data_dir: Path) -> None:
    now = time.time()
    build_store(data_dir, now)
    served = _runner(now - 900, 5133, 2)
    w = StoreWriter(db_path(data_dir))
    try:
        w.write(PutRunners([served]))
        w.write(PutRunners([]))  # it exited, or a collector started while none ran
        w.write(PutLoadedModels(now, []))  # and the model is no longer loaded
    finally:
        w.close()

    m = build_why(db_path(data_dir), MODEL, now, 3600)
    assert m is not None and m.runner == served
    rows = {r.name: r for r in whatif.in_force(m).rows}
    assert rows["num_parallel"].value == "2", rows["num_parallel"]
    read = f"pid 5133, read {fmt.when(served.ts_unix_s)}"
    for name in ("num_parallel", "batch / micro-batch", "GPU layers", "flash attention"):
        assert "no runner read" not in rows[name].source and read in rows[name].source, rows[name]
    assert rows["GPU layers"].value == "999" and rows["batch / micro-batch"].value == "512 / 512"


def test_a_newer_runner_of_the_same_model_wins_and_a_reused_pid_replaces_the_old_one(data_dir: Path) -> None:
    now = time.time()
    build_store(data_dir, now)
    w = StoreWriter(db_path(data_dir))
    try:
        w.write(PutRunners([_runner(now - 900, 5133, 2)]))
        w.write(PutRunners([_runner(now - 60, 6001, 4)]))  # reloaded with other settings: this one served last
        w.write(PutRunners([]))
    finally:
        w.close()
    m = build_why(db_path(data_dir), MODEL, now, 3600)
    assert m is not None and m.runner is not None and (m.runner.pid, m.runner.parallel) == (6001, 4)

    w = StoreWriter(db_path(data_dir))
    try:
        w.write(PutRunners([_runner(now - 30, 5133, 1)]))  # the pid came back for another runner
    finally:
        w.close()
    conn = queries.open_readonly(data_dir)
    try:
        assert [(r.pid, r.parallel) for r in queries.runners(conn)] == [(5133, 1), (6001, 4)]
    finally:
        conn.close()
