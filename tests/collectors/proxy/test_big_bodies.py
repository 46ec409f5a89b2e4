"""Large chunks and request bodies decoded off the event loop: number arrays dropped, deferred parsing, the worker, its bounds.

The worker is a real process (``concurrent.futures``, spawn); its failures here are real ones: a worker
that exits mid-parse, one that takes too long, more large bodies than may wait.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from analysis.chunks import (
    MIN_DROPPED_NUMBERS,
    Chunk,
    Decoded,
    StreamFormat,
    StreamParser,
    StreamSummary,
    decode_lean,
    decode_object,
    decoded_chunk,
    drop_number_arrays,
)
from collectors.proxy.big_bodies import BigBodyDecoder
from collectors.proxy.limits import Limits
from collectors.proxy.request_facts import describe_request
from tests.support.proxy_thread import run_proxy
from tests.support.scripted_upstream import ScriptedUpstream, start_scripted_upstream
from tests.support.sim_process import SimProcess

N = MIN_DROPPED_NUMBERS

pytestmark = pytest.mark.sim_args("--hardware", "rtx-3060")


def _crash(raw: bytes) -> Decoded:  # the worker dies mid-parse (as when the OOM killer takes it)
    os._exit(3)


def _slow(raw: bytes) -> Decoded:
    time.sleep(3.0)
    return decode_lean(raw)


# -- dropping long number arrays ----------------------------------------------------------------------


def test_long_number_arrays_are_emptied_and_nothing_else_changes() -> None:
    numbers = [0.5] * N
    text = json.dumps(numbers)  # a number array inside a string is text, never touched
    obj = {
        "embeddings": [[-1.25e-05, 3e2, 7, -0.0, 2.5e-3] * (N // 5 + 1), [1.0] * N],  # nested: each vector emptied
        "data": [{"object": "embedding", "embedding": numbers, "index": 0}],  # arrays of objects stay; inside, emptied
        "context": list(range(5000)),  # token ids: ints are numbers too
        "short": [1.5] * (N - 1),  # short arrays stay
        "mixed": [*numbers, "x"],  # not numbers only
        "flags": [True] * N,  # booleans are not numbers
        "nulls": [None] * N,
        "response": text,
        "message": {"role": "assistant", "content": text, "tool_calls": [{"function": {"arguments": {"v": numbers}}}]},
        "usage": {"prompt_tokens": 12, "completion_tokens": 0},
        "total_duration": 1_000_000,
    }
    raw = json.dumps(obj).encode()
    lean, problem = decode_lean(raw)
    assert problem is None and lean is not None
    expected = json.loads(raw)
    expected["embeddings"] = [[], []]
    expected["data"][0]["embedding"] = []
    expected["context"] = []
    expected["message"]["tool_calls"][0]["function"]["arguments"]["v"] = []
    assert lean == expected
    assert lean["response"] == text and lean["short"] == [1.5] * (N - 1) and lean["flags"] == [True] * N


def test_exponent_forms_and_deep_nesting() -> None:
    raw = b'{"v": [' + b",".join([b"1E+2", b"-2.5e-7", b"0e0", b"12", b"-0.1E1"] * N) + b"]}"
    assert decode_lean(raw) == ({"v": []}, None)
    deep = {"a": [[[[{"b": [[2.0] * N]}]]]]}
    assert drop_number_arrays(deep) == {"a": [[[[{"b": [[]]}]]]]}
    # Deeper than any recursion limit the decoder accepts: the walk is iterative.
    nested: dict[str, object] = {"v": [1] * N}
    for _ in range(5000):
        nested = {"n": nested}
    drop_number_arrays(nested)
    for _ in range(5000):
        nested = nested["n"]  # type: ignore[assignment]
    assert nested == {"v": []}


@pytest.mark.parametrize("raw", [b'{"a": [1, 2,, 3]}', b"[1, 2, 3]", b'"text"', b'{"a": "\xff"}', b"[" * 100_000, b""])
def test_bad_bodies_give_the_same_problem_as_before(raw: bytes) -> None:
    obj, problem = decode_object(raw)
    assert obj is None and problem
    assert decode_lean(raw) == (None, problem)


# -- deferred chunks give the summary an undeferred parse gives -----------------------------------


def _embed_body(n: int) -> bytes:
    vectors = [[round((i * 7 + j) % 13 / 13 - 0.5, 7) for j in range(768)] for i in range(n)]
    reply = {"model": "nomic-embed-text", "embeddings": vectors, "total_duration": 91_000_000, "prompt_eval_count": 3 * n}
    return json.dumps(reply).encode()


def _streams() -> Iterator[tuple[StreamFormat, list[tuple[int, bytes]]]]:
    final = {"done": True, "done_reason": "stop", "context": list(range(40_000)), "eval_count": 3, "eval_duration": 9}
    lines = [{"response": "Hel"}, {"response": "lo"}, {"thinking": "hm"}, {"response": "!"}, final]
    body = b"".join(json.dumps(o).encode() + b"\n" for o in lines)
    yield StreamFormat.NDJSON, [(i, body[i * 4096 : (i + 1) * 4096]) for i in range(len(body) // 4096 + 1)]
    # A big line in the middle: what follows waits for it and keeps its own timestamps.
    mid = b"".join(json.dumps(o).encode() + b"\n" for o in [lines[0], final | {"done": False}, *lines[1:]])
    yield StreamFormat.NDJSON, [(i, mid[i * 1000 : (i + 1) * 1000]) for i in range(len(mid) // 1000 + 1)]
    sse = b"".join(b"data: " + json.dumps({"choices": [{"delta": {"content": c}}]}).encode() + b"\n\n" for c in ("a", "b"))
    sse += b"data: " + json.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}], "context": final["context"]}).encode()
    sse += b"\n\ndata: [DONE]\n\n"
    yield StreamFormat.SSE, [(1, sse[:100]), (2, sse[100:])]
    embed = _embed_body(60)
    yield StreamFormat.JSON, [(5, embed[:300_000]), (6, embed[300_000:])]
    yield StreamFormat.JSON, [(7, b'{"embeddings": [' + b"1," * 200_000)]  # cut: malformed either way


def _parse(fmt: StreamFormat, reads: list[tuple[int, bytes]], defer_bytes: int | None, resolve: bool) -> StreamSummary:
    parser = StreamParser(fmt, keep_text=True, defer_bytes=defer_bytes)
    for t_ns, data in reads:
        parser.feed(t_ns, data)
        while resolve and (chunk := parser.deferred()) is not None:
            parser.resolve(decoded_chunk(chunk.t_ns, chunk.raw, decode_lean(chunk.raw)))
    parser.end()
    while resolve and (chunk := parser.deferred()) is not None:
        parser.resolve(decoded_chunk(chunk.t_ns, chunk.raw, decode_lean(chunk.raw)))
    return parser.finish()


@pytest.mark.parametrize(("fmt", "reads"), list(_streams()))
def test_deferred_chunks_give_the_same_summary(fmt: StreamFormat, reads: list[tuple[int, bytes]]) -> None:
    plain = _parse(fmt, reads, None, resolve=False)
    assert plain.final_chunk_ns is not None or plain.malformed_count
    assert _parse(fmt, reads, 64 << 10, resolve=True) == plain
    assert _parse(fmt, reads, 64 << 10, resolve=False) == plain  # finish() decodes what nobody resolved


def test_held_chunks_wait_for_the_deferred_one() -> None:
    big = json.dumps({"response": "x", "context": list(range(50_000))}).encode() + b"\n"
    parser = StreamParser(StreamFormat.NDJSON, defer_bytes=1000)
    parser.feed(1, b'{"response": "a"}\n' + big + b'{"response": "b"}\n')
    assert parser.summary.token_chunk_ns == [1]  # "b" waits behind the big line
    chunk = parser.deferred()
    assert chunk is not None and chunk.raw == big[:-1]
    parser.resolve(replace(chunk, deferred=False, problem="not parsed (test), 1 bytes: b''"))
    assert parser.summary.token_chunk_ns == [1, 1] and parser.summary.malformed_count == 1
    assert parser.deferred() is None


# -- the worker process ----------------------------------------------------------------------------


def _big_chunk() -> Chunk:
    return Chunk(42, _embed_body(40), deferred=True)


@pytest.mark.slow
def test_worker_decodes_and_survives_a_crash() -> None:
    async def go() -> None:
        decoder = BigBodyDecoder(Limits())
        try:
            chunk = _big_chunk()
            got = await decoder.decode(chunk)
            assert got.problem is None and got.obj is not None and got.t_ns == 42
            assert got.obj["embeddings"] == [[]] * 40 and got.obj["prompt_eval_count"] == 120
            assert decoder.waiting == 0
        finally:
            decoder.close()
        crashing = BigBodyDecoder(Limits(), decode=_crash)
        try:
            got = await crashing.decode(chunk)
            assert got.obj is None and got.problem is not None
            assert got.problem.startswith("not parsed (the parser process failed (BrokenProcessPool))")
            assert crashing.waiting == 0
            got = await crashing.decode(chunk)  # a fresh worker, which fails the same way: not stuck, not raised
            assert got.problem is not None and "BrokenProcessPool" in got.problem
        finally:
            crashing.close()

    asyncio.run(go())


def test_timeout_and_the_bound_on_waiting_bodies() -> None:
    async def go() -> None:
        decoder = BigBodyDecoder(Limits(max_big_bodies_waiting=1, big_parse_timeout_s=1.5), decode=_slow)
        try:
            chunk = _big_chunk()
            first = asyncio.create_task(decoder.decode(chunk))
            await asyncio.sleep(0.1)
            second = await decoder.decode(chunk)  # one already waits: this one is refused at once
            assert second.problem is not None
            assert second.problem.startswith("not parsed (1 large bodies already waiting to be parsed")
            got = await first  # the worker sleeps 3 s (plus its start): past the 1.5 s timeout
            assert got.problem is not None and got.problem.startswith("not parsed (the parser process took over 1.5 s)")
            assert decoder.waiting == 1  # still in the worker: its place stays taken until it is done
        finally:
            decoder.close()
        await asyncio.sleep(0)  # the cancelled future's callbacks run on the next turn of the loop
        assert decoder.waiting == 0
        assert (await decoder.decode(chunk)).problem is not None  # closed: never waits

    asyncio.run(go())


# -- through the proxy -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_failed_worker_leaves_a_record_that_says_why(sim: SimProcess) -> None:
    inputs = 40  # 40 x 768 dims: ~350 kB, over big_body_bytes
    body = json.dumps({"model": "nomic-embed-text", "input": [f"text {i}" for i in range(inputs)]}).encode()
    with run_proxy(sim.base_url) as proxy:
        proxy.proxy._big_bodies = BigBodyDecoder(proxy.proxy.limits, decode=_crash)
        status, reply = _post(proxy.base_url + "/api/embed", body)
        assert status == 200 and len(reply) > Limits().big_body_bytes
        (record,) = proxy.wait_records(1)
    assert record.outcome == "upstream_failed" and record.final_chunk_ns is None and record.metrics is None
    assert record.error is not None and "not parsed (the parser process failed (BrokenProcessPool))" in record.error
    assert record.batch_size == inputs and record.model == "nomic-embed-text"


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    import urllib.request

    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.status, r.read()


# -- large request bodies ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedUpstream]:
    with start_scripted_upstream() as u:  # never decodes a body: any size is answered at once
        yield u


def _vision_body(image_bytes: int = 600_000) -> bytes:
    image = base64.b64encode(os.urandom(image_bytes)).decode()
    return json.dumps(
        {
            "model": "llava",
            "messages": [{"role": "user", "content": "what is this?", "images": [image]}],
            "stream": False,
            "options": {"num_ctx": 4096},
            "keep_alive": "10m",
        }
    ).encode()


def test_a_large_request_body_is_described_in_the_worker(scripted: ScriptedUpstream) -> None:
    body = _vision_body()
    assert len(body) > Limits().big_body_bytes
    with run_proxy(scripted.base_url, record_text=True) as proxy:
        status, _ = _post(proxy.base_url + "/api/chat", body)
        assert status == 200
        (record,) = proxy.wait_records(1)
        assert proxy.proxy._big_bodies._pool is not None  # the worker was started for it
    facts = describe_request("/api/chat", body, record_text=True)
    assert {name: getattr(record, name) for name in facts} == facts  # what decoding it here would have given
    assert record.model == "llava" and record.stream is False and record.num_ctx == 4096 and record.keep_alive == "10m"
    assert record.prompt_text == "user: what is this?" and record.prompt_chars == len("what is this?")  # no image kept
    assert record.error is None and record.outcome == "ok"


def test_a_request_body_the_worker_cannot_take_keeps_its_record_and_model(scripted: ScriptedUpstream) -> None:
    body = _vision_body()
    with run_proxy(scripted.base_url) as proxy:
        proxy.proxy._big_bodies = BigBodyDecoder(replace(proxy.proxy.limits, max_big_bodies_waiting=0))
        status, _ = _post(proxy.base_url + "/api/chat", body)
        assert status == 200
        (record,) = proxy.wait_records(1)
    assert record.model == "llava" and record.outcome == "ok"  # the model named at its start; the reply parsed
    assert record.num_ctx is None and record.prompt_chars is None  # unknown, never 0
    assert record.error is not None and record.error.startswith(
        f"request body not parsed (0 large bodies already waiting to be parsed (max_big_bodies_waiting)), {len(body)} bytes"
    )
