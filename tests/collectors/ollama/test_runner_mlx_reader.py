"""Issue 45, the MLX runner through the collector's runner reader: sim's MLX runner (a real child, its lines copied
into a real log file as Ollama copies them) is polled on /v1/status, its log tailed; a direct generation comes out of
``drain_direct`` once (in flight while it runs, then final) with its progress rows from ``drain``, and a generation a
proxied request of its model accounts for is left to the proxy."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from analysis.records import Outcome, ProgressSample, ProgressSource, RequestRecord
from collectors.ollama.discovery import FOUND_SAME_USER, MLX_RUNNER, Discovery, runner_from_argv
from collectors.ollama.runners import RunnerReader
from sim.llama_server_engine import free_loopback_port
from sim.mlx_runner import start_mlx_runner
from sim.tokens import make_prompt
from tests.support.live_cards import record

MODEL = "qwen3:0.6b"
PROMPT_TOKENS = 3000


def _complete(port: int, prompt: str) -> dict[str, Any]:
    body = json.dumps({"prompt": prompt, "max_tokens": 8}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        out: dict[str, Any] = json.load(r)
        return out


def test_the_reader_records_an_mlx_generation_once_and_leaves_a_proxied_one(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    log_file = log_path.open("a", encoding="utf-8", buffering=1)
    lock = threading.Lock()

    def write(text: str) -> None:
        with lock:
            log_file.write(text + "\n")

    port = free_loopback_port()
    child = start_mlx_runner(MODEL, port, write)
    proxied: list[RequestRecord] = []
    try:
        for _ in range(200):
            if log_path.read_text(encoding="utf-8"):
                break  # its start line: it is up
            time.sleep(0.05)
        proc = psutil.Process(child.pid)
        runner = runner_from_argv(child.pid, proc.name(), proc.cmdline())
        assert runner is not None and runner.kind == MLX_RUNNER
        records, samples = asyncio.run(_run_reader(runner, log_path, port, proxied))
    finally:
        child.terminate()
        child.wait(timeout=10)
        log_file.close()

    final = [r for r in records if r.outcome is not Outcome.IN_FLIGHT]
    (rec,) = final  # the direct one, once; the proxied one not at all
    assert any(r.id == rec.id and r.outcome is Outcome.IN_FLIGHT for r in records), "Live saw it while it ran"
    assert rec.metrics is not None and rec.metrics.prompt_eval_count == PROMPT_TOKENS
    assert rec.metrics.prompt_eval_cached_count == 0 and rec.metrics.eval_count is None
    assert rec.model == MODEL and rec.runner_port == port
    mine = [s for s in samples if s.request_id == rec.id]
    assert len(mine) >= 2 and all(s.source is ProgressSource.LOG and s.prompt_tokens == PROMPT_TOKENS for s in mine)
    assert mine[0].processed_tokens < mine[-1].processed_tokens < PROMPT_TOKENS


async def _run_reader(
    runner: Any, log_path: Path, port: int, proxied: list[RequestRecord]
) -> tuple[list[RequestRecord], list[ProgressSample]]:
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        reader = RunnerReader(
            "http://127.0.0.1:9",
            session,
            in_flight=lambda: list(proxied),
            loaded_models=list,
            log_path=log_path,
            busy_interval_s=0.05,
            idle_interval_s=0.1,
            discover=lambda _url: Discovery([runner], found_by=FOUND_SAME_USER),
        )
        task = asyncio.create_task(reader.run(stop))
        records: list[RequestRecord] = []
        samples: list[ProgressSample] = []

        async def collect_until(done: Any) -> None:
            while not done():
                await asyncio.sleep(0.03)
                records.extend(reader.drain_direct()[0])
                samples.extend(reader.drain())

        await collect_until(lambda: reader.mlx.runner is not None)  # /v1/status answered: its lines are believed
        sender = asyncio.create_task(asyncio.to_thread(_complete, port, make_prompt(PROMPT_TOKENS)))
        await collect_until(lambda: sender.done() and any(r.outcome is not Outcome.IN_FLIGHT for r in records))
        # A proxied request of its model in flight: the generation is the proxy's, never recorded here.
        proxied.append(record("p" * 32, model=MODEL))
        await asyncio.to_thread(_complete, port, make_prompt(PROMPT_TOKENS, seed=1))
        await collect_until(lambda: reader.mlx.proxied == 1)
        stop.set()
        await task
        records.extend(reader.drain_direct()[0])
        return records, samples
