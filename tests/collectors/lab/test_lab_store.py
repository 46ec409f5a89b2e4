"""Lab runs in the store: the ingester copies run documents into the experiments table, and a run
cancelled through the real proxy leaves the store consistent (no request left in flight)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collectors.lab.ingest import LabIngester, result_from_row
from collectors.lab.results import CANCELLED, DONE, ExperimentResult, RunState, lab_dir, read_result, write_result
from collectors.lock import read_lock
from store import queries
from store.ops import PutExperiment
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.collector_process import query
from tests.support.sim_process import REPO_ROOT, start_sim
from tests.support.waiting import wait_until

MODEL = "qwen2.5:0.5b"


def _sink(writer: StoreWriter) -> Callable[..., None]:
    """What the collector hands the ingester: each document as a ``PutExperiment``."""

    def sink(*args: Any, **kwargs: Any) -> None:
        writer.write(PutExperiment(*args, **kwargs))

    return sink


def _doc(run_id: str, state: RunState = DONE) -> ExperimentResult:
    return ExperimentResult(
        name="prompt-cache",
        run_id=run_id,
        model=MODEL,
        ollama_url="http://127.0.0.1:11435",
        parameters={"prefix_tokens": 2048, "num_predict": 4},
        started_at_unix_s=time.time(),
        state=state,
        points=[{"attempt": 1, "prefill_s": 0.5}, {"attempt": 2, "prefill_s": 0.01}],
        summary={"saved_fraction": 0.98},
        conclusion="saved",
        finished_at_unix_s=time.time() + 1,
        model_facts={"layers": 24},
    )


def test_ingester_stores_each_new_or_changed_document_once(tmp_path: Path) -> None:
    writer = StoreWriter(db_path(tmp_path))
    try:
        ingester = LabIngester(tmp_path, _sink(writer))
        assert ingester.poll() == 0  # no lab folder yet
        write_result(lab_dir(tmp_path) / "a.json", _doc("a"))
        (lab_dir(tmp_path) / "junk.json").write_text("[1, 2")
        (lab_dir(tmp_path) / "a.log").write_text("not a document")
        assert ingester.poll() == 1
        assert ingester.poll() == 0  # unchanged: nothing to do
        changed = _doc("a", CANCELLED)
        time.sleep(0.01)
        write_result(lab_dir(tmp_path) / "a.json", changed)
        assert ingester.poll() == 1
    finally:
        writer.close()
    conn = queries.open_readonly(db_path(tmp_path))
    try:
        rows = queries.experiment_rows(conn)
    finally:
        conn.close()
    assert len(rows) == 1 and rows[0].status == CANCELLED and rows[0].kind == "prompt-cache"
    assert result_from_row(rows[0]) == changed


@contextlib.contextmanager
def collector(data: Path, ollama_url: str) -> Iterator[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collectors",
            "--data",
            str(data),
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "0.2",
            "--ollama",
            ollama_url,
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while (info := read_lock(data)) is None or info.pid != proc.pid or not info.listen:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "collector did not get ready"
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.slow
def test_cancel_through_the_proxy_leaves_the_store_consistent(tmp_path: Path) -> None:
    with start_sim("--hardware", "rtx-3090", "--num-parallel", "2") as sim, collector(tmp_path, sim.base_url) as coll:
        info = read_lock(tmp_path)
        assert info is not None
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collectors.lab",
                "concurrency",
                "--ollama",
                info.listen,
                "--model",
                MODEL,
                "--max-streams",
                "2",
                "--num-predict",
                "3000",
                "--data",
                str(tmp_path),
                "--run-id",
                "cut1",
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        doc_path = lab_dir(tmp_path) / "cut1.json"
        try:
            deadline = time.monotonic() + 30
            while not (doc_path.exists() and read_result(doc_path).progress.done >= 1):
                assert run.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.3)  # the first measured stream is now generating
            run.send_signal(signal.SIGTERM)
            _, err = run.communicate(timeout=10)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(timeout=5)
        assert run.returncode == 130, err
        cancelled = "SELECT COUNT(*) AS n FROM requests WHERE model = ? AND outcome = 'cancelled'"
        wait_until(
            lambda: query(tmp_path, cancelled, MODEL)[0]["n"] == 1, 30, "the cancelled stream recorded", ignoring=(sqlite3.Error,)
        )
        coll.send_signal(signal.SIGTERM)
        coll.communicate(timeout=30)
        assert coll.returncode == 0
    # Now the collector is gone: the ingester (its job, normally on its tick) stores the run.
    writer = StoreWriter(db_path(tmp_path))
    try:
        assert LabIngester(tmp_path, _sink(writer)).poll() == 1
    finally:
        writer.close()
    conn = sqlite3.connect(f"file:{db_path(tmp_path)}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        outcomes = [r["outcome"] for r in conn.execute("SELECT outcome FROM requests WHERE model = ?", (MODEL,))]
        assert "in_flight" not in outcomes
        assert outcomes.count("cancelled") == 1  # the stream that was running when the run was cancelled
        assert outcomes.count("ok") >= 1  # the warm-up finished normally
        exp = conn.execute("SELECT * FROM experiments WHERE id = 'cut1'").fetchone()
        assert exp["status"] == CANCELLED and exp["ended_at_unix_s"] is not None
        assert json.loads(exp["results_json"])["conclusion"].startswith("Cancelled")
    finally:
        conn.close()
