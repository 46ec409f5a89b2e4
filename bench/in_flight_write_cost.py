"""What one second's write of a running request costs the store writer, by how long the reply is so far.

    .venv/bin/python bench/in_flight_write_cost.py [--rate 300] [--at 300,2000,8000,30000,50000] [--before DIR]

A reply grows by ``--rate`` tokens a second; once a second the collector writes its row (``PutRequest`` of the
running record, what the service's tick submits). This replays that growth straight into a ``StoreWriter`` on a
temporary file, with no sleeping, and times the write (the op built, split, written and committed) of the seconds
from the one that reaches each token count in ``--at`` (median of 5 seconds' writes). ``--before DIR`` times another
checkout's store the same way in a child process, alternating with this one, so both are measured under the same
load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 5


def _measure(rate: int, at: list[int]) -> dict[int, float]:
    """µs per write, median of ROUNDS writes around each count in ``at`` (run from the checkout being measured)."""
    sys.path.insert(0, str(Path.cwd()))
    from analysis.records import Outcome, RequestRecord
    from store.ops import PutRequest
    from store.writer import StoreWriter

    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="pw-inflight-") as d:
        writer = StoreWriter(Path(d) / "s.sqlite3")
        rec = RequestRecord(
            id="long", started_at_unix_s=time.time(), client_addr="127.0.0.1:1", endpoint="/api/generate",
            model="m", stream=True, received_ns=0, forwarded_ns=1, outcome=Outcome.IN_FLIGHT,
        )  # fmt: skip
        t_ns, writes = 0, []  # (tokens so far, µs) of each second's write
        while len(rec.token_chunk_ns) < max(at) + ROUNDS * rate:
            for _ in range(rate):
                t_ns += rng.randrange(2_000_000, 5_000_000)
                rec.token_chunk_ns.append(t_ns)
            rec.first_token_ns = rec.token_chunk_ns[0]
            t0 = time.perf_counter()
            writer.write(PutRequest(rec))
            writes.append((len(rec.token_chunk_ns), (time.perf_counter() - t0) * 1e6))
        writer.close()
    # The ROUNDS seconds from the one that reaches each count.
    return {n: statistics.median([us for k, us in writes if k >= n][:ROUNDS]) for n in at}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=300, help="tokens a second")
    ap.add_argument("--at", default="300,2000,8000,30000,50000", help="token counts to report")
    ap.add_argument("--before", type=Path, help="another checkout measured beside this one")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    at = [int(s) for s in args.at.split(",")]
    if args.child:
        print(json.dumps(_measure(args.rate, at)))
        return 0
    runs = {"before": args.before, "after": REPO} if args.before else {"after": REPO}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--rate", str(args.rate), "--at", args.at]
    got = {
        name: {int(k): v for k, v in json.loads(subprocess.check_output(cmd, cwd=cwd.resolve())).items()}
        for name, cwd in runs.items()
    }
    print(f"one write of a running request, µs (median of {ROUNDS}), reply growing {args.rate} tokens a second")
    print(f"{'tokens so far':>14} " + " ".join(f"{n:>10}" for n in got))
    for count in at:
        print(f"{count:>14} " + " ".join(f"{got[n][count]:10.0f}" for n in got))
    for name, us in got.items():
        print(f"{name}: at {at[-1]} tokens ÷ at {at[0]}: {us[at[-1]] / us[at[0]]:.2f}x")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
