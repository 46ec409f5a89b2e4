"""The collector's orchestration in-process: sim on a loopback port, a real SQLite store, fake NVML."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import ollama
import pytest

from analysis.phases import split_record
from analysis.records import HostBandwidth, HostSample, Outcome, RequestRecord
from collectors.config import Settings, load_settings
from collectors.host.bandwidth import measure_host_bandwidth, same_machine
from collectors.lock import read_lock
from collectors.service import INTERRUPTED_REASON, CollectorService
from store import queries
from store.ops import REDERIVE_BATCH, PutHostBandwidth, PutHostSample, PutRequest
from store.schema import db_path
from store.tables import PHASES_VERSION
from store.writer import StoreWriter
from tests.support.exposition import parse_exposition
from tests.support.fake_pynvml import FakeGpu, FakeNvml
from tests.support.sim_process import SimProcess, start_sim
from tests.support.stale_phases import stale_phases_count

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


@pytest.mark.slow
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
        # One /api/show per digest: the loaded model's, and the installed ones' (/api/tags) beside it.
        (show,) = _query(data, f"SELECT * FROM model_info WHERE name = '{MODEL}'")
        assert '"general.architecture": "qwen2"' in show["show_json"]
        assert MODEL in [r["name"] for r in _query(data, "SELECT name FROM installed_models")]

        # /phasewatch/metrics, served by the proxy itself.
        async with aiohttp.ClientSession() as session, session.get(f"http://{service.listen}/phasewatch/metrics") as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            metrics = parse_exposition(await resp.text())
        assert metrics[("phasewatch_ollama_up", (("url", sim.base_url),))] == 1
        proxied = (("endpoint", "/api/generate"), ("model", MODEL), ("outcome", "ok"), ("source", "proxy"))
        assert metrics[("phasewatch_requests_total", proxied)] == 1
        port = sim.base_url.rsplit(":", 1)[1]
        ttft = {labels: v for (name, labels), v in metrics.items() if name == "gen_ai_server_time_to_first_token_seconds_count"}
        assert sum(ttft.values()) == 2 and all(("server_port", port) in labels for labels in ttft)
        gpu_labels = (("gpu", "0"), ("name", gpu.name), ("simulated", "false"), ("uuid", "GPU-fake-0"))
        assert metrics[("phasewatch_gpu_ollama_memory_used_bytes", gpu_labels)] == 3 << 30
    finally:
        await service.stop()
    assert read_lock(data) is None


def test_start_marks_requests_left_in_flight(tmp_path: Path) -> None:
    writer = StoreWriter(db_path(tmp_path))
    writer.write(
        PutRequest(
            RequestRecord(
                id="left", started_at_unix_s=time.time(), client_addr="127.0.0.1", endpoint="/api/chat", model=MODEL, stream=True
            )
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_no_runner_process_is_told_beside_what_api_ps_lists(tmp_path: Path) -> None:
    """sim serves its models without runner processes, as an Ollama in a container or on another machine seems to:
    "no model is loaded" only while /api/ps agrees, then the disagreement, with the model's name."""
    with start_sim("--hardware", "rtx-4090") as sim:

        async def scenario() -> None:
            service = CollectorService(_settings(sim.base_url, tmp_path))
            await service.start()
            try:

                def problem() -> str:
                    rows = _query(tmp_path, "SELECT runners_problem FROM collector_heartbeat")
                    return str(rows[0]["runners_problem"]) if rows and rows[0]["runners_problem"] else ""

                assert "(no model is loaded)" in await _until(lambda: "loaded" in problem() and problem())
                client = ollama.AsyncClient(host=f"http://{service.listen}")
                await client.generate(model=MODEL, prompt="hi", options={"num_predict": 4})
                told = await _until(lambda: "/api/ps lists" in problem() and problem())
                assert told.startswith(f"no runner process here, though Ollama's /api/ps lists {MODEL} as loaded")
                assert "no model is loaded" not in told
            finally:
                await service.stop()

        asyncio.run(scenario())


@pytest.mark.slow
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
    writer.write(PutHostSample(HostSample(ts_unix_s=now - 3 * 86400, cpu_pct=1, mem_used_bytes=1, mem_total_bytes=2)))
    writer.write(PutHostSample(HostSample(ts_unix_s=now - 0.5 * 86400, cpu_pct=2, mem_used_bytes=1, mem_total_bytes=2)))
    writer.close()

    async def start_and_stop() -> None:
        service = CollectorService(_settings("http://127.0.0.1:9", tmp_path, "--samples-days", "1"), nvml=FakeNvml([]))
        await service.start()
        await service.stop()

    asyncio.run(start_and_stop())
    kept = [r["cpu_pct"] for r in _query(tmp_path, "SELECT cpu_pct FROM host_samples WHERE ts_unix_s < ?", now - 60)]
    assert kept == [2.0]  # the 3-day-old sample is gone, the half-day-old one stays


@pytest.mark.slow
def test_lab_run_documents_reach_the_experiments_table(tmp_path: Path) -> None:
    """A Lab run writes its result file; the collector (the store's only writer) copies it on its tick."""
    with start_sim("--hardware", "rtx-4090") as sim:
        asyncio.run(_lab_ingest(sim, tmp_path))


