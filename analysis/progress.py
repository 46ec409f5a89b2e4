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
    """Prompt tokens read per second so far: between the first and last readings that show progress.

    Readings before any progress are left out: the request may have waited or loaded before them.
    """
    moving = [s for s in preferred(samples) if s.processed_tokens > 0 and not s.decoded_tokens]
    if len(moving) < 2:
        return None
    first, last = moving[0], moving[-1]
    dt_s = last.ts_unix_s - first.ts_unix_s
    if dt_s <= 0 or last.processed_tokens <= first.processed_tokens:
        return None
    return (last.processed_tokens - first.processed_tokens) / dt_s


def prefill_eta_unix_s(samples: Sequence[ProgressSample], prompt_tokens: int | None = None) -> float | None:
    """When the prompt will have been read, at the rate so far; None when that cannot be said yet.

    ``prompt_tokens`` overrides the size the readings carry (e.g. an estimate made from the prompt's characters).
    """
    size = prompt_tokens if prompt_tokens is not None else prompt_size_tokens(samples)[0]
    rate = prefill_rate_tok_s(samples)
    shown = [s for s in preferred(samples) if not s.decoded_tokens]
    if size is None or rate is None or not shown:
        return None
    last = shown[-1]
    to_read = size - (last.cached_tokens or 0) - last.processed_tokens
    return last.ts_unix_s + max(0, to_read) / rate
