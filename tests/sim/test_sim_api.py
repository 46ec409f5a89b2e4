"""The official ollama client (0.6.3) against a real sim server on loopback."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import ollama
import pytest

from tests.support.sim_process import SimProcess

SMALL = "qwen2.5:0.5b"

pytestmark = pytest.mark.sim_args("--hardware", "rtx-4090", "--num-parallel", "2")


@pytest.fixture()
def client(sim: SimProcess) -> ollama.Client:
    return ollama.Client(host=sim.base_url, timeout=30)


def _http(sim: SimProcess, method: str, path: str, body: bytes | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(sim.base_url + path, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def test_root_and_version(sim: SimProcess) -> None:
    assert _http(sim, "GET", "/")[2] == "Ollama is running"
    status, ctype, body = _http(sim, "GET", "/api/version")
    assert status == 200 and ctype.startswith("application/json")
    assert json.loads(body) == {"version": "0.33.3"}
    assert _http(sim, "HEAD", "/api/version")[0] == 200


def test_generate_non_streaming(client: ollama.Client) -> None:
    r = client.generate(model=SMALL, prompt="Why is the sky blue?", options={"num_predict": 7})
    assert r.done and r.done_reason == "length"
    assert r.eval_count == 7
    assert r.response and r.response.strip()
    for name in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(getattr(r, name), int) and getattr(r, name) > 0, name
    assert r.context and all(isinstance(t, int) for t in r.context)
    assert r.total_duration >= r.load_duration + r.prompt_eval_duration + r.eval_duration  # type: ignore[operator]


def test_chat_streaming_parts(client: ollama.Client) -> None:
    parts = list(client.chat(model=SMALL, messages=[{"role": "user", "content": "hi"}], stream=True, options={"num_predict": 4}))
    assert [p.done for p in parts] == [False] * 4 + [True]
    assert all(p.message.role == "assistant" for p in parts)
    assert all(p.eval_count is None and p.total_duration is None for p in parts[:-1])
    assert parts[-1].eval_count == 4 and parts[-1].message.content == ""


def test_chat_non_streaming_concatenates(client: ollama.Client) -> None:
    r = client.chat(model=SMALL, messages=[{"role": "user", "content": "tell me"}], options={"num_predict": 5})
    assert r.message.content and len(r.message.content.split()) >= 3
    assert r.eval_count == 5


def test_list_show_ps_agree(client: ollama.Client) -> None:
    client.generate(model=SMALL, prompt="warm up", options={"num_predict": 1})
    listed = {m.model: m for m in client.list().models}
    assert "llama3.1:8b" in listed and SMALL in listed
    for m in listed.values():
        assert m.digest is not None and len(m.digest) == 64 and int(m.digest, 16) >= 0
    info = client.show("llama3.1:8b").modelinfo
    assert info is not None
    assert info["general.architecture"] == "llama"
    assert info["llama.block_count"] == 32 and info["llama.attention.head_count_kv"] == 8
    assert info["general.parameter_count"] == 8_030_261_312
    loaded = {m.model: m for m in client.ps().models}
    assert SMALL in loaded
    row = loaded[SMALL]
    assert row.digest == listed[SMALL].digest
    assert row.size_vram == row.size and row.context_length == 32768  # 24 GiB of VRAM: Ollama defaults to 32K
    assert row.expires_at is not None


@pytest.mark.parametrize(
    ("call", "status"),
    [
        (lambda c: c.generate(model="no-such-model", prompt="x"), 404),
        (lambda c: c.chat(model="no-such:model", messages=[{"role": "user", "content": "x"}]), 404),
        (lambda c: c.show("nothing:here"), 404),
    ],
)
def test_errors_raise_response_error(client: ollama.Client, call: Any, status: int) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        call(client)
    assert e.value.status_code == status
    assert "not found" in e.value.error


def test_bad_bodies_and_routes(sim: SimProcess) -> None:
    status, _, body = _http(sim, "POST", "/api/generate", b"")
    assert (status, json.loads(body)) == (400, {"error": "missing request body"})
    status, _, body = _http(sim, "POST", "/api/chat", b"x{")
    assert status == 400 and json.loads(body) == {"error": "invalid character 'x' looking for beginning of value"}
    assert _http(sim, "GET", "/api/nothing")[0:3:2] == (404, "404 page not found")
    assert _http(sim, "GET", "/api/generate")[0] == 405


def test_async_client_streams_chat(sim: SimProcess) -> None:
    async def run() -> list[ollama.ChatResponse]:
        client = ollama.AsyncClient(host=sim.base_url, timeout=30)
        stream = await client.chat(
            model=SMALL, messages=[{"role": "user", "content": "hi"}], stream=True, options={"num_predict": 3}
        )
        return [part async for part in stream]

    parts = asyncio.run(run())
    assert [p.done for p in parts] == [False, False, False, True]
    assert parts[-1].eval_count == 3


def test_keep_alive_zero_unloads_after_the_request(client: ollama.Client) -> None:
    r = client.chat(model="llama3.2", messages=[{"role": "user", "content": "bye"}], keep_alive=0, options={"num_predict": 2})
    assert r.done
    assert "llama3.2:latest" not in [m.model for m in client.ps().models]


def test_whitespace_raw_prompt_still_evaluates_one_token(client: ollama.Client) -> None:
    r = client.generate(model=SMALL, prompt="   ", raw=True, options={"num_predict": 2})
    assert r.prompt_eval_count == 1 and r.eval_count == 2
