"""How long a ~31 MB request body through the proxy stalls another client's stream.

Not a test (``tests/collectors/proxy/test_proxy_request_body_stall.py`` asserts what holds on a busy machine):
prints, side by side in one run, a steady stream's longest gap between lines (the upstream writes one every
10 ms) through ``python -m collectors.proxy`` alone and beside a 31 MB request body of each shape (an
image in base64, a long ``context`` array, a chat history of small objects), with the body decoded on
the event loop as before (``PHASEWATCH_BIG_BODY_BYTES`` above the body: nothing is handed to the worker)
and in the worker process (the default). The gap is taken from the body's first byte to twice the stdlib
parse time of the body after its last, measured here in the same run. The upstream never decodes a body
(``tests.support.scripted_upstream``), as Ollama stalls no other client while it decodes one.

    .venv/bin/python bench/request_body_stall.py [--reps 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import big_request
from tests.support.proxy_process import start_proxy_process
from tests.support.scripted_upstream import start_scripted_upstream

MODES = {
    "on the loop (before)": {"PHASEWATCH_BIG_BODY_BYTES": str(1 << 40)},
    "worker process (after)": {},
}


def _measure(base_url: str, shape: str | None) -> tuple[float, float]:
    """(longest gap in the window, parse time of the body); without a ``shape`` the window is the same
    stretch of the stream (from its middle) beside no body."""
    if shape is None:
        run = big_request.run(base_url, "/api/generate", None)
        start_s, parse_s = run.chunk_s[len(run.chunk_s) // 2], 0.0
        end_s = start_s + 1.0
    else:
        path, body = big_request.BODIES[shape]()
        parse_s = big_request.parse_s(body)
        run = big_request.run(base_url, path, body, lines=big_request.lines_for(parse_s))
        assert run.body_sent_s is not None and run.body_done_s is not None
        start_s, end_s = run.body_sent_s, run.body_done_s + 2 * parse_s
    if run.errors:
        raise RuntimeError(run.errors)
    if run.chunk_s[-1] <= end_s:
        raise RuntimeError("the stream ended inside the window: raise big_request.STREAM_LINES")
    return run.max_gap_s(start_s, end_s), parse_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2, help="runs per mode and case (the table shows the median)")
    args = ap.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    cases: list[str | None] = [None, *big_request.BODIES]
    rows = []
    with start_scripted_upstream() as upstream:
        for mode, env in MODES.items():
            with (
                tempfile.TemporaryDirectory(prefix="pw-bench-") as folder,
                start_proxy_process(upstream.base_url, Path(folder), env) as proxy,
            ):
                for case in cases:
                    runs = [_measure(proxy.base_url, case) for _ in range(args.reps)]
                    rows.append((mode, case or "stream alone", [g for g, _ in runs], [p for _, p in runs]))
                proxy.stop()
    print(f"\nstream's longest gap between lines (ms; median of {args.reps}, all runs in brackets)")
    print(f"{'decoded':<24} {'beside':<16} {'longest gap':>24} {'stdlib parse of body':>28}")
    for mode, case, gaps, parses in rows:
        print(f"{mode:<24} {case:<16} {_cell(gaps):>24} {_cell(parses):>28}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


def _cell(values_s: list[float]) -> str:
    return f"{statistics.median(values_s) * 1e3:.0f} [{', '.join(f'{v * 1e3:.0f}' for v in values_s)}]"


if __name__ == "__main__":
    sys.exit(main())
