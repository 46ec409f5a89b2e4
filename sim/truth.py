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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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
