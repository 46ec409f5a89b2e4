"""Hand-built requests for the diagnoses and the sentences that explain them: an RTX 3090, Llama 3.1 8B's
facts, and a finished request whose phases run back to back with a token every gap."""

from __future__ import annotations

from analysis.hardware import spec_by_key
from analysis.model_facts import ModelFacts
from analysis.records import FinalMetrics, LoadedModel, Outcome, RequestRecord

MS = 1_000_000
T0_UNIX = 1_800_000_000.0
T0_NS = 5_000_000_000
SPEC = spec_by_key("rtx-3090")
FACTS = ModelFacts("llama", 8.03e9, 8.03e9, 32, 4096, 32, 8, 128, 128, 131072, "Q4_K_M", 4.92e9, False)


def make_record(
    *,
    load_ms: int = 3,
    queue_ms: int = 2,
    prompt: int = 200,
    cached: int | None = 0,
    prefill_ms: int = 60,
    output: int = 50,
    token_gap_ms: float = 9.0,
    model: str = "llama3.1:8b",
) -> RequestRecord:
    """A finished request shaped as the proxy records it: phases back to back, a token every gap."""
    received = T0_NS
    forwarded = received + MS
    decode_ns = int((output - 1) * token_gap_ms * MS) if output > 1 else 0
    first_token = forwarded + (load_ms + queue_ms + prefill_ms) * MS
    tokens = [first_token + int(i * token_gap_ms * MS) for i in range(output)]
    final = (tokens[-1] if tokens else first_token) + MS
    total_ns = (load_ms + queue_ms + prefill_ms) * MS + decode_ns
    metrics = FinalMetrics(
        total_duration_ns=total_ns,
        load_duration_ns=load_ms * MS,
        prompt_eval_count=prompt,
        prompt_eval_cached_count=cached,
        prompt_eval_duration_ns=prefill_ms * MS,
        eval_count=output,
        eval_duration_ns=decode_ns or None,
        done_reason="stop",
    )
    return RequestRecord(
        id="r1",
        started_at_unix_s=T0_UNIX,
        client_addr="127.0.0.1",
        endpoint="/api/chat",
        model=model,
        stream=True,
        received_ns=received,
        forwarded_ns=forwarded,
        first_byte_ns=first_token,
        first_token_ns=first_token,
        token_chunk_ns=tokens,
        final_chunk_ns=final,
        closed_ns=final,
        status_code=200,
        outcome=Outcome.OK,
        metrics=metrics,
    )


def loaded(size: float = 5.6e9, vram: float | None = None) -> LoadedModel:
    return LoadedModel(
        T0_UNIX, "llama3.1:8b", "llama3.1:8b", "d" * 64, int(size), int(size if vram is None else vram), 4096, None
    )
