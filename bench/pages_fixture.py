"""Fill a store with realistic recordings, for the page tests and ``bench/pages_refresh.py``.

Everything goes through ``store.writer.StoreWriter``, the collector's own writer, so
the pages read exactly what a collector would have written.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from analysis.records import (
    CollectorInfo,
    FinalMetrics,
    GpuSample,
    HostSample,
    LoadedModel,
    OllamaStatus,
    Outcome,
    RequestRecord,
)
from store.ops import PutGpuSamples, PutHeartbeat, PutHostSample, PutLoadedModels, PutOllamaStatus, PutRequest
from store.schema import db_path
from store.writer import StoreWriter

GIB = 1024**3
MONO_BASE_NS = 5_000_000_000_000  # the collector's monotonic clock at wall time T0 (any value works)
XSS_REPLY = '<script>window.__pw_xss=1</script><img src=x onerror="window.__pw_xss=2"> [click me](http://evil.example) **bold**'
XSS_PROMPT = "Repeat after me: <b>not bold</b> <script>alert(1)</script> [link](javascript:alert(1))"


@dataclass(frozen=True)
class Shape:
    """The true phases of one synthetic request (ms) and its token counts."""

    load_ms: float = 3.0
    queue_ms: float = 2.0
    prefill_ms: float = 40.0
    decode_ms: float = 1500.0
    prompt_tokens: int = 120
    cached_tokens: int | None = 0
    output_tokens: int = 60
    transport_ms: float = 1.0


def make_request(
    started_unix_s: float,
    t0_unix_s: float,
    model: str = "llama3.2:latest",
    shape: Shape = Shape(),
    endpoint: str = "/api/chat",
    stall_at: int | None = None,
    stall_ms: float = 0.0,
    outcome: Outcome = Outcome.OK,
    in_flight_tokens: int | None = None,
    error: str | None = None,
    prompt_text: str | None = None,
    response_text: str | None = None,
    request_id: str | None = None,
) -> RequestRecord:
    """A request as the proxy would record it, consistent with ``shape``.

    ``in_flight_tokens`` makes a request still decoding with that many tokens so far.
    """
    ms = 1_000_000
    received = MONO_BASE_NS + int((started_unix_s - t0_unix_s) * 1e9)
    forwarded = received + 200_000
    load_end = forwarded + int(shape.load_ms * ms)
    prefill_start = load_end + int(shape.queue_ms * ms)
    decode_start = prefill_start + int(shape.prefill_ms * ms)
    n = shape.output_tokens
    step = int(shape.decode_ms * ms / max(n - 1, 1))
    chunks = []
    t = decode_start
    for i in range(n):
        if stall_at is not None and i == stall_at:
            t += int(stall_ms * ms)
        chunks.append(t)
        t += step
    rec = RequestRecord(
        id=request_id or uuid.uuid4().hex,
        started_at_unix_s=started_unix_s,
        client_addr="127.0.0.1",
        endpoint=endpoint,
        model=model,
        stream=True,
        received_ns=received,
        forwarded_ns=forwarded,
        prompt_text=prompt_text,
        response_text=response_text,
    )
    if in_flight_tokens is not None:
        rec.first_byte_ns = chunks[0] if in_flight_tokens else None
        rec.first_token_ns = chunks[0] if in_flight_tokens else None
        rec.token_chunk_ns = chunks[:in_flight_tokens]
        rec.outcome = Outcome.IN_FLIGHT
        return rec
    final = chunks[-1] + step
    rec.first_byte_ns = chunks[0]
    rec.first_token_ns = chunks[0]
    rec.token_chunk_ns = chunks
    rec.final_chunk_ns = final
    rec.closed_ns = final + int(shape.transport_ms * ms)
    rec.status_code = 200
    rec.outcome = outcome
    rec.error = error
    if outcome is Outcome.OK:
        decode_ns = chunks[-1] - chunks[0]
        rec.metrics = FinalMetrics(
            total_duration_ns=final - forwarded,
            load_duration_ns=load_end - forwarded,
            prompt_eval_count=shape.prompt_tokens,
            prompt_eval_cached_count=shape.cached_tokens,
            prompt_eval_duration_ns=decode_start - prefill_start,
            eval_count=n,
            eval_duration_ns=decode_ns,
            done_reason="stop",
        )
    return rec


def gpu_sample(ts: float, util: float, index: int = 0, name: str = "NVIDIA GeForce RTX 4090") -> GpuSample:
    return GpuSample(
        ts_unix_s=ts,
        index=index,
        name=name,
        uuid=f"GPU-{index}",
        util_gpu_pct=util,
        util_mem_pct=util * 0.6,
        mem_used_bytes=int(6 * GIB + util * 0.01 * GIB),
        mem_total_bytes=24 * GIB,
        power_w=60 + 3.5 * util,
        power_limit_w=450.0,
        sm_clock_mhz=2520 if util > 5 else 210,
        sm_clock_max_mhz=2790,
        mem_clock_mhz=10501,
        mem_clock_max_mhz=10501,
        ollama_mem_bytes=int(5 * GIB),
        temperature_c=45 + util / 4,
    )


def _busy(requests: Iterable[RequestRecord]) -> list[tuple[float, float]]:
    out = []
    for r in requests:
        end_ns = r.closed_ns or (r.token_chunk_ns[-1] if r.token_chunk_ns else r.received_ns)
        out.append((r.started_at_unix_s, r.wall_s(end_ns)))
    return out


def status_rows(w: StoreWriter, now: float, data_dir: Path, up: bool = True, gpu_state: str = "nvml", demo: bool = False) -> None:
    w.write(
        PutOllamaStatus(
            OllamaStatus(now - 1, up, "http://127.0.0.1:11434", "0.33.0" if up else None, None if up else "connection refused")
        )
    )
    w.write(
        PutHeartbeat(
            CollectorInfo(
                ts_unix_s=now - 0.5,
                pid=4242,
                listen="127.0.0.1:11435",
                ollama_url="http://127.0.0.1:11434",
                data_dir=str(data_dir),
                gpu_state=gpu_state,
                gpu_message=None if gpu_state != "none" else "NVML: driver not loaded (libnvidia-ml.so.1 not found)",
                demo=demo,
                record_text=True,
            )
        )
    )


@dataclass
class Fixture:
    data_dir: Path
    now: float
    finished: list[RequestRecord]
    in_flight: RequestRecord
    xss: RequestRecord
    stalled: RequestRecord
    failed: RequestRecord
    bypass: tuple[float, float]  # when the GPU was busy with no proxied request


def build_fixture_store(data_dir: Path, now: float, n_gpus: int = 1, seed: int = 7) -> Fixture:
    """Ten minutes of a small, varied history ending at ``now``, one request in flight."""
    rng = random.Random(seed)
    t0 = now - 600
    finished: list[RequestRecord] = []
    t = t0 + 5
    while t < now - 30:
        shape = Shape(
            prompt_tokens=rng.randint(50, 3000),
            output_tokens=rng.randint(20, 200),
            prefill_ms=rng.uniform(20, 300),
            decode_ms=rng.uniform(500, 4000),
        )
        finished.append(make_request(t, t0, shape=shape, endpoint=rng.choice(["/api/chat", "/api/generate"])))
        t += rng.uniform(15, 40)
    cold = make_request(now - 200, t0, model="llama3.1:8b", shape=Shape(load_ms=2300, output_tokens=30, decode_ms=300))
    stalled = make_request(now - 120, t0, shape=Shape(output_tokens=80, decode_ms=1600), stall_at=40, stall_ms=700)
    xss = make_request(
        now - 60,
        t0,
        shape=Shape(prompt_tokens=25, output_tokens=30, decode_ms=600),
        prompt_text=XSS_PROMPT,
        response_text=XSS_REPLY,
    )
    failed = make_request(
        now - 45,
        t0,
        outcome=Outcome.UPSTREAM_FAILED,
        error='{"error":"<b>model runner has stopped</b>"}',
        shape=Shape(output_tokens=5, decode_ms=100),
    )
    in_flight = make_request(now - 2, t0, shape=Shape(output_tokens=400, decode_ms=8000), in_flight_tokens=50)
    finished += [cold, stalled, xss, failed]
    busy = _busy([*finished, in_flight])
    # A quiet stretch with no request: make the GPU busy there (a client bypassing the proxy).
    bypass = (now - 20.0, now - 12.0)
    assert not any(a - 2 < bypass[1] and b + 2 > bypass[0] for a, b in busy), "fixture: bypass overlaps a request"

    w = StoreWriter(db_path(data_dir))
    try:
        w.apply([PutRequest(r) for r in finished])
        w.write(PutRequest(in_flight))
        for ts_i in range(int(t0), int(now) + 1):
            ts = float(ts_i)
            util = 95.0 if any(a <= ts <= b for a, b in busy) or bypass[0] <= ts <= bypass[1] else 1.0
            w.write(PutGpuSamples([gpu_sample(ts, util, i) for i in range(n_gpus)]))
            w.write(PutHostSample(HostSample(ts, 20.0 + util / 10, int(12 * GIB), int(32 * GIB), util / 5, int(1.5 * GIB))))
        w.write(
            PutLoadedModels(
                now - 1,
                [
                    LoadedModel(
                        now - 1,
                        "llama3.2:latest",
                        "llama3.2:latest",
                        "a" * 64,
                        int(2.6 * GIB),
                        int(2.6 * GIB),
                        8192,
                        now + 240,
                        "3.2B",
                        "Q4_K_M",
                        "llama",
                    ),
                    LoadedModel(
                        now - 1,
                        "llama3.1:70b",
                        "llama3.1:70b",
                        "b" * 64,
                        int(42 * GIB),
                        int(21 * GIB),
                        4096,
                        now + 90,
                        "70.6B",
                        "Q4_K_M",
                        "llama",
                    ),
                ],
            )
        )
        status_rows(w, now, data_dir)
    finally:
        w.close()
    return Fixture(data_dir, now, finished, in_flight, xss, stalled, failed, bypass)
