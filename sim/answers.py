"""Answers with a shape: JSON for ``format`` ("json" or a JSON schema) and tool calls for ``tools``.

The model's tokens are still pseudo-words; what they spell is valid JSON (what Ollama's grammar-constrained
sampling guarantees) or a call of the request's first tool with arguments that fit its parameter schema.
Both come as the pieces the engine streams one token at a time (``GenRequest.answer_pieces``).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from sim import tokens

_PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])")
_MAX_DEPTH = 4


def pieces(text: str) -> list[str]:
    """``text`` cut into tokens (a word or a punctuation mark with the spaces before it); they join back to it."""
    return _PIECE_RE.findall(text)


def _words(rng: random.Random, n: int) -> str:
    stream = tokens.TextStream(rng.randrange(2**32))
    return " ".join(next(stream).strip(" .,") or "ka" for _ in range(n))


def _type_of(schema: dict[Any, Any]) -> Any:
    """The schema's type: the first non-null one of a list, "object" where it only names properties."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and "properties" in schema:
        return "object"
    return kind


def _scalar(kind: Any, rng: random.Random) -> Any:
    """A value of a scalar type; words for a string or a type this sim does not know."""
    if kind == "integer":
        return rng.randint(1, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _words(rng, rng.randint(1, 4))


def value_for(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value that fits a JSON schema (the common keywords: type, properties, items, enum, const)."""
    if not isinstance(schema, dict):
        return _words(rng, 2)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = _type_of(schema)
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict):
            props = {}
        if depth >= _MAX_DEPTH:
            return {}
        return {str(k): value_for(v, rng, depth + 1) for k, v in props.items()}
    if kind == "array":
        return [] if depth >= _MAX_DEPTH else [value_for(schema.get("items"), rng, depth + 1) for _ in range(2)]
    return _scalar(kind, rng)


def format_answer(fmt: Any, seed: str) -> list[str] | None:
    """The pieces of a JSON answer for ``format`` ("json" or a schema), or None when the format is unset."""
    if fmt is None or fmt == "":
        return None
    rng = random.Random(seed + ":format")
    value = {"answer": _words(rng, rng.randint(4, 24))} if fmt == "json" else value_for(fmt, rng)
    return pieces(json.dumps(value, ensure_ascii=False))


def tool_call(tools: Any, messages: list[Any], seed: str) -> dict[str, Any] | None:
    """The call of the first tool a model makes when tools are offered and the last message is the user's.

    After a tool's result (``role: tool``) the model answers in words, as a real one would.
    """
    if not isinstance(tools, list) or not tools or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role", "user") != "user":
        return None
    fn = tools[0].get("function") if isinstance(tools[0], dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return None
    rng = random.Random(seed + ":tool")
    return {"name": fn["name"], "arguments": value_for(fn.get("parameters") or {"type": "object"}, rng)}


def call_id(seed: str) -> str:
    """Ollama's tool call id: ``call_`` and 8 lowercase letters or digits."""
    rng = random.Random(seed + ":call")
    return "call_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
