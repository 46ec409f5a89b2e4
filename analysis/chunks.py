"""Parse the response stream of one generation request, as recorded by the proxy.

The proxy's hot path only keeps ``(t_ns, bytes)`` for every read from Ollama; this
module turns those reads into chunks (one NDJSON line, one SSE event, or one JSON
body), stamps each chunk with the time of the read that completed it, and
summarises them: which chunks carried content (tokens), when the final chunk came,
Ollama's final numbers, a final ``{"error": ...}``, and anything malformed.

Pure: no I/O, no clock. Any bytes give a result; only misuse of the API (wrong
argument types, feeding after the end) raises, and then only ``ChunkParseError``.

A caller that must not spend long in one call (the proxy's event loop) can set
``defer_bytes``: longer chunks are then not decoded here but held, in order, until
the caller hands back their decoding (``StreamParser.deferred``/``resolve``, with
``decode_lean`` run wherever it likes, e.g. a worker process).
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import orjson

from analysis.agent_events import EventFacts, read_event
from analysis.records import FinalMetrics

MAX_PROBLEMS_KEPT = 5  # malformed chunks described in full; the rest are only counted
MAX_LINE_BYTES = 16 << 20  # one line, event or JSON body kept for parsing; longer ones are dropped, marked malformed
# decode_lean drops number-only arrays of at least this many items (embedding vectors, ``context`` token ids):
# no field read here is such an array in any Ollama or OpenAI reply, and dropping them keeps the object small.
MIN_DROPPED_NUMBERS = 64
_EXCERPT_BYTES = 80
FAST_LINE_BYTES = 64 << 10  # a read of one whole line up to this long is decoded on StreamParser's fast path


class ChunkParseError(ValueError):
    """The parser was used wrongly (not: the stream was bad — that gives malformed markers)."""


class StreamFormat(StrEnum):
    NDJSON = "ndjson"  # Ollama's native streams: one JSON object per "\n"-terminated line
    SSE = "sse"  # OpenAI-compatible streams: "data: {...}" events, then "data: [DONE]"
    JSON = "json"  # stream:false, errors: the whole body is one JSON object


def stream_format(content_type: str | None) -> StreamFormat:
    """Pick the framing from a response's Content-Type header."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "text/event-stream":
        return StreamFormat.SSE
    if media in ("application/x-ndjson", "application/jsonl", "application/x-jsonlines"):
        return StreamFormat.NDJSON
    return StreamFormat.JSON


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs three times as much, once per token
class Chunk:
    """One NDJSON line, SSE event or JSON body, stamped when its last byte was read."""

    t_ns: int
    raw: bytes  # the line without its newline, or the event's joined data lines
    obj: dict[str, Any] | None = None  # None when malformed or for SSE's [DONE]
    problem: str | None = None  # why it is malformed
    done_marker: bool = False  # SSE "data: [DONE]"
    deferred: bool = False  # longer than the parser's defer_bytes: not decoded yet (see StreamParser.resolve)


def _excerpt(raw: bytes) -> str:
    cut = raw[:_EXCERPT_BYTES]
    return repr(cut) + ("…" if len(raw) > _EXCERPT_BYTES else "")


_json_decode = json.JSONDecoder().decode  # what json.loads calls, minus its per-call encoding sniffing
# orjson reads an integer past 64 bits (from 19 digits, negative) as a float, the stdlib as an int (stored clamped
# and flagged): an object whose numbers the summary reads, with a run of 19 digits, goes to the stdlib, so that
# every line is read as before.
_LONG_DIGITS = re.compile(rb"\d{19}")


Decoded = tuple[dict[str, Any] | None, str | None]  # (the object, or why there is none)


def decode_object(raw: bytes) -> Decoded:
    """One chunk's JSON object, or the problem that makes it malformed.

    orjson first (a token's line in a third of the stdlib's time, once per token on the proxy's loop); what it
    refuses goes to the stdlib decoder, which decides as before (it also takes NaN, integers past 64 bits and
    lone surrogates) and words the problem.
    """
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _decode_stdlib(raw)
    if type(obj) is dict and _numbers_read(obj) and _LONG_DIGITS.search(raw) is not None:
        return _decode_stdlib(raw)
    if not isinstance(obj, dict):
        return None, f"not a JSON object: {_excerpt(raw)}"
    return obj, None


