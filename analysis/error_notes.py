"""What a record's ``error`` says about a failed exchange, without prompt or reply text unless asked for.

With text recording off the proxy keeps only the kind of failure: the upstream status and the server's
own error message (a JSON ``error`` field, cut short), never a raw error body; for malformed chunks the
kind of problem, never the excerpt of the chunk (a cut reply line carries reply text).
"""

from __future__ import annotations

import json

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
