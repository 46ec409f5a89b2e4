"""One beat for the collector's periodic work, so that work of one period wakes the event loop once, together.

An idle collector's cost is mostly its wake-ups, not its work: on these machines a thread's wake-up costs ~0.3 ms
whatever it then does (bench/README.md, issue 44). The sampler's tick, the Ollama poller, the runner reader's quiet
step and the relay's timeout watch each ran once a second from its own start, so the loop woke four times a second
for them. Each now sleeps to the next multiple of its period on the loop's clock: periods that divide one another
(0.25 s, 1 s) land on the same instants, and the loop runs them in one wake-up.
"""

from __future__ import annotations


def until_next_beat_s(now_s: float, period_s: float) -> float:
    """Seconds from ``now_s`` (the loop's clock) to the next multiple of ``period_s``; never 0 (a beat just
    reached waits for the next one, so a loop that ran on the beat does not run again at once)."""
    return period_s - (now_s % period_s) or period_s
