"""What one event of the coding agents' routes says: ``/v1/messages`` (Anthropic's Messages API, Claude Code) and
``/v1/responses`` (OpenAI's Responses API, Codex), as Ollama writes them (docs/ollama-api.md §9).

Both are SSE whose every ``data:`` object names its ``type`` (the ``event:`` line repeats it). Content:
Anthropic's ``content_block_delta`` (``text_delta``, ``thinking_delta``, ``input_json_delta`` for a tool call),
the Responses API's ``response.output_text.delta``, ``response.reasoning_summary_text.delta`` (Ollama's thinking)
and ``response.function_call_arguments.delta``. The end and the runner's counts: Anthropic's ``message_delta``
(``stop_reason``, ``usage.input_tokens``/``output_tokens``; ``message_start``'s usage is only Ollama's estimate of
the prompt, never read), the Responses API's ``response.completed`` (``response.usage``; its cached and reasoning
details are a fixed 0 in Ollama, so not read: unknown is not zero). A whole reply is a ``message`` or a
``response`` object with the same fields. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_THINKING_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})
_ANSWER_DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


@dataclass(frozen=True, slots=True)
class EventFacts:
    """One event's part in the summary; all empty for an event that carries none (``message_start``, ``ping``)."""

    thinking: bool = False  # carries a thinking token
    answer: bool = False  # carries an answer token (text or a tool call's arguments)
    text: str = ""  # answer text it carries
    final: bool = False  # the reply ends here
    reason: str | None = None  # why, in the API's words (stop_reason, or the response's status)
    prompt_tokens: int | None = None  # the runner's counts, from the API's own usage fields
    output_tokens: int | None = None
    error: str | None = None  # a failed response's message


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _usage(usage: object, reason: str | None) -> EventFacts:
    u = _dict(usage)
    return EventFacts(
        final=True,
        reason=reason,
        prompt_tokens=_raw_count(u.get("input_tokens")),
        output_tokens=_raw_count(u.get("output_tokens")),
    )


def _raw_count(value: object) -> int | None:
    """A count as sent (checked, like every count, by the caller's publishing); a bool or text is none."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _anthropic_delta(obj: dict[str, Any]) -> EventFacts:
    delta = _dict(obj.get("delta"))
    kind = delta.get("type")
    if kind == "thinking_delta":
        return EventFacts(thinking=bool(_str(delta.get("thinking"))))
    if kind == "input_json_delta":
        return EventFacts(answer=True)
    text = _str(delta.get("text"))
    return EventFacts(answer=bool(text), text=text)


def _message_body(obj: dict[str, Any]) -> EventFacts:
    """A whole ``/v1/messages`` reply: its text blocks, thinking, stop reason and usage."""
    blocks = [b for b in obj.get("content") or [] if isinstance(b, dict)]
    text = "".join(_str(b.get("text")) for b in blocks if b.get("type") == "text")
    ends = _usage(obj.get("usage"), _str(obj.get("stop_reason")) or None)
    thinking = any(b.get("type") == "thinking" for b in blocks)
    answer = bool(text) or any(b.get("type") == "tool_use" for b in blocks)
    return EventFacts(thinking, answer, text, True, ends.reason, ends.prompt_tokens, ends.output_tokens)


def _response_body(response: object) -> EventFacts:
    """A response object (a whole ``/v1/responses`` reply, or the one ``response.completed`` carries)."""
    r = _dict(response)
    items = [i for i in r.get("output") or [] if isinstance(i, dict)]
    parts = [p for i in items if i.get("type") == "message" for p in i.get("content") or [] if isinstance(p, dict)]
    text = "".join(_str(p.get("text")) for p in parts if p.get("type") == "output_text")
    ends = _usage(r.get("usage"), _str(r.get("status")) or None)
    error = _str(_dict(r.get("error")).get("message")) or None
    thinking = any(i.get("type") == "reasoning" for i in items)
    answer = bool(text) or any(i.get("type") == "function_call" for i in items)
    return EventFacts(thinking, answer, text, True, ends.reason, ends.prompt_tokens, ends.output_tokens, error)


def read_event(obj: dict[str, Any], *, whole: bool) -> EventFacts | None:
    """What ``obj`` says, when it is one of these APIs' events (``whole``: the reply's single JSON body); None
    when it is not (an Ollama or OpenAI chat chunk: no ``type``)."""
    kind = obj.get("type")
    if whole and obj.get("object") == "response":
        return _response_body(obj)
    if not isinstance(kind, str):
        return None
    if kind == "content_block_delta":
        return _anthropic_delta(obj)
    if kind == "message_delta":
        return _usage(obj.get("usage"), _str(_dict(obj.get("delta")).get("stop_reason")) or None)
    if kind == "error" and "error" not in obj:  # the Responses API's stream error (Anthropic's nests an object)
        return EventFacts(error=_str(obj.get("message")) or "error event without a message")
    if kind == "message_stop":
        return EventFacts(final=True)
    if kind == "message":
        return _message_body(obj)
    if kind in _THINKING_DELTAS:
        return EventFacts(thinking=bool(_str(obj.get("delta"))))
    if kind in _ANSWER_DELTAS:
        text = _str(obj.get("delta")) if kind == "response.output_text.delta" else ""
        return EventFacts(answer=bool(_str(obj.get("delta"))), text=text)
    if kind in _RESPONSE_ENDS:
        ends = _response_body(obj.get("response"))
        # The streamed content was counted by its deltas: the closing object only ends the reply.
        return EventFacts(
            final=True, reason=ends.reason, prompt_tokens=ends.prompt_tokens, output_tokens=ends.output_tokens, error=ends.error
        )
    return EventFacts()
