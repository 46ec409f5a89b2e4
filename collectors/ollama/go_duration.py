"""Go's durations as Ollama's lines print them (gin's latency, the MLX runner's ``took=``), in seconds.

Its own module so that both the log's reader (``collectors.ollama.log``) and the MLX runner's lines
(``collectors.ollama.mlx_log``, which the log's reader parses) use it without importing each other."""

from __future__ import annotations

import math
import re

MAX_GO_DURATION_S = 7 * 24 * 3600.0  # a request longer than a week is no real one's
_NUM = r"[0-9]{1,15}(?:\.[0-9]{1,9})?"
_GO_DURATION_PART = re.compile(r"(" + _NUM + r")(h|ms|µs|μs|us|ns|m|s)")
_GO_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ns": 1e-9}


def go_duration_s(text: str) -> float | None:
    """A Go duration as gin prints it ("36.330512ms", "1m2s", "512.3µs") in seconds; None if it is not one."""
    if len(text) > 64:
        return None
    parts = _GO_DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    seconds = sum(float(n) * _GO_UNIT_S[u] for n, u in parts)
    return seconds if math.isfinite(seconds) and seconds <= MAX_GO_DURATION_S else None
