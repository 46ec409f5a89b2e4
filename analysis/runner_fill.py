"""What the runner's readings add to a request whose reply carries no durations (the OpenAI-compatible routes).

Pure: no I/O, no clock. ``split_with_readings(rec, readings)`` is ``analysis.phases.split_record`` plus, for a
``/v1`` generation, the values its ``/slots`` (or Ollama's log) readings bound, each with that source:

- prompt tokens: the prompt's size as the runner read it once decoding began (processed + cached), where the
  reply's ``usage`` gave none; cached tokens: the slot's cache match, where the reply did not say.
- prefill, only for a streamed reply, only from readings taken while the prompt was read:
  * it ends at the first content chunk. llama-server samples the first token from the prompt's last batch and
    sends it at once, so prefill ends at (just before) that chunk; the last reading before decoding only says
    it had not ended yet, up to one poll earlier, so the chunk is the tighter bound.
  * it starts right after a reading that shows the request's slot holding it with nothing read yet, where one
    was taken: llama-server answers ``/slots`` only between batches (a poll during a batch waits for its end),
    so the first batch began just after that answer.
  * else it starts before the first reading that shows progress (``p1`` of the ``N`` uncached prompt tokens read at
    ``t1``). The readings do not see that start; what they measure is the rate from ``t1`` to the end,
    ``(N − p1) / (end − t1)``, and the first ``p1`` tokens are taken at that same rate (a batch of the prompt
    costs what the next one does, to within the attention's growth over it). The start is never placed
    before the request was forwarded (nothing can be read before that).
  * where no reading saw it waiting and the first one already shows the whole prompt read (``p1 = N``), or no
    reading was taken while it was read, the readings bound no start: prefill stays unknown.
  A whole-body reply has no first chunk: the readings then only bound the end between two polls, so its prefill
  stays unknown (its token counts are still filled in).

Load and queue stay unknown: the readings do not see them apart (the time before prefill is either).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from analysis.phases import (
    IMPLAUSIBLE_PREFILL_TOK_S,
    NS_PER_S,
    Flag,
    Phases,
    PhaseSource,
    no_durations_route,
    split_record,
)
from analysis.records import ProgressSample, ProgressSource, RequestKind, RequestRecord

# A reading's source → the phase source it gives.
_SOURCES: dict[ProgressSource, PhaseSource] = {ProgressSource.SLOTS: PhaseSource.SLOTS, ProgressSource.LOG: PhaseSource.LOG}


def wants_readings(rec: RequestRecord) -> bool:
    """Whether the runner's readings can add anything to this record (a finished /v1 generation)."""
    return (rec.endpoint or "").startswith("/v1/") and RequestKind(rec.kind) is RequestKind.GENERATE


def _read_rows(readings: Sequence[ProgressSample]) -> tuple[PhaseSource, list[ProgressSample]] | None:
    """The rows of the best read source (slots, else log), oldest first; estimates never count here."""
    for source in (ProgressSource.SLOTS, ProgressSource.LOG):
        rows = sorted((s for s in readings if s.source is source), key=lambda s: s.ts_unix_s)
        if rows:
            return _SOURCES[source], rows
    return None


def _prompt_size(rows: Sequence[ProgressSample], source: PhaseSource) -> int | None:
    """The prompt's size as read: slots once decoding began (processed + cached); the log's "done" line."""
    if source is PhaseSource.SLOTS:
        sizes = [s.processed_tokens + (s.cached_tokens or 0) for s in rows if s.decoded_tokens]
    else:
        sizes = [s.processed_tokens for s in rows if s.prompt_tokens is not None and s.processed_tokens == s.prompt_tokens]
    return max(sizes) if sizes else None


