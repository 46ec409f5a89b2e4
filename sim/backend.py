"""The interface between the HTTP layer (``sim.server``) and an inference engine.

The HTTP layer speaks Ollama's API; an engine only turns token ids into
timed tokens. ``sim.engine.SimEngine`` is the physical model; a real backend
(llama.cpp's server as a child process, ``sim/llama_server_engine.py``) implements the same ``Backend``
protocol and can then be served by ``python -m sim --engine ...``.

A backend must:

* ``catalog()`` -- the models it can serve (``ModelFacts``), for tags/show/ps.
* ``async generate(req)`` -- an async iterator of events for one request:
  first ``Loaded`` (the model is ready; Ollama's ``load_duration`` ends here),
  then ``SlotAcquired``, then one ``Token`` per sampled token (the first one
  marks the end of prefill; an answer that ends by itself ends with an
  ``eos=True`` token, which counts in ``eval_count`` as in llama-server but
  has no text), and finally ``Done`` (with the engine's measured
  durations) -- or ``Failed`` after tokens have been sent. Errors before any
  token is sent are raised as ``EngineError(status, message)``. Closing the
  iterator early (``aclose()``, client gone) must free the slot at once.
  The backend fills ``req.truth`` (a ``TruthRecord``) with the true
  ``time.monotonic_ns()`` of each phase boundary.
* ``async load(model, options, keep_alive_ns)`` / ``async unload(model)`` --
  Ollama's empty-prompt load and ``keep_alive: 0`` unload.
* ``loaded()`` -- what ``/api/ps`` lists.
* ``gpu_state()`` -- a dict for ``/sim/gpu`` (or ``None`` if the backend has
  no virtual GPU).

Times are ``time.monotonic_ns()`` throughout: CLOCK_MONOTONIC is system-wide
on Linux, so another process can compare them with its own readings.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sim.catalog import ModelFacts
from sim.truth import TruthRecord

# Ollama's 503 body when OLLAMA_MAX_QUEUE requests already wait (docs/ollama-api.md §7); every backend refuses with it.
QUEUE_FULL_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"


class EngineError(Exception):
    """A failure before the stream starts; the HTTP layer answers ``status`` with ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class GenRequest:
    model: ModelFacts
    prompt_ids: list[int]
    truth: TruthRecord
    num_predict: int = -1  # <= 0: the answer ends by itself ("stop")
    num_ctx: int | None = None  # None: the server's default
    num_batch: int | None = None
    keep_alive_ns: int | None = None  # None: keep the runner's; < 0: forever
    seed: str = "0"  # seeds the generated text
    faults: dict[str, Any] = field(default_factory=dict)  # one-shot fault switches taken for this request
    # The request's own text and options, for engines that tokenize and sample themselves (sim/llama_server_engine.py);
    # ``prompt_ids`` above are the simulator's stand-in tokens.
    prompt_text: str | None = None  # /api/generate and /v1/completions: the prompt as sent (untemplated)
    system: str | None = None  # /api/generate's ``system``
    messages: list[dict[str, Any]] | None = None  # /api/chat and /v1/chat/completions: the messages as sent
    raw: bool = False  # /api/generate's ``raw``
    options: dict[str, Any] = field(default_factory=dict)  # Ollama's ``options`` (temperature, top_k, stop, ...)
    # Simulated engine only (others may ignore them): think first ("low" | "medium" | "high" | "max"), and a fixed
    # answer (its tokens, e.g. JSON for ``format`` or a tool call) instead of free pseudo-words.
    think: str | None = None
    answer_pieces: list[str] | None = None
    shift: bool = True  # the request's "shift": false asks for a 400 rather than a cut prompt (sim/context_fit.py)


@dataclass
class EmbedRequest:
    """One /api/embed batch: every input is prefilled (together, as one batch of sequences), nothing decoded."""

    model: ModelFacts
    inputs: list[list[int]]  # token ids per input, already truncated to the context
    truth: TruthRecord
    num_ctx: int | None = None
    keep_alive_ns: int | None = None
    texts: list[str] | None = None  # the inputs as sent: a real runner tokenizes them itself


@dataclass(frozen=True)
class EmbedDone:
    loaded_ns: int  # time.monotonic_ns() when the model was ready (load_duration ends here)
    prompt_eval_count: int  # tokens of all inputs
    prefill_ns: int  # first prefill step start -> last step end


@dataclass(frozen=True)
class Loaded:
    at_ns: int


@dataclass(frozen=True)
class SlotAcquired:
    at_ns: int
    cached_tokens: int


@dataclass(frozen=True)
class Token:
    text: str
    token_id: int
    at_ns: int  # when the engine sampled it
    eos: bool = False  # the end-of-generation token: counted in eval_count, never written as a chunk
    thinking: bool = False  # part of the thinking that precedes the answer


@dataclass(frozen=True)
class Done:
    done_reason: str  # "stop" | "length"
    prompt_eval_count: int  # whole prompt, cached tokens included
    prompt_eval_cached_count: int
    prompt_eval_ns: int  # uncached tokens only: prefill start -> first token
    eval_count: int  # first token included
    eval_ns: int  # first token -> last token
    context_ids: list[int]


@dataclass(frozen=True)
class Failed:
    message: str


Event = Loaded | SlotAcquired | Token | Done | Failed


@dataclass(frozen=True)
class LoadedInfo:
    model: ModelFacts
    size_bytes: int
    size_vram_bytes: int
    context_length: int
    expires_at_unix_s: float | None  # None: forever


@runtime_checkable
class Embedder(Protocol):
    """A backend that can also embed (``sim.engine.SimEngine``); routes check for it with ``isinstance``."""

    async def embed(self, req: EmbedRequest) -> EmbedDone: ...


class Backend(Protocol):
    def catalog(self) -> list[ModelFacts]: ...

    def generate(self, req: GenRequest) -> AsyncGenerator[Event, None]: ...

    async def load(self, model: ModelFacts, num_ctx: int | None, keep_alive_ns: int | None) -> None: ...

    async def unload(self, model: ModelFacts) -> None: ...

    def loaded(self) -> list[LoadedInfo]: ...

    def queued(self) -> dict[str, int]:
        """Per loaded model, the requests waiting for one of its slots (``/metrics``' ``ollama_requests_queued``)."""
        ...

    def gpu_state(self) -> dict[str, Any] | None: ...

    async def close(self) -> None: ...
