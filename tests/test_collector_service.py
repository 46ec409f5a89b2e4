"""The collector's orchestration in-process: sim on a loopback port, a real SQLite store, fake NVML."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import ollama
import pytest

from analysis.records import HostSample, Outcome, RequestRecord
from collectors.config import Settings, load_settings
from collectors.lock import read_lock
from collectors.metrics import parse_exposition
from collectors.service import INTERRUPTED_REASON, CollectorService
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.fake_pynvml import FakeGpu, FakeNvml
from tests.support.sim_process import SimProcess, start_sim

MODEL = "qwen2.5:0.5b"


def _settings(sim_url: str, data: Path, *extra: str) -> Settings:
    return load_settings(["--ollama", sim_url, "--listen", "127.0.0.1:0", "--data", str(data), "--interval", "0.2", *extra], {})


def _query(data: Path, sql: str, *args: Any) -> list[sqlite3.Row]:
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute(sql, args))
    finally:
        conn.close()


async def _until(cond: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_records_requests_samples_and_serves_metrics(tmp_path: Path) -> None:
    with start_sim("--hardware", "cpu") as sim:  # a slow profile: a long reply takes seconds
        asyncio.run(_records_everything(sim, tmp_path))


async def _records_everything(sim: SimProcess, data: Path) -> None:
    gpu = FakeGpu(uuid="GPU-fake-0", compute_processes=[(sim.proc.pid, 3 << 30), (1, 1 << 30)])
    service = CollectorService(_settings(sim.base_url, data, "--ollama-pids", str(sim.proc.pid)), nvml=FakeNvml([gpu]))
    await service.start()
    try:
        info = read_lock(data)
        assert info is not None and info.pid == os.getpid() and info.listen == service.listen
        assert info.ollama_url == sim.base_url
        client = ollama.AsyncClient(host=f"http://{service.listen}")

        # A short streamed chat, through the proxy.
        parts = [p async for p in await client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)]
        assert parts[-1].done

        # A long generation: its row shows up in flight while it runs, then finished.
        stream = await client.generate(model=MODEL, prompt="tell me a long story", stream=True, options={"num_predict": 400})
        seen, last_done = 0, False
        async for part in stream:
            seen, last_done = seen + 1, bool(part.done)
            if seen == 20:
                # (The chat's row may still read in flight for one write batch: ask for this one.)
                rows = await _until(
                    lambda: _query(
                        data,
                        "SELECT * FROM requests WHERE outcome = 'in_flight' AND endpoint = '/api/generate' AND tokens_so_far > 0",
                    )
                )
                assert rows[0]["endpoint"] == "/api/generate" and rows[0]["model"] == MODEL
        assert last_done and seen > 20

        await _until(lambda: len(_query(data, "SELECT id FROM requests WHERE outcome = 'ok'")) == 2)
        rows = _query(data, "SELECT * FROM requests ORDER BY started_at_unix_s")
        assert [r["endpoint"] for r in rows] == ["/api/chat", "/api/generate"]
        assert rows[1]["eval_count"] == 400 and rows[1]["prompt_text"] is None  # text only with --record-text

        # Samplers, poller and heartbeat, every interval.
        await _until(lambda: _query(data, "SELECT 1 FROM model_info"))
        gpu_rows = await _until(lambda: _query(data, "SELECT * FROM gpu_samples"))
        assert gpu_rows[-1]["uuid"] == "GPU-fake-0" and gpu_rows[-1]["ollama_mem_bytes"] == 3 << 30
        assert gpu_rows[-1]["power_w"] == gpu.power_mw / 1000
        host = await _until(lambda: _query(data, "SELECT * FROM host_samples WHERE ollama_rss_bytes IS NOT NULL"))
        assert host[-1]["ollama_rss_bytes"] > 10 << 20  # the sim process
        (beat,) = _query(data, "SELECT * FROM collector_heartbeat")
        assert (beat["pid"], beat["listen"], beat["gpu_state"], beat["ollama_url"]) == (
            os.getpid(),
            service.listen,
            "nvml",
            sim.base_url,
        )
        (poll,) = _query(data, "SELECT * FROM ollama_last_poll")
        assert poll["up"] == 1 and poll["version"] == "0.33.3"
        loaded = _query(data, "SELECT DISTINCT name FROM loaded_models")
        assert [r["name"] for r in loaded] == [MODEL]
        (show,) = _query(data, "SELECT * FROM model_info")
        assert show["name"] == MODEL and '"general.architecture": "qwen2"' in show["show_json"]

        # /phasewatch/metrics, served by the proxy itself.
        async with aiohttp.ClientSession() as session, session.get(f"http://{service.listen}/phasewatch/metrics") as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            metrics = parse_exposition(await resp.text())
        assert metrics[("phasewatch_ollama_up", (("url", sim.base_url),))] == 1
        assert metrics[("phasewatch_requests_total", (("endpoint", "/api/generate"), ("model", MODEL), ("outcome", "ok")))] == 1
        assert metrics[("phasewatch_ttft_seconds_count", ())] == 2
        gpu_labels = (("gpu", "0"), ("name", gpu.name), ("simulated", "false"), ("uuid", "GPU-fake-0"))
        assert metrics[("phasewatch_gpu_ollama_memory_used_bytes", gpu_labels)] == 3 << 30
    finally:
        await service.stop()
    assert read_lock(data) is None


def test_start_marks_requests_left_in_flight(tmp_path: Path) -> None:
    writer = StoreWriter(db_path(tmp_path))
    writer.write_request(
        RequestRecord(
            id="left", started_at_unix_s=time.time(), client_addr="127.0.0.1", endpoint="/api/chat", model=MODEL, stream=True
        )
    )
    writer.close()
    assert _query(tmp_path, "SELECT outcome FROM requests")[0]["outcome"] == Outcome.IN_FLIGHT.value

    async def start_and_stop() -> None:
        service = CollectorService(_settings("http://127.0.0.1:9", tmp_path), nvml=FakeNvml([]))
        await service.start()
        await service.stop()

    asyncio.run(start_and_stop())
    (row,) = _query(tmp_path, "SELECT outcome, error FROM requests WHERE id = 'left'")
    assert (row["outcome"], row["error"]) == (Outcome.UPSTREAM_FAILED.value, INTERRUPTED_REASON)


def test_demo_mode_samples_the_sims_gpu(tmp_path: Path) -> None:
    with start_sim("--hardware", "rtx-4090") as sim:

        async def scenario() -> None:
            service = CollectorService(_settings(sim.base_url, tmp_path, "--demo"))  # no NVML at all
            await service.start()
            try:
                rows = await _until(lambda: _query(tmp_path, "SELECT * FROM gpu_samples"))
                assert rows[-1]["simulated"] == 1 and "RTX 4090" in rows[-1]["name"]
                host = await _until(lambda: _query(tmp_path, "SELECT * FROM host_samples WHERE ollama_rss_bytes > 0"))
                assert host  # `python -m sim` counts as Ollama in demo mode
                (beat,) = await _until(lambda: _query(tmp_path, "SELECT * FROM collector_heartbeat"))
                assert beat["gpu_state"] == "simulated" and beat["demo"] == 1
            finally:
                await service.stop()

        asyncio.run(scenario())


def test_stop_reports_records_the_store_would_not_take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process holds the store's write lock: stop() gives up after its timeout and says how many were lost."""
    monkeypatch.setattr("collectors.service.WRITER_CLOSE_TIMEOUT_S", 1.0)

    async def scenario() -> None:
        service = CollectorService(_settings("http://127.0.0.1:9", tmp_path), nvml=FakeNvml([]))
        await service.start()
        assert service.writer is not None and service.writer.flush(5)
        blocker = sqlite3.connect(db_path(tmp_path), isolation_level=None)
        try:
            blocker.execute("BEGIN EXCLUSIVE")
            await _until(lambda: service.writer is not None and service.writer.pending_count > 0)  # heartbeats queue up
            await service.stop()
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert service.unwritten_records > 0
        assert service.unwritten_error is not None and "locked" in service.unwritten_error

    asyncio.run(scenario())


