"""Progress readings of a running generation → which to trust, prefill rate and ETA. Pure.

A request may have readings from several sources: the runner's /slots and Ollama's log are read;
an estimate is computed. Read ones win: ``preferred`` keeps the estimate only where nothing was read.
"""

from __future__ import annotations

from collections.abc import Sequence

from analysis.records import ProgressSample, ProgressSource

READ_SOURCES = (ProgressSource.SLOTS, ProgressSource.LOG)


def preferred(samples: Sequence[ProgressSample]) -> list[ProgressSample]:
    """The readings to show for one request, oldest first: slots, else log, else the estimate."""
    for source in (*READ_SOURCES, ProgressSource.ESTIMATE):
        chosen = [s for s in samples if s.source is source]
        if chosen:
            return sorted(chosen, key=lambda s: s.ts_unix_s)
    return []


def prompt_size_tokens(samples: Sequence[ProgressSample]) -> tuple[int | None, bool]:
    """(the prompt's size, whether it was read): the latest read size, else the latest estimated one."""
    for read in (True, False):
        sized = [s for s in samples if s.prompt_tokens is not None and (s.source in READ_SOURCES) == read]
        if sized:
            return max(sized, key=lambda s: s.ts_unix_s).prompt_tokens, read
    return None, False


def prefill_rate_tok_s(samples: Sequence[ProgressSample]) -> float | None:
    """Prompt tokens read per second so far: from the first reading that shows progress to the one that first
    showed the latest count.

    Readings before any progress are left out: the request may have waited or loaded before them, and from the
    reading that shows a runner's slot has taken the task, its first batch took up to twice as long as the next
    ones (sim's llama-server, a 4,000-token prompt). The count moves a batch at a time and repeats between
    batches: the latest count is dated by the reading that first showed it, not by its repeats.
    """
    moving = [s for s in _prefill_readings(samples) if s.processed_tokens > 0]
    if len(moving) < 2:
        return None
    first, reached = moving[0], _reached(moving)
    dt_s = reached.ts_unix_s - first.ts_unix_s
    if dt_s <= 0 or reached.processed_tokens <= first.processed_tokens:
        return None
    return (reached.processed_tokens - first.processed_tokens) / dt_s


def prefill_eta_unix_s(samples: Sequence[ProgressSample], prompt_tokens: int | None = None) -> float | None:
    """When the prompt will have been read, at the rate so far; None when that cannot be said yet.

    ``prompt_tokens`` overrides the size the readings carry (e.g. an estimate made from the prompt's characters).
    """
    size = prompt_tokens if prompt_tokens is not None else prompt_size_tokens(samples)[0]
    rate = prefill_rate_tok_s(samples)
    shown = _prefill_readings(samples)
    if size is None or rate is None or not shown:
        return None
    reached = _reached(shown)
    to_read = size - (reached.cached_tokens or 0) - reached.processed_tokens
    return reached.ts_unix_s + max(0, to_read) / rate


def _prefill_readings(samples: Sequence[ProgressSample]) -> list[ProgressSample]:
    """The preferred source's readings while the prompt is read (none that shows decoding), oldest first."""
    return [s for s in preferred(samples) if not s.decoded_tokens]


def _reached(shown: Sequence[ProgressSample]) -> ProgressSample:
    """The reading that first showed the latest count of prompt tokens read."""
    i = len(shown) - 1
    while i > 0 and shown[i - 1].processed_tokens == shown[i].processed_tokens:
        i -= 1
    return shown[i]