def split_with_readings(
    rec: RequestRecord, readings: Sequence[ProgressSample], sorted_gaps_ns: Sequence[int] | None = None
) -> Phases:
    """``split_record(rec, sorted_gaps_ns)``, with what the runner's readings of the same request bound (module doc)."""
    phases = split_record(rec, sorted_gaps_ns)
    picked = _read_rows(readings) if wants_readings(rec) else None
    if picked is None:
        return phases
    source, rows = picked
    fill: dict[str, object] = {}
    if phases.prompt_tokens is None:
        size = _prompt_size(rows, source)
        if size is not None:
            fill.update(prompt_tokens=size, prompt_tokens_source=source)
    cached = phases.cached_tokens
    if cached is None:
        known = [s.cached_tokens for s in rows if s.cached_tokens is not None]
        if known:
            cached = known[-1]
            fill["cached_tokens"] = cached
    prompt = fill.get("prompt_tokens", phases.prompt_tokens)
    assert prompt is None or isinstance(prompt, int)
    if prompt is not None and cached is not None and rec.stream and rec.first_token_ns is not None:
        fill.update(_prefill(rec, rows, prompt - cached, rec.first_token_ns, source))
    if not fill:
        return phases
    text = dict(phases.flag_text)
    if "prefill_s" in fill and Flag.NO_SERVER_TIMINGS in text:
        text[Flag.NO_SERVER_TIMINGS] = (
            f"{no_durations_route(rec.endpoint)} sends no durations: load and queue are unknown; prefill is timed from the "
            f"runner's {source} readings to the first content chunk; decode from the stream's first to last content chunk"
        )
    flags = list(phases.flags)
    rate = fill.get("prefill_tok_s")
    if isinstance(rate, float) and rate > IMPLAUSIBLE_PREFILL_TOK_S and Flag.IMPLAUSIBLE_PREFILL_RATE not in text:
        flags.append(Flag.IMPLAUSIBLE_PREFILL_RATE)
        text[Flag.IMPLAUSIBLE_PREFILL_RATE] = f"{rate:.0f} prompt tokens/s from the runner's readings"
    return replace(phases, **fill, flags=flags, flag_text=text)  # type: ignore[arg-type]


def _prefill(
    rec: RequestRecord, rows: Sequence[ProgressSample], uncached: int, end_ns: int, source: PhaseSource
) -> dict[str, object]:
    """Prefill's start, length and rate as the readings bound them (module doc); {} where they bound none."""
    end_unix_s = rec.wall_s(end_ns)
    before_end = [s for s in rows if not s.decoded_tokens and s.ts_unix_s < end_unix_s]
    reading = [s for s in before_end if s.processed_tokens > 0]
    waiting = [s for s in before_end if s.processed_tokens == 0 and (not reading or s.ts_unix_s < reading[0].ts_unix_s)]
    if uncached <= 0:
        return {}
    floor_ns = rec.forwarded_ns if rec.forwarded_ns is not None else rec.received_ns
    if source is PhaseSource.SLOTS and waiting:
        # The slot held the request with nothing read yet: its first batch began right after that answer.
        start_ns = max(floor_ns, end_ns - round((end_unix_s - waiting[-1].ts_unix_s) * NS_PER_S))
        prefill_s = (end_ns - start_ns) / NS_PER_S
    elif reading and reading[0].processed_tokens < uncached:
        first = reading[0]
        measured_s = end_unix_s - first.ts_unix_s
        prefill_s = measured_s * uncached / (uncached - first.processed_tokens)
        start_ns = end_ns - round(prefill_s * NS_PER_S)
        if start_ns < floor_ns:  # it cannot have begun before Ollama had the request
            start_ns = floor_ns
            prefill_s = (end_ns - start_ns) / NS_PER_S
    else:
        return {}  # the whole prompt was read by the first reading, and none saw it waiting: no start is bounded
    if prefill_s <= 0:
        return {}
    return {
        "prefill_s": prefill_s,
        "prefill_source": source,
        "prefill_start_ns": start_ns,
        "prefill_tok_s": uncached / prefill_s,
    }
