"""Whether one of Ollama's access lines can be a given generation's (``collectors.ollama.direct``).

An access line says when an HTTP request ended (to the second), how long it took, its status, client and route;
no model, no request id. The request ended in the line's second, before the line was read, and no earlier than
its generation ended (the runner sends its final answer a moment before it frees the slot; the line is written
within ``ANSWER_LAG_S`` of that); it began no later than the generation began (it may have waited for a load or a
slot first). So a line fits a generation whose end, as bounded by the polls around it, meets the line's span,
and that began no earlier than the line's start. Four requests sent at once on one slot end about a second apart:
a window of seconds either side of each end (the rule before) let every line fit two or three of them, and none
was told. A request Ollama answered 500 is not one the runner ran to its end, and a proxied request's line has the
status the proxy recorded. One request's figures are never taken for another's: a line two generations fit is
neither's.
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors.ollama.log import AccessLine

ACCESS_SLACK_S = 1.5  # a line's start against a generation's start (as late as known), and the lines gathered near an end
# Ollama writes its access line when its handler returns: once the runner's final answer is relayed, which the
# runner sends just before it frees the slot. Milliseconds on an idle machine; half a second leaves room for a busy
# scheduler. The runner's answer comes a moment before its release: the line may end that much before the slot is free.
ANSWER_LAG_S = 0.5
# A line is stamped with the time its read began: a read takes milliseconds, and a line written meanwhile is in it.
READ_SLACK_S = 0.1


@dataclass(frozen=True)
class Claimant:
    """A generation that may own an access line: when it ran as far as known, and what is known of its answer."""

    start: float  # as late as known: the request began no later
    end: float  # as late as known: it ended no later (the first poll that saw it over, or the proxy's last chunk)
    status: int | None = None  # the status it was answered with, when known (a proxied request's)
    answered: bool = False  # the runner ran it to its end (decoded, its runner still there): Ollama answered it
    earliest_end: float | None = None  # as early as known: when the last poll that saw it running asked (None: ``end``)

    @property
    def end_lo(self) -> float:
        return self.end if self.earliest_end is None else min(self.earliest_end, self.end)


def fits_line(line: AccessLine, c: Claimant) -> bool:
    """Whether the request of ``line`` can have been generation ``c`` (module doc)."""
    ended_lo = line.ended_unix_s  # the request ended in the line's second...
    ended_hi = line.ended_unix_s + 1
    if line.read_unix_s is not None:
        ended_hi = min(ended_hi, line.read_unix_s + READ_SLACK_S)  # ...and before the line was read
    if ended_hi + READ_SLACK_S < c.end_lo:
        return False  # the request was over before the generation was
    if ended_lo > c.end + ANSWER_LAG_S:
        return False  # the request went on well after the generation ended: another one's
    if max(ended_lo, c.end_lo) - line.latency_s > c.start + ACCESS_SLACK_S:
        return False  # begun after it: shorter than the generation (it may have waited for a load or a slot first)
    if c.status is not None and c.status != line.status:
        return False
    return not (c.answered and line.status >= 500)
