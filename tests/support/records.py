"""Request records as the proxy writes them, for tests of the store and the pages."""

from __future__ import annotations

from analysis.records import FinalMetrics, Outcome, RequestRecord

MS = 1_000_000


def make_record(
    id: str = "req-1",
    started_at_unix_s: float = 1_700_000_000.0,
    *,
    final: bool = True,
    n_tokens: int = 20,
    model: str = "llama3.2",
    received_ns: int = 5_000_000_000,
) -> RequestRecord:
    """A streamed chat as the proxy records it: 200 ms to first token, then 25 ms per token."""
    first = received_ns + 200 * MS
    chunks = [first + i * 25 * MS for i in range(n_tokens)]
    rec = RequestRecord(
        id=id,
        started_at_unix_s=started_at_unix_s,
        client_addr="127.0.0.1:50000",
        endpoint="/api/chat",
        model=model,
        stream=True,
        num_ctx=4096,
        keep_alive="5m",
        received_ns=received_ns,
        forwarded_ns=received_ns + MS,
        first_byte_ns=first if chunks else None,
        first_token_ns=first if chunks else None,
        token_chunk_ns=chunks,
    )
    if final:
        end = (chunks[-1] if chunks else first) + MS
        rec.final_chunk_ns = end
        rec.closed_ns = end + MS
        rec.status_code = 200
        rec.outcome = Outcome.OK
        rec.metrics = FinalMetrics(
            total_duration_ns=end - received_ns - 2 * MS,
            load_duration_ns=3 * MS,
            prompt_eval_count=120,
            prompt_eval_cached_count=20,
            prompt_eval_duration_ns=150 * MS,
            eval_count=n_tokens,
            eval_duration_ns=max(n_tokens - 1, 0) * 25 * MS,
            done_reason="stop",
        )
    return rec


# A spreadsheet runs a text cell that starts with one of these as a formula (OWASP's CSV injection rule).
FORMULA_MODELS = ['=HYPERLINK("http://x","c")', "+1+cmd", "-2+3", "@SUM(A1)", "\tx", "\rx"]