def _fast_object(line: bytes) -> dict[str, Any] | None:
    """A line's JSON object when orjson takes it and it is an object (the common case); None: the general path
    decides (and words any problem). orjson ignores the newline and a ``\\r`` before it as JSON whitespace."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict or (_numbers_read(obj) and _LONG_DIGITS.search(line) is not None):
        return None
    return obj


def _numbers_read(obj: dict[str, Any]) -> bool:
    """Whether the summary reads numbers from this object (a final chunk's counts, usage, an error object)."""
    return obj.get("done") is True or "usage" in obj or "error" in obj or "response" in obj


def _decode_stdlib(raw: bytes) -> Decoded:
    try:
        obj = _json_decode(raw.decode("utf-8"))  # Ollama's wire format is UTF-8
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return None, f"not JSON ({type(exc).__name__}): {_excerpt(raw)}"
    if not isinstance(obj, dict):
        return None, f"not a JSON object: {_excerpt(raw)}"
    return obj, None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def drop_number_arrays(obj: dict[str, Any], min_items: int = MIN_DROPPED_NUMBERS) -> dict[str, Any]:
    """``obj`` with every array of ``min_items`` or more numbers (and nothing else) emptied, in place.

    Keys stay, so does every string, object and shorter array: an embeddings reply still says it is one.
    Iterative, so no nesting depth the decoder accepts can overflow the stack here.
    """
    stack: list[dict[str, Any] | list[Any]] = [obj]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, list):
                if len(value) >= min_items and all(_is_number(v) for v in value):
                    node[key] = []  # type: ignore[index]  # replacing a value, not adding a key: safe mid-iteration
                else:
                    stack.append(value)
            elif isinstance(value, dict):
                stack.append(value)
    return obj


def decode_lean(raw: bytes) -> Decoded:
    """``decode_object`` with long number arrays dropped: a worker process's job, so what it sends back is small."""
    obj, problem = decode_object(raw)
    return (drop_number_arrays(obj) if obj is not None else None), problem


def decoded_chunk(t_ns: int, raw: bytes, decoded: Decoded) -> Chunk:
    obj, problem = decoded
    return Chunk(t_ns, raw, obj=obj, problem=problem)


def _decode(t_ns: int, raw: bytes) -> Chunk:
    return decoded_chunk(t_ns, raw, decode_object(raw))


def _check_read(t_ns: object, data: object) -> bytes:
    if type(t_ns) is int and type(data) is bytes:  # the common case, checked cheaply
        return data
    if isinstance(t_ns, bool) or not isinstance(t_ns, int):
        raise ChunkParseError(f"t_ns must be an int (monotonic nanoseconds), got {type(t_ns).__name__}")
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise ChunkParseError(f"data must be bytes, got {type(data).__name__}")


def _too_long(t_ns: int, head: bytes, max_bytes: int) -> Chunk:
    return Chunk(t_ns, head[:_EXCERPT_BYTES], problem=f"longer than {max_bytes} bytes, not kept: {_excerpt(head)}")


