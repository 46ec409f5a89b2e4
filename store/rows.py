"""A request between its two forms: ``analysis.records.RequestRecord`` and the stored ``RequestRow``."""

from __future__ import annotations

import itertools
import re
import sys
from array import array
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from analysis.phases import Flag, Phases
from analysis.records import FinalMetrics, Outcome, RequestRecord
from analysis.wait_split import Busy
from store.tables import RequestRow, RequestSummary


def encode_token_times(received_ns: int, token_chunk_ns: Sequence[int]) -> bytes:
    """Chunk times as little-endian int64 gaps: first from ``received_ns``, then chunk to chunk."""
    gaps = array("q", [t - prev for prev, t in itertools.pairwise(itertools.chain((received_ns,), token_chunk_ns))])
    if sys.byteorder != "little":
        gaps.byteswap()
    return gaps.tobytes()


def decode_token_times(received_ns: int, blob: bytes) -> list[int]:
    """Inverse of ``encode_token_times``."""
    gaps = array("q")
    gaps.frombytes(blob)
    if sys.byteorder != "little":
        gaps.byteswap()
    return list(itertools.accumulate(gaps, initial=received_ns))[1:]


_ROW_FIELDS = {f.name for f in fields(RequestRow)}
# The record's fields and its final metrics' fields stored as they are, under their own names.
RECORD_COLUMNS = tuple(f.name for f in fields(RequestRecord) if f.name in _ROW_FIELDS - {"outcome"})
METRIC_COLUMNS = tuple(f.name for f in fields(FinalMetrics) if f.name in _ROW_FIELDS)
# Fields of the phase split stored under their own names (durations, counts, rates, boundaries on the
# record's clock); the split's flags, done_reason and token count are stored as the row spells them.
PHASE_COLUMNS = tuple(f.name for f in fields(Phases) if f.name in _ROW_FIELDS - {"flags", "flag_text", "done_reason"})


def _named(obj: object, names: Sequence[str]) -> dict[str, Any]:
    """``obj``'s attributes of those names (all None when ``obj`` is None)."""
    return {name: None if obj is None else getattr(obj, name) for name in names}


def _opt_wall(rec: RequestRecord, t_ns: int | None) -> float | None:
    return None if t_ns is None else rec.wall_s(t_ns)


# SQLite's INTEGER range: a larger Python int makes it refuse the whole row.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INT_COLUMNS = tuple(f.name for f in fields(RequestRow) if f.type in ("int", "int | None"))


def clamp_int64(value: int) -> int:
    return min(max(value, INT64_MIN), INT64_MAX)


def _clamped(row: RequestRow) -> RequestRow:
    """The row with every integer beyond 64 bits clamped into range and flagged ``clamped`` (naming the fields)."""
    changed: dict[str, Any] = {
        name: clamp_int64(v)
        for name in _INT_COLUMNS
        if isinstance(v := getattr(row, name), int) and not INT64_MIN <= v <= INT64_MAX
    }
    if not changed:
        return row
    flag = str(Flag.CLAMPED)
    text = dict(row.flag_text)
    text[flag] = f"beyond 64 bits, stored clamped: {', '.join(sorted(changed))}"
    flags = row.flags if flag in row.flags else (*row.flags, flag)
    return replace(row, **changed, flags=flags, flag_text=text)


_TEXT_COLUMNS = tuple(f.name for f in fields(RequestRow) if f.type in ("str", "str | None"))
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(value: str) -> str:
    """``value`` as valid Unicode: surrogate pairs joined, each lone UTF-16 surrogate replaced by U+FFFD.

    JSON's ``\\ud83d`` escape (a JavaScript client cutting a string mid-emoji) decodes to a lone surrogate,
    which UTF-8, and so SQLite, cannot hold: the whole row would be refused.
    """
    if value.isascii() or _SURROGATE.search(value) is None:  # isascii is O(1): most text stops there
        return value
    return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _valid(row: RequestRow) -> RequestRow:
    """The row with every text made valid Unicode (``valid_text``) and flagged ``invalid_text`` (naming the fields)."""
    changed: dict[str, Any] = {}
    for name in _TEXT_COLUMNS:
        value = getattr(row, name)
        if isinstance(value, str) and (valid := valid_text(value)) is not value:
            changed[name] = valid
    text = {code: valid_text(sentence) for code, sentence in row.flag_text.items()}
    fixed = [*changed, *(["flag_text"] if text != row.flag_text else [])]
    if not fixed:
        return row
    flag = str(Flag.INVALID_TEXT)
    text[flag] = f"lone UTF-16 surrogates stored as U+FFFD in: {', '.join(fixed)}"
    flags = row.flags if flag in row.flags else (*row.flags, flag)
    return replace(row, **changed, flags=flags, flag_text=text)


