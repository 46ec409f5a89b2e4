"""Time the store's read queries on a full store: 24 h of 1 Hz samples and 100,000 requests.

Not a test: prints milliseconds per query (median of repeats) next to the page budgets
(Live refresh 150 ms in all, Requests page 500 ms), and the write throughput of the fill.

    .venv/bin/python bench/store_queries.py [--requests 100000] [--hours 24] [--gpus 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
from store import queries, sample_queries
from store.ops import PutGpuSamples, PutHeartbeat, PutHostSample, PutLoadedModels, PutOllamaStatus, PutRequest
from store.schema import db_path
from store.writer import StoreWriter

MS = 1_000_000


def make_request(i: int, started: float, rng: random.Random, model: str) -> RequestRecord:
    received = 10**12 + i * 10**9
    n = rng.randint(20, 300)
    gap = int(rng.uniform(8, 40) * MS)
    first = received + int(rng.uniform(50, 800) * MS)
    chunks = [first + k * gap for k in range(n)]
    end = chunks[-1] + MS
    prompt = rng.randint(20, 4000)
    return RequestRecord(
        id=f"{i:032x}",
        started_at_unix_s=started,
        client_addr="127.0.0.1:40000",
        endpoint="/api/chat",
        model=model,
        stream=True,
        num_ctx=8192,
        received_ns=received,
        forwarded_ns=received + MS,
        first_byte_ns=first,
        first_token_ns=first,
        token_chunk_ns=chunks,
        final_chunk_ns=end,
        closed_ns=end + MS,
        status_code=200,
        outcome=Outcome.OK,
        metrics=FinalMetrics(
            total_duration_ns=end - received - MS,
            load_duration_ns=3 * MS,
            prompt_eval_count=prompt,
            prompt_eval_cached_count=0,
            prompt_eval_duration_ns=first - received - 5 * MS,
            eval_count=n,
            eval_duration_ns=(n - 1) * gap,
            done_reason="stop",
        ),
    )


def fill(path: Path, now: float, hours: float, n_requests: int, n_gpus: int) -> dict[str, float]:
    rng = random.Random(7)
    w = StoreWriter(path)
    t_start = now - hours * 3600
    n_s = int(hours * 3600)
    t = time.perf_counter()
    batch: list[GpuSample] = []
    for i in range(n_s):
        ts = t_start + i
        batch += [
            GpuSample(
                ts,
                g,
                "NVIDIA GeForce RTX 4090",
                f"GPU-{g}",
                util_gpu_pct=rng.uniform(0, 100),
                util_mem_pct=40.0,
                mem_used_bytes=20 * 2**30,
                mem_total_bytes=24 * 2**30,
                power_w=300.0,
                power_limit_w=450.0,
                sm_clock_mhz=2500,
                mem_clock_mhz=10501,
                temperature_c=60.0,
            )
            for g in range(n_gpus)
        ]
        if len(batch) >= 3600:
            w.write(PutGpuSamples(batch))
            batch = []
    w.write(PutGpuSamples(batch))
    for i in range(0, n_s, 3600):
        hour = [t_start + j for j in range(i, min(i + 3600, n_s))]
        w.apply([PutHostSample(HostSample(ts, 20.0, 8 * 2**30, 64 * 2**30, 5.0, 2**30)) for ts in hour])
        model = LoadedModel(0.0, "llama3.2:latest", "llama3.2:latest", "a" * 64, 3 * 2**30, 3 * 2**30, 8192, now + 300)
        w.apply([PutLoadedModels(ts, [replace(model, ts_unix_s=ts)]) for ts in hour])
    samples_s = time.perf_counter() - t
    t = time.perf_counter()
    models = ["llama3.2:latest", "qwen3:8b", "gemma3:27b"]
    step = hours * 3600 / max(n_requests, 1)
    recs: list[RequestRecord] = []
    for i in range(n_requests):
        recs.append(make_request(i, t_start + i * step, rng, models[i % 3]))
        if len(recs) == 1000:
            w.apply([PutRequest(r) for r in recs])
            recs = []
    w.apply([PutRequest(r) for r in recs])
    live = make_request(n_requests, now - 3, rng, "llama3.2:latest")
    live.outcome, live.metrics, live.final_chunk_ns, live.closed_ns = Outcome.IN_FLIGHT, None, None, None
    w.write(PutRequest(live))
    requests_s = time.perf_counter() - t
    w.write(PutOllamaStatus(OllamaStatus(now - 1, True, "http://127.0.0.1:11434", "0.33.0")))
    w.write(PutHeartbeat(CollectorInfo(now - 1, 1, "127.0.0.1:11435", "http://127.0.0.1:11434", str(path.parent), "nvml")))
    w.close()
    return {"samples_s": samples_s, "requests_s": requests_s, "n_samples": n_s * n_gpus * 1.0}


CPU_MS: dict[str, float] = {}


def timed(fn: Callable[[], object], repeats: int = 7) -> tuple[float, float]:
    """Median wall and CPU milliseconds over repeats (after one warm-up).

    CPU time is the steadier figure on a shared machine: wall time also counts waiting for a core.
    """
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def live_refresh(conn: sqlite3.Connection, now: float, window_s: float, q: Callable[[str, Callable[[], object]], float]) -> float:
    """The queries of one Live page refresh over a window; returns their total."""
    w0 = now - window_s
    label = f"live {window_s / 60:.0f} min:"
    names_before = set(CPU_MS)
    total = sum(
        [
            q(f"{label} in_flight_requests", lambda: queries.in_flight_requests(conn, now)),
            q(f"{label} gpu_samples", lambda: sample_queries.gpu_samples(conn, w0, now)),
            q(f"{label} host_samples", lambda: sample_queries.host_samples(conn, w0, now)),
            q(f"{label} requests_in_window", lambda: queries.requests_in_window(conn, w0, now)),
            q(f"{label} recent_requests (bands)", lambda: queries.recent_requests(conn, w0 - 600, limit=500, until_unix_s=now)),
            q(f"{label} latest_loaded_models", lambda: queries.latest_loaded_models(conn)),
            q(f"{label} ollama status + heartbeat", lambda: (queries.latest_ollama_status(conn), queries.latest_heartbeat(conn))),
        ]
    )
    cpu = sum(v for k, v in CPU_MS.items() if k.startswith(label) and k not in names_before)
    print(f"LIVE REFRESH TOTAL, {window_s / 60:.0f} min window: {total:.1f} ms wall, {cpu:.1f} ms CPU (budget 150 ms)")
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--keep", metavar="DIR", help="build the store here (reused if present) instead of a temp folder")
    args = ap.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.keep or tmp)
        path = db_path(data)
        if not path.exists():
            f = fill(path, now, args.hours, args.requests, args.gpus)
            print(
                f"fill: {f['n_samples']:.0f} GPU samples in {f['samples_s']:.1f} s; "
                f"{args.requests} requests in {f['requests_s']:.1f} s ({args.requests / f['requests_s']:.0f} requests/s, "
                f"split + upsert + token times); file {path.stat().st_size / 2**20:.0f} MiB"
            )
        else:
            now = queries.open_readonly(path).execute("SELECT MAX(ts_unix_s) FROM gpu_samples").fetchone()[0] + 1
        conn = queries.open_readonly(path)
        rows: list[tuple[str, float]] = []

        def q(name: str, fn: Callable[[], object]) -> float:
            wall_ms, cpu_ms = timed(fn)
            rows.append((name, wall_ms))
            CPU_MS[name] = cpu_ms
            return wall_ms

        live = 0.0
        for window_s in (300.0, 900.0, 3600.0):
            live = max(live, live_refresh(conn, now, window_s, q))
        q("gpu_samples 24 h (downsampled)", lambda: sample_queries.gpu_samples(conn, now - 86400, now))
        q("requests page: recent_requests 24 h, limit 5000", lambda: queries.recent_requests(conn, now - 86400))
        q("requests page: request_models 24 h", lambda: queries.request_models(conn, now - 86400))
        some_id = queries.recent_requests(conn, 0, limit=1)[0].id
        q("requests page: request_detail", lambda: queries.request_detail(conn, some_id))
        q("why page: rate_rows 7 d", lambda: queries.rate_rows(conn, "llama3.2:latest", now - 7 * 86400))
        width = max(len(n) for n, _ in rows)
        print(f"{'query':<{width}}  {'wall':>8}     {'CPU':>8}")
        for name, ms in rows:
            print(f"{name:<{width}}  {ms:8.2f} ms  {CPU_MS[name]:8.2f} ms")
        print(
            f"worst live refresh: {live:.1f} ms = {live / 150:.2f} × the 150 ms budget "
            f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs while measuring)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
