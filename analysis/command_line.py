"""What every Phasewatch command line shares: its exit codes and the forms ``--since``/``--until`` take.

One home, so that ``python -m store export``, ``python -m pages.report``, ``python -m collectors`` and the rest
answer alike (docs/settings.md, "Exit codes" and "Times on the command line"). It lives in ``analysis`` because
every layer may import ``analysis`` (pyproject's import contracts); it is plain Python, no I/O.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum


class ExitCode(IntEnum):
    """A command's exit status. argparse exits 2 on a bad argument itself, so USAGE is 2 everywhere."""

    OK = 0
    FAILED = 1  # the command ran and its work failed: a store not written, a child process that died, a run that failed
    USAGE = 2  # the command was wrong: a bad argument or setting, no store where --data points
    BUSY = 3  # a collector already records into the data folder (the message names its process)
    CANCELLED = 130  # stopped by Ctrl-C (128 + SIGINT, as a shell reports it)


# Limits on what --since/--until take: anything longer or older is a typo, not a window.
MAX_TIME_CHARS = 64
MAX_AGE_S = 10 * 365 * 86400.0  # ten years back
TIME_HELP = "Unix seconds, an ISO 8601 time (UTC unless it names a zone), or an age back from now: 90s, 30m, 24h, 7d, 2w"
UNTIL_HELP = "the window's end, in the same forms as --since (default: now)"

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_AGE_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


@dataclass(frozen=True)
class TimeArg:
    """A time given on the command line: either a fixed instant or an age, which needs the command's "now"."""

    text: str
    unix_s: float | None = None  # a fixed instant
    age_s: float | None = None  # this long before now

    def at(self, now_unix_s: float) -> float:
        """The instant, in Unix seconds."""
        return self.unix_s if self.unix_s is not None else now_unix_s - (self.age_s or 0.0)


def parse_time(text: str) -> TimeArg:
    """``--since``/``--until``: Unix seconds, an ISO 8601 time, or an age (``24h``). ValueError says which forms."""
    stripped = text.strip()
    if not stripped or len(stripped) > MAX_TIME_CHARS:
        raise ValueError(f"{text[:MAX_TIME_CHARS]!r} is not a time: give {TIME_HELP} ({MAX_TIME_CHARS} characters at most)")
    if age := _AGE.fullmatch(stripped):
        age_s = float(age.group(1)) * _AGE_UNIT_S[age.group(2)]
        if age_s > MAX_AGE_S:
            raise ValueError(f"{stripped!r} is over {MAX_AGE_S / 86400 / 365:.0f} years back; give a shorter age")
        return TimeArg(text=stripped, age_s=age_s)
    return TimeArg(text=stripped, unix_s=_instant(stripped))


def _instant(text: str) -> float:
    try:
        unix_s = float(text)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a time: give {TIME_HELP}") from None
        unix_s = (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(unix_s) or unix_s < 0:  # float() takes "nan" and "inf"; a window cannot end there
        raise ValueError(f"{text!r} is not a time: give {TIME_HELP}")
    return unix_s


def time_arg(text: str) -> TimeArg:
    """``parse_time`` as an argparse ``type``: a bad time exits USAGE with argparse's own message."""
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_window_arguments(parser: argparse.ArgumentParser, since_default: str | None = None, until: bool = True) -> None:
    """``--since`` (and ``--until``) with the one parser and help text every command uses."""
    default = f" (default {since_default})" if since_default else " (default: from the first request)"
    parser.add_argument(
        "--since",
        type=time_arg,
        default=parse_time(since_default) if since_default else None,
        metavar="TIME",
        help=f"the window's start: {TIME_HELP}{default}",
    )
    if until:
        parser.add_argument("--until", type=time_arg, default=None, metavar="TIME", help=UNTIL_HELP)
