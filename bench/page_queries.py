"""Every SQL statement each page runs, with its time, its SQLite VM steps and its query plan.

    .venv/bin/python bench/page_queries.py --store DIR [--window "24 h"] [--top 15]

Renders ``app.py`` (Live) in ``AppTest`` over the store at ``--store DIR`` (filled by
``bench/page_switch.py`` or ``bench/pages_refresh.py``), then switches to Requests, Why and Lab. Every
connection the pages open is traced (``set_trace_callback``: the statement with its values bound). Each
statement seen is then run again alone on a fresh read-only connection: its wall time, the VM steps
it took (``set_progress_handler``, counted per 1,000 steps) and ``EXPLAIN QUERY PLAN``'s full scans.
Prints, per page, the statements by time, the slowest first.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
PAGES = ("Live", "pages/requests/page.py", "pages/why/page.py", "pages/lab/page.py")
STEP_UNIT = 1000  # the progress handler is called every STEP_UNIT VM instructions
# A full scan in a plan: "SCAN requests" (not "SCAN requests USING INDEX ...", which reads an index, maybe all of it).
SCAN_RE = re.compile(r"\bSCAN (\w+)(?! USING (?:COVERING )?INDEX)")


def trace_pages(data_dir: Path, window: str) -> dict[str, list[str]]:
    """The statements each page ran, in order (values bound)."""
    from streamlit.testing.v1 import AppTest

    seen: dict[str, list[str]] = {}
    current: list[str] = []
    real_connect = sqlite3.connect

    def connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = real_connect(*args, **kwargs)  # type: ignore[call-overload]
        conn.set_trace_callback(current.append)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    os.environ.update(PHASEWATCH_DATA=str(data_dir), PHASEWATCH_COLLECTOR="off")
    try:
        at = AppTest.from_file(str(REPO / "app.py"), default_timeout=600)
        at.session_state["pw_window"] = window
        for page in PAGES:
            current.clear()
            started = time.perf_counter()
            if page == "Live":
                at.run()
            else:
                at.switch_page(page).run()
            elapsed = time.perf_counter() - started
            assert not at.exception, [e.value for e in at.exception]
            seen[page] = list(current)
            print(f"{page}: script {elapsed * 1000:.0f} ms, {len(current)} statements", flush=True)
    finally:
        sqlite3.connect = real_connect
    return seen


def measure(db: Path, sql: str) -> tuple[float, int, list[str]]:
    """Wall seconds, VM steps (thousands) and the full scans of one statement run alone."""
    conn = real_ro(db)
    try:
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        plan: list[str] = []
        if sql.lstrip().upper().startswith(("SELECT", "WITH")):
            plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql)]
        conn.set_progress_handler(count, STEP_UNIT)
        started = time.perf_counter()
        try:
            conn.execute(sql).fetchall()
        except sqlite3.Error:
            return 0.0, 0, ["(not rerunnable)"]
        elapsed = time.perf_counter() - started
        scans = [p for p in plan if SCAN_RE.search(p)]
        return elapsed, steps[0], scans
    finally:
        conn.close()


def real_ro(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--window", default="24 h")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    from store.schema import db_path

    db = db_path(args.store)
    seen = trace_pages(args.store, args.window)
    for page, statements in seen.items():
        rows = []
        for sql in dict.fromkeys(s for s in statements if s.lstrip().upper().startswith(("SELECT", "WITH"))):
            elapsed, ksteps, scans = measure(db, sql)
            rows.append((elapsed, ksteps, scans, sql))
        rows.sort(reverse=True)
        total = sum(r[0] for r in rows)
        print(f"\n== {page}: {len(rows)} distinct SELECTs, {total * 1000:.0f} ms when rerun alone")
        for elapsed, ksteps, scans, sql in rows[: args.top]:
            one_line = " ".join(sql.split())
            print(f"  {elapsed * 1000:8.1f} ms {ksteps:8,}k steps  {'; '.join(scans) or '-'}\n      {one_line[:400]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
