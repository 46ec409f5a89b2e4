"""llama-server's ``GET /slots``, read as counts only.

The answer can carry the prompt and the generated text (``prompt``, ``generated``); ``parse_slots``
keeps none of it, only the counters below. A body that is not the list of slots llama-server sends
raises ``SlotsFormatError``, so the reader can fall back instead of storing a guess.

One quirk, measured on llama-server: while a prompt is read, ``n_prompt_tokens`` is the end of the batch
being evaluated (it runs one batch ahead of ``n_prompt_tokens_processed``), not the prompt's size; the
size is known only once the first token is decoded (``prompt_size_tokens``).

llama-server lists exactly its ``-np`` slots, numbered from 0. An answer with more slots than the runner was
started with (or than ``MAX_SLOTS``), or with a slot id twice or out of that range, is not a runner's answer
(something else answers on its port): refused whole, so a forged list costs no more than its parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_SLOTS = 256  # slots per runner believed at most, whatever its -np says (OLLAMA_NUM_PARALLEL is a few in practice)


def slots_cap(n_parallel: int | None) -> int:
    """How many slots a runner started with ``-np n_parallel`` may list (``MAX_SLOTS`` when it is not given)."""
    return min(n_parallel, MAX_SLOTS) if n_parallel is not None and n_parallel > 0 else MAX_SLOTS


class SlotsFormatError(ValueError):
    """The body is not a /slots answer (HTML error page, truncated JSON, another server...)."""


@dataclass(frozen=True)
class SlotReading:
    """One slot of a runner at one moment (counts only)."""

    slot_id: int
    n_ctx: int | None
    is_processing: bool
    task_id: int | None  # the task in (or last in) the slot; grows with each request the runner takes
    ctx_tokens: int | None  # tokens in the slot's context now: the prompt read or queued so far, then the output
    processed_tokens: int | None  # prompt tokens evaluated for this task (cached ones not included)
    cached_tokens: int | None  # prompt tokens reused from the slot's cache
    decoded_tokens: int | None  # output tokens so far

    @property
    def decoding(self) -> bool:
        """The prompt is read and output has begun."""
        return bool(self.decoded_tokens)

    @property
    def prompt_size_tokens(self) -> int | None:
        """The whole prompt (cached + evaluated), known once decoding has begun; None before (see module doc)."""
        if not self.decoding or self.processed_tokens is None:
            return None
        return self.processed_tokens + (self.cached_tokens or 0)


def _int(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def parse_slots(body: Any, max_slots: int = MAX_SLOTS) -> list[SlotReading]:
    """The slots of a decoded /slots JSON body, at most ``max_slots`` (``slots_cap``). Raises SlotsFormatError
    for anything else."""
    if not isinstance(body, list):
        raise SlotsFormatError(f"/slots answered {type(body).__name__}, not a list of slots")
    if len(body) > max_slots:
        raise SlotsFormatError(f"/slots listed {len(body)} slots, more than the runner's {max_slots}")
    out: list[SlotReading] = []
    seen: set[int] = set()
    for item in body:
        if not isinstance(item, dict) or _int(item, "id") is None or not isinstance(item.get("is_processing"), bool):
            raise SlotsFormatError("a /slots entry lacks its id or is_processing")
        if item["id"] >= max_slots or item["id"] in seen:
            raise SlotsFormatError(f"/slots listed slot id {item['id']} twice or beyond the runner's {max_slots} slots")
        seen.add(item["id"])
        decoded = None
        next_token = item.get("next_token")
        if isinstance(next_token, list) and next_token and isinstance(next_token[0], dict):
            next_token = next_token[0]  # newer servers: a list, one entry per sequence
        if isinstance(next_token, dict):
            decoded = _int(next_token, "n_decoded")
        out.append(
            SlotReading(
                slot_id=int(item["id"]),
                n_ctx=_int(item, "n_ctx"),
                is_processing=bool(item["is_processing"]),
                task_id=_int(item, "id_task"),
                ctx_tokens=_int(item, "n_prompt_tokens"),
                processed_tokens=_int(item, "n_prompt_tokens_processed"),
                cached_tokens=_int(item, "n_prompt_tokens_cache"),
                decoded_tokens=decoded,
            )
        )
    return out
