"""Prometheus exposition of the collector's readings."""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from analysis.phases import split_record
from analysis.records import (
    FinalMetrics,
    GpuSample,
    HostSample,
    LoadedModel,
    OllamaStatus,
    Outcome,
    RequestRecord,
    SeenFrom,
)
from collectors.config import load_settings
from collectors.metrics import (
    LABEL_CUT_MARKER,
    LABEL_MAX_CHARS,
    LABEL_VALUES_MAX,
    OTHER_LABEL,
    THROTTLE_REASONS,
    TTFT_BUCKETS_S,
    Histogram,
    LabelSet,
    MetricsSnapshot,
    RequestStats,
    bound_label,
    render,
)
from collectors.service import CollectorService
from store.rows import request_row
from store.tables import PHASES_VERSION, RequestRow
from tests.support.exposition import parse_exposition
from tests.support.sim_process import start_sim

# One line of the text format: name, optional {labels}, one value.
LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (NaN|[+-]Inf|-?[0-9.e+-]+)$')
# Each model name appears in at most this many lines: requests, prompt, output and decode tokens, 4 phases.
LINES_PER_MODEL = 8
# Bound on the exposition with LABEL_VALUES_MAX names of LABEL_MAX_CHARS (3-byte marker) each: ~210 KB.
EXPOSITION_MAX_BYTES = LABEL_VALUES_MAX * LINES_PER_MODEL * (LABEL_MAX_CHARS + 2 + 140) + (64 << 10)


def _record(
    ttft_ms: float, eval_count: int, eval_ms: float, outcome: Outcome = Outcome.OK, model: str = "llama3.2"
) -> RequestRecord:
    t0 = 1_000_000_000
    first = t0 + int(ttft_ms * 1e6)
    final = first + int(eval_ms * 1e6)
    return RequestRecord(
        id="x",
        started_at_unix_s=1.0,
        client_addr="127.0.0.1",
        endpoint="/api/chat",
        model=model,
        stream=True,
        received_ns=t0,
        forwarded_ns=t0,
        first_byte_ns=first,
        first_token_ns=first,
        token_chunk_ns=[first, final],
        final_chunk_ns=final,
        closed_ns=final,
        status_code=200,
        outcome=outcome,
        metrics=FinalMetrics(
            total_duration_ns=int((ttft_ms + eval_ms) * 1e6),
            load_duration_ns=1_000_000,
            prompt_eval_count=10,
            prompt_eval_duration_ns=int(ttft_ms * 0.5e6),
            eval_count=eval_count,
            eval_duration_ns=int(eval_ms * 1e6),
            done_reason="stop",
        ),
    )


def _stored(*args: Any, **kwargs: Any) -> RequestRow:
    """The row the store writes for ``_record(...)``: what the collector's statistics count."""
    rec = _record(*args, **kwargs)
    return request_row(rec, split_record(rec), 1.0, PHASES_VERSION)


def test_direct_records_are_counted_by_source_and_their_unknown_route_is_an_empty_label() -> None:
    stats = RequestStats()
    stats.observe(_stored(100, 11, 1000))
    for source in ("log", "log", "slots"):
        rec = replace(
            _record(100, 11, 1000),
            id=f"d-{source}",
            endpoint=None,
            client_addr=None,
            stream=None,
            seen_from=SeenFrom.RUNNER,
            runner_source=source,
            token_chunk_ns=[],
        )
        stats.observe(request_row(rec, split_record(rec), 1.0, PHASES_VERSION))
    text = render(MetricsSnapshot(stats=stats))
    assert 'phasewatch_requests_total{endpoint="/api/chat",model="llama3.2",outcome="ok",source="proxy"} 1.0' in text
    assert 'phasewatch_requests_total{endpoint="",model="llama3.2",outcome="ok",source="log"} 2.0' in text
    assert 'phasewatch_requests_total{endpoint="",model="llama3.2",outcome="ok",source="slots"} 1.0' in text


