"""The chunk parser: framing, timestamps, what the chunks say, and garbage."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.chunks import (
    ChunkParseError,
    StreamFormat,
    StreamParser,
    parse_stream,
    split_chunks,
    stream_format,
)
from analysis.records import FinalMetrics

GEN_FINAL = {
    "model": "llama3.2",
    "created_at": "2026-08-21T10:00:01.5Z",
    "response": "",
    "done": True,
    "done_reason": "stop",
    "context": [1, 2, 3],
    "total_duration": 5_000_000_000,
    "load_duration": 3_000_000,
    "prompt_eval_count": 26,
    "prompt_eval_cached_count": 10,
    "prompt_eval_duration": 130_000_000,
    "eval_count": 4,
    "eval_duration": 290_000_000,
}


def ndjson(*objs: dict) -> bytes:
    return b"".join(json.dumps(o, separators=(",", ":")).encode() + b"\n" for o in objs)


def gen_chunk(text: str) -> dict:
    return {"model": "llama3.2", "created_at": "2026-08-21T10:00:00Z", "response": text, "done": False}


def sse(*objs: dict | str) -> bytes:
    out = b""
    for o in objs:
        payload = o if isinstance(o, str) else json.dumps(o)
        out += b"data: " + payload.encode() + b"\n\n"
    return out


def test_content_type_picks_the_framing() -> None:
    assert stream_format("application/x-ndjson") is StreamFormat.NDJSON
    assert stream_format("text/event-stream; charset=utf-8") is StreamFormat.SSE
    assert stream_format("application/json; charset=utf-8") is StreamFormat.JSON
    assert stream_format(None) is StreamFormat.JSON


def test_generate_stream_tokens_final_and_metrics() -> None:
    body = ndjson(gen_chunk("Hel"), gen_chunk("lo"), gen_chunk(""), GEN_FINAL)
    # Two lines in the first read share its time; the last line is split across two reads.
    lines = body.splitlines(keepends=True)
    reads = [(100, lines[0] + lines[1]), (200, lines[2] + lines[3][:-20]), (300, lines[3][-20:])]
    summary = parse_stream(reads, StreamFormat.NDJSON, keep_text=True)
    assert summary.token_chunk_ns == [100, 100]  # the empty response chunk is no token
    assert summary.first_token_ns == 100
    assert summary.final_chunk_ns == 300
    assert summary.text == "Hello"
    assert summary.chunk_count == 4
    assert summary.metrics == FinalMetrics(
        total_duration_ns=5_000_000_000,
        load_duration_ns=3_000_000,
        prompt_eval_count=26,
        prompt_eval_cached_count=10,
        prompt_eval_duration_ns=130_000_000,
        eval_count=4,
        eval_duration_ns=290_000_000,
        done_reason="stop",
    )
    assert summary.malformed_count == 0 and summary.error is None


def test_chat_thinking_and_tool_calls_count_as_tokens_but_not_text() -> None:
    chat = [
        {"message": {"role": "assistant", "content": "", "thinking": "hmm"}, "done": False},
        {"message": {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}, "done": False},
        {"message": {"role": "assistant", "content": "Hi"}, "done": False},
        {"message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop", "eval_count": 3},
    ]
    summary = parse_stream(
        [(i, line) for i, line in enumerate(ndjson(*chat).splitlines(keepends=True))], StreamFormat.NDJSON, keep_text=True
    )
    assert summary.token_chunk_ns == [0, 1, 2]
    assert summary.text == "Hi"
    assert summary.final_chunk_ns == 3
    assert summary.metrics is not None and summary.metrics.eval_count == 3 and summary.metrics.total_duration_ns is None


def test_text_is_not_kept_unless_asked() -> None:
    summary = parse_stream([(1, ndjson(gen_chunk("secret"), GEN_FINAL))], StreamFormat.NDJSON)
    assert summary.text is None
    assert summary.token_chunk_ns == [1]


def test_final_error_line_is_reported() -> None:
    summary = parse_stream([(1, ndjson(gen_chunk("a"), {"error": "model runner has unexpectedly stopped"}))], StreamFormat.NDJSON)
    assert summary.error == "model runner has unexpectedly stopped"
    assert summary.final_chunk_ns is None


def test_openai_sse_stream_with_usage() -> None:
    def delta(content: str, finish: str | None = None) -> dict:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": finish}],
        }

    body = sse(
        delta("Hel"),
        delta("lo"),
        delta("", "stop"),
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 2,
                "total_tokens": 14,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        },
        "[DONE]",
    )
    events = body.split(b"\n\n")
    reads = [(10 * (i + 1), e + b"\n\n") for i, e in enumerate(events[:-1])]
    summary = parse_stream(reads, StreamFormat.SSE, keep_text=True)
    assert summary.token_chunk_ns == [10, 20]
    assert summary.final_chunk_ns == 30
    assert summary.done_marker
    assert summary.text == "Hello"
    assert summary.metrics == FinalMetrics(prompt_eval_count=12, eval_count=2, prompt_eval_cached_count=4, done_reason="stop")


def test_openai_non_stream_completion() -> None:
    body = json.dumps(
        {
            "choices": [{"index": 0, "text": "four", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
    ).encode()
    summary = parse_stream([(5, body[:7]), (9, body[7:])], StreamFormat.JSON, keep_text=True)
    assert summary.token_chunk_ns == []  # a whole body times no token: the client saw none before the end
    assert summary.final_chunk_ns == 9
    assert summary.text == "four"
    assert summary.metrics == FinalMetrics(prompt_eval_count=3, eval_count=1, done_reason="length")


def test_openai_error_object() -> None:
    summary = parse_stream([(1, sse({"error": {"message": "boom", "type": "api_error"}}))], StreamFormat.SSE)
    assert summary.error == "boom"


def test_sse_crlf_split_between_reads_and_comments() -> None:
    body = b': keep-alive\r\ndata: {"choices":[{"delta":{"content":"x"}}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    cut = body.index(b"\r\n\r\n") + 1  # first read ends in "\r"
    whole = split_chunks([(1, body)], StreamFormat.SSE)
    split = split_chunks([(1, body[:cut]), (2, body[cut:])], StreamFormat.SSE)
    assert [c.raw for c in whole] == [c.raw for c in split] == [b'{"choices":[{"delta":{"content":"x"}}]}', b"[DONE]"]


def test_malformed_lines_are_marked_not_raised() -> None:
    body = ndjson(gen_chunk("a")) + b"{not json\n" + b"[1,2]\n" + b"\xff\xfe\n" + ndjson(GEN_FINAL)
    summary = parse_stream([(1, body)], StreamFormat.NDJSON)
    assert summary.malformed_count == 3
    assert any("not JSON" in p for p in summary.problems)
    assert any("not a JSON object" in p for p in summary.problems)
    assert summary.final_chunk_ns == 1 and summary.token_chunk_ns == [1]


def test_bad_metric_values_are_dropped_and_flagged() -> None:
    final = dict(GEN_FINAL, eval_count="many", eval_duration=-5, prompt_eval_count=True)
    summary = parse_stream([(1, ndjson(final))], StreamFormat.NDJSON)
    assert summary.metrics is not None
    assert (
        summary.metrics.eval_count is None
        and summary.metrics.eval_duration_ns is None
        and summary.metrics.prompt_eval_count is None
    )
    assert summary.malformed_count == 3


def test_cut_line_and_cut_event_are_marked() -> None:
    nd = parse_stream([(1, ndjson(gen_chunk("a")) + b'{"model":"x","resp')], StreamFormat.NDJSON)
    assert nd.malformed_count == 1 and nd.token_chunk_ns == [1]
    ev = parse_stream([(1, b'data: {"choices":[]}\n')], StreamFormat.SSE)
    assert ev.malformed_count == 1 and "inside an SSE event" in ev.problems[0]


def test_deep_nesting_is_malformed_not_a_crash() -> None:
    summary = parse_stream([(1, b"[" * 100_000 + b"\n")], StreamFormat.NDJSON)
    assert summary.malformed_count == 1


def test_misuse_raises_the_parsers_own_error() -> None:
    parser = StreamParser(StreamFormat.NDJSON)
    with pytest.raises(ChunkParseError):
        parser.feed(1, "text")  # type: ignore[arg-type]
    with pytest.raises(ChunkParseError):
        parser.feed(1.5, b"x")  # type: ignore[arg-type]
    parser.finish()
    with pytest.raises(ChunkParseError):
        parser.feed(2, b"{}\n")


# -- properties -----------------------------------------------------------------------

texts = st.text(max_size=12)
gen_objs = st.lists(texts.map(gen_chunk), max_size=8).map(lambda chunks: [*chunks, GEN_FINAL])
openai_objs = st.lists(texts, max_size=8).map(
    lambda parts: (
        [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in parts]
        + [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    )
)


def _split(body: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    """Split body at the given offsets; read i gets time 1000 * (i + 1)."""
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    return [(1000 * (i + 1), body[a:b]) for i, (a, b) in enumerate(itertools.pairwise(points))]


def _time_of_byte(reads: list[tuple[int, bytes]], offset: int) -> int:
    pos = 0
    for t_ns, data in reads:
        pos += len(data)
        if offset < pos:
            return t_ns
    raise AssertionError("offset past the end")


@settings(max_examples=150, deadline=None)
@given(objs=gen_objs, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_of_ndjson_gives_the_same_parse(objs: list[dict], cuts: list[int]) -> None:
    body = ndjson(*objs)
    whole = split_chunks([(1, body)], StreamFormat.NDJSON)
    reads = _split(body, cuts)
    split = split_chunks(reads, StreamFormat.NDJSON)
    assert [(c.raw, c.obj) for c in split] == [(c.raw, c.obj) for c in whole]
    assert [c.obj for c in split] == objs
    # Each line is stamped with the read that carried its newline.
    ends = [i for i, b in enumerate(body) if b == ord("\n")]
    assert [c.t_ns for c in split] == [_time_of_byte(reads, e) for e in ends]
    summary = parse_stream(reads, StreamFormat.NDJSON, keep_text=True)
    assert summary.text == "".join(o["response"] for o in objs)
    assert len(summary.token_chunk_ns) == sum(1 for o in objs if o["response"])


@settings(max_examples=150, deadline=None)
@given(objs=openai_objs, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12), crlf=st.booleans())
def test_any_split_of_sse_gives_the_same_parse(objs: list[dict], cuts: list[int], crlf: bool) -> None:
    body = sse(*objs, "[DONE]")
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    reads = _split(body, cuts)
    whole = parse_stream([(1, body)], StreamFormat.SSE, keep_text=True)
    split = parse_stream(reads, StreamFormat.SSE, keep_text=True)
    assert split.text == whole.text == "".join(o["choices"][0]["delta"].get("content", "") for o in objs)
    assert len(split.token_chunk_ns) == len(whole.token_chunk_ns)
    assert split.done_marker and split.final_chunk_ns is not None
    assert split.metrics == whole.metrics
    if not crlf:  # with "\n" framing, each event gets the time of the read holding its blank line
        ends = [i + 1 for i in range(len(body) - 1) if body[i : i + 2] == b"\n\n"]
        events = split_chunks(reads, StreamFormat.SSE)
        assert [c.t_ns for c in events] == [_time_of_byte(reads, e) for e in ends]


@settings(max_examples=300, deadline=None)
@given(
    reads=st.lists(st.tuples(st.integers(min_value=0, max_value=2**62), st.binary(max_size=64)), max_size=10),
    fmt=st.sampled_from(list(StreamFormat)),
)
def test_garbage_never_raises(reads: list[tuple[int, bytes]], fmt: StreamFormat) -> None:
    summary = parse_stream(reads, fmt, keep_text=True)
    assert summary.malformed_count <= summary.chunk_count
    assert all(isinstance(t, int) for t in summary.token_chunk_ns)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8,
)
wire_keys = st.sampled_from(
    [
        "response",
        "thinking",
        "message",
        "done",
        "done_reason",
        "error",
        "choices",
        "usage",
        "eval_count",
        "total_duration",
        "delta",
        "content",
    ]
)


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(
    objs=st.lists(st.dictionaries(wire_keys, json_values, max_size=6), max_size=6),
    fmt=st.sampled_from([StreamFormat.NDJSON, StreamFormat.SSE]),
)
def test_valid_json_of_the_wrong_shape_never_raises(objs: list[dict], fmt: StreamFormat) -> None:
    body = ndjson(*objs) if fmt is StreamFormat.NDJSON else sse(*objs)
    summary = parse_stream([(7, body)], fmt, keep_text=True)
    assert summary.chunk_count == len(objs)


# A read that is one whole line takes StreamParser's fast path (orjson); the same line inside a larger read goes
# through the splitter. Both must give the same summary, also for lines orjson refuses or reads differently.
AWKWARD_LINES = [
    b'{"response":"a","done":false}\r\n',  # CRLF
    b'   {"response":"b","done":false}  \n',  # whitespace around the object
    b"   \n",  # a blank line: no chunk at all
    b'{"response":"c","done":false,"x":NaN}\n',  # the stdlib takes NaN, orjson does not
    b'{"response":"d\\ud800","done":false}\n',  # a lone surrogate: the stdlib takes it
    b'{"eval_count":123456789012345678901234567890,"done":true}\n',  # past 64 bits
    b'["not", "an", "object"]\n',
    b'{"response":"\xff\xfe","done":false}\n',  # not UTF-8
    b"{not json}\n",
    b'{"response":"e","response":"f","done":false}\n',  # a repeated key: the last wins in both
]


@pytest.mark.parametrize("line", AWKWARD_LINES, ids=range(len(AWKWARD_LINES)))
def test_fast_path_summary_equals_the_splitters(line: bytes) -> None:
    fast = StreamParser(StreamFormat.NDJSON, keep_text=True)
    fast.feed(1, line)  # one whole line: the fast path where orjson takes it
    slow = StreamParser(StreamFormat.NDJSON, keep_text=True)
    slow.feed(1, b"")
    slow.feed(1, line[:1])  # the same line in two reads: always the splitter
    slow.feed(1, line[1:])
    summary = fast.finish()
    assert summary == slow.finish()
    if b"1234567890123456789" in line:  # read as the stdlib reads it: an int, kept (the store clamps it)
        assert summary.metrics is not None and summary.metrics.eval_count == 123456789012345678901234567890


def test_fast_path_waits_behind_a_pending_line() -> None:
    parser = StreamParser(StreamFormat.NDJSON)
    parser.feed(1, b'{"response":"a",')  # an unterminated line is pending
    parser.feed(2, b'"done":false}\n')  # ends it: not a line of its own
    parser.feed(3, b'{"response":"b","done":false}\n')
    assert parser.finish().token_chunk_ns == [2, 3]
