"""What a recorded request's body says: the ``RequestRecord`` fields that follow from it.

Pure functions of the body's bytes (no I/O), so a body too large to decode on the proxy's event loop
can be described in the big-body worker process instead (``collectors.proxy.big_bodies``). What comes
back is small whatever the body held: images, token-id ``context`` arrays and embed inputs are never
kept, only counted; prompt text only with ``record_text``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from analysis.records import EMBED_ENDPOINTS, RequestKind


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _keep_alive_text(value: object) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value)[:100]


def _parts_text(content: object) -> str | None:
    """A message's text: a string, or its parts' (OpenAI) or blocks' (Anthropic) ``text`` joined; None: neither."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else None


def _message_contents(messages: object) -> list[str]:
    """The text content of each chat message (content parts or blocks joined)."""
    out = []
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and (content := _parts_text(message.get("content"))) is not None:
            out.append(content)
    return out


def _responses_input(obj: dict[str, Any]) -> list[str] | None:
    """/v1/responses: its ``instructions`` and the text of its ``input`` (a string, or message items)."""
    value = obj.get("input")
    texts = [obj["instructions"]] if isinstance(obj.get("instructions"), str) else []
    if isinstance(value, str):
        return [*texts, value]
    if not isinstance(value, list):
        return None
    return texts + _message_contents(value)


def prompt_chars(obj: dict[str, Any], endpoint: str = "") -> int | None:
    """Characters of the prompt a generation body carries (messages' content with Anthropic's ``system``, the
    Responses API's input and instructions, or prompt plus system); None when it names none. Only the count:
    the Live page estimates prefill from it, with or without --record-text."""
    if endpoint == "/v1/responses":
        texts = _responses_input(obj)
        return sum(len(t) for t in texts) if texts is not None else None
    if "messages" in obj:
        if not isinstance(obj["messages"], list):
            return None
        return sum(len(c) for c in _message_contents(obj["messages"])) + len(_parts_text(obj.get("system")) or "")
    prompt = obj.get("prompt")
    if isinstance(prompt, list):  # /v1/completions accepts a list of prompts
        prompt = "".join(p for p in prompt if isinstance(p, str))
    if not isinstance(prompt, str):
        return None
    system = obj.get("system")
    return len(prompt) + (len(system) if isinstance(system, str) else 0)


def _message_text(messages: object) -> str:
    """Chat messages as plain "role: content" lines (OpenAI content parts included)."""
    lines = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        if isinstance(content, str):
            lines.append(f"{message.get('role', '')}: {content}")
    return "\n".join(lines)


_MODEL_FIELD = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.){0,4096}")')


def _label(value: str, max_chars: int) -> str:
    """A name kept in a record, cut to ``max_chars`` (marked with "…" when cut)."""
    return value if len(value) <= max_chars else value[: max_chars - 1] + "…"


def _model_from_start(body: bytes) -> str:
    """The model named near the start of a body too large to keep whole (clients put it first)."""
    match = _MODEL_FIELD.search(body, 0, 1 << 16)
    if match is None:
        return ""
    try:
        model = json.loads(match.group(1))
    except ValueError:
        return ""
    return model if isinstance(model, str) else ""


def _unloads(keep_alive: object) -> bool:
    """``keep_alive`` says 0: Ollama unloads the model (0, 0.0, "0", "0s", "0m", ...)."""
    if isinstance(keep_alive, bool):
        return False
    if isinstance(keep_alive, int | float):
        return keep_alive == 0
    return isinstance(keep_alive, str) and re.fullmatch(r"\s*0+(\.0*)?\s*(ns|us|µs|ms|s|m|h)?\s*", keep_alive) is not None


def _request_kind(endpoint: str, obj: dict[str, Any]) -> RequestKind:
    """What the body asks for: an empty native prompt only loads (or, with keep_alive 0, unloads) the model."""
    if endpoint in EMBED_ENDPOINTS:
        return RequestKind.EMBED
    if endpoint == "/api/chat":
        empty = not obj.get("messages")
    elif endpoint == "/api/generate":
        empty = not obj.get("prompt")
    else:
        return RequestKind.GENERATE
    model = obj.get("model")
    if not empty or not isinstance(model, str) or not model:  # no model: Ollama refuses it, nothing loads
        return RequestKind.GENERATE
    return RequestKind.UNLOAD if _unloads(obj.get("keep_alive")) else RequestKind.LOAD