class _Splitter:
    """Incremental framing: feed reads, get back the chunks they completed."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, defer_bytes: int | None = None) -> None:
        self._finished = False
        self._last_t_ns: int | None = None
        self._max_bytes = max_line_bytes
        self._defer_bytes = defer_bytes

    def _chunk(self, t_ns: int, raw: bytes) -> Chunk:
        """The decoded chunk, or a deferred one when it is longer than ``defer_bytes``."""
        if self._defer_bytes is not None and len(raw) > self._defer_bytes:
            return Chunk(t_ns, raw, deferred=True)
        return _decode(t_ns, raw)

    def feed(self, t_ns: int, data: bytes) -> list[Chunk]:
        data = _check_read(t_ns, data)
        if self._finished:
            raise ChunkParseError("feed() after finish()")
        self._last_t_ns = t_ns
        return self._feed(t_ns, data)

    def finish(self) -> list[Chunk]:
        if self._finished:
            raise ChunkParseError("finish() called twice")
        self._finished = True
        return self._finish(self._last_t_ns if self._last_t_ns is not None else 0)

    def _feed(self, t_ns: int, data: bytes) -> list[Chunk]:
        raise NotImplementedError

    def _finish(self, t_ns: int) -> list[Chunk]:
        raise NotImplementedError


class NdjsonSplitter(_Splitter):
    """One JSON object per line; a line split across reads gets the time of its last read."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, defer_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes, defer_bytes)
        self._pending: list[bytes] = []  # pieces of an unterminated line (a list: no quadratic joins)
        self._pending_bytes = 0
        self._skipping: bytes | None = None  # start of an over-long line, dropped up to its newline

    def idle(self) -> bool:
        """Nothing pending: the next read starts a line."""
        return not self._pending and self._skipping is None and not self._finished

    def took_line(self, t_ns: int) -> None:
        """A whole line was taken past ``feed`` (StreamParser's fast path): only its time is kept here."""
        self._last_t_ns = t_ns

    def _feed(self, t_ns: int, data: bytes) -> list[Chunk]:
        out: list[Chunk] = []
        if self._skipping is not None:
            end = data.find(b"\n")
            if end < 0:
                return out
            out.append(_too_long(t_ns, self._skipping, self._max_bytes))
            self._skipping = None
            data = data[end + 1 :]
        if b"\n" not in data:
            if data:
                self._pending.append(data)
                self._pending_bytes += len(data)
                if self._pending_bytes > self._max_bytes:
                    self._skipping = b"".join(self._pending)[:_EXCERPT_BYTES]
                    self._pending, self._pending_bytes = [], 0
            return out
        if self._pending:
            self._pending.append(data)
            data = b"".join(self._pending)
        lines = data.split(b"\n")
        rest = lines.pop()
        self._pending = [rest] if rest else []
        self._pending_bytes = len(rest)
        for line in lines:
            line = line.rstrip(b"\r")
            if line.strip():
                out.append(self._chunk(t_ns, line))
        return out

    def _finish(self, t_ns: int) -> list[Chunk]:
        # A last line without its newline: normal for a JSON body, a cut line otherwise.
        if self._skipping is not None:
            return [_too_long(t_ns, self._skipping, self._max_bytes)]
        line = b"".join(self._pending).rstrip(b"\r")
        self._pending = []
        return [self._chunk(t_ns, line)] if line.strip() else []


class JsonSplitter(_Splitter):
    """The whole body is one JSON object (pretty-printed or not), complete at the last read."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, defer_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes, defer_bytes)
        self._parts: list[bytes] = []
        self._bytes = 0

    def _feed(self, t_ns: int, data: bytes) -> list[Chunk]:
        if self._bytes <= self._max_bytes:
            self._parts.append(data)
        self._bytes += len(data)
        if self._bytes > self._max_bytes and len(self._parts) > 1:
            self._parts = [b"".join(self._parts)[:_EXCERPT_BYTES]]  # only the start, for the marker
        return []

    def _finish(self, t_ns: int) -> list[Chunk]:
        if self._bytes > self._max_bytes:
            return [_too_long(t_ns, b"".join(self._parts), self._max_bytes)]
        body = b"".join(self._parts)
        self._parts = []
        return [self._chunk(t_ns, body)] if body.strip() else []


_SSE_EOL = re.compile(rb"\r\n|\r|\n")


class SseSplitter(_Splitter):
    """Server-sent events (WHATWG rules): data lines joined by "\\n", dispatched at a blank line."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, defer_bytes: int | None = None) -> None:
        super().__init__(max_line_bytes, defer_bytes)
        self._pending = b""  # an unterminated line
        self._data: list[bytes] = []  # data lines of the event being built
        self._skip_lf = False  # the last read ended in "\r": a leading "\n" belongs to it

    def _feed(self, t_ns: int, data: bytes) -> list[Chunk]:
        if self._skip_lf and data[:1] == b"\n":
            data = data[1:]
            self._skip_lf = False
        if not data:
            return []
        self._skip_lf = data[-1:] == b"\r"
        parts = _SSE_EOL.split(self._pending + data)
        self._pending = parts.pop()
        out: list[Chunk] = []
        if len(self._pending) > self._max_bytes:  # an over-long line: dropped, so joins stay bounded
            out.append(_too_long(t_ns, self._pending, self._max_bytes))
            self._pending = b""
        for line in parts:
            if not line:
                if self._data:
                    out.append(self._dispatch(t_ns))
            else:
                self._field(line)
        return out

    def _field(self, line: bytes) -> None:
        if line[:1] == b":":  # a comment
            return
        name, _, value = line.partition(b":")
        if name == b"data":  # other fields (event, id, retry) do not matter here
            self._data.append(value[1:] if value[:1] == b" " else value)

    def _dispatch(self, t_ns: int) -> Chunk:
        payload = b"\n".join(self._data)
        self._data = []
        if payload.strip() == b"[DONE]":
            return Chunk(t_ns, payload, done_marker=True)
        return self._chunk(t_ns, payload)

    def _finish(self, t_ns: int) -> list[Chunk]:
        # The WHATWG rules drop an event left open at the end; we keep a marker of it.
        if self._pending:
            self._field(self._pending)
        self._pending = b""
        if not self._data:
            return []
        payload = b"\n".join(self._data)
        self._data = []
        return [Chunk(t_ns, payload, problem=f"stream ended inside an SSE event: {_excerpt(payload)}")]


