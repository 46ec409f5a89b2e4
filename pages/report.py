"""``python -m pages.report --data DIR [--since 24h] [--until TIME]``: print the Why page's report to paste
(pages/why/report.py). ``--since``/``--until`` take the forms every command takes (analysis/command_line.py)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analysis.command_line import ExitCode, add_window_arguments
from pages.why.report import DEFAULT_SINCE_S, build_report

DEFAULT_SINCE = f"{DEFAULT_SINCE_S / 3600:g}h"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pages.report", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", required=True, type=Path, metavar="DIR", help="the data folder the collector writes")
    add_window_arguments(ap, since_default=DEFAULT_SINCE)
    args = ap.parse_args(argv)
    wall_s = time.time()
    end_s = args.until.at(wall_s) if args.until else wall_s
    window_s = end_s - args.since.at(wall_s)
    if window_s <= 0:
        ap.error(f"--since {args.since.text} is not before the window's end; give an earlier time or a later --until")
    text = build_report(args.data, now_unix_s=end_s, since_s=window_s)
    if text is None:
        print(f"no store in the data folder {args.data.name!r}", file=sys.stderr)
        return ExitCode.USAGE
    sys.stdout.write(text)
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
