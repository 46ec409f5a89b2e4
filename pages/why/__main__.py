"""``python -m pages.why --data DIR [--model NAME] --json``: the object the Why page draws, as JSON.

The page and this command share one function (``pages.why.view.build_why``, then ``why_json``), so what this prints
is what the page shows: placement, prefill and decode against what was expected, the verdicts with their figures."""

from __future__ import annotations

import argparse
import json
import sys
import time

from analysis.command_line import TIME_HELP, ExitCode, time_arg
from pages.shared.window import DEFAULT_WINDOW_S
from pages.why.view import build_why, model_choices, why_json
from store import queries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pages.why", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", required=True, help="the collector's data folder (or its store file)")
    ap.add_argument("--model", help="the model to explain (default: the one with the newest request)")
    ap.add_argument(
        "--window-s", type=float, default=DEFAULT_WINDOW_S, help="every number from the requests of this many seconds"
    )
    ap.add_argument(
        "--now",
        type=time_arg,
        metavar="TIME",
        help=f"the end of the window: {TIME_HELP} (default: now; a window with no request of the model moves to end at "
        "its newest request, as the page's does)",
    )
    ap.add_argument("--json", action="store_true", help="print the story as JSON (the only output for now)")
    args = ap.parse_args(argv)
    db = queries.resolve_db(args.data)
    if not db.exists():
        print(f"no store at {db}", file=sys.stderr)
        return ExitCode.USAGE
    models = model_choices(db) or []
    model = args.model or (models[0] if models else None)
    if model is None:
        print(f"no generation is stored in {db} yet", file=sys.stderr)
        return ExitCode.FAILED  # the store is there; it holds nothing to explain yet
    now_unix_s = args.now.at(time.time()) if args.now else None
    m = build_why(db, model, now_unix_s=now_unix_s, window_s=args.window_s)
    if m is None:
        print(f"cannot read {db}", file=sys.stderr)
        return ExitCode.FAILED
    json.dump(why_json(m), sys.stdout, indent=2, default=str)
    print()
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