def new_splitter(fmt: StreamFormat, max_line_bytes: int = MAX_LINE_BYTES, defer_bytes: int | None = None) -> _Splitter:
    if fmt is StreamFormat.NDJSON:
        return NdjsonSplitter(max_line_bytes, defer_bytes)
    if fmt is StreamFormat.SSE:
        return SseSplitter(max_line_bytes, defer_bytes)
    if fmt is StreamFormat.JSON:
        return JsonSplitter(max_line_bytes, defer_bytes)
    raise ChunkParseError(f"unknown stream format {fmt!r}")


def split_chunks(reads: Iterable[tuple[int, bytes]], fmt: StreamFormat) -> list[Chunk]:
    """All chunks of a finished stream, each stamped with the time of the read that completed it."""
    splitter = new_splitter(fmt)
    out: list[Chunk] = []
    for t_ns, data in reads:
        out.extend(splitter.feed(t_ns, data))
    out.extend(splitter.finish())
    return out


# ---------------------------------------------------------------------------
# What the chunks say.


@dataclass
class StreamSummary:
    """What one response stream carried, as far as it has been read."""

    chunk_count: int = 0
    token_chunk_ns: list[int] = field(default_factory=list)  # every chunk carrying content
    final_chunk_ns: int | None = None  # done:true, or an OpenAI chunk with a finish_reason
    metrics: FinalMetrics | None = None
    error: str | None = None  # text of an {"error": ...} chunk
    malformed_count: int = 0
    problems: list[str] = field(default_factory=list)  # the first MAX_PROBLEMS_KEPT, described
    done_marker: bool = False  # SSE [DONE] seen
    text: str | None = None  # response text, only when asked for
    thinking_chunks: int = 0  # chunks in token_chunk_ns that carried thinking
    last_thinking_ns: int | None = None
    first_answer_ns: int | None = None  # first chunk with answer content (a streamed reply only)

    @property
    def first_token_ns(self) -> int | None:
        return self.token_chunk_ns[0] if self.token_chunk_ns else None

    def copy(self) -> StreamSummary:
        return replace(self, token_chunk_ns=list(self.token_chunk_ns), problems=list(self.problems))


_METRIC_KEYS = (
    ("total_duration", "total_duration_ns"),
    ("load_duration", "load_duration_ns"),
    ("prompt_eval_count", "prompt_eval_count"),
    ("prompt_eval_cached_count", "prompt_eval_cached_count"),
    ("prompt_eval_duration", "prompt_eval_duration_ns"),
    ("eval_count", "eval_count"),
    ("eval_duration", "eval_duration_ns"),
)


