"""Make ``v3.sqlite3`` (and ``expected.json``) with the LANDED code's own writer, not this tree's.

Run from a checkout of the landed version (schema v3, ``StoreWriter.write_*``), e.g.:

    mkdir /tmp/landed && git archive <landed-commit> | tar -x -C /tmp/landed
    cd /tmp/landed && python /path/to/tests/data/landed_store/make.py /path/to/tests/data/landed_store

``expected.json`` holds each request as recorded and the phases the landed split gave it,
for ``tests/test_store_landed.py`` to hold the migrated store against.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from analysis.phases import split_record
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
from store.schema import SCHEMA_VERSION
from store.writer import StoreWriter

MS = 1_000_000
T0 = 1_780_000_000.0  # fixed, so the file is the same on every run


def chat(
    id: str,
    t: float,
    *,
    n_tokens: int,
    cached: int | None,
    prompt: int,
    outcome: Outcome = Outcome.OK,
    endpoint: str = "/api/chat",
    model: str = "llama3.2",
    metrics: bool = True,
) -> RequestRecord:
    received = 10_000_000_000 + int((t - T0) * 1e9)
    first = received + 180 * MS
    chunks = [first + i * 23 * MS for i in range(n_tokens)]
    rec = RequestRecord(
        id=id,
        started_at_unix_s=t,
        client_addr="127.0.0.1:50000",
        endpoint=endpoint,
        model=model,
        stream=True,
        num_ctx=4096,
        keep_alive="5m",
        received_ns=received,
        forwarded_ns=received + MS,
        first_byte_ns=first if chunks else None,
        first_token_ns=first if chunks else None,
        token_chunk_ns=chunks,
    )
    if outcome is Outcome.IN_FLIGHT:
        return rec
    end = (chunks[-1] if chunks else first) + MS
    rec.final_chunk_ns, rec.closed_ns, rec.status_code, rec.outcome = end, end + MS, 200, outcome
    if metrics:
        rec.metrics = FinalMetrics(
            total_duration_ns=end - received - 2 * MS,
            load_duration_ns=4 * MS,
            prompt_eval_count=prompt,
            prompt_eval_cached_count=cached,
            prompt_eval_duration_ns=140 * MS,
            eval_count=n_tokens,
            eval_duration_ns=max(0, n_tokens - 1) * 23 * MS,
            done_reason="stop",
        )
    return rec


def main(out: Path) -> None:
    assert SCHEMA_VERSION == 3, "run this with the landed code (schema v3)"
    path = out / "v3.sqlite3"
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        p.unlink(missing_ok=True)
    recs = [
        chat("ok-cache-hit", T0, n_tokens=30, cached=20, prompt=120),
        chat("ok-no-cache-info", T0 + 10, n_tokens=12, cached=None, prompt=300, model="qwen2.5:0.5b"),
        chat("one-token", T0 + 20, n_tokens=1, cached=0, prompt=40),
        chat("openai", T0 + 30, n_tokens=8, cached=None, prompt=0, endpoint="/v1/chat/completions", metrics=False),
        chat("cancelled", T0 + 40, n_tokens=5, cached=None, prompt=0, outcome=Outcome.CANCELLED, metrics=False),
        chat("running", T0 + 50, n_tokens=3, cached=None, prompt=0, outcome=Outcome.IN_FLIGHT),
    ]
    w = StoreWriter(path, clock=lambda: T0 + 60)
    w.write_requests(recs)
    w.write_gpu_samples(
        [
            GpuSample(
                T0 + i,
                0,
                "NVIDIA GeForce RTX 4090",
                "GPU-1",
                util_gpu_pct=90.0 - i,
                mem_used_bytes=(20 << 30) + i,
                power_w=300.0 + i,
                pstate=2,
            )
            for i in range(5)
        ]
    )
    w.write_host_sample(HostSample(T0, 12.5, 8 << 30, 64 << 30, ollama_cpu_pct=3.0, ollama_rss_bytes=1 << 30))
    w.write_loaded_models(
        T0 + 1,
        [
            LoadedModel(
                T0 + 1,
                "llama3.2:latest",
                "llama3.2:latest",
                "a" * 64,
                3_600_000_000,
                3_000_000_000,
                4096,
                T0 + 300,
                "3.2B",
                "Q4_K_M",
                "llama",
            )
        ],
    )
    w.write_model_info("a" * 64, "llama3.2:latest", {"details": {"family": "llama"}, "model_info": {"llama.block_count": 28}})
    w.write_ollama_status(OllamaStatus(T0 + 2, True, "http://127.0.0.1:11434", "0.33.0"))
    w.write_heartbeat(CollectorInfo(T0 + 3, 4321, "127.0.0.1:11435", "http://127.0.0.1:11434", "/data", "nvml"))
    w.write_experiment("exp-1", "prompt-length", {"lengths": [128, 512]}, T0 + 5, "done", T0 + 50, {"rows": [1, 2]})
    w.close()
    # One file, no WAL beside it: check the WAL into the main file.
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    expected = [{"record": asdict(r), "phases": split_record(r).to_json_dict()} for r in recs]
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes) and expected.json with {len(recs)} requests")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
