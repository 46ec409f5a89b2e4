"""Requests in flight and runner readings for the Live page's cards, built by hand at fixed times."""

from __future__ import annotations

from collections.abc import Sequence

from analysis.records import ProgressSample, ProgressSource, RequestRecord

T0 = 1_800_000_000.0
NS = 1_000_000_000
BASE_NS = 7_000 * NS


def record(
    rid: str, model: str = "llama3.2:latest", *, started: float = T0, tokens: Sequence[float] = (), **kw: object
) -> RequestRecord:
    """A running request; ``tokens``: seconds after its arrival at which each content chunk came."""
    chunk_ns = [BASE_NS + int(t * NS) for t in tokens]
    rec = RequestRecord(
        id=rid,
        started_at_unix_s=started,
        client_addr="127.0.0.1:5000",
        endpoint="/api/generate",
        model=model,
        stream=True,
        received_ns=BASE_NS,
        forwarded_ns=BASE_NS + NS // 100,
        token_chunk_ns=chunk_ns,
        first_token_ns=chunk_ns[0] if chunk_ns else None,
    )
    for k, v in kw.items():
        setattr(rec, k, v)
    return rec


def reading(rid: str, ts: float, processed: int, source: ProgressSource, prompt: int | None = 8000, **kw: int) -> ProgressSample:
    return ProgressSample(rid, ts, source, processed, prompt_tokens=prompt, **kw)


LOADED: dict[str, int | None] = {"llama3.2:latest": 8192, "llama3.2": 8192}
