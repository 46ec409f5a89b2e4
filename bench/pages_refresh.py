"""Server-side work of the Live and Requests pages over a big store, against the targets.

    .venv/bin/python bench/pages_refresh.py [--store DIR] [--requests 100000] [--reps 7]

Fills a store (through the collector's own ``StoreWriter``) with 24 hours of 1 Hz GPU
and host samples and 100,000 requests, or reuses ``--store DIR`` when it already holds
one. Then times, as median and worst of ``--reps`` runs, what the pages do on the server:

- the Live page's 1 s fragment (store reads, figures, and their JSON as Streamlit sends it)
  at the default 5-minute window and at the widest, 24-hour window;
- the Live page's 5 s fragment (loaded models, host);
- the Requests page (history of the window, the newest request's detail, figures as JSON);
- both pages as whole Streamlit script runs (``AppTest``: what one refresh costs the server).

Each line prints the measured time beside its target and their ratio (< 1.00 meets it).
Targets: 150 ms per Live refresh, 500 ms for the Requests page.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.records import HostSample, LoadedModel
from bench.pages_fixture import GIB, Shape, gpu_sample, make_request, status_rows
from store.ops import Op, PutGpuSamples, PutHostSample, PutLoadedModels, PutRequest
from store.schema import db_path
from store.writer import StoreWriter

LIVE_TARGET_S = 0.150
REQUESTS_TARGET_S = 0.500
DAY_S = 24 * 3600


def fill(data_dir: Path, n_requests: int, now: float) -> None:
    """24 h of 1 Hz samples and ``n_requests`` requests spread over the day, written in big transactions."""
    rng = random.Random(1)
    t0 = now - DAY_S
    w = StoreWriter(db_path(data_dir))
    try:
        started = time.perf_counter()
        chunk = 3600
        for base in range(int(t0), int(now), chunk):
            ts = [float(t) for t in range(base, min(base + chunk, int(now) + 1))]
            ops: list[Op[None]] = [PutGpuSamples([gpu_sample(t, 95.0 if rng.random() < 0.3 else 2.0)]) for t in ts]
            ops += [PutHostSample(HostSample(t, 20.0, 12 * GIB, 32 * GIB, 5.0, GIB)) for t in ts]
            w.apply(ops)
        print(f"  samples: {2 * DAY_S:,} rows in {time.perf_counter() - started:.1f} s", flush=True)
        started = time.perf_counter()
        step = DAY_S / n_requests
        batch = []
        for i in range(n_requests):
            shape = Shape(
                prompt_tokens=rng.randint(20, 3000),
                output_tokens=rng.randint(5, 60),
                prefill_ms=rng.uniform(10, 200),
                decode_ms=rng.uniform(100, 600),
            )
            batch.append(make_request(t0 + i * step, t0, model=rng.choice(["llama3.2:latest", "llama3.1:8b"]), shape=shape))
            if len(batch) == 5000:
                w.apply([PutRequest(r) for r in batch])
                batch = []
        if batch:
            w.apply([PutRequest(r) for r in batch])
        print(f"  requests: {n_requests:,} in {time.perf_counter() - started:.1f} s", flush=True)
        size = int(2.6 * GIB)
        model = LoadedModel(now, "llama3.2:latest", "llama3.2:latest", "a" * 64, size, size, 8192, now + 300)
        w.write(PutLoadedModels(now, [model]))
        status_rows(w, now, data_dir)
    finally:
        w.close()


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    fn()  # warm: imports, SQLite page cache
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), max(times)


def line(what: str, median_s: float, worst_s: float, target_s: float) -> None:
    print(
        f"  {what:<52} {median_s * 1000:8.1f} ms  (worst {worst_s * 1000:7.1f})  target {target_s * 1000:5.0f} ms"
        f"  ratio {median_s / target_s:5.2f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--store", type=Path, help="data folder to fill (or reuse when it holds a store)")
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    data_dir = args.store or Path(tempfile.mkdtemp(prefix="pw-bench-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    if not db_path(data_dir).exists():
        print(f"filling {db_path(data_dir)} ...", flush=True)
        fill(data_dir, args.requests, time.time())
    db = db_path(data_dir)
    print(f"store: {db} ({db.stat().st_size / 1e6:.0f} MB)")

    # The store's clock ends when it was filled; "now" for the pages is its newest sample.
    import sqlite3

    with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as conn:
        now = float(conn.execute("SELECT MAX(ts_unix_s) FROM gpu_samples").fetchone()[0])
        n_req = int(conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0])
        n_gpu = int(conn.execute("SELECT COUNT(*) FROM gpu_samples").fetchone()[0])
    print(f"  {n_gpu:,} GPU samples, {n_req:,} requests; pages look at the store's last moment\n")

    from pages.live.view import build_live, timeline_refresh_s
    from pages.requests.view import build_detail, build_history

    def live(window_s: float, part: str) -> Callable[[], object]:
        def run() -> object:
            every = part == "all"
            m = build_live(
                db,
                now,
                window_s,
                flight=every or part == "flight",
                timeline=every or part == "timeline",
                context=every or part == "context",
            )
            assert m is not None
            figs = [f for _, f in m.gpu_figures] + [m.bands_figure, m.models_figure, m.host_figure]
            return [f.to_json() for f in figs if f is not None]  # what Streamlit serialises for the browser

        return run

    def requests_page(window_s: float) -> Callable[[], object]:
        def run() -> object:
            h = build_history(db, now - window_s, now)
            assert h is not None and h.rows
            d = build_detail(db, h.rows[0].id)
            assert d is not None
            out = [h.frame.to_dict()] + [f.to_json() for f in (h.figure, d.waterfall, d.gaps) if f is not None]
            return out

        return run

    print("functions (store → tables and figures → JSON):")
    line("Live, in flight (every 1 s)", *timed(live(300, "flight"), args.reps), LIVE_TARGET_S)
    for window_s, label in ((300, "5 min"), (3600, "1 h"), (DAY_S, "24 h")):
        every = timeline_refresh_s(window_s)
        line(
            f"Live, GPU timeline, {label} window (every {every:.0f} s)",
            *timed(live(window_s, "timeline"), args.reps),
            LIVE_TARGET_S,
        )
    line("Live, models and host, 5 min window (every 5 s)", *timed(live(300, "context"), args.reps), LIVE_TARGET_S)
    line("Live, all three parts together, 5 min window", *timed(live(300, "all"), args.reps), LIVE_TARGET_S)
    line("Requests page, 5 min window", *timed(requests_page(300), args.reps), REQUESTS_TARGET_S)
    line("Requests page, 24 h window (100,000 requests)", *timed(requests_page(DAY_S), args.reps), REQUESTS_TARGET_S)

    # Whole script runs in-process: Streamlit's own work on top (widgets, protobufs, Arrow for tables).
    from streamlit.testing.v1 import AppTest

    os.environ.update(PHASEWATCH_DATA=str(data_dir), PHASEWATCH_COLLECTOR="off")
    os.environ.pop("PHASEWATCH_DEMO", None)
    app = str(Path(__file__).resolve().parents[1] / "app.py")

    def apptest(page: str | None, window: str) -> Callable[[], object]:
        def run() -> object:
            at = AppTest.from_file(app, default_timeout=120)
            at.session_state["pw_window"] = window
            at.run()
            if page:
                at.switch_page(page).run()
            assert not at.exception, [e.value for e in at.exception]
            return at

        return run

    print("\nwhole Streamlit runs (AppTest; includes app.py, the sidebar and Streamlit's own work):")
    live_s = timed(apptest(None, "5 min"), max(3, args.reps // 2))
    line("Live page, first run of a session, 5 min window", *live_s, LIVE_TARGET_S)
    both = timed(apptest("pages/requests/page.py", "24 h"), max(3, args.reps // 2))
    line("Live then Requests page (two runs), 24 h window", *both, LIVE_TARGET_S + REQUESTS_TARGET_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
