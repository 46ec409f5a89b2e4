"""bench/proxy_overhead.py's last lines: the collector over the proxy alone per stream count (issue 44's targets)."""

from __future__ import annotations

from bench.proxy_overhead import Path_, Run, _over_proxy


def _run(cpu_us_per_chunk: float, p99_ms: float, chunks: int = 1_000) -> Run:
    # 98 delays of 1 ms and two of p99_ms: the 99th percentile (inclusive method) is p99_ms itself.
    delays = [1.0] * 98 + [p99_ms, p99_ms]
    return Run(ttfb_ms=[1.0], transit_ms=[1.0], delay_ms=delays, chunks=chunks, cpu_s=cpu_us_per_chunk * chunks / 1e6)


def test_each_stream_count_gets_the_collectors_ratio_to_the_proxy_alone_and_its_verdict() -> None:
    paths = [Path_("direct", ""), Path_("collector", "", [1]), Path_("collector-before", "", [2]), Path_("proxy", "", [3])]
    results = {
        (16, "direct"): _run(0, 1.0),
        (16, "collector"): _run(60.0, 3.0),
        (16, "collector-before"): _run(80.0, 9.0),
        (16, "proxy"): _run(50.0, 2.0),
        (64, "direct"): _run(0, 1.0),
        (64, "collector"): _run(52.0, 2.9),
        (64, "collector-before"): _run(70.0, 3.5),
        (64, "proxy"): _run(50.0, 2.0),
    }
    lines = _over_proxy([16, 64], paths, results).splitlines()
    assert lines[0] == (
        "over the proxy alone, 16 streams: collector 1.20x (ok: target <= 1.3x), added p99 +2.00 ms against the proxy "
        "alone's +1.00; collector-before 1.60x (MISSED: target <= 1.3x), added p99 +8.00 ms against the proxy alone's +1.00"
    )
    assert lines[1] == (
        "over the proxy alone, 64 streams: collector 1.04x (ok: target <= 1.3x), added p99 +1.90 ms against the proxy "
        "alone's +1.00 (ok: target <= +1.0 ms over it); collector-before 1.40x (MISSED: target <= 1.3x), added p99 "
        "+2.50 ms against the proxy alone's +1.00 (MISSED: target <= +1.0 ms over it)"
    )
