"""``python -m pages.report --data DIR [--since 24h]``: print the Why page's report to paste (pages/why/report.py)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from pages.why.report import DEFAULT_SINCE_S, build_report

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str) -> float:
    """``90s``, ``30m``, ``24h``, ``7d`` (a bare number is hours) → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 24h, 7d)")
    return float(match.group(1)) * _UNITS_S[match.group(2) or "h"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pages.report", description=__doc__)
    ap.add_argument("--data", required=True, type=Path, metavar="DIR", help="the data folder the collector writes")
    ap.add_argument("--since", type=parse_since, default=DEFAULT_SINCE_S, metavar="DURATION", help="window (default 24h)")
    args = ap.parse_args(argv)
    text = build_report(args.data, since_s=args.since)
    if text is None:
        print(f"no store in the data folder {args.data.name!r}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
