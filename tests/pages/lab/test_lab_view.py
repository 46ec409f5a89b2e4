"""What the Lab page reads: models and recent rates from a real store, merged run history, run liveness."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.pages_fixture import build_fixture_store
from collectors.lab import launcher
from collectors.lab.experiments import EXPERIMENTS, make_params
from collectors.lab.ingest import store_row
from collectors.lab.results import CANCELLED, DONE, RUNNING, ExperimentResult, RunState, lab_dir, write_result
from pages.lab import view
from pages.shared.window import ModelWindow
from pages.why.view import build_why
from store.ops import PutExperiment
from store.schema import db_path
from store.writer import StoreWriter


def _doc(run_id: str, started: float, state: RunState = DONE, pid: int | None = None) -> ExperimentResult:
    return ExperimentResult(
        "prompt-cache", run_id, "llama3.2:latest", "http://127.0.0.1:11435", {}, started, state=state, pid=pid
    )


def test_models_and_rates_come_from_the_store(tmp_path: Path) -> None:
    build_fixture_store(tmp_path, time.time())
    models = view.known_models(db_path(tmp_path))
    assert "llama3.2:latest" in models and "llama3.1:8b" in models
    rates = view.recent_rates(db_path(tmp_path), "llama3.2:latest")
    assert rates.measured and rates.prefill_tok_s > rates.decode_tok_s > 0
    unknown = view.recent_rates(db_path(tmp_path), "nosuch")
    assert not unknown.measured and unknown.prefill_tok_s == view.FALLBACK_PREFILL_TOK_S
    cost = EXPERIMENTS["prompt-cache"].cost(make_params("prompt-cache"), 4096)
    sentence = view.cost_sentence(cost, rates)
    assert sentence.startswith(f"Sends {cost.requests} requests") and "as the Why page reads it" in sentence
    assert "slow machine" in view.cost_sentence(cost, unknown)


def test_lab_reads_the_speeds_why_reads_in_the_same_window(tmp_path: Path) -> None:
    """Issue 40 item 6: one function and one window for a model's speeds (Lab once said 3,477 / 4,039 tok/s where
    Why's medians were 6,290-7,135: all requests of 7 days, short and impossible readings included)."""
    now = time.time()
    build_fixture_store(tmp_path, now)
    measured = set()
    for model in ("llama3.2:latest", "llama3.1:8b"):
        for window_s in (300.0, 86_400.0):
            why = build_why(db_path(tmp_path), model, now, window_s)
            rates = view.recent_rates(db_path(tmp_path), model, now, window_s)
            assert why is not None
            if why.prefill_median_tok_s is None or why.decode_median_tok_s is None:
                assert not rates.measured  # no reading that counts: the Lab's guess, said so
                continue
            assert rates.measured and rates.window == why.window
            assert (rates.prefill_tok_s, rates.decode_tok_s) == (why.prefill_median_tok_s, why.decode_median_tok_s)
            measured.add(model)
    assert "llama3.2:latest" in measured


def test_the_cost_says_which_request_gives_no_point() -> None:
    """Lab said "sends 9 requests" and showed 8 points: the first is the warm-up."""
    cost = EXPERIMENTS["prompt-length"].cost(make_params("prompt-length"), 8192)
    assert cost.warm_up_requests == 1
    sentence = view.cost_sentence(cost, view.Rates(1000.0, 50.0, True))
    assert sentence.startswith(f"Sends {cost.requests} requests (the first a warm-up that gives no point)"), sentence


def test_no_store_means_no_models_and_fallback_rates(tmp_path: Path) -> None:
    assert view.known_models(db_path(tmp_path)) == []
    assert view.loaded_context(db_path(tmp_path), "x") is None
    assert not view.recent_rates(db_path(tmp_path), "x").measured


def test_history_merges_store_rows_and_documents_document_wins(tmp_path: Path) -> None:
    now = time.time()
    writer = StoreWriter(db_path(tmp_path))
    try:
        writer.write(PutExperiment(**store_row(_doc("stored", now - 100))))
        writer.write(PutExperiment(**store_row(_doc("both", now - 50, RUNNING))))
    finally:
        writer.close()
    write_result(lab_dir(tmp_path) / "both.json", _doc("both", now - 50, CANCELLED))
    write_result(lab_dir(tmp_path) / "file.json", _doc("file", now - 10))
    runs = view.load_runs(tmp_path, db_path(tmp_path))
    assert [(r.run_id, r.state) for r in runs] == [("file", DONE), ("both", CANCELLED), ("stored", DONE)]


def test_a_running_document_whose_process_is_gone_is_interrupted() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert launcher.interrupted(_doc("r1", time.time(), RUNNING, pid=gone.pid))
    # A live process that is not this run (our own pid) does not count either: no pid reuse fooling us.
    assert not launcher.is_alive(_doc("r2", time.time(), RUNNING, pid=os.getpid()))
    assert not launcher.cancel(_doc("r3", time.time(), RUNNING, pid=os.getpid()))
    assert not launcher.interrupted(_doc("r4", time.time(), DONE, pid=gone.pid))


def test_command_line_of_a_run() -> None:
    argv = launcher.command("concurrency", "http://127.0.0.1:11435", "m", Path("/d"), "abc", {"max_streams": 2}, 8192)
    assert argv[1:] == [
        "-m",
        "collectors.lab",
        "concurrency",
        "--ollama",
        "http://127.0.0.1:11435",
        "--model",
        "m",
        "--data",
        "/d",
        "--run-id",
        "abc",
        "--max-streams",
        "2",
        "--num-ctx",
        "8192",
    ]


def test_points_table_has_human_names_and_the_units_convention() -> None:
    frame = view.points_frame(
        [
            {"prompt_tokens": 512, "prefill_tok_s": 20123.4, "ttft_s": 0.034, "decode_tok_s": None, "size_bytes": 4.9e9},
            {"prompt_tokens": 1024, "prefill_tok_s": 19000.0, "ttft_s": 3.2, "load_ms": 250.0},
        ]
    )
    assert list(frame.columns) == ["prompt tokens", "prefill (tok/s)", "first token", "decode (tok/s)", "size", "load"]
    first, second = frame.iloc[0].to_dict(), frame.iloc[1].to_dict()
    assert first == {
        "prompt tokens": "512",
        "prefill (tok/s)": "20,123",
        "first token": "34 ms",
        "decode (tok/s)": "—",
        "size": "4.90 GB",
        "load": "—",
    }
    assert second["prompt tokens"] == "1,024" and second["first token"] == "3.20 s" and second["load"] == "250 ms"
    assert "None" not in frame.to_string() and not any("_" in c for c in frame.columns)


def test_readings_set_apart_are_not_called_absent() -> None:
    """Readings that exist but none counts (e.g. all above the ceiling of the hardware they ran on) are said so."""
    cost = EXPERIMENTS["prompt-length"].cost(make_params("prompt-length"), 8192)
    win = ModelWindow(1000.0, 300.0, 1000.0)
    flagged = view.Rates(view.FALLBACK_PREFILL_TOK_S, view.FALLBACK_DECODE_TOK_S, False, 12, win)
    assert "none of this model's 12 readings over the last 5 min" in view.cost_sentence(cost, flagged)
