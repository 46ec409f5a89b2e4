"""A request between its two forms: ``analysis.records.RequestRecord`` and the stored ``RequestRow``."""

from __future__ import annotations

import itertools
import sys
from array import array
from collections.abc import Sequence

from analysis.phases import Phases
from analysis.records import FinalMetrics, Outcome, RequestRecord
from store.tables import RequestRow


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


def _opt_wall(rec: RequestRecord, t_ns: int | None) -> float | None:
    return None if t_ns is None else rec.wall_s(t_ns)


def request_row(rec: RequestRecord, phases: Phases, now_unix_s: float, phases_version: int) -> RequestRow:
    """One ``requests`` row: the record's fields, its metrics flattened, and its derived phases."""
    m = rec.metrics
    in_flight = Outcome(rec.outcome) is Outcome.IN_FLIGHT
    end_ns = rec.final_chunk_ns if rec.final_chunk_ns is not None else rec.closed_ns
    return RequestRow(
        id=rec.id,
        started_at_unix_s=rec.started_at_unix_s,
        client_addr=rec.client_addr,
        endpoint=rec.endpoint,
        model=rec.model,
        stream=rec.stream,
        num_ctx=rec.num_ctx,
        num_predict=rec.num_predict,
        keep_alive=rec.keep_alive,
        received_ns=rec.received_ns,
        forwarded_ns=rec.forwarded_ns,
        first_byte_ns=rec.first_byte_ns,
        first_token_ns=rec.first_token_ns,
        final_chunk_ns=rec.final_chunk_ns,
        closed_ns=rec.closed_ns,
        status_code=rec.status_code,
        outcome=Outcome(rec.outcome),
        error=rec.error,
        has_metrics=m is not None,
        total_duration_ns=m.total_duration_ns if m else None,
        load_duration_ns=m.load_duration_ns if m else None,
        prompt_eval_count=m.prompt_eval_count if m else None,
        prompt_eval_cached_count=m.prompt_eval_cached_count if m else None,
        prompt_eval_duration_ns=m.prompt_eval_duration_ns if m else None,
        eval_count=m.eval_count if m else None,
        eval_duration_ns=m.eval_duration_ns if m else None,
        done_reason=m.done_reason if m else None,
        prompt_text=rec.prompt_text,
        response_text=rec.response_text,
        updated_at_unix_s=now_unix_s,
        # A finished request always has an end (the write time at worst), so windows can find it by index.
        ended_at_unix_s=_opt_wall(rec, end_ns) if end_ns is not None else (None if in_flight else now_unix_s),
        last_token_unix_s=_opt_wall(rec, rec.token_chunk_ns[-1] if rec.token_chunk_ns else None),
        tokens_so_far=len(rec.token_chunk_ns),
        total_s=phases.total_s,
        load_s=phases.load_s,
        prefill_s=phases.prefill_s,
        decode_s=phases.decode_s,
        queue_s=phases.queue_s,
        transport_s=phases.transport_s,
        ttft_s=phases.ttft_s,
        client_s=phases.client_s,
        prompt_tokens=phases.prompt_tokens,
        cached_tokens=phases.cached_tokens,
        output_tokens=phases.output_tokens,
        prefill_tok_s=phases.prefill_tok_s,
        decode_tok_s=phases.decode_tok_s,
        ollama_prefill_tok_s=phases.ollama_prefill_tok_s,
        ollama_decode_tok_s=phases.ollama_decode_tok_s,
        itl_p50_ms=phases.itl_p50_ms,
        itl_p99_ms=phases.itl_p99_ms,
        itl_max_ms=phases.itl_max_ms,
        flags=tuple(phases.flags),
        load_start_unix_s=_opt_wall(rec, phases.load_start_ns),
        prefill_start_unix_s=_opt_wall(rec, phases.prefill_start_ns),
        decode_start_unix_s=_opt_wall(rec, phases.decode_start_ns),
        decode_end_unix_s=_opt_wall(rec, phases.decode_end_ns),
        phases_version=phases_version,
        load_start_ns=phases.load_start_ns,
        load_end_ns=phases.load_end_ns,
        prefill_start_ns=phases.prefill_start_ns,
        decode_start_ns=phases.decode_start_ns,
        decode_end_ns=phases.decode_end_ns,
        phases_done_reason=phases.done_reason,
        flag_text=dict(phases.flag_text),
    )


def phases_of(row: RequestRow) -> Phases:
    """The phases as stored with the row (as ``split_record`` of version ``row.phases_version`` gave them)."""
    return Phases(
        total_s=row.total_s,
        load_s=row.load_s,
        prefill_s=row.prefill_s,
        decode_s=row.decode_s,
        queue_s=row.queue_s,
        transport_s=row.transport_s,
        ttft_s=row.ttft_s,
        client_s=row.client_s,
        prompt_tokens=row.prompt_tokens,
        cached_tokens=row.cached_tokens,
        output_tokens=row.output_tokens,
        prefill_tok_s=row.prefill_tok_s,
        decode_tok_s=row.decode_tok_s,
        ollama_prefill_tok_s=row.ollama_prefill_tok_s,
        ollama_decode_tok_s=row.ollama_decode_tok_s,
        itl_p50_ms=row.itl_p50_ms,
        itl_p99_ms=row.itl_p99_ms,
        itl_max_ms=row.itl_max_ms,
        token_chunks=row.tokens_so_far,
        load_start_ns=row.load_start_ns,
        load_end_ns=row.load_end_ns,
        prefill_start_ns=row.prefill_start_ns,
        decode_start_ns=row.decode_start_ns,
        decode_end_ns=row.decode_end_ns,
        done_reason=row.phases_done_reason,
        flags=list(row.flags),
        flag_text=dict(row.flag_text),
    )


def record_of(row: RequestRow, gaps_le_i64: bytes | None) -> RequestRecord:
    """The request as the proxy recorded it (token times only when their blob is given)."""
    metrics = None
    if row.has_metrics:
        metrics = FinalMetrics(
            total_duration_ns=row.total_duration_ns,
            load_duration_ns=row.load_duration_ns,
            prompt_eval_count=row.prompt_eval_count,
            prompt_eval_cached_count=row.prompt_eval_cached_count,
            prompt_eval_duration_ns=row.prompt_eval_duration_ns,
            eval_count=row.eval_count,
            eval_duration_ns=row.eval_duration_ns,
            done_reason=row.done_reason,
        )
    return RequestRecord(
        id=row.id,
        started_at_unix_s=row.started_at_unix_s,
        client_addr=row.client_addr,
        endpoint=row.endpoint,
        model=row.model,
        stream=row.stream,
        num_ctx=row.num_ctx,
        num_predict=row.num_predict,
        keep_alive=row.keep_alive,
        received_ns=row.received_ns,
        forwarded_ns=row.forwarded_ns,
        first_byte_ns=row.first_byte_ns,
        first_token_ns=row.first_token_ns,
        token_chunk_ns=decode_token_times(row.received_ns, gaps_le_i64) if gaps_le_i64 else [],
        final_chunk_ns=row.final_chunk_ns,
        closed_ns=row.closed_ns,
        status_code=row.status_code,
        outcome=row.outcome,
        error=row.error,
        metrics=metrics,
        prompt_text=row.prompt_text,
        response_text=row.response_text,
    )
