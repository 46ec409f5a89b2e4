"""The host's own memory bandwidth, measured by the collector.

When Ollama puts part of a model in system memory, decode speed is set by this
bandwidth for that part (analysis.ceilings blends it with the GPU's). No table
can know it, so we measure it: several threads copy a few hundred MB with numpy
(which releases the GIL inside the copy), best of a few runs. A copy reads and
writes every byte, so the bytes moved are twice the buffer.

The collector measures it once, at start, in a background thread, and stores it
(``store.ops.PutHostBandwidth``); it measures again only when the machine no longer
looks the same (CPU count or total memory). The Why page reads it from the store.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from analysis.command_line import ExitCode
from analysis.records import HostBandwidth

__all__ = ["HostBandwidth", "measure_host_bandwidth", "same_machine"]

log = logging.getLogger(__name__)

DEFAULT_BUFFER_BYTES = 256 * 2**20
DEFAULT_RUNS = 3
MAX_THREADS = 8


def measure_host_bandwidth(
    buffer_bytes: int = DEFAULT_BUFFER_BYTES, runs: int = DEFAULT_RUNS, threads: int | None = None
) -> HostBandwidth:
    """Copy ``buffer_bytes`` split over ``threads`` threads, ``runs`` times; keep the fastest."""
    import numpy as np  # numpy comes with streamlit; imported here so importing this module stays cheap

    if buffer_bytes < 2**20 or runs < 1:
        raise ValueError("buffer_bytes must be at least 1 MiB and runs at least 1")
    n_threads = threads or min(os.cpu_count() or 1, MAX_THREADS)
    src = np.ones(buffer_bytes, dtype=np.uint8)  # ones, not empty: every page really allocated
    dst = np.zeros_like(src)
    bounds = [(i * buffer_bytes // n_threads, (i + 1) * buffer_bytes // n_threads) for i in range(n_threads)]

    def copy(b: tuple[int, int]) -> None:
        np.copyto(dst[b[0] : b[1]], src[b[0] : b[1]])

    best_s = float("inf")
    with ThreadPoolExecutor(max_workers=n_threads) as pool:
        list(pool.map(copy, bounds))  # warm-up: fault in pages, start threads
        for _ in range(runs):
            t0 = time.perf_counter()
            list(pool.map(copy, bounds))
            best_s = min(best_s, time.perf_counter() - t0)
    return HostBandwidth(
        bandwidth_bytes_s=2.0 * buffer_bytes / best_s,
        measured_unix_s=time.time(),
        buffer_bytes=buffer_bytes,
        threads=n_threads,
        runs=runs,
        cpu_count=os.cpu_count() or 1,
        mem_total_bytes=int(psutil.virtual_memory().total),
    )


def same_machine(hb: HostBandwidth) -> bool:
    """Whether a measurement was taken on a machine like this one (same CPU count and total memory)."""
    return hb.cpu_count == (os.cpu_count() or 1) and hb.mem_total_bytes == int(psutil.virtual_memory().total)


def main() -> int:
    """``python -m collectors.host.bandwidth``: measure and print this machine's figure."""
    hb = measure_host_bandwidth()
    print(f"host memory bandwidth: {hb.bandwidth_bytes_s / 1e9:.1f} GB/s ({hb.threads} threads, {hb.buffer_bytes >> 20} MiB)")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