def request_row(rec: RequestRecord, phases: Phases, now_unix_s: float, phases_version: int) -> RequestRow:
    """One ``requests`` row: the record's fields, its metrics flattened, and its derived phases.

    Integers beyond SQLite's 64 bits (a client's ``num_ctx``, an upstream ``eval_count``) are clamped
    and the row flagged ``clamped``; text that is not valid Unicode (a lone surrogate in a model name, a
    prompt, a reply) is repaired and the row flagged ``invalid_text``: the request is kept, never refused.
    """
    return _valid(_clamped(_request_row(rec, phases, now_unix_s, phases_version)))


def _request_row(rec: RequestRecord, phases: Phases, now_unix_s: float, phases_version: int) -> RequestRow:
    m = rec.metrics
    in_flight = Outcome(rec.outcome) is Outcome.IN_FLIGHT
    end_ns = rec.final_chunk_ns if rec.final_chunk_ns is not None else rec.closed_ns
    return RequestRow(
        **_named(rec, RECORD_COLUMNS),
        **_named(m, METRIC_COLUMNS),
        outcome=Outcome(rec.outcome),
        has_metrics=m is not None,
        updated_at_unix_s=now_unix_s,
        # A finished request always has an end (the write time at worst), so windows can find it by index.
        ended_at_unix_s=_opt_wall(rec, end_ns) if end_ns is not None else (None if in_flight else now_unix_s),
        last_token_unix_s=_opt_wall(rec, rec.token_chunk_ns[-1] if rec.token_chunk_ns else None),
        tokens_so_far=len(rec.token_chunk_ns),
        **_named(phases, PHASE_COLUMNS),
        flags=tuple(phases.flags),
        load_start_unix_s=_opt_wall(rec, phases.load_start_ns),
        prefill_start_unix_s=_opt_wall(rec, phases.prefill_start_ns),
        decode_start_unix_s=_opt_wall(rec, phases.decode_start_ns),
        decode_end_unix_s=_opt_wall(rec, phases.decode_end_ns),
        phases_version=phases_version,
        phases_done_reason=phases.done_reason,
        flag_text={str(code): text for code, text in phases.flag_text.items()},
    )


# A row of an older phases version may carry a code this version no longer has: it is dropped on reading
# (the collector re-derives such rows at start).
_FLAG_CODES = frozenset(Flag)


def phases_of(row: RequestRow) -> Phases:
    """The phases as stored with the row (as ``split_record`` of version ``row.phases_version`` gave them)."""
    return Phases(
        **_named(row, PHASE_COLUMNS),
        token_chunks=row.tokens_so_far,
        done_reason=row.phases_done_reason,
        flags=[Flag(code) for code in row.flags if code in _FLAG_CODES],
        flag_text={Flag(code): text for code, text in row.flag_text.items() if code in _FLAG_CODES},
    )


def record_of(row: RequestRow, gaps_le_i64: bytes | None) -> RequestRecord:
    """The request as the proxy recorded it (token times only when their blob is given)."""
    metrics = FinalMetrics(**_named(row, METRIC_COLUMNS)) if row.has_metrics else None
    return RequestRecord(
        **_named(row, RECORD_COLUMNS),
        outcome=row.outcome,
        token_chunk_ns=decode_token_times(row.received_ns, gaps_le_i64) if gaps_le_i64 else [],
        metrics=metrics,
    )


def busy_of_row(row: RequestSummary, *, names: bool = True) -> Busy | None:
    """A stored row's intervals for ``analysis.wait_split``; None without a prefill (a load, a failure before its
    prompt). ``names``: keep its model and client (False: /metrics, which says no sentence and must not hold a
    client's 50 KB model name once per row)."""
    p0, p1, end = row.prefill_start_unix_s, row.decode_start_unix_s, row.decode_end_unix_s
    if p0 is None or p1 is None or end is None or p1 < p0 or end < p0:
        return None
    wait_start = p0 - row.queue_s if row.queue_s is not None and row.queue_s > 0 else p0  # load end (Ollama's queue)
    model, client = (row.model, row.client_addr) if names else ("", None)
    tokens = row.computed_prompt_tokens
    return Busy(row.id, model, client, tokens, wait_start, (p0, p1), (p0, end), (), row.started_at_unix_s)
