"""Where a proxy's CPU goes: per chunk relayed, and per request, for each path side by side in one run.

    .venv/bin/python bench/proxy_cost_split.py [--streams 16] [--seconds 15] [--rounds 2] [--before DIR]

``bench/proxy_overhead.py`` gives one figure per path, CPU time per chunk over bursts of 100-token
streams, and that figure mixes two costs: what each chunk costs (read, frame, write, record its time,
decode its line) and what each request costs once (its head, its record finished and written to the store,
the tick's snapshots of it while it runs). This bench separates them. For each path it sends back-to-back
bursts of ``--streams`` streams for ``--seconds`` with short replies (10 tokens) and again with long ones (100),
the paths and lengths alternating, and fits CPU per request = per-request cost + lines x per-line cost through
the two points (a reply of N tokens is N + 1 lines: the last one carries Ollama's numbers). Long windows
(tens of thousands of chunks) keep the figures steady where a 3-burst cell is not.

The paths are those of ``proxy_overhead.py``: the collector as users run it, the proxy alone (relaying and
recording, no store, no samplers), nginx, and ``bench/tcp_pipe.py`` (uvloop relaying bytes with no Python per
chunk beyond a write: what any uvloop proxy pays before doing anything of its own). Last it prints what the
collector's per-chunk figure at 100 tokens would be against nginx's for each part taken away, so the ratio
``proxy_overhead.py`` checks (target 1.3x) can be read against what it is made of.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proxy_overhead import (
    Path_,
    _burst,
    start_nginx,
    start_python,
    start_sim,
    wait_started_up,
)

SHORT_TOKENS, LONG_TOKENS = 10, 100
MODEL = "llama3.2"


@dataclass
class Window:
    requests: int = 0
    lines: int = 0
    cpu_s: float = 0.0


@dataclass
class Split:
    per_line_us: float
    per_request_us: float

    def per_chunk_at(self, tokens: int) -> float:
        """CPU per line of a reply of ``tokens`` tokens, both parts included (what proxy_overhead.py prints)."""
        return self.per_line_us + self.per_request_us / (tokens + 1)


def _window(runner: asyncio.Runner, path: Path_, sim_url: str, streams: int, tokens: int, seconds: float) -> Window:
    w = Window()
    cpu0, t0 = path.cpu_s(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        run = runner.run(_burst(path, sim_url, streams, tokens, MODEL, f"{path.name}-{tokens}-{w.requests}"))
        w.lines += run.chunks
        w.requests += streams
    w.cpu_s = path.cpu_s() - cpu0
    return w


def _split(short: Window, long: Window) -> Split:
    """Through the two points (lines per request, CPU per request)."""
    x0, y0 = short.lines / short.requests, short.cpu_s / short.requests
    x1, y1 = long.lines / long.requests, long.cpu_s / long.requests
    per_line = (y1 - y0) / (x1 - x0)
    return Split(per_line * 1e6, (y0 - per_line * x0) * 1e6)


def _merge(windows: list[Window]) -> Window:
    return Window(sum(w.requests for w in windows), sum(w.lines for w in windows), sum(w.cpu_s for w in windows))


def _report(splits: dict[str, Split]) -> None:
    print(f"\n{'path':<18} {'per line':>9} {'per request':>12} {'per line at 100 tokens':>23} {'over nginx':>10}")
    nginx = splits.get("nginx")
    for name, s in splits.items():
        at = s.per_chunk_at(LONG_TOKENS)
        ratio = f"{at / nginx.per_chunk_at(LONG_TOKENS):9.2f}x" if nginx else f"{'-':>10}"
        print(f"{name:<18} {s.per_line_us:7.1f}µs {s.per_request_us:10.0f}µs {at:21.1f}µs {ratio}")
    collector, proxy, pipe = splits.get("collector"), splits.get("proxy"), splits.get("tcp-pipe")
    if not (nginx and collector and proxy and pipe):
        return
    target = 1.3 * nginx.per_chunk_at(LONG_TOKENS)
    print(f"\nthe target, 1.3x nginx at {LONG_TOKENS} tokens: {target:.1f}µs per line; the collector's parts against it:")
    print(f"  uvloop relaying bytes (tcp-pipe), per line             {pipe.per_line_us:6.1f}µs")
    print(f"  + the proxy's own per line (HTTP framing, stamp, decode) {proxy.per_line_us - pipe.per_line_us:6.1f}µs")
    print(f"  + the collector's per line beyond the proxy's          {collector.per_line_us - proxy.per_line_us:6.1f}µs")
    lines = LONG_TOKENS + 1
    print(f"  + the proxy's per request, spread over {lines} lines     {proxy.per_request_us / lines:6.1f}µs")
    extra = (collector.per_request_us - proxy.per_request_us) / lines
    print(f"  + the collector's per request beyond it (store, ticks)  {extra:6.1f}µs")
    total = collector.per_chunk_at(LONG_TOKENS)
    print(f"  = {total:.1f}µs ({total / nginx.per_chunk_at(LONG_TOKENS):.2f}x nginx)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=16, help="concurrent streams per burst")
    ap.add_argument("--seconds", type=float, default=15.0, help="window per path, length and round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every path and length (alternating)")
    ap.add_argument("--before", type=Path, help="another checkout whose collector runs as the path collector-before")
    args = ap.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    sim_args = ["--hardware", "rtx-3060", "--num-parallel", str(args.streams), "--disk-gbs", "20"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(runner)
        sim = stack.enter_context(start_sim(*sim_args))
        paths: list[Path_] = []
        data_dirs: list[str] = []
        checkouts = [("collector", Path(__file__).resolve().parents[1])]
        if args.before is not None:
            checkouts.append(("collector-before", args.before.resolve()))
        for name, cwd in checkouts:
            data = stack.enter_context(tempfile.TemporaryDirectory(prefix="pw-split-"))
            cmd = ["-m", "collectors", "--ollama", sim.base_url, "--listen", "127.0.0.1:{port}", "--data", data]
            paths.append(stack.enter_context(start_python(name, cmd, cwd=cwd)))
            data_dirs.append(data)
        proxy_cmd = ["-m", "collectors.proxy", "--upstream", sim.base_url, "--listen", "127.0.0.1:{port}"]
        paths.append(stack.enter_context(start_python("proxy", proxy_cmd)))
        nginx = stack.enter_context(start_nginx(sim.port))
        if nginx is not None:
            paths.append(nginx)
        paths.append(stack.enter_context(start_python("tcp-pipe", ["bench/tcp_pipe.py", f"127.0.0.1:{sim.port}", "{port}"])))
        for p in paths:
            runner.run(_burst(p, sim.base_url, args.streams, 4, MODEL, "warm"))
        for data, p in zip(data_dirs, paths, strict=False):
            wait_started_up(data, p.name)
        print(
            f"machine: {psutil.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; sim {' '.join(sim_args)}; "
            f"{args.streams} streams per burst, {args.seconds:g} s per window, {args.rounds} rounds"
        )
        windows: dict[tuple[str, int], list[Window]] = {}
        for _ in range(args.rounds):
            for tokens in (SHORT_TOKENS, LONG_TOKENS):
                for p in paths:
                    w = _window(runner, p, sim.base_url, args.streams, tokens, args.seconds)
                    windows.setdefault((p.name, tokens), []).append(w)
        splits = {p.name: _split(_merge(windows[(p.name, SHORT_TOKENS)]), _merge(windows[(p.name, LONG_TOKENS)])) for p in paths}
        _report(splits)
        print(f"load average at the end: {os.getloadavg()[0]:.2f} on {psutil.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
