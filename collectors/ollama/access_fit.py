"""Whether one of Ollama's access lines can be a given generation's (``collectors.ollama.direct``).

An access line says when an HTTP request ended (to the second), how long it took, its status, client and route;
no model, no request id. It fits a generation that ended in that second (within ``ACCESS_SLACK_S``) and began no
earlier than the line's start (so the request took at least as long as the generation's span), answered with that
status: a request Ollama answered 500 is not one the runner ran to its end, and a proxied request's line has the
status the proxy recorded. One request's figures are never taken for another's: a line two generations fit is neither's.
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors.ollama.log import AccessLine

ACCESS_SLACK_S = 1.5  # an access line's second and a generation's end (or start): how far apart they may be and fit


@dataclass(frozen=True)
class Claimant:
    """A generation that may own an access line: when it ran as far as known, and what is known of its answer."""

    start: float  # as late as known: the request began no later
    end: float
    status: int | None = None  # the status it was answered with, when known (a proxied request's)
    answered: bool = False  # the runner ran it to its end (decoded, its runner still there): Ollama answered it


def fits_line(line: AccessLine, c: Claimant) -> bool:
    """Whether the request of ``line`` can have been generation ``c`` (module doc)."""
    if not line.ended_unix_s - ACCESS_SLACK_S <= c.end <= line.ended_unix_s + 1 + ACCESS_SLACK_S:
        return False  # not ended with it
    if line.ended_unix_s - line.latency_s > c.start + ACCESS_SLACK_S:
        return False  # begun after it: shorter than the generation (it may have waited for a load or a slot first)
    if c.status is not None and c.status != line.status:
        return False
    return not (c.answered and line.status >= 500)
