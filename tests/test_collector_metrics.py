"""Prometheus exposition of the collector's readings."""

from __future__ import annotations

import math
import re
from typing import Any

from analysis.phases import split_record
from analysis.records import FinalMetrics, GpuSample, HostSample, LoadedModel, OllamaStatus, Outcome, RequestRecord
from collectors.metrics import MetricsSnapshot, RequestStats, escape_label, format_value, parse_exposition, render
from store.rows import request_row
from store.tables import PHASES_VERSION, RequestRow

# One line of the text format: name, optional {labels}, one value.
LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (NaN|[+-]Inf|-?[0-9.e+-]+)$')


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


def test_formatting_helpers() -> None:
    assert escape_label('a "b"\\c\nd') == 'a \\"b\\"\\\\c\\nd'
    assert [format_value(v) for v in (3.0, 0.25, math.nan, math.inf, -math.inf, 1e20)] == [
        "3",
        "0.25",
        "NaN",
        "+Inf",
        "-Inf",
        "1e+20",
    ]


def _stored(*args: Any, **kwargs: Any) -> RequestRow:
    """The row the store writes for ``_record(...)``: what the collector's statistics count."""
    rec = _record(*args, **kwargs)
    return request_row(rec, split_record(rec), 1.0, PHASES_VERSION)


def test_stats_count_outcomes_and_summarise_rates() -> None:
    stats = RequestStats()
    stats.observe(_stored(100, 11, 1000))  # 10 intervals in 1 s: 10 tok/s
    stats.observe(_stored(300, 41, 2000))  # 40 intervals in 2 s: 20 tok/s
    stats.observe(_stored(50, 0, 0, outcome=Outcome.UPSTREAM_FAILED))
    assert stats.counts == {("/api/chat", "llama3.2", "ok"): 2, ("/api/chat", "llama3.2", "upstream_failed"): 1}
    assert stats.ttft_s.count == 3 and math.isclose(stats.ttft_s.total, 0.45)
    assert stats.decode_tok_s.count == 2 and math.isclose(stats.decode_tok_s.total, 30.0)


def test_render_is_valid_exposition_and_reads_back() -> None:
    stats = RequestStats()
    stats.observe(_stored(100, 11, 1000, model='we"ird\\model'))
    snap = MetricsSnapshot(
        gpus=[
            GpuSample(ts_unix_s=1, index=0, name="NVIDIA GeForce RTX 4090", uuid="GPU-a", util_gpu_pct=97, power_w=300.5,
                      energy_j=1234.5, sm_clock_mhz=2520, ollama_mem_bytes=5 << 30),
            GpuSample(ts_unix_s=1, index=1, name="NVIDIA A100", uuid="GPU-b"),  # NVML gave nothing: no lines
        ],
        host=HostSample(ts_unix_s=1, cpu_pct=50, mem_used_bytes=4 << 30, mem_total_bytes=16 << 30, ollama_cpu_pct=150),
        ollama=OllamaStatus(ts_unix_s=1, up=True, base_url="http://127.0.0.1:11434", version="0.33.3"),
        loaded_models=[LoadedModel(1, "llama3.2:latest", "llama3.2:latest", "d" * 64, 3 << 30, 2 << 30, 4096, None)],
        stats=stats,
        in_flight=2,
        store_pending=7,
    )  # fmt: skip
    text = render(snap)
    assert text.endswith("\n")
    for line in text.splitlines():
        assert line.startswith("# ") or LINE.match(line), line
    # Every family is declared once, before its samples.
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))

    m = parse_exposition(text)
    gpu0 = (("gpu", "0"), ("name", "NVIDIA GeForce RTX 4090"), ("simulated", "false"), ("uuid", "GPU-a"))
    assert m[("phasewatch_ollama_up", (("url", "http://127.0.0.1:11434"),))] == 1
    assert m[("phasewatch_ollama_info", (("version", "0.33.3"),))] == 1
    assert m[("phasewatch_gpu_utilization_ratio", gpu0)] == 0.97
    assert m[("phasewatch_gpu_power_watts", gpu0)] == 300.5
    assert m[("phasewatch_gpu_sm_clock_hertz", gpu0)] == 2.52e9
    assert m[("phasewatch_gpu_energy_joules_total", gpu0)] == 1234.5
    assert m[("phasewatch_gpu_ollama_memory_used_bytes", gpu0)] == 5 << 30
    assert not any(name.startswith("phasewatch_gpu") and ("uuid", "GPU-b") in labels for name, labels in m)
    assert m[("phasewatch_host_cpu_ratio", ())] == 0.5
    assert m[("phasewatch_ollama_cpu_ratio", ())] == 1.5
    assert ("phasewatch_ollama_resident_memory_bytes", ()) not in m  # unknown stays absent, not 0
    assert m[("phasewatch_ollama_model_vram_bytes", (("model", "llama3.2:latest"),))] == 2 << 30
    ok = (("endpoint", "/api/chat"), ("model", 'we"ird\\model'), ("outcome", "ok"))
    assert m[("phasewatch_requests_total", ok)] == 1
    assert m[("phasewatch_requests_in_flight", ())] == 2
    assert m[("phasewatch_ttft_seconds", (("quantile", "0.5"),))] == 0.1
    assert m[("phasewatch_ttft_seconds_count", ())] == 1
    assert m[("phasewatch_decode_tokens_per_second_sum", ())] == 10.0
    assert m[("phasewatch_store_pending_records", ())] == 7


def test_empty_snapshot_renders() -> None:
    m = parse_exposition(render(MetricsSnapshot()))
    assert m[("phasewatch_requests_in_flight", ())] == 0
    assert math.isnan(m[("phasewatch_ttft_seconds", (("quantile", "0.99"),))])
    assert not any(name.startswith(("phasewatch_gpu", "phasewatch_host")) for name, _ in m)
