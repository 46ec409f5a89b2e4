"""Issue 45, the MLX runner end to end: ``python -m sim --engine mlx`` (a real process) starts its runner child as Ollama
does, ``ollama runner --mlx-engine --model NAME --port N``, and writes its lines into its log file; the collector's
runner reader, finding that child among sim's processes, records a generation sent to sim directly once, with the
prompt and cached counts sim's own reply gives, output tokens unknown (no MLX line says them), and its prompt read."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from analysis.records import Outcome, ProgressSample, RequestRecord
from collectors.ollama.discovery import FOUND_SAME_USER, MLX_RUNNER, Discovery, Runner, runner_from_argv
from collectors.ollama.runners import RunnerReader
from sim.llama_server_engine import free_loopback_port
from sim.tokens import make_prompt

MODEL = "qwen3:0.6b"
PROMPT_TOKENS = 3000
REPO = Path(__file__).resolve().parents[3]


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        out: dict[str, Any] = json.load(r)
        return out


def _runner_of(sim_pid: int) -> Runner:
    found = []
    for child in psutil.Process(sim_pid).children():
        runner = runner_from_argv(child.pid, child.name(), child.cmdline())
        if runner is not None:
            found.append(runner)
    (runner,) = found
    assert runner.kind == MLX_RUNNER and runner.model_path == MODEL
    return runner


def test_sim_engine_mlx_generation_recorded_once_from_its_runner(tmp_path: Path) -> None:
    port, log_path = free_loopback_port(), tmp_path / "server.log"
    argv = [sys.executable, "-m", "sim", "--engine", "mlx", "--model-name", MODEL, "--port", str(port)]
    sim = subprocess.Popen([*argv, "--log-file", str(log_path)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(base + "/api/version", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        _post(base + "/api/generate", {"model": MODEL, "prompt": ""})  # a preload: Ollama starts its runner
        runner = _runner_of(sim.pid)
        records, samples, reply, window_ns = asyncio.run(_read(runner, log_path, base))
    finally:
        sim.terminate()
        assert sim.wait(timeout=15) == 0
    assert not psutil.pid_exists(runner.pid) or psutil.Process(runner.pid).status() == psutil.STATUS_ZOMBIE

    (rec,) = [r for r in records if r.outcome is not Outcome.IN_FLIGHT]
    assert rec.metrics is not None and rec.model == MODEL and rec.runner_port == runner.port
    assert rec.metrics.prompt_eval_count == reply["prompt_eval_count"] >= PROMPT_TOKENS
    assert rec.metrics.prompt_eval_cached_count == reply["prompt_eval_cached_count"] == 0
    assert reply["eval_count"] == 8 and rec.metrics.eval_count is None  # Ollama's reply has it; no MLX line does
    # The runner's "took" (its ServeHTTP line) runs from its handler's start to after its last write; it lies inside
    # this test's window, from before the request was sent to when the record came out of its log line. Not bounded
    # by the reply's total_duration: sim stops that clock after reading the runner's last write, and a loaded machine
    # may pause the runner between that write and its own stamp (seen: 661.5 ms against 659.0 ms).
    took_ns = rec.metrics.total_duration_ns
    assert took_ns is not None and 0 < took_ns <= window_ns
    assert reply["total_duration"] <= window_ns  # the window holds sim's whole request too: it is no looser than that
    mine = [s for s in samples if s.request_id == rec.id]
    assert len(mine) >= 2 and mine[0].processed_tokens < mine[-1].processed_tokens < reply["prompt_eval_count"]


async def _read(
    runner: Runner, log_path: Path, base: str
) -> tuple[list[RequestRecord], list[ProgressSample], dict[str, Any], int]:
    """The records and samples read while one generation ran; its reply; and the window (ns) from before it was
    sent to when its record was read."""
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        reader = RunnerReader(
            base,
            session,
            in_flight=list,
            loaded_models=list,
            log_path=log_path,
            busy_interval_s=0.05,
            idle_interval_s=0.1,
            discover=lambda _url: Discovery([runner], found_by=FOUND_SAME_USER),
        )
        task = asyncio.create_task(reader.run(stop))
        records: list[RequestRecord] = []
        samples: list[ProgressSample] = []
        while reader.mlx.runner is None:
            await asyncio.sleep(0.03)
        body = {"model": MODEL, "prompt": make_prompt(PROMPT_TOKENS), "stream": False, "options": {"num_predict": 8}}
        sent_ns = time.monotonic_ns()
        sender = asyncio.create_task(asyncio.to_thread(_post, base + "/api/generate", body))
        while not (sender.done() and any(r.outcome is not Outcome.IN_FLIGHT for r in records)):
            await asyncio.sleep(0.03)
            records.extend(reader.drain_direct()[0])
            samples.extend(reader.drain())
        window_ns = time.monotonic_ns() - sent_ns
        stop.set()
        await task
        return records, samples, sender.result(), window_ns
