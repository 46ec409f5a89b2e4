"""How long the Requests page's usage totals take to build over a store, and how many requests they count.

    .venv/bin/python bench/usage_totals.py --store DIR [--module FILE] [--rounds 2]

Times ``load_usage`` (pages/requests/usage.py) over the store at ``--store DIR``, ``now`` a minute after its newest
request. ``--module FILE`` times another copy of that module beside it, e.g. the integration branch's
(``git show stage:pages/requests/usage.py > /tmp/stage_usage.py``), over the same store, alternating the two.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sqlite3
import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pages.requests import usage
from store.schema import db_path


def _module(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("usage_other", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["usage_other"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", type=Path, required=True, help="the data folder holding the store")
    ap.add_argument("--module", help="another copy of pages/requests/usage.py to time beside this one")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    db = db_path(args.store)
    with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        (newest,) = conn.execute("SELECT MAX(started_at_unix_s) FROM requests").fetchone()
    now = float(newest) + 60.0
    mods = [("this tree", usage)] + ([(args.module, _module(args.module))] if args.module else [])
    for _ in range(args.rounds):
        for name, mod in mods:
            started = time.perf_counter()
            rows = mod.load_usage(db, now) or []
            took_s = time.perf_counter() - started
            month = sum(r.requests for r in rows if r.period == "30 days" and r.by == "model")
            print(f"{name}: {took_s:.2f} s, {month:,} requests counted over 30 days")


if __name__ == "__main__":
    main()
