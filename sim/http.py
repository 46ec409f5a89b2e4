"""What sim's two HTTP faces share: Ollama's ``/api`` (``sim.server``) and OpenAI's ``/v1`` (``sim.openai_api``).

The application keys and configuration, request parsing with Go's error texts, model lookup, and the
stand-in chat template (prompt token ids). Shapes and texts follow Ollama as ``docs/ollama-api.md``
describes it; how a generation is written to the client lives in ``sim.streaming``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sim import tokens
from sim.backend import Backend
from sim.catalog import ModelFacts, find_model
from sim.faults import Faults
from sim.truth import TruthLog

NDJSON = "application/x-ndjson"
RUNNER_STOPPED = (
    "model runner has unexpectedly stopped, this may be due to resource limitations or an internal error, "
    "check ollama server logs for details"
)
BOS, HEADER, EOT = tokens.special_id(0), tokens.special_id(1), tokens.special_id(2)


def version_tuple(v: str) -> tuple[int, ...]:
    """``"0.33.3-rc1"`` -> ``(0, 33, 3)``; non-digits are dropped, an empty part counts as 0."""
    out: list[int] = []
    for part in v.split("-")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


@dataclass(frozen=True)
class ServerConfig:
    ollama_version: str = "0.33.3"
    seed: int = 0
    metrics: bool = False  # serve /metrics, as Ollama would with OLLAMA_METRICS set (docs/ollama-api.md §13)
    cloud_models: tuple[str, ...] = ()  # cloud models served as Ollama passes on ollama.com's answers (sim.cloud)

    @property
    def counts_only_new_prompt_tokens(self) -> bool:
        """Ollama 0.30.0 reported only the uncached tokens in ``prompt_eval_count`` (#16414; fixed in 0.30.1)."""
        return (0, 30, 0) <= version_tuple(self.ollama_version) < (0, 30, 1)

    @property
    def reports_cached_count(self) -> bool:
        """``prompt_eval_cached_count`` exists from Ollama 0.33.3 on."""
        return version_tuple(self.ollama_version) >= (0, 33, 3)


BACKEND_KEY = web.AppKey("backend", Backend)
CONFIG_KEY = web.AppKey("config", ServerConfig)
TRUTH_KEY = web.AppKey("truth", TruthLog)
FAULTS_KEY = web.AppKey("faults", Faults)


class ApiError(Exception):
    """An answer before any byte of the body was sent: ``status`` with the route's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str, request_id: str | None = None) -> web.Response:
    """Ollama's error body ``{"error": message}``."""
    headers = {"X-Sim-Request-Id": request_id} if request_id else None
    return web.json_response({"error": message}, status=status, headers=headers)


def dumps(obj: object) -> bytes:
    """Compact JSON as Go's encoder writes it (no spaces, UTF-8 unescaped)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def go_json_error(text: str, err: json.JSONDecodeError) -> str:
    """Go encoding/json's wording for the common cases."""
    if err.pos >= len(text.rstrip()):
        return "unexpected EOF"
    return f"invalid character {text[err.pos]!r} looking for beginning of value"


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or ApiError(400) worded as Ollama words it."""
    raw = await request.read()
    if not raw.strip():
        raise ApiError(400, "missing request body")
    text = raw.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, go_json_error(text, e)) from None
    if not isinstance(body, dict):
        raise ApiError(400, f"json: cannot unmarshal {type(body).__name__} into Go value of type api.Request")
    return body


def lookup_model(backend: Backend, name: str) -> ModelFacts | None:
    """Resolve a model string against the backend's catalog as Ollama does: exact name, else with ``:latest``."""
    by_name = {m.name: m for m in backend.catalog()}
    return by_name.get(name) or (by_name.get(name + ":latest") if ":" not in name else None)


def model_or_404(name: object, backend: Backend | None = None) -> ModelFacts:
    """The model ``name`` refers to, or ApiError(404) with Ollama's text."""
    if backend is not None:
        model = lookup_model(backend, name) if isinstance(name, str) else None
    else:
        model = find_model(name) if isinstance(name, str) else None
    if model is None:
        raise ApiError(404, f"model '{name if isinstance(name, str) else ''}' not found")
    return model


# --- the stand-in template ---------------------------------------------------------


def turn(role: str, content: str) -> list[int]:
    """One templated message: header, role, content, end-of-turn (a Llama 3 style template)."""
    return [HEADER, tokens.token_id(role), *tokens.encode(content), EOT]


# The assistant header that ends every templated prompt. A reply sent back in a later chat turn then
# extends the slot's cache (prompt + generated tokens) exactly, as it does with a real template.
ASSISTANT_HEADER = [HEADER, tokens.token_id("assistant")]


def prompt_ids_generate(body: dict[str, Any]) -> list[int]:
    """Token ids of a /api/generate body (``prompt``, ``system``, ``raw``) after templating."""
    prompt = str(body.get("prompt") or "")
    system = body.get("system")
    if body.get("raw"):
        return tokens.encode(prompt)
    ids = [BOS]
    if system:
        ids += turn("system", str(system))
    return ids + turn("user", prompt) + ASSISTANT_HEADER


def prompt_ids_chat(messages: list[Any]) -> list[int]:
    """Token ids of chat messages after templating; a message that is not an object is a 400."""
    ids = [BOS]
    for m in messages:
        if not isinstance(m, dict):
            raise ApiError(400, "json: cannot unmarshal message")
        ids += turn(str(m.get("role") or "user"), str(m.get("content") or ""))
    return ids + ASSISTANT_HEADER


def seed_for(cfg: ServerConfig, opts: dict[str, Any], prompt_ids: list[int]) -> str:
    """Seed of the generated text: the server's ``--seed``, the request's ``seed`` option and the prompt."""
    req_seed = int(opts.get("seed", -1))
    # Ints hash the same in every process, so the text is reproducible for a given --seed and prompt.
    return f"{cfg.seed}:{req_seed if req_seed >= 0 else 'auto'}:{hash(tuple(prompt_ids[-64:]))}"
