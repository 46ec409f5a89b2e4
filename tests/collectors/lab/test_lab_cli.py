"""``python -m collectors.lab``: JSON on stdout, clear errors with exit code 2, SIGTERM cancels."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from collectors.lab.results import CANCELLED, read_result
from tests.support.ports import free_port
from tests.support.sim_process import REPO_ROOT, SimProcess

MODEL = "qwen2.5:0.5b"

pytestmark = pytest.mark.sim_args("--hardware", "rtx-3090", "--num-parallel", "2")


def lab(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collectors.lab", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_json_result_has_name_parameters_points(sim: SimProcess) -> None:
    p = lab("prompt-length", "--ollama", sim.base_url, "--model", MODEL, "--max-prompt-tokens", "256", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # exactly one JSON object
    assert doc["name"] == "prompt-length"
    assert doc["state"] == "done"
    assert doc["parameters"]["max_prompt_tokens"] == 256
    assert doc["parameters"]["min_prompt_tokens"] == 64
    assert [pt["prompt_tokens_target"] for pt in doc["points"]] == [64, 128, 256]
    assert all(pt["prefill_tok_s"] > 0 and pt["ttft_s"] > 0 for pt in doc["points"])
    assert doc["conclusion"]
    assert doc["model_facts"]["layers"] == 24 and doc["model_facts"]["kv_heads"] == 2
    assert "[" not in p.stderr  # no progress bar when stderr is not a terminal


@pytest.mark.slow
def test_host_without_scheme_and_port_default(sim: SimProcess) -> None:
    p = lab("cold-warm", "--ollama", f"127.0.0.1:{sim.port}", "--model", MODEL, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ollama_url"] == sim.base_url


def test_unreachable_ollama_exits_2_with_a_clear_message() -> None:
    port = free_port()
    p = lab("prompt-length", "--ollama", f"http://127.0.0.1:{port}", "--model", MODEL, "--json")
    assert p.returncode == 2
    assert f"cannot reach Ollama at http://127.0.0.1:{port}" in p.stderr
    assert p.stdout == ""


def test_bad_address_exits_2_and_the_document_says_why(tmp_path: Path) -> None:
    p = lab("cold-warm", "--ollama", "ftp://box", "--model", MODEL, "--data", str(tmp_path), "--run-id", "r1")
    assert p.returncode == 2 and "scheme 'ftp' is not supported" in p.stderr
    doc = read_result(tmp_path / "lab" / "r1.json")  # what the Lab page shows
    assert doc.state == "failed" and doc.error and "not supported" in doc.error


def test_unknown_model_exits_2_and_names_the_known_ones(sim: SimProcess) -> None:
    p = lab("prompt-length", "--ollama", sim.base_url, "--model", "nosuch:7b", "--json")
    assert p.returncode == 2
    assert "model 'nosuch:7b' not found" in p.stderr and "qwen2.5:0.5b" in p.stderr


def test_parameter_of_another_experiment_is_rejected(sim: SimProcess) -> None:
    p = lab("prompt-length", "--ollama", sim.base_url, "--model", MODEL, "--prefix-tokens", "100")
    assert p.returncode == 2
    assert "prompt-length has no parameter prefix_tokens" in p.stderr


@pytest.mark.slow
def test_bad_values_exit_2_before_anything_is_sent(sim: SimProcess) -> None:
    p = lab(
        "prompt-length", "--ollama", sim.base_url, "--model", MODEL, "--min-prompt-tokens", "900", "--max-prompt-tokens", "100"
    )
    assert p.returncode == 2 and "larger than max_prompt_tokens" in p.stderr
    p = lab("prompt-length", "--ollama", sim.base_url, "--model", MODEL, "--timeout", "0")
    assert p.returncode == 2 and "must be positive" in p.stderr


def test_dry_run_prints_the_cost_and_sends_nothing(sim: SimProcess) -> None:
    p = lab("concurrency", "--ollama", sim.base_url, "--model", MODEL, "--max-streams", "4", "--num-predict", "10", "--dry-run")
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    # Warm-up, then 1 + 2 + 4 streams.
    assert plan["cost"]["requests"] == 8
    assert plan["cost"]["output_tokens"] == 1 + 7 * 10


@pytest.mark.slow
def test_sigterm_cancels_keeps_partial_result_and_closes_streams(sim: SimProcess, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collectors.lab",
            "concurrency",
            "--ollama",
            sim.base_url,
            "--model",
            MODEL,
            "--max-streams",
            "2",
            "--num-predict",
            "3000",
            "--out",
            str(out),
            "--json",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # the document appears at once; wait until the first streams run
            assert time.monotonic() < deadline and proc.poll() is None
            if out.exists() and read_result(out).progress.done >= 1:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    assert proc.returncode == 130, stderr
    doc = json.loads(stdout)
    assert doc["state"] == CANCELLED
    saved = read_result(out)
    assert saved.state == CANCELLED and saved.finished_at_unix_s is not None
    # The stream the run had open was closed, and the server stopped generating for it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with urllib.request.urlopen(sim.base_url + "/sim/truth", timeout=5) as r:
            records = json.load(r)["requests"]
        if all(rec["done_ns"] is not None for rec in records):
            break
        time.sleep(0.05)
    cut = [rec for rec in records if rec["cancelled"]]
    assert cut and all(len(rec["token_sampled_ns"]) < 3000 for rec in cut)
    assert all(rec["done_ns"] is not None for rec in records)


@pytest.mark.slow
def test_progress_bar_on_a_terminal(sim: SimProcess) -> None:
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collectors.lab",
                "prompt-cache",
                "--ollama",
                sim.base_url,
                "--model",
                MODEL,
                "--prefix-tokens",
                "256",
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
        )
        os.close(follower)
        seen = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        proc.communicate(timeout=10)
    finally:
        os.close(leader)
    assert proc.returncode == 0
    text = seen.decode(errors="replace")
    assert "\r[" in text and "3/3" in text
