"""The host's own memory bandwidth, measured by the collector; and which Apple chip this is.

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

import json
import logging
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from analysis.hardware import apple_chip_name, apple_gpu_cores_from_system_profiler
from analysis.records import HostBandwidth

__all__ = ["HostBandwidth", "detect_apple_gpu", "measure_host_bandwidth", "same_machine"]

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


# ---------------------------------------------------------------------------------------------
# Apple Silicon: which chip, how many GPU cores


def _run(cmd: list[str], timeout_s: float = 10.0) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def detect_apple_gpu() -> tuple[str, int | None] | None:
    """("Apple M3 Max", 40) on Apple Silicon macOS, None elsewhere.

    The chip from ``sysctl -n machdep.cpu.brand_string``; the GPU core count from
    ``system_profiler SPDisplaysDataType -json`` (None if that fails), which tells
    core variants with different bandwidth apart (M3 Max 30 vs 40 cores).
    """
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return None
    brand = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
    chip = apple_chip_name(brand or "")
    if chip is None:
        return None
    profile = _run(["system_profiler", "SPDisplaysDataType", "-json"], timeout_s=20.0)
    cores = None
    if profile:
        try:
            cores = apple_gpu_cores_from_system_profiler(json.loads(profile))
        except ValueError:
            cores = None
    return chip, cores


def main() -> int:
    """``python -m collectors.host.bandwidth``: measure and print this machine's figure."""
    hb = measure_host_bandwidth()
    print(f"host memory bandwidth: {hb.bandwidth_bytes_s / 1e9:.1f} GB/s ({hb.threads} threads, {hb.buffer_bytes >> 20} MiB)")
    apple = detect_apple_gpu()
    if apple:
        print(f"Apple GPU: {apple[0]}, {apple[1] or 'unknown'} GPU cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