async def _lab_ingest(sim: SimProcess, data: Path) -> None:
    from collectors.lab.results import DONE, ExperimentResult, lab_dir, write_result
    from store.queries import experiment_rows, open_readonly
    from store.tables import ExperimentRow

    service = CollectorService(_settings(sim.base_url, data), nvml=FakeNvml([]))
    await service.start()
    try:
        run = ExperimentResult(
            name="prompt-length",
            run_id="run-1",
            model=MODEL,
            ollama_url=f"http://{service.listen}",
            parameters={"min_prompt_tokens": 64},
            started_at_unix_s=time.time(),
            state=DONE,
            points=[{"prompt_tokens": 64, "prefill_tok_s": 1234.5}],
        )
        write_result(lab_dir(data) / "run-1.json", run)

        def stored() -> list[ExperimentRow]:
            conn = open_readonly(data)
            try:
                return experiment_rows(conn)
            finally:
                conn.close()

        rows = await _until(stored)
        assert rows[0].id == "run-1" and rows[0].kind == "prompt-length" and rows[0].status == "done"
        assert rows[0].results["points"] == [{"prompt_tokens": 64, "prefill_tok_s": 1234.5}]
    finally:
        await service.stop()


def _closed_port_url() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there once closed


def test_host_bandwidth_is_measured_once_per_machine_and_stored(tmp_path: Path) -> None:
    asyncio.run(_host_bandwidth(tmp_path))


async def _host_bandwidth(data: Path) -> None:
    measured: list[HostBandwidth] = []

    def measure() -> HostBandwidth:
        measured.append(measure_host_bandwidth(buffer_bytes=8 * 2**20, runs=1, threads=1))
        return measured[-1]

    async def run_once() -> None:
        service = CollectorService(_settings(_closed_port_url(), data), nvml=FakeNvml([]), host_bandwidth=measure)
        await service.start()
        try:
            await _until(lambda: (hb := _stored_bandwidth(data)) is not None and same_machine(hb))
        finally:
            await service.stop()

    await run_once()
    assert len(measured) == 1 and _stored_bandwidth(data) == measured[0]
    await run_once()  # the store holds this machine's figure: not measured again
    assert len(measured) == 1
    # A figure from another machine (the store moved to a bigger one) is measured again.
    raw = sqlite3.connect(db_path(data))
    raw.execute("DELETE FROM host_bandwidth")
    raw.commit()
    raw.close()
    w = StoreWriter(db_path(data))
    w.write(PutHostBandwidth(replace(measured[0], mem_total_bytes=1)))
    w.close()
    await run_once()
    assert len(measured) == 2 and _stored_bandwidth(data) == measured[1]


def test_the_apple_chip_is_read_by_the_collector_and_stored_beside_the_bandwidth(tmp_path: Path) -> None:
    asyncio.run(_apple_chip(tmp_path))


async def _apple_chip(data: Path) -> None:
    # The page no longer runs sysctl/system_profiler: the collector reads the chip (faked: this is no Mac) and
    # stores it; a store measured before the chip was stored gets it without measuring the bandwidth again.
    measured: list[HostBandwidth] = []

    def measure() -> HostBandwidth:
        measured.append(measure_host_bandwidth(buffer_bytes=8 * 2**20, runs=1, threads=1))
        return measured[-1]

    async def run_once(chip: tuple[str, int | None] | None) -> HostBandwidth:
        service = CollectorService(
            _settings(_closed_port_url(), data), nvml=FakeNvml([]), host_bandwidth=measure, apple_chip=lambda: chip
        )
        await service.start()
        try:
            return await _until(lambda: (hb := _stored_bandwidth(data)) is not None and (chip is None or hb.apple_chip) and hb)
        finally:
            await service.stop()

    first = await run_once(None)
    assert (first.apple_chip, first.apple_gpu_cores) == (None, None)  # unknown stays NULL, never 0
    second = await run_once(("Apple M3 Max", 40))
    assert (second.apple_chip, second.apple_gpu_cores) == ("Apple M3 Max", 40)
    assert len(measured) == 1 and second.bandwidth_bytes_s == first.bandwidth_bytes_s


def _stored_bandwidth(data: Path) -> HostBandwidth | None:
    with queries.open_reader(data) as conn:
        return None if conn is None else queries.latest_host_bandwidth(conn)


def test_rows_of_an_older_phase_split_are_derived_again_in_the_background(tmp_path: Path) -> None:
    # More rows than one batch, so that the re-derivation goes on from batch to batch.
    now = time.time()  # within the retention the collector applies at start
    recs = [_finished_record(f"r{i:04d}", now - 3600 + i) for i in range(REDERIVE_BATCH * 2 + 50)]
    w = StoreWriter(db_path(tmp_path))
    w.apply([PutRequest(r) for r in recs])
    w.close()
    raw = sqlite3.connect(db_path(tmp_path))
    # As an older split left them: another rate, no flags, version 0.
    raw.execute("UPDATE requests SET phases_version = 0, decode_tok_s = 1.0, flags = '[]', flag_text = '{}'")
    raw.commit()
    raw.close()
    asyncio.run(_rederive(tmp_path))
    with queries.open_reader(tmp_path) as conn:
        assert conn is not None
        assert stale_phases_count(conn) == 0
        for rec in (recs[0], recs[REDERIVE_BATCH], recs[-1]):
            stored = queries.request_detail(conn, rec.id)
            assert stored is not None and stored.phases_version == PHASES_VERSION
            assert stored.phases == split_record(rec)


async def _rederive(data: Path) -> None:
    service = CollectorService(_settings(_closed_port_url(), data), nvml=FakeNvml([]), host_bandwidth=None)
    await service.start()
    try:
        await _until(lambda: not _query(data, "SELECT 1 FROM requests WHERE phases_version < ? LIMIT 1", PHASES_VERSION))
    finally:
        await service.stop()


def _finished_record(id: str, started_at_unix_s: float) -> RequestRecord:
    from tests.support.records import make_record

    return make_record(id, started_at_unix_s)
