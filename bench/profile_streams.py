"""Where the collector's CPU per chunk goes over the proxy alone's: py-spy on each while bursts run, split by part.

    .venv/bin/python bench/profile_streams.py [--streams 16] [--seconds 20] [--out DIR]

Starts one sim, the collector (``python -m collectors``) and the proxy alone (``python -m collectors.proxy``), waits
for the collector's one-off start-up work, then for each of the two sends back-to-back bursts of ``--streams``
streams of 100 tokens for ``--seconds`` with ``py-spy record --threads --nonblocking --format raw`` attached
(``.venv/bin/pip install py-spy``). It prints each one's CPU per chunk over the window and, for each part (the
outermost frame that names one, ``PARTS`` below), its share of the samples times that CPU per chunk: the
microseconds per chunk that part costs. py-spy counts a thread waiting for the GIL as busy, so thread parts are
over-counted a little; the shares are the finding. The collapsed stacks are left in ``--out`` for a closer look.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proxy_overhead import Path_, _burst, start_python, start_sim, wait_started_up

MODEL = "llama3.2"
TOKENS = 100

# (part, substrings of a frame). A sample goes to the part named by the frame nearest its leaf that names one (a
# psutil call under the client-process lookup is the lookup's), so each part is where the time was spent.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("client process lookup: psutil.net_connections per new client (worker thread)", ("client_process.py",)),
    ("store writer thread: finished rows, 1 Hz in-flight rows, samples", ("store/",)),
    ("parsing chunks (pump, StreamParser)", ("analysis/chunks.py", "feed_some", "_parse_pending")),
    ("finishing a record (finaliser, metrics)", ("_finalise", "collectors/metrics.py", "analysis/")),
    ("relay's Python callbacks (relay.py)", ("relay.py",)),
    ("runner discovery and process watch", ("discovery.py", "process_watch")),
    ("host / GPU samplers", ("collectors/host/", "collectors/gpu/")),
    ("Ollama poller, runner reader, log", ("collectors/ollama/",)),
    ("service tick: in-flight snapshots, heartbeat, progress", ("service.py", "recording.py")),
    ("idle worker threads waking (queue and condition waits)", ("threading.py", "concurrent/futures/thread.py")),
    ("event loop in C (uvloop: reads, writes, llhttp, epoll)", ("uvloop/", "asyncio/runners.py")),
)
OTHER = "other"


def _part_of(stack: str) -> str:
    for frame in reversed(stack.split(";")):
        for name, keys in PARTS:
            if any(k in frame for k in keys):
                return name
    return OTHER


def _shares(raw: Path) -> collections.Counter[str]:
    """Samples per part from py-spy's raw (collapsed) output: one ``stack count`` per line."""
    out: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        out[_part_of(stack)] += int(count)
    return out


def _profile(runner: asyncio.Runner, path: Path_, sim_url: str, streams: int, seconds: float, out: Path) -> None:
    raw = out / f"{path.name}.txt"
    spy = subprocess.Popen(
        [shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")), "record", "--threads", "--nonblocking",
         "--format", "raw", "-r", "250", "-p", str(path.pids[0]), "-o", str(raw), "-d", str(int(seconds) + 1)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    cpu0, t0, chunks, rep = path.cpu_s(), time.monotonic(), 0, 0
    while time.monotonic() - t0 < seconds:
        chunks += runner.run(_burst(path, sim_url, streams, TOKENS, MODEL, f"{path.name}-prof-{rep}")).chunks
        rep += 1
    cpu_us = (path.cpu_s() - cpu0) / chunks * 1e6
    spy.wait(timeout=60)
    shares = _shares(raw)
    total = sum(shares.values()) or 1
    load = os.getloadavg()[0]
    print(f"\n{path.name}: {cpu_us:.1f} µs of CPU per chunk over {chunks} chunks ({total} busy samples), load {load:.2f}")
    for name, n in shares.most_common():
        print(f"  {n / total * cpu_us:6.1f} µs ({n / total:4.0%})  {name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=Path("artifacts/profile"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import uvloop

    with contextlib.ExitStack() as stack:
        runner = stack.enter_context(asyncio.Runner(loop_factory=uvloop.new_event_loop))
        sim = stack.enter_context(start_sim("--hardware", "rtx-3060", "--num-parallel", "64", "--disk-gbs", "20"))
        data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="pw-prof-"))
        collector_args = ["-m", "collectors", "--ollama", sim.base_url, "--listen", "127.0.0.1:{port}", "--data", data_dir]
        collector = stack.enter_context(start_python("collector", collector_args))
        proxy = stack.enter_context(
            start_python("proxy", ["-m", "collectors.proxy", "--upstream", sim.base_url, "--listen", "127.0.0.1:{port}"])
        )
        for p in (collector, proxy):
            runner.run(_burst(p, sim.base_url, args.streams, 4, MODEL, "warm"))
        wait_started_up(data_dir, "collector")
        for p in (collector, proxy):
            _profile(runner, p, sim.base_url, args.streams, args.seconds, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
