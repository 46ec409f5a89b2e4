"""What really happened to each request, served on ``GET /sim/truth``.

All ``*_ns`` are ``time.monotonic_ns()`` of the simulator process, which on
Linux is the same clock every process reads, so a test or the proxy can hold
its own timestamps against these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TruthRecord:
    id: str
    endpoint: str
    model: str
    received_ns: int
    stream: bool = True
    prompt_tokens: int = 0
    cached_tokens: int = 0
    slot_acquired_ns: int | None = None
    load_start_ns: int | None = None  # None when the model was already loaded
    load_end_ns: int | None = None
    prefill_start_ns: int | None = None
    prefill_end_ns: int | None = None  # first token sampled
    token_sampled_ns: list[int] = field(default_factory=list)  # engine side, per token
    token_written_ns: list[int] = field(default_factory=list)  # after each content chunk was written to the socket
    done_ns: int | None = None  # final chunk written (or the request ended)
    cancelled: bool = False  # the client went away first
    status: int | None = None
    error: str | None = None
    reported: dict[str, Any] = field(default_factory=dict)  # metrics as sent in the final chunk
    kind: str = "generate"  # "generate" | "load" | "unload" | "embed" | "cloud" (sim.cloud: ollama.com answered)
    inputs: int | None = None  # embed: texts in the batch
    thinking_tokens: int = 0  # the first tokens sampled were thinking
    thinking_chunks: int = 0  # the first chunks written were thinking (/v1/completions writes none)

    def first_answer_sampled_ns(self) -> int | None:
        """When the first answer token (after any thinking) was sampled."""
        k = self.thinking_tokens
        return self.token_sampled_ns[k] if len(self.token_sampled_ns) > k else None

    def first_answer_written_ns(self) -> int | None:
        """When the first answer chunk had been written (streams only)."""
        k = self.thinking_chunks
        return self.token_written_ns[k] if len(self.token_written_ns) > k else None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        first_answer = self.first_answer_sampled_ns()
        first = self.token_sampled_ns[0] if self.token_sampled_ns else None
        last = self.token_sampled_ns[-1] if self.token_sampled_ns else None
        d["first_answer_sampled_ns"] = first_answer
        d["first_answer_written_ns"] = self.first_answer_written_ns()
        # Thinking spans its tokens' intervals: first token sampled -> first answer token sampled;
        # the answer the rest, so thinking_ns + answer_ns = eval_duration.
        no_thinking = self.thinking_tokens == 0
        d["thinking_ns"] = (
            0
            if no_thinking
            else (
                first_answer - first
                if first_answer is not None and first is not None
                else (last - first if last is not None and first is not None else None)
            )
        )
        d["answer_ns"] = last - first_answer if first_answer is not None and last is not None else None
        d["embed_prefill_ns"] = (
            self.prefill_end_ns - self.prefill_start_ns
            if self.kind == "embed" and self.prefill_end_ns and self.prefill_start_ns
            else None
        )
        return d


class TruthLog:
    """Bounded in-memory log of TruthRecords, oldest dropped first."""

    def __init__(self, max_records: int = 10_000) -> None:
        self._records: dict[str, TruthRecord] = {}
        self._max = max_records

    def add(self, rec: TruthRecord) -> None:
        self._records[rec.id] = rec
        while len(self._records) > self._max:
            self._records.pop(next(iter(self._records)))

    def all(self) -> list[TruthRecord]:
        return list(self._records.values())

    def clear(self) -> None:
        self._records.clear()
