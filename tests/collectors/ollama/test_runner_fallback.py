"""Runners that cannot be read: real child processes the discovery finds, answering /slots with 404, 501,
garbage or HTML, not listening at all, or exiting mid-request. No exception, no reading stored, the reader
runs on and says why (the request keeps its estimate, written elsewhere)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.ollama.discovery import discover
from tests.support.reader_run import ReaderRun, in_flight_record, loaded, run_reader
from tests.support.runner_process import REPO_ROOT, OllamaStandIn, ps_entry, start_bad_runner

MODEL = "gemma3:270m"
DIGEST = "ab" * 32


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / f"sha256-{DIGEST}"  # Ollama's blob name: the digest without hashing
    path.write_bytes(b"GGUF")
    return path


def test_discovery_finds_a_child_named_llama_server(model_file: Path) -> None:
    with OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama, start_bad_runner("404", model_file) as child:
        found = discover(ollama.base_url)
    runners, problem = found.runners, found.problem
    assert problem is None
    assert [(r.pid, r.port, r.model_path) for r in runners] == [(child.proc.pid, child.port, str(model_file))]


def test_remote_ollama_has_no_runner_to_read() -> None:
    found = discover("http://192.0.2.1:11434")
    runners, problem = found.runners, found.problem
    assert runners == [] and problem is not None and "not on this machine" in problem


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("404", "HTTP 404"),
        ("501", "HTTP 501"),
        ("garbage", "not a list of slots"),
        ("html", "not a list of slots"),
    ],
)
def test_unreadable_runner_no_exception_no_reading(model_file: Path, mode: str, why: str) -> None:
    request = in_flight_record("r1", MODEL)

    def tried_twice_and_said_why(run: ReaderRun) -> bool:  # a poll counts once its answer is judged
        return run.reader.polls >= 2 and any(why in (s.problem or "") for s in run.reader.runners.values())

    with OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama, start_bad_runner(mode, model_file) as child:
        # The second try comes RETRY_INTERVAL_S (2 s) after the first: stop then, not after a fixed wait.
        run = asyncio.run(
            run_reader(
                ollama.base_url,
                in_flight=lambda: [request],
                models=loaded(ollama.models),
                seconds=15.0,
                until=tried_twice_and_said_why,
            )
        )
    assert not run.task_done_early and run.reader.errors == 0
    assert run.samples == []
    assert run.reader.polls >= 2, "it kept trying"
    states = list(run.reader.runners.values())
    assert [s.runner.pid for s in states] == [child.proc.pid]
    assert states[0].problem is not None and why in states[0].problem


def test_a_runner_whose_port_nobody_listens_on_is_not_adopted(model_file: Path) -> None:
    """What answers on a runner's port is read only once the runner itself holds it (issue 29)."""
    request = in_flight_record("r1", MODEL)
    with OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama, start_bad_runner("closed", model_file) as child:
        run = asyncio.run(run_reader(ollama.base_url, in_flight=lambda: [request], models=loaded(ollama.models), seconds=2.0))
    assert not run.task_done_early and run.reader.errors == 0 and run.samples == []
    assert run.reader.runners == {}
    assert f"nothing listens on its port {child.port} (yet)" in (
        (run.reader.discovery.problem if run.reader.discovery else None) or ""
    )


def test_runner_exiting_mid_request(model_file: Path) -> None:
    """One good reading, then the runner is gone: the reading is kept, counts only; the reader runs on and drops it."""
    request = in_flight_record("r1", MODEL)
    with OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama, start_bad_runner("exit", model_file):
        run = asyncio.run(
            run_reader(
                ollama.base_url,
                in_flight=lambda: [request],
                models=loaded(ollama.models),
                seconds=15.0,
                # Read once, then gone from the reader's runners: nothing further can come.
                until=lambda run: bool(run.samples) and run.reader.runners == {},
            )
        )
    assert not run.task_done_early and run.reader.errors == 0
    assert len(run.samples) == 1
    sample = run.samples[0]
    assert (sample.request_id, sample.processed_tokens, sample.cached_tokens, sample.decoded_tokens) == ("r1", 512, 0, 0)
    assert sample.prompt_tokens is None, "n_prompt_tokens runs a batch ahead while the prompt is read: not its size"
    assert (sample.ctx_used_tokens, sample.n_ctx) == (1024, 4096)
    assert "SECRET" not in repr(run.samples) + json.dumps(run.reader.snapshot())
    assert run.reader.runners == {}, "rediscovery dropped the runner that exited"


@pytest.mark.slow
def test_cli_prints_runners_and_slots_counts_only(model_file: Path) -> None:
    with OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama, start_bad_runner("exit", model_file) as child:
        out = subprocess.run(
            [sys.executable, "-m", "collectors.ollama", "--ollama", ollama.base_url, "--json"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    assert "SECRET" not in out.stdout
    found = json.loads(out.stdout)
    [runner] = found["runners"]
    assert (runner["pid"], runner["port"], runner["model"], runner["digest"]) == (child.proc.pid, child.port, MODEL, DIGEST)
    assert runner["problem"] is None
    assert [(s["slot_id"], s["processed_tokens"], s["ctx_tokens"], s["n_ctx"]) for s in runner["slots"]] == [(0, 512, 1024, 4096)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["garbage", "exit"])
def test_collector_runs_on_beside_an_unreadable_runner(model_file: Path, tmp_path: Path, mode: str) -> None:
    """``python -m collectors`` watching an Ollama whose runner answers garbage, or exits: it says so and records on."""
    from tests.support.collector_process import collector, query

    data = tmp_path / "data"
    with (
        OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama,
        start_bad_runner(mode, model_file) as child,
        collector(data, "--ollama", ollama.base_url) as proc,
    ):
        time.sleep(4.0)
        assert proc.poll() is None, "the collector runs on"
        beats = query(data, "SELECT COUNT(*) AS n FROM collector_heartbeat")[0]["n"]
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and beats >= 1
    assert f"pid {child.proc.pid} port {child.port}" in err, "found the runner"
    assert mode != "garbage" or "not a list of slots" in err, "and said why it cannot read it"
    assert "Traceback" not in err
