"""What the coding agents' routes share: ``/v1/messages`` (``sim.anthropic_api``) and ``/v1/responses``
(``sim.responses_api``) are both Ollama's ``/api/chat`` behind a translation (docs/ollama-api.md §9).

Each route turns its body into plain chat messages (``{"role", "content": str}``); from there the generation
is the same: the model looked up, thinking decided as ``/api/chat`` decides it, and one ``GenRequest``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from sim import answers
from sim.backend import GenRequest
from sim.catalog import ModelFacts
from sim.http import BACKEND_KEY, CONFIG_KEY, FAULTS_KEY, TRUTH_KEY, ApiError, lookup_model, prompt_ids_chat, seed_for
from sim.truth import TruthRecord


def block_text(content: object) -> str:
    """The text of a message's content: a string, or a list of blocks/parts whose ``text`` fields are joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


def new_truth(request: web.Request, endpoint: str) -> tuple[str, int, TruthRecord]:
    """(sim's request id, when it was received, its truth record, already served on /sim/truth)."""
    t0 = time.monotonic_ns()
    rid = uuid.uuid4().hex
    truth = TruthRecord(id=rid, endpoint=endpoint, model="", received_ns=t0)
    request.app[TRUTH_KEY].add(truth)
    return rid, t0, truth


def find_model(request: web.Request, model_str: object) -> ModelFacts:
    """The model a body names, or Ollama's 400/404 (its chat handler's words)."""
    if not isinstance(model_str, str) or not model_str:
        raise ApiError(400, "model is required")
    model = lookup_model(request.app[BACKEND_KEY], model_str)
    if model is None:
        raise ApiError(404, f"model '{model_str}' not found")
    if "completion" not in model.capabilities:
        raise ApiError(400, f'"{model_str}" does not support chat')
    return model


def chat_request(
    request: web.Request,
    truth: TruthRecord,
    model: ModelFacts,
    messages: list[dict[str, Any]],
    *,
    max_tokens: int | None,
    think: bool | str | None,
    temperature: object,
) -> GenRequest:
    """One chat generation, as Ollama's chat handler runs it after the route's translation.

    ``think``: True/False/a level as the route asked, None when it did not (a thinking model then thinks, as
    ``/api/chat`` with no ``think``). Both routes relax thinking: asking a model that cannot think is no error.
    """
    prompt_ids = prompt_ids_chat(messages)
    truth.model = model.name
    truth.prompt_tokens = len(prompt_ids)
    level: str | None = None
    if "thinking" in model.capabilities and think is not False:
        level = think if isinstance(think, str) and model.think_levels and think in ("low", "medium", "high") else "medium"
    seed = seed_for(request.app[CONFIG_KEY], {}, prompt_ids)
    return GenRequest(
        model=model,
        prompt_ids=prompt_ids,
        truth=truth,
        num_predict=max_tokens if max_tokens is not None else -1,
        seed=seed,
        faults=request.app[FAULTS_KEY].take_generation(),
        messages=messages,
        raw=True,
        options={"temperature": temperature} if isinstance(temperature, int | float) else {},
        think=level,
        answer_pieces=answers.format_answer(None, seed),
    )