def _batch_size(endpoint: str, obj: dict[str, Any]) -> int | None:
    """How many inputs an embed request carries (a list of token ids is one input)."""
    value = obj.get("prompt") if endpoint == "/api/embeddings" else obj.get("input")
    if isinstance(value, str):
        return 1
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return 1
        return len(value)
    return None


def _streams_by_default(endpoint: str) -> bool:
    return endpoint.startswith("/api/") and endpoint not in EMBED_ENDPOINTS


def head_facts(endpoint: str, body: bytes, *, max_label_chars: int = 256) -> dict[str, Any]:
    """What a body too large to decode here says at a glance: the model named near its start (clients put it
    first). Cheap (a bounded regex search), for a body over the kept-body bound, or one still being decoded."""
    return {"model": _label(_model_from_start(body), max_label_chars), "stream": _streams_by_default(endpoint)}


def _v1_token_limit(endpoint: str, obj: dict[str, Any]) -> int | None:
    """The output limit a /v1 body sets: the Responses API's ``max_output_tokens``, else OpenAI's and Anthropic's."""
    limit = obj.get("max_output_tokens") if endpoint == "/v1/responses" else None
    return _int_or_none(limit) or _int_or_none(obj.get("max_completion_tokens")) or _int_or_none(obj.get("max_tokens"))


def describe_request(
    endpoint: str, body: bytes, *, record_text: bool, truncated: bool = False, max_label_chars: int = 256
) -> dict[str, Any]:
    """RequestRecord fields that follow from a generation request body.

    Bad JSON is Ollama's to answer (it says 400); we record what we can. A ``truncated``
    body (over the kept-body bound) gives only the model named at its start.
    """
    if truncated:
        return head_facts(endpoint, body, max_label_chars=max_label_chars)
    try:
        obj = json.loads(body) if body else {}
    except (ValueError, RecursionError):
        obj = None
    if not isinstance(obj, dict):
        return {"model": "", "stream": _streams_by_default(endpoint)}
    native = endpoint.startswith("/api/")
    stream_value = obj.get("stream")
    kind = _request_kind(endpoint, obj)
    # Ollama's native API streams unless told not to; the OpenAI one only when asked; embeddings never.
    stream = stream_value is not False if native else stream_value is True
    if kind is RequestKind.EMBED:
        stream = False
    options = obj.get("options") if isinstance(obj.get("options"), dict) else {}
    assert isinstance(options, dict)
    num_predict = _int_or_none(options.get("num_predict")) if native else _v1_token_limit(endpoint, obj)
    model_value = obj.get("model")
    fields: dict[str, Any] = {
        "model": _label(model_value, max_label_chars) if isinstance(model_value, str) else "",
        "stream": stream,
        "num_ctx": _int_or_none(options.get("num_ctx")),
        "num_predict": num_predict,
        "keep_alive": _keep_alive_text(obj.get("keep_alive")),
        "kind": kind,
    }
    if kind is RequestKind.EMBED:
        fields["batch_size"] = _batch_size(endpoint, obj)
    if (chars := prompt_chars(obj, endpoint)) is not None:
        fields["prompt_chars"] = chars
    if record_text and (text := _prompt_text(endpoint, obj, kind)) is not None:
        fields["prompt_text"] = text
    return fields


def _prompt_text(endpoint: str, obj: dict[str, Any], kind: RequestKind) -> str | None:
    """The prompt's text, kept only with --record-text; None when the body names none."""
    if endpoint == "/v1/responses":
        return "\n".join(_responses_input(obj) or []) or None
    if "messages" in obj:
        return _message_text(obj["messages"])
    if isinstance(obj.get("prompt"), str):
        return str(obj["prompt"])
    if isinstance(obj.get("prompt"), list):
        return "\n".join(p for p in obj["prompt"] if isinstance(p, str))
    if kind is RequestKind.EMBED and isinstance(obj.get("input"), str | list):
        inputs = obj["input"] if isinstance(obj["input"], list) else [obj["input"]]
        return "\n".join(p for p in inputs if isinstance(p, str))
    return None


def describe_body(body: bytes, endpoint: str, record_text: bool, max_label_chars: int) -> dict[str, Any]:
    """``describe_request`` with the body first, as ``BigBodyDecoder.call`` hands it to the worker process."""
    return describe_request(endpoint, body, record_text=record_text, max_label_chars=max_label_chars)