def _count(value: object) -> int | None:
    """A wire count or duration: a non-negative integer (JSON may spell it 12.0)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer() and value < 2**63:
        return int(value)
    return None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _error_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):  # OpenAI shape: {"message", "type", "param", "code"}
        message = value.get("message")
        if isinstance(message, str):
            return message
    return json.dumps(value, ensure_ascii=False)[:500]


def _content(obj: dict[str, Any]) -> tuple[bool, bool, str]:
    """(carries thinking, carries answer content, response text) of one Ollama or OpenAI chunk.

    Thinking and tool calls are tokens too (they take decode steps) but are not
    the response text; tool calls count as answer.
    """
    text = _str(obj.get("response"))
    thinking = bool(_str(obj.get("thinking")))
    answer = bool(text)
    message = obj.get("message")
    if isinstance(message, dict):
        content = _str(message.get("content"))
        text += content
        thinking = thinking or bool(_str(message.get("thinking")))
        answer = answer or bool(content) or bool(message.get("tool_calls"))
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            piece = _str(choice.get("text"))
            for key in ("delta", "message"):
                part = choice.get(key)
                if isinstance(part, dict):
                    piece += _str(part.get("content"))
                    thinking = thinking or bool(_str(part.get("reasoning")) or _str(part.get("reasoning_content")))
                    answer = answer or bool(part.get("tool_calls"))
            text += piece
            answer = answer or bool(piece)
    return thinking, answer, text


def _is_embedding(obj: dict[str, Any]) -> bool:
    """An embeddings reply: Ollama's ``embeddings``/``embedding`` or OpenAI's ``data`` list."""
    return "embeddings" in obj or "embedding" in obj or (obj.get("object") == "list" and isinstance(obj.get("data"), list))


class StreamParser:
    """Incremental parser for one response: ``feed`` reads as they come, ``finish`` at the end.

    Any split of the same bytes into reads gives the same summary (only the
    timestamps follow the reads).

    With ``defer_bytes`` set, a chunk longer than that is held undecoded, and so is
    every chunk after it, until ``resolve`` hands in its decoding: the summary takes
    the chunks in wire order whoever decodes them.
    """

    def __init__(
        self,
        fmt: StreamFormat,
        *,
        keep_text: bool = False,
        max_line_bytes: int = MAX_LINE_BYTES,
        defer_bytes: int | None = None,
    ) -> None:
        self.format = fmt
        self._splitter = new_splitter(fmt, max_line_bytes, defer_bytes)
        self._ndjson = self._splitter if isinstance(self._splitter, NdjsonSplitter) else None
        self._fast_max_bytes = min(FAST_LINE_BYTES, max_line_bytes, defer_bytes or FAST_LINE_BYTES)
        self._summary = StreamSummary(text="" if keep_text else None)
        self._keep_text = keep_text
        self._metric_values: dict[str, Any] = {}
        self._held: deque[Chunk] = deque()  # a deferred chunk first, then what came after it
        self._ended = False
        self._finished = False

    def feed(self, t_ns: int, data: bytes) -> None:
        ndjson = self._ndjson
        if ndjson is not None and type(t_ns) is int and self._one_line(ndjson, data) and (obj := _fast_object(data)):
            ndjson.took_line(t_ns)
            self._take_object(t_ns, obj)
            return
        for chunk in self._splitter.feed(t_ns, data):
            self._take_or_hold(chunk)

    def _one_line(self, ndjson: NdjsonSplitter, data: bytes) -> bool:
        """A read that is exactly one whole NDJSON line, with nothing pending or held: how Ollama streams a
        token. It takes the fast path (the same result as the splitter's, in a third of the time)."""
        return (
            not self._held
            and ndjson.idle()
            and type(data) is bytes
            and data.endswith(b"\n")
            and data.count(b"\n") == 1
            and len(data) <= self._fast_max_bytes
        )

    def end(self) -> None:
        """End of stream: flush a last unterminated chunk (which may be deferred). Once only."""
        for chunk in self._splitter.finish():
            self._take_or_hold(chunk)
        self._ended = True

    def deferred(self) -> Chunk | None:
        """The chunk waiting for ``resolve`` (its ``raw`` is what to decode), or None."""
        return self._held[0] if self._held else None

    def resolve(self, chunk: Chunk) -> None:
        """The deferred chunk, decoded (``decoded_chunk``) or marked malformed: take it and what it held back."""
        if not self._held:
            raise ChunkParseError("resolve() with no deferred chunk")
        self._held.popleft()
        self._take(chunk)
        while self._held and not self._held[0].deferred:
            self._take(self._held.popleft())

    def finish(self) -> StreamSummary:
        """End of stream (``end`` if not called yet); returns the summary.

        Deferred chunks nobody resolved are decoded here, at the caller's cost: the result never depends on it.
        """
        if self._finished:
            raise ChunkParseError("finish() called twice")
        if not self._ended:
            self.end()
        while (chunk := self.deferred()) is not None:
            self.resolve(_decode(chunk.t_ns, chunk.raw))
        self._finished = True
        return self._summary

    def _take_or_hold(self, chunk: Chunk) -> None:
        if chunk.deferred or self._held:
            self._held.append(chunk)
        else:
            self._take(chunk)

    @property
    def summary(self) -> StreamSummary:
        """The summary so far (live object; copy it to keep it)."""
        return self._summary

    def _take(self, chunk: Chunk) -> None:
        if chunk.done_marker:
            self._summary.chunk_count += 1
            self._summary.done_marker = True
            return
        if chunk.obj is None:
            self._summary.chunk_count += 1
            self._malformed(chunk.problem or "malformed chunk")
            return
        self._take_object(chunk.t_ns, chunk.obj)

    def _take_object(self, t_ns: int, obj: dict[str, Any]) -> None:
        s = self._summary
        s.chunk_count += 1
        if "error" in obj and obj["error"] is not None:
            s.error = _error_text(obj["error"])
        if ("type" in obj or obj.get("object") == "response") and (
            facts := read_event(obj, whole=self.format is StreamFormat.JSON)
        ) is not None:
            self._take_event(t_ns, facts)
            return
        thinking, answer, text = _content(obj)
        self._take_content(t_ns, thinking, answer, text)
        if obj.get("done") is True or (self.format is StreamFormat.JSON and _is_embedding(obj)):
            s.final_chunk_ns = t_ns
            self._native_metrics(obj)
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                    s.final_chunk_ns = t_ns
                    self._metric_values["done_reason"] = choice["finish_reason"]
                    self._publish_metrics()
        if isinstance(obj.get("usage"), dict):
            self._usage(obj["usage"])

    def _take_content(self, t_ns: int, thinking: bool, answer: bool, text: str) -> None:
        s = self._summary
        # A whole JSON body is no stream: its content arrives at once, so it times no token.
        if (thinking or answer) and self.format is not StreamFormat.JSON:
            s.token_chunk_ns.append(t_ns)
            if thinking:
                s.thinking_chunks += 1
                s.last_thinking_ns = t_ns
            if answer and s.first_answer_ns is None:
                s.first_answer_ns = t_ns
        if self._keep_text and text:
            s.text = (s.text or "") + text

    def _take_event(self, t_ns: int, facts: EventFacts) -> None:
        """One event of /v1/messages or /v1/responses (``analysis.agent_events``)."""
        s = self._summary
        self._take_content(t_ns, facts.thinking, facts.answer, facts.text)
        if facts.error is not None:
            s.error = facts.error
        if not facts.final:
            return
        s.final_chunk_ns = t_ns
        if facts.reason is not None:
            self._metric_values["done_reason"] = facts.reason
        # message_stop follows message_delta with no counts: what an earlier event said stays.
        for name, value in (("prompt_eval_count", facts.prompt_tokens), ("eval_count", facts.output_tokens)):
            if value is not None:
                self._metric_values[name] = _count(value)
        self._publish_metrics()

    def _malformed(self, problem: str) -> None:
        s = self._summary
        s.malformed_count += 1
        if len(s.problems) < MAX_PROBLEMS_KEPT:
            s.problems.append(problem)

    def _native_metrics(self, obj: dict[str, Any]) -> None:
        for wire, name in _METRIC_KEYS:
            if wire in obj:
                value = _count(obj[wire])
                if value is None:
                    self._malformed(f"{wire} is not a non-negative integer: {obj[wire]!r:.60}")
                self._metric_values[name] = value
        reason = obj.get("done_reason")
        if isinstance(reason, str):
            self._metric_values["done_reason"] = reason
        self._publish_metrics()

    def _usage(self, usage: dict[str, Any]) -> None:
        # OpenAI-compatible replies carry no durations, only counts.
        self._metric_values["prompt_eval_count"] = _count(usage.get("prompt_tokens"))
        self._metric_values["eval_count"] = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and "cached_tokens" in details:
            self._metric_values["prompt_eval_cached_count"] = _count(details["cached_tokens"])
        self._publish_metrics()

    def _publish_metrics(self) -> None:
        self._summary.metrics = FinalMetrics(**self._metric_values)


def parse_stream(reads: Iterable[tuple[int, bytes]], fmt: StreamFormat, *, keep_text: bool = False) -> StreamSummary:
    """Summary of a finished stream given all its ``(t_ns, bytes)`` reads."""
    parser = StreamParser(fmt, keep_text=keep_text)
    for t_ns, data in reads:
        parser.feed(t_ns, data)
    return parser.finish()