def test_stats_count_outcomes_and_observe_histograms() -> None:
    stats = RequestStats()
    stats.observe(_stored(100, 11, 1000), token_gaps_s=[0.1] * 10)  # 10 intervals in 1 s: 10 tok/s
    stats.observe(_stored(300, 41, 2000))  # 40 intervals in 2 s: 20 tok/s
    stats.observe(_stored(50, 0, 0, outcome=Outcome.UPSTREAM_FAILED))
    assert stats.counts == {("/api/chat", "llama3.2", "ok", "proxy"): 2, ("/api/chat", "llama3.2", "upstream_failed", "proxy"): 1}
    ttft = stats.histogram("gen_ai_server_time_to_first_token_seconds")
    assert ttft.count == 3 and math.isclose(ttft.total, 0.45)
    decode = stats.histogram("phasewatch_request_decode_tokens_per_second")
    assert decode.count == 2 and math.isclose(decode.total, 30.0)
    assert stats.histogram("phasewatch_inter_token_latency_seconds").count == 10
    assert stats.decode_tokens == {"llama3.2": 50} and math.isclose(stats.phase_s[("llama3.2", "decode")], 3.0)
    assert stats.output_tokens == {"llama3.2": 52} and stats.prompt_tokens == {"llama3.2": 30}
    assert stats.histogram("phasewatch_request_thinking_time_seconds").count == 0  # hook: nothing recorded yet


def test_a_reply_s_gaps_land_in_the_buckets_one_observe_each_would_give() -> None:
    """A reply's token gaps are counted in one call per reply, not one per token on the loop (issue 33)."""
    bounds = (0.01, 0.02, 0.05)
    gaps = [0.0, 0.01, 0.0100001, 0.02, 0.05, 0.051, 7.0, 0.005]  # on a bound: that bound's bucket (le)
    one_by_one, batched = Histogram(bounds), Histogram(bounds)
    for gap in gaps:
        one_by_one.observe(gap)
    batched.observe_many(gaps)
    assert batched.counts == one_by_one.counts == [3, 2, 1, 2]
    assert (batched.count, batched.total) == (one_by_one.count, one_by_one.total)
    stats = RequestStats()
    stats.observe(_stored(100, 11, 1000), token_gaps_s=[0.1, math.nan, -1.0, math.inf, 0.2])
    kept = stats.histogram("phasewatch_inter_token_latency_seconds")
    assert kept.count == 2 and math.isclose(kept.total, 0.3), "a gap that is no time is not counted"


def test_ttft_buckets_extend_the_conventions_past_ten_seconds() -> None:
    assert TTFT_BUCKETS_S[:16][-1] == 10.0 and TTFT_BUCKETS_S[-1] == 600.0
    stats = RequestStats()
    stats.observe(_stored(95_000, 11, 1000))  # a 95 s prompt on a small GPU
    cumulative = dict(stats.histogram("gen_ai_server_time_to_first_token_seconds").buckets())
    assert cumulative["60.0"] == 0 and cumulative["120.0"] == 1


