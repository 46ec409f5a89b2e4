"""What the collector holds in memory under two floods (issue 25 findings 1 and 4); prints RSS as it goes.

``no-gpu``: an in-process collector without a GPU source (a CPU-only host) in front of sim, with --record-text,
sent ``--requests`` requests of ``--chars`` characters, 8 at a time: RSS after each 1,000.

``store-flood``: a store writer at a 50 MB size bound sent --record-text sized requests (``--chars`` of prompt and
of reply) at ``--rate`` a second for ``--seconds``, faster than it can write them: RSS, records waiting, shed.

    .venv/bin/python bench/collector_memory.py no-gpu [--requests 3000] [--chars 100000]
    .venv/bin/python bench/collector_memory.py store-flood [--seconds 20] [--rate 400] [--chars 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collectors.config import load_settings
from collectors.gpu.choose import GpuChoice
from collectors.service import CollectorService
from store.ops import PutRequest, RetentionPolicy
from store.writer import BackgroundWriter
from tests.store.test_store_writer import make_record
from tests.support.sim_process import SimProcess, start_sim

BOUND_BYTES = 50 * 1024**2


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def no_gpu(sim: SimProcess, data: Path, requests: int, chars: int) -> None:
    argv = ["--ollama", sim.base_url, "--listen", "127.0.0.1:0", "--data", str(data), "--record-text"]
    service = CollectorService(load_settings(argv, {}), gpu_choose=lambda **_: GpuChoice(None, []), host_bandwidth=None)
    await service.start()
    url = f"http://{service.listen}/api/generate"
    body = {"model": "qwen2.5:0.5b", "prompt": "x" * chars, "stream": False, "options": {"num_predict": 3}}
    try:
        async with aiohttp.ClientSession() as session:

            async def one() -> None:
                async with session.post(url, json=body) as resp:
                    await resp.read()

            print(f"start: RSS {rss_mb():.0f} MB", flush=True)
            for sent in range(0, requests, 1000):
                for _ in range(0, 1000, 8):
                    await asyncio.gather(*(one() for _ in range(8)))
                assert service.writer is not None and service.writer.flush(30)
                await asyncio.sleep(0.5)
                print(f"after {sent + 1000} requests: RSS {rss_mb():.0f} MB", flush=True)
    finally:
        await service.stop()


def store_flood(data: Path, seconds: float, rate: int, chars: int) -> None:
    bg = BackgroundWriter(data / "pw.db", retention=RetentionPolicy(max_bytes=BOUND_BYTES))
    base = make_record("x", n_tokens=50)
    started, sent, next_print, peak = time.monotonic(), 0, 2.0, 0.0
    while (elapsed := time.monotonic() - started) < seconds:
        while sent < elapsed * rate:
            rec = replace(
                base, id=f"r{sent}", started_at_unix_s=1.7e9 + sent * 0.01, prompt_text="p" * chars, response_text="r" * chars
            )
            bg.submit(PutRequest(rec))
            sent += 1
        if elapsed >= next_print:
            peak = max(peak, rss_mb())
            shed = getattr(bg, "shed_count", "n/a")  # n/a: a writer without a byte cap
            print(f"{elapsed:4.0f} s: sent {sent}, waiting {bg.pending_count}, shed {shed}, RSS {rss_mb():.0f} MB", flush=True)
            next_print += 2.0
        time.sleep(0.005)
    written = sent - bg.pending_count - bg.dropped_count
    print(f"peak RSS {peak:.0f} MB; {written} of {sent} written in {seconds:.0f} s ({written / seconds:.0f} a second)")
    bg.close(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["no-gpu", "store-flood"])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--chars", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.mode == "no-gpu":
            with start_sim("--hardware", "cpu") as sim:
                asyncio.run(no_gpu(sim, Path(tmp), args.requests, args.chars))
        else:
            store_flood(Path(tmp), args.seconds, args.rate, args.chars)


if __name__ == "__main__":
    main()
