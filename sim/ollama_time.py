"""Go-compatible time and duration formats used on Ollama's wire."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

FOREVER_S = 292 * 365 * 24 * 3600  # Go's maximum duration, about 292 years
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
_PART_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


_base_cache: tuple[int, str] = (-1, "")


def rfc3339nano(unix_ns: int | None = None) -> str:
    """Like Go's time.RFC3339Nano in UTC: trailing zeros of the fraction trimmed."""
    global _base_cache
    ns = time.time_ns() if unix_ns is None else unix_ns
    secs, frac = divmod(ns, 10**9)
    if _base_cache[0] != secs:  # every chunk asks; the seconds part changes once a second
        _base_cache = (secs, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)))
    digits = f"{frac:09d}".rstrip("0")
    return _base_cache[1] + ("." + digits if digits else "") + "Z"


def rfc3339_from_unix_s(unix_s: float) -> str:
    """An expires_at value; far-future values are clamped to what datetime can hold."""
    if unix_s > 253_402_300_000:
        unix_s = 253_402_300_000 - 1
    dt = datetime.fromtimestamp(unix_s, tz=UTC)
    return dt.isoformat(timespec="microseconds").replace("+00:00", "Z")


def format_go_duration(ns: int) -> str:
    """Go's time.Duration.String(): "1.234567s", "12.5ms", "830µs", "97ns", "1m2.5s"."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return sign + _trim(f"{ns / 1_000:.3f}") + "µs"
    if ns < 10**9:
        return sign + _trim(f"{ns / 1_000_000:.6f}") + "ms"
    hours, rest = divmod(ns, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    secs = _trim(f"{rest / 10**9:.9f}") + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}"
    if minutes:
        return f"{sign}{minutes}m{secs}"
    return sign + secs


def _trim(number: str) -> str:
    return number.rstrip("0").rstrip(".") if "." in number else number


def parse_go_duration_ns(text: str) -> int:
    """Parse Go's time.ParseDuration syntax ("5m", "1h30m", "-1s", "0"); ValueError with Go's wording."""
    s = text.strip()
    orig = s
    sign = 1
    if s[:1] in "+-" and s:
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f'time: invalid duration "{orig}"')
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _PART_RE.match(s, pos)
        if not m:
            if re.fullmatch(r"[\d.]+", s[pos:]):
                raise ValueError(f'time: missing unit in duration "{orig}"')
            raise ValueError(f'time: invalid duration "{orig}"')
        total += float(m.group(1)) * _UNIT_NS[m.group(2)]
        pos = m.end()
    return sign * int(total)


def keep_alive_ns(value: object) -> int | None:
    """Ollama's keep_alive: number = seconds, string = Go duration; negative = forever (-1). None = not given."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("invalid keep_alive value")
    if isinstance(value, int | float):
        ns = int(value * 10**9)
    elif isinstance(value, str):
        ns = parse_go_duration_ns(value)
    else:
        raise ValueError("invalid keep_alive value")
    return -1 if ns < 0 else ns