def test_render_is_valid_exposition_and_reads_back() -> None:
    stats = RequestStats.for_upstream("http://127.0.0.1:11434")
    stats.observe(_stored(100, 11, 1000, model='we"ird\\model'))
    snap = MetricsSnapshot(
        gpus=[
            GpuSample(
                ts_unix_s=1,
                index=0,
                name="NVIDIA GeForce RTX 4090",
                uuid="GPU-a",
                util_gpu_pct=97,
                power_w=300.5,
                energy_j=1234.5,
                sm_clock_mhz=2520,
                ollama_mem_bytes=5 << 30,
                throttle_reasons=0x44,
            ),
            GpuSample(ts_unix_s=1, index=1, name="NVIDIA A100", uuid="GPU-b"),  # NVML gave nothing: no lines
        ],
        host=HostSample(ts_unix_s=1, cpu_pct=50, mem_used_bytes=4 << 30, mem_total_bytes=16 << 30, ollama_cpu_pct=150),
        ollama=OllamaStatus(ts_unix_s=1, up=True, base_url="http://127.0.0.1:11434", version="0.33.3"),
        loaded_models=[LoadedModel(1, "llama3.2:latest", "llama3.2:latest", "d" * 64, 3 << 30, 2 << 30, 4096, None)],
        stats=stats,
        in_flight_by_phase={"decode": 2},
        store_pending=7,
    )
    text = render(snap)
    assert text.endswith("\n")
    for line in text.splitlines():
        assert line.startswith("# ") or LINE.match(line), line
    # Every family is declared once, before its samples.
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
    assert "summary" not in {line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")}

    m = parse_exposition(text)
    gpu0 = (("gpu", "0"), ("name", "NVIDIA GeForce RTX 4090"), ("simulated", "false"), ("uuid", "GPU-a"))
    assert m[("phasewatch_ollama_up", (("url", "http://127.0.0.1:11434"),))] == 1
    assert m[("phasewatch_ollama_info", (("version", "0.33.3"),))] == 1
    assert m[("phasewatch_gpu_utilization_ratio", gpu0)] == 0.97
    assert m[("phasewatch_gpu_power_watts", gpu0)] == 300.5
    assert m[("phasewatch_gpu_sm_clock_hertz", gpu0)] == 2.52e9
    assert m[("phasewatch_gpu_energy_joules_total", gpu0)] == 1234.5
    throttled = {r: m[("phasewatch_gpu_throttled", (*gpu0[:2], ("reason", r), *gpu0[2:]))] for r in THROTTLE_REASONS}
    assert throttled == {
        "sw_power_cap": 1,
        "hw_slowdown": 0,
        "sync_boost": 0,
        "sw_thermal": 0,
        "hw_thermal": 1,
        "hw_power_brake": 0,
    }
    assert m[("phasewatch_gpu_ollama_memory_used_bytes", gpu0)] == 5 << 30
    assert not any(name.startswith("phasewatch_gpu") and ("uuid", "GPU-b") in labels for name, labels in m)
    assert m[("phasewatch_host_cpu_ratio", ())] == 0.5
    assert m[("phasewatch_ollama_cpu_ratio", ())] == 1.5
    assert ("phasewatch_ollama_resident_memory_bytes", ()) not in m  # unknown stays absent, not 0
    assert m[("phasewatch_model_loaded_bytes", (("memory", "vram"), ("model", "llama3.2:latest")))] == 2 << 30
    assert m[("phasewatch_model_loaded_bytes", (("memory", "ram"), ("model", "llama3.2:latest")))] == 1 << 30
    assert m[("phasewatch_model_vram_ratio", (("model", "llama3.2:latest"),))] == 2 / 3
    assert m[("phasewatch_model_context_tokens", (("model", "llama3.2:latest"),))] == 4096
    ok = (("endpoint", "/api/chat"), ("model", 'we"ird\\model'), ("outcome", "ok"), ("source", "proxy"))
    assert m[("phasewatch_requests_total", ok)] == 1
    assert m[("phasewatch_requests_running", (("phase", "decode"),))] == 2
    host = (
        ("gen_ai_operation_name", "chat"),
        ("gen_ai_provider_name", "ollama"),
        ("server_address", "127.0.0.1"),
        ("server_port", "11434"),
    )
    assert m[("gen_ai_server_time_to_first_token_seconds_bucket", (*host[:2], ("le", "0.1"), *host[2:]))] == 1
    assert m[("gen_ai_server_time_to_first_token_seconds_bucket", (*host[:2], ("le", "0.08"), *host[2:]))] == 0
    assert m[("gen_ai_server_time_to_first_token_seconds_count", host)] == 1
    assert m[("phasewatch_request_decode_tokens_per_second_sum", host)] == 10.0
    assert m[("phasewatch_phase_seconds_total", (("model", 'we"ird\\model'), ("phase", "decode")))] == 1.0
    assert m[("phasewatch_store_pending_records", ())] == 7
    assert not any(name.startswith("phasewatch_slot") for name, _ in m)  # hook: no source of slot use yet


def test_empty_snapshot_renders() -> None:
    m = parse_exposition(render(MetricsSnapshot()))
    assert m[("phasewatch_requests_running", (("phase", "prefill"),))] == 0
    assert not any(name.startswith("gen_ai_") for name, _ in m)  # no request yet: no histogram series
    assert not any(name.startswith(("phasewatch_gpu", "phasewatch_host", "phasewatch_ollama_loaded")) for name, _ in m)


def test_label_values_are_bounded_in_length_and_number() -> None:
    """2,000 unique 50 KB model names (what one web page can POST): counters and exposition stay small."""
    import tracemalloc

    names = [f"{i:05d}" + "m" * 50_000 for i in range(2000)]
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    stats = RequestStats()
    for name in names:
        rec = _record(100, 11, 1000, model=name)
        rec.endpoint = "/api/" + name
        stats.observe(request_row(rec, split_record(rec), 1.0, PHASES_VERSION))
    held_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    text = render(MetricsSnapshot(stats=stats))

    assert len(stats.models.seen) == LABEL_VALUES_MAX and len(stats.endpoints.seen) == LABEL_VALUES_MAX
    assert len(stats.counts) == LABEL_VALUES_MAX + 1  # each of the first names paired with its endpoint, then other/other
    assert held_bytes < 1 << 20, held_bytes  # the names themselves are 100 MB
    assert len(text.encode()) < EXPOSITION_MAX_BYTES, len(text)
    m = parse_exposition(text)
    other = (("endpoint", OTHER_LABEL), ("model", OTHER_LABEL), ("outcome", "ok"), ("source", "proxy"))
    assert m[("phasewatch_requests_total", other)] == 1900
    first = names[0][: LABEL_MAX_CHARS - len(LABEL_CUT_MARKER)] + LABEL_CUT_MARKER
    assert len(first) == LABEL_MAX_CHARS
    first_labels = (("endpoint", bound_label("/api/" + names[0])), ("model", first), ("outcome", "ok"), ("source", "proxy"))
    assert m[("phasewatch_requests_total", first_labels)] == 1
    assert sum(v for (name, _), v in m.items() if name == "phasewatch_requests_total") == 2000  # nothing lost, only merged


def test_bound_label_keeps_short_values_and_marks_cut_ones() -> None:
    assert bound_label("llama3.2:latest") == "llama3.2:latest"
    assert bound_label("x" * LABEL_MAX_CHARS) == "x" * LABEL_MAX_CHARS
    assert bound_label("x" * (LABEL_MAX_CHARS + 1)) == "x" * (LABEL_MAX_CHARS - 1) + LABEL_CUT_MARKER
    assert bound_label("abcdef", max_chars=4) == "abc" + LABEL_CUT_MARKER
    labels = LabelSet(max_values=2)
    assert [labels.admit(v) for v in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER_LABEL, "a", OTHER_LABEL, "b"]


def test_collector_metrics_stay_small_under_unique_model_names(tmp_path: Path) -> None:
    """Through a real collector in front of sim: more unique 50 KB model names than LABEL_VALUES_MAX."""
    with start_sim("--hardware", "rtx-4090") as sim:
        asyncio.run(_flood_model_names(sim.base_url, tmp_path))


async def _flood_model_names(sim_url: str, data: Path) -> None:
    n = LABEL_VALUES_MAX + 50
    service = CollectorService(load_settings(["--ollama", sim_url, "--listen", "127.0.0.1:0", "--data", str(data)], {}))
    await service.start()
    try:
        async with aiohttp.ClientSession() as session:
            for i in range(n):
                body = {"model": f"{i:04d}" + "m" * 50_000, "prompt": "hi", "stream": False}
                async with session.post(f"http://{service.listen}/api/generate", json=body) as resp:
                    await resp.read()
            deadline = time.monotonic() + 30
            while sum(service.stats.counts.values()) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            async with session.get(f"http://{service.listen}/phasewatch/metrics") as resp:
                text = await resp.text()
    finally:
        await service.stop()
    assert len(service.stats.models.seen) == LABEL_VALUES_MAX
    assert len(text.encode()) < EXPOSITION_MAX_BYTES, len(text)
    totals = {labels: v for (name, labels), v in parse_exposition(text).items() if name == "phasewatch_requests_total"}
    assert sum(totals.values()) == n
    assert sum(v for labels, v in totals.items() if ("model", OTHER_LABEL) in labels) == n - LABEL_VALUES_MAX
    assert all(len(value) <= LABEL_MAX_CHARS for labels in totals for _, value in labels)


def test_the_log_lines_not_believed_are_counted_by_why() -> None:
    m = parse_exposition(render(MetricsSnapshot(log_dropped={"unconfirmed": 100_000, "load": 1, "progress": 2})))
    assert m[("phasewatch_ollama_log_dropped_lines_total", (("reason", "unconfirmed"),))] == 100_000
    assert m[("phasewatch_ollama_log_dropped_lines_total", (("reason", "load"),))] == 1
    assert m[("phasewatch_ollama_log_dropped_lines_total", (("reason", "progress"),))] == 2
    assert not any(name.startswith("phasewatch_ollama_log") for name, _ in parse_exposition(render(MetricsSnapshot())))


def test_every_recorded_route_has_its_opentelemetry_operation() -> None:
    """The agents' routes are chats (gen_ai.operation.name), like every other route the proxy records: none falls
    into "other"."""
    from analysis.records import AGENT_ENDPOINTS
    from collectors.metrics import OPERATIONS
    from collectors.proxy.recording import RECORDED_ENDPOINTS

    assert AGENT_ENDPOINTS <= RECORDED_ENDPOINTS and set(RECORDED_ENDPOINTS) <= set(OPERATIONS)
    assert {OPERATIONS[e] for e in AGENT_ENDPOINTS} == {"chat"}
