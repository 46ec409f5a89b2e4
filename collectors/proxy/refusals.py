"""The relay's own answers on the record: every request it refused (a 400, 408, 431, 501 or 505 for the bytes, a
401 or 403 for access, the 503 at the connection bound) and every connection it cut to make room.

Each is logged at WARNING with the client's address and the reason (at most ``Limits.refusal_warnings_per_minute``
lines a minute, so a flood cannot fill the log), counted by status and reason for ``/phasewatch/metrics``
(``phasewatch_proxy_refused_total``, docs/metrics.md), and kept per minute for an hour for the sidebar. A user whose
client got a 400 from Phasewatch, not from Ollama, finds it in all three.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from enum import Enum

log = logging.getLogger(__name__)

NO_ANSWER = "none"  # the status label of a refusal that wrote no answer (a connection cut, a pipeline closed)
WINDOW_S = 60.0  # the rate limit's window
KEPT_MINUTES = 60  # refusals are kept per minute for this many minutes (the sidebar's last hour)


class Refusal(Enum):
    """Why the relay refused a request: the ``reason`` label (a fixed set, so the counter stays bounded)."""

    MALFORMED = "malformed"  # 400: bytes llhttp refused, a bad request target, contradictory framing
    HEAD_TOO_LARGE = "head_too_large"  # 431: over Limits.max_head_bytes
    HEAD_TIMEOUT = "head_timeout"  # 408: the head did not end within Limits.head_timeout_s
    BODY_TIMEOUT = "body_timeout"  # 408: no body byte for Limits.body_timeout_s
    BODY_TOO_SLOW = "body_too_slow"  # 408: the body under Limits.min_body_rate_bps
    UPGRADE = "upgrade"  # 501: a protocol upgrade (WebSocket, h2c)
    TRANSFER_CODING = "transfer_coding"  # 501: a transfer coding other than chunked
    HTTP_VERSION = "http_version"  # 505: neither HTTP/1.0 nor HTTP/1.1
    UNAUTHORIZED = "unauthorized"  # 401: without the collector's token
    FOREIGN_HOST = "foreign_host"  # 403: a Host that is not this machine (DNS rebinding)
    FOREIGN_ORIGIN = "foreign_origin"  # 403: a browser Origin Ollama would refuse
    CONNECTION_BOUND = "connection_bound"  # 503: every connection busy at the bound
    EVICTED = "evicted"  # no answer: a slow request cut at the connection bound to make room
    TOO_MANY_PIPELINED = "too_many_pipelined"  # no answer: over Limits.max_pipelined in one read; closed after those


# For the sidebar and the log: what each reason means, in words.
WORDS = {
    Refusal.MALFORMED: "malformed",
    Refusal.HEAD_TOO_LARGE: "head too large",
    Refusal.HEAD_TIMEOUT: "head too slow",
    Refusal.BODY_TIMEOUT: "body stalled",
    Refusal.BODY_TOO_SLOW: "body too slow",
    Refusal.UPGRADE: "protocol upgrade",
    Refusal.TRANSFER_CODING: "transfer coding",
    Refusal.HTTP_VERSION: "HTTP version",
    Refusal.UNAUTHORIZED: "no token",
    Refusal.FOREIGN_HOST: "foreign Host",
    Refusal.FOREIGN_ORIGIN: "foreign Origin",
    Refusal.CONNECTION_BOUND: "too many connections",
    Refusal.EVICTED: "cut to make room",
    Refusal.TOO_MANY_PIPELINED: "too many pipelined",
}

Key = tuple[str, Refusal]  # (status label: "400" … or NO_ANSWER, reason)


class Refusals:
    """Counts, the last hour and the rate-limited warnings of the relay's refusals (all on the event loop).

    Cost: nothing per chunk or per relayed request; a dict update and a deque check per refusal.
    """

    def __init__(self, warnings_per_minute: int, clock_s: Callable[[], float] = time.monotonic) -> None:
        self.warnings_per_minute = warnings_per_minute
        self.counts: dict[Key, int] = {}  # since the relay started
        self._clock_s = clock_s
        self._minutes: deque[tuple[int, dict[Key, int]]] = deque()  # (minute number, counts in it), oldest first
        self._window_start_s = -WINDOW_S
        self._logged_in_window = 0
        self._not_logged = 0  # refusals past the limit since the last line written

    def note(self, status: int | None, reason: Refusal, client_addr: str, detail: str) -> None:
        """One refusal: ``status`` the client got (None: no answer), ``detail`` what was wrong, for the log."""
        key = (str(status) if status else NO_ANSWER, reason)
        self.counts[key] = self.counts.get(key, 0) + 1
        now_s = self._clock_s()
        minute = int(now_s // 60)
        if not self._minutes or self._minutes[-1][0] != minute:
            self._minutes.append((minute, {}))
            while self._minutes[0][0] <= minute - KEPT_MINUTES:
                self._minutes.popleft()
        in_minute = self._minutes[-1][1]
        in_minute[key] = in_minute.get(key, 0) + 1
        if now_s - self._window_start_s >= WINDOW_S:
            self._window_start_s, self._logged_in_window = now_s, 0
        if self._logged_in_window >= self.warnings_per_minute:
            self._not_logged += 1
            return
        self._logged_in_window += 1
        answer = f"answered {status}" if status else "no answer"
        skipped = ""
        if self._not_logged:
            skipped = f" ({self._not_logged} more refused before this and not logged: over {self.warnings_per_minute} a minute)"
            self._not_logged = 0
        who = client_addr or "an unknown address"
        log.warning("refused a request from %s (%s, %s): %s%s", who, WORDS[reason], answer, detail, skipped)

    def last_hour(self) -> dict[Key, int]:
        """Refusals of the last 60 minutes (whole minutes), by status and reason."""
        since = int(self._clock_s() // 60) - KEPT_MINUTES
        out: dict[Key, int] = {}
        for minute, counts in self._minutes:
            if minute > since:
                for key, n in counts.items():
                    out[key] = out.get(key, 0) + n
        return out


def summary(counts: dict[Key, int]) -> str | None:
    """The sidebar's words for some refusals, most first, e.g. "2 × 400 malformed, 1 × 503 too many connections";
    None when there are none."""
    if not any(counts.values()):
        return None
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0][0], item[0][1].value))
    return ", ".join(f"{n} × {status + ' ' if status != NO_ANSWER else ''}{WORDS[reason]}" for (status, reason), n in ranked)