def test_retention_options_apply_at_start(tmp_path: Path) -> None:
    now = time.time()
    writer = StoreWriter(db_path(tmp_path))
    writer.write_host_sample(HostSample(ts_unix_s=now - 3 * 86400, cpu_pct=1, mem_used_bytes=1, mem_total_bytes=2))
    writer.write_host_sample(HostSample(ts_unix_s=now - 0.5 * 86400, cpu_pct=2, mem_used_bytes=1, mem_total_bytes=2))
    writer.close()

    async def start_and_stop() -> None:
        service = CollectorService(_settings("http://127.0.0.1:9", tmp_path, "--samples-days", "1"), nvml=FakeNvml([]))
        await service.start()
        await service.stop()

    asyncio.run(start_and_stop())
    kept = [r["cpu_pct"] for r in _query(tmp_path, "SELECT cpu_pct FROM host_samples WHERE ts_unix_s < ?", now - 60)]
    assert kept == [2.0]  # the 3-day-old sample is gone, the half-day-old one stays


def test_lab_run_documents_reach_the_experiments_table(tmp_path: Path) -> None:
    """A Lab run writes its result file; the collector (the store's only writer) copies it on its tick."""
    with start_sim("--hardware", "rtx-4090") as sim:
        asyncio.run(_lab_ingest(sim, tmp_path))


async def _lab_ingest(sim: SimProcess, data: Path) -> None:
    from collectors.lab.results import ExperimentResult, lab_dir, write_result
    from store.queries import experiments, open_readonly

    service = CollectorService(_settings(sim.base_url, data), nvml=FakeNvml([]))
    await service.start()
    try:
        run = ExperimentResult(
            name="prompt-length", run_id="run-1", model=MODEL, ollama_url=f"http://{service.listen}",
            parameters={"min_prompt_tokens": 64}, started_at_unix_s=time.time(), state="done",
            points=[{"prompt_tokens": 64, "prefill_tok_s": 1234.5}],
        )
        write_result(lab_dir(data) / "run-1.json", run)

        def stored() -> list[dict[str, Any]]:
            conn = open_readonly(data)
            try:
                return experiments(conn)
            finally:
                conn.close()

        rows = await _until(stored)
        assert rows[0]["id"] == "run-1" and rows[0]["kind"] == "prompt-length" and rows[0]["status"] == "done"
        assert rows[0]["results"]["points"] == [{"prompt_tokens": 64, "prefill_tok_s": 1234.5}]
    finally:
        await service.stop()
