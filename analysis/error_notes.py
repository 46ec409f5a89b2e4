"""What a record's ``error`` says about a failed exchange, without prompt or reply text unless asked for.

With text recording off the proxy keeps only the kind of failure: the upstream status and the server's
own error message (a JSON ``error`` field, cut short), never a raw error body; for malformed chunks the
kind of problem, never the excerpt of the chunk (a cut reply line carries reply text).
"""

from __future__ import annotations

import json
import re

ERROR_MESSAGE_CHARS = 200  # the longest server error message kept with text recording off


def http_error_note(status: int | None, body_head: bytes, *, keep_text: bool) -> str:
    """The ``error`` note of an answer with an error status; ``body_head`` is the start of its body."""
    if keep_text:
        return body_head.decode("utf-8", "replace")
    note = f"upstream HTTP {status}"
    message = _server_message(body_head)
    return f"{note}: {message}" if message else note


def stream_error_note(error: str, *, keep_text: bool) -> str:
    """The ``error`` note of an ``{"error": ...}`` line mid-stream (status 200): cut like an HTTP error's message."""
    return f"Ollama reported an error mid-stream: {error if keep_text else _cut(error)}"


def malformed_note(count: int, problems: list[str], *, keep_text: bool) -> str:
    """The ``error`` note of ``count`` malformed chunks; each problem reads ``kind: excerpt``."""
    kinds = problems if keep_text else [p.partition(": ")[0] for p in problems]
    return f"{count} malformed upstream chunk(s), passed on untouched: {'; '.join(kinds)}"


def _server_message(body: bytes) -> str | None:
    """Ollama's ``{"error": "..."}`` or OpenAI's ``{"error": {"message": "..."}}``; None for any other body."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    error = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    if not isinstance(error, str) or not error:
        return None
    return _cut(error)


def _cut(message: str) -> str:
    """A server's message as kept with text recording off: at most ERROR_MESSAGE_CHARS, "…" marking a cut."""
    return message if len(message) <= ERROR_MESSAGE_CHARS else message[: ERROR_MESSAGE_CHARS - 1] + "…"


# Ollama's 400 for a capability the model lacks (docs/ollama-api.md §5: `x:latest does not support tools`,
# `"x" does not support thinking`, `"x" does not support generate`): what it means, what to change in the client.
_CAPABILITY = re.compile(r"does not support (tools|thinking|generate|chat|embeddings|insert)\b")
# Images to a model without vision: Ollama passes on its llama-server's refusal whole ("Multimodal data provided,
# but model does not support multimodal requests."); its capability check's own wording is "does not support vision".
_NO_VISION = re.compile(r"does not support (?:multimodal requests|vision)\b")
CAPABILITY_ADVICE: dict[str, str] = {
    "tools": (
        "The client sent tools (function calling) to a model without tool support: Ollama refuses the whole request. "
        "Turn tools off for this model in the client (Open WebUI sends them by default with some features on), or "
        "pick a model whose capabilities (ollama show MODEL) list tools."
    ),
    "thinking": (
        "The client asked for thinking (think: true) from a model that cannot think. Turn thinking off for this "
        "model in the client, or pick a thinking model (ollama show MODEL lists thinking)."
    ),
    "generate": (
        "The model cannot write text (an embedding model, for one): the client asked it for a completion. Use "
        "/api/embed with it, or pick a model for generation."
    ),
    "chat": (
        "The model cannot write text (an embedding model, for one): the client asked it for a chat. Use /api/embed "
        "with it, or pick a model for chat."
    ),
    "embeddings": "The model cannot make embeddings: the client asked /api/embed of a model for text. Pick an embedding model.",
    "vision": (
        "The client sent images to a model that cannot see them (no vision): Ollama's runner refuses the whole "
        "request. Leave images out for this model in the client (Open WebUI: remove the attached image, or turn "
        "vision off in the model's settings), or pick a vision model (ollama show MODEL lists vision)."
    ),
    "insert": (
        "The client sent a suffix (fill-in-the-middle) to a model that cannot insert. Leave the suffix out, or pick a "
        "model whose capabilities list insert."
    ),
}


def capability_advice(status_code: int | None, error: str | None) -> str | None:
    """For Ollama's 400 about a capability the model lacks: what it means and what to change; None otherwise."""
    if status_code != 400 or not error:
        return None
    if _NO_VISION.search(error):
        return CAPABILITY_ADVICE["vision"]
    match = _CAPABILITY.search(error)
    return CAPABILITY_ADVICE[match.group(1)] if match else None
