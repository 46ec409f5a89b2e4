"""How long a ~16 MB embeddings reply through the proxy stalls another client's stream.

Not a test (``tests/collectors/proxy/test_proxy_big_body.py`` asserts what holds on a busy machine): prints, side by
side in one run, the streamed generation's longest gap between chunks through ``python -m
collectors.proxy.recording`` alone and with a concurrent 1800 x 768 embeddings reply (~15.7 MB), with the body
parsed on the event loop as before (``PHASEWATCH_BIG_BODY_BYTES`` above ``max_line_bytes``: nothing is
handed to the worker) and in the worker process (the default). The gap is taken from the reply's end
(when the proxy parses it) over twice the stdlib parse time of the body, measured here in the same run.

    .venv/bin/python bench/big_body_stall.py [--reps 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import big_body
from tests.support.proxy_process import start_proxy_process
from tests.support.sim_process import start_sim

MODES = {
    "on the loop (before)": {"PHASEWATCH_BIG_BODY_BYTES": str(1 << 40)},
    "worker process (after)": {},
}


def _measure(base_url: str, embed: bool) -> tuple[float, float]:
    """(max gap in the window after the reply ended, parse time of the body); without ``embed`` the window
    is the same stretch of the stream (from its middle) with no reply."""
    run = big_body.run(base_url, embed=embed)
    if run.errors:
        raise RuntimeError(run.errors)
    if embed:
        assert run.embed_done_s is not None
        parse_s = big_body.parse_s(run.embed_body)
        start_s = run.embed_done_s
    else:
        parse_s = 0.0
        start_s = run.chunk_s[len(run.chunk_s) // 2]
    end_s = start_s + 2 * max(parse_s, 0.5)
    if run.chunk_s[-1] <= end_s:
        raise RuntimeError("the stream ended inside the window: raise big_body.STREAM_TOKENS")
    return run.max_gap_s(start_s, end_s), parse_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2, help="runs per mode and case (the table shows the median)")
    args = ap.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    rows = []
    with start_sim("--hardware", "rtx-3060", "--num-parallel", "2") as sim:
        for mode, env in MODES.items():
            with (
                tempfile.TemporaryDirectory(prefix="pw-bench-") as folder,
                start_proxy_process(sim.base_url, Path(folder), env) as proxy,
            ):
                big_body.warm_up(proxy.base_url)
                alone = [_measure(proxy.base_url, embed=False)[0] for _ in range(args.reps)]
                both = [_measure(proxy.base_url, embed=True) for _ in range(args.reps)]
                proxy.stop()
            rows.append((mode, alone, [g for g, _ in both], [p for _, p in both]))
    print(f"\nstream's longest gap between chunks (ms; median of {args.reps}, all runs in brackets)")
    print(f"{'parse':<24} {'stream alone':>22} {'with 16 MB embed reply':>30} {'stdlib parse of body':>30}")
    for mode, alone, gaps, parses in rows:
        print(f"{mode:<24} {_cell(alone):>22} {_cell(gaps):>30} {_cell(parses):>30}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


def _cell(values_s: list[float]) -> str:
    return f"{statistics.median(values_s) * 1e3:.0f} [{', '.join(f'{v * 1e3:.0f}' for v in values_s)}]"


if __name__ == "__main__":
    sys.exit(main())
