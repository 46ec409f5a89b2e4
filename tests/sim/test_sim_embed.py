"""Embeddings on a real sim: ``/api/embed``, ``/api/embeddings`` and ``/v1/embeddings``, shapes, errors and timing.

An embed batch is prefill only; the reply's durations are measured like a generation's, and
``/sim/truth`` holds the load and the prefill (its start and end) to check them against.
"""

from __future__ import annotations

import math
import threading
from itertools import pairwise

import httpx
import ollama
import pytest

from sim import timing
from sim.catalog import BY_NAME
from sim.profiles import profile_by_key
from sim.tokens import count_tokens, make_prompt
from tests.support.sim_process import SimProcess, http_json, truth

EMBED = "nomic-embed-text"
HARDWARE = "rtx-3060"

pytestmark = pytest.mark.sim_args("--hardware", HARDWARE, "--num-parallel", "2")


@pytest.fixture()
def client(sim: SimProcess) -> ollama.Client:
    return ollama.Client(host=sim.base_url, timeout=30)


def _unload(sim: SimProcess, model: str) -> None:
    http_json(sim, "POST", "/api/generate", {"model": model, "keep_alive": 0})
    for _ in range(200):
        if not [m for m in http_json(sim, "GET", "/api/ps")[1]["models"] if m["name"].startswith(model)]:
            return
        httpx.get(sim.base_url + "/", timeout=5)
    raise AssertionError(f"{model} still loaded")


def _last_truth(sim: SimProcess, endpoint: str) -> dict:
    return [r for r in truth(sim) if r["endpoint"] == endpoint][-1]


def test_embed_a_batch_with_the_official_client(client: ollama.Client, sim: SimProcess) -> None:
    texts = [make_prompt(40, seed=1), make_prompt(200, seed=2), "short"]
    r = client.embed(model=EMBED, input=texts)
    assert r.model == EMBED
    assert len(r.embeddings) == 3
    assert all(len(v) == BY_NAME["nomic-embed-text:latest"].embedding_length for v in r.embeddings)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-4 for v in r.embeddings)
    assert r.prompt_eval_count == sum(count_tokens(t) + 2 for t in texts)
    assert r.total_duration and r.load_duration and r.total_duration >= r.load_duration
    rec = _last_truth(sim, "/api/embed")
    assert rec["kind"] == "embed" and rec["inputs"] == 3 and rec["status"] == 200
    assert rec["reported"] == {
        "total_duration": r.total_duration,
        "load_duration": r.load_duration,
        "prompt_eval_count": r.prompt_eval_count,
    }
    # The same text gives the same vector; another text another one.
    again = client.embed(model=EMBED, input=texts[2])
    assert again.embeddings[0] == r.embeddings[2] and again.embeddings[0] != r.embeddings[0]


def test_embed_load_and_prefill_match_the_truth(sim: SimProcess) -> None:
    _unload(sim, EMBED)
    texts = [make_prompt(300, seed=i) for i in range(6)]
    status, body = http_json(sim, "POST", "/api/embed", {"model": EMBED, "input": texts})
    assert status == 200, body
    rec = _last_truth(sim, "/api/embed")
    load_ns = rec["load_end_ns"] - rec["received_ns"]
    assert rec["load_start_ns"] is not None
    assert body["load_duration"] == pytest.approx(load_ns, rel=0.05)
    # The load reads the GGUF at the profile's disk speed (never faster).
    model, profile = BY_NAME["nomic-embed-text:latest"], profile_by_key(HARDWARE)
    assert rec["load_end_ns"] - rec["load_start_ns"] >= timing.load_seconds(model, profile) * 1e9 * 0.99
    prefill_ns = rec["embed_prefill_ns"]
    assert prefill_ns == rec["prefill_end_ns"] - rec["prefill_start_ns"] > 0
    # Batched prefill: 6 x 302 tokens in steps of 512, each input its own sequence; no faster than the floor.
    tokens_n = body["prompt_eval_count"]
    assert tokens_n == 6 * 302
    floor_s, pos = 0.0, 0
    lengths = [302] * 6
    while pos < tokens_n:
        n = min(512, tokens_n - pos)
        segs, start = [], 0
        for length in lengths:
            lo, hi = max(pos, start), min(pos + n, start + length)
            if hi > lo:
                segs.append((lo - start, hi - lo))
            start += length
        floor_s += timing.floor_seconds(model, profile, 1.0, timing.StepWork([], segs))
        pos += n
    assert prefill_ns >= floor_s * 1e9 * 0.99
    # What the reply does not carry is the truth's: total = load + (slot wait, prefill, overhead).
    assert body["total_duration"] >= body["load_duration"] + prefill_ns
    warm = http_json(sim, "POST", "/api/embed", {"model": EMBED, "input": texts})[1]
    warm_rec = _last_truth(sim, "/api/embed")
    assert warm_rec["load_start_ns"] is None
    assert warm["load_duration"] < body["load_duration"]


def test_embed_input_forms_and_errors(sim: SimProcess) -> None:
    status, body = http_json(sim, "POST", "/api/embed", {"model": EMBED, "input": "one text"})
    assert status == 200 and len(body["embeddings"]) == 1
    status, body = http_json(sim, "POST", "/api/embed", {"model": EMBED})
    assert status == 200 and body["embeddings"] == [] and "prompt_eval_count" not in body
    assert http_json(sim, "POST", "/api/embed", {"model": "nope", "input": "x"}) == (404, {"error": "model 'nope' not found"})
    assert http_json(sim, "POST", "/api/embed", {"model": EMBED, "input": 5}) == (400, {"error": "invalid input type"})
    long_text = make_prompt(3000)
    assert http_json(sim, "POST", "/api/embed", {"model": EMBED, "input": long_text, "truncate": False}) == (
        400,
        {"error": "input exceeds maximum context length"},
    )
    status, body = http_json(sim, "POST", "/api/embed", {"model": EMBED, "input": long_text})
    assert status == 200 and body["prompt_eval_count"] == BY_NAME["nomic-embed-text:latest"].context_length
    status, body = http_json(sim, "POST", "/api/embed", {"model": EMBED, "input": "x", "dimensions": 64})
    assert status == 200 and len(body["embeddings"][0]) == 64
    # Generative models embed too (as in Ollama), an embedding model does not generate.
    status, body = http_json(sim, "POST", "/api/embed", {"model": "qwen2.5:0.5b", "input": "x"})
    assert status == 200 and len(body["embeddings"][0]) == BY_NAME["qwen2.5:0.5b"].embedding_length
    assert http_json(sim, "POST", "/api/generate", {"model": EMBED, "prompt": "hi"}) == (
        400,
        {"error": f'"{EMBED}" does not support generate'},
    )
    assert http_json(sim, "POST", "/api/chat", {"model": EMBED, "messages": [{"role": "user", "content": "hi"}]}) == (
        400,
        {"error": f'"{EMBED}" does not support chat'},
    )


def test_legacy_embeddings_route(client: ollama.Client, sim: SimProcess) -> None:
    r = client.embeddings(model=EMBED, prompt="the older route")
    assert len(r.embedding) == 768
    rec = _last_truth(sim, "/api/embeddings")
    assert rec["kind"] == "embed" and rec["prompt_tokens"] == count_tokens("the older route") + 2
    status, body = http_json(sim, "POST", "/api/embeddings", {"model": EMBED, "prompt": ""})
    assert status == 200 and body == {"embedding": []}
    assert http_json(sim, "POST", "/api/embeddings", {"model": "nope", "prompt": "x"})[0] == 404


def test_openai_embeddings(sim: SimProcess) -> None:
    r = httpx.post(sim.base_url + "/v1/embeddings", json={"model": EMBED, "input": ["a b c", "d e"]}, timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == EMBED
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 768 for d in body["data"])
    assert body["usage"] == {"prompt_tokens": 5 + 4, "total_tokens": 5 + 4}
    rec = _last_truth(sim, "/v1/embeddings")
    assert rec["reported"]["prompt_eval_count"] == 9 and rec["inputs"] == 2
    b64 = httpx.post(sim.base_url + "/v1/embeddings", json={"model": EMBED, "input": "x", "encoding_format": "base64"}).json()
    assert isinstance(b64["data"][0]["embedding"], str)
    bad = httpx.post(sim.base_url + "/v1/embeddings", json={"model": EMBED, "input": ""})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.post(sim.base_url + "/v1/embeddings", json={"model": "nope", "input": "x"})
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "model 'nope' not found",
        "type": "not_found_error",
        "param": None,
        "code": None,
    }


def test_embed_shares_batch_steps_with_a_decoding_slot(sim: SimProcess) -> None:
    """An embed batch on a model that is generating runs in the same steps: the decode slows while it prefills."""
    model = "qwen2.5:0.5b"
    http_json(sim, "POST", "/api/generate", {"model": model})
    out: dict[str, object] = {}

    def generate() -> None:
        out["gen"] = http_json(
            sim,
            "POST",
            "/api/generate",
            {"model": model, "prompt": "go", "stream": False, "options": {"num_predict": 400}},
            timeout_s=60,
        )

    worker = threading.Thread(target=generate)
    worker.start()
    for _ in range(500):  # wait until it decodes
        recs = [r for r in truth(sim) if r["endpoint"] == "/api/generate" and r["prompt_tokens"] and r["done_ns"] is None]
        if recs and len(recs[-1]["token_sampled_ns"]) > 20:
            break
        httpx.get(sim.base_url + "/", timeout=5)
    texts = [make_prompt(500, seed=i) for i in range(8)]
    status, _ = http_json(sim, "POST", "/api/embed", {"model": model, "input": texts})
    worker.join(60)
    assert status == 200 and out["gen"][0] == 200  # type: ignore[index]
    emb = _last_truth(sim, "/api/embed")
    gen = [r for r in truth(sim) if r["endpoint"] == "/api/generate" and r["prompt_tokens"]][-1]
    stamps = gen["token_sampled_ns"]
    assert stamps[0] < emb["prefill_start_ns"] < emb["prefill_end_ns"] < stamps[-1]
    during = [b - a for a, b in pairwise(stamps) if emb["prefill_start_ns"] < b <= emb["prefill_end_ns"]]
    before = [b - a for a, b in pairwise(stamps) if b < emb["prefill_start_ns"]][-10:]
    assert during and before
    # Steps that carry 512 prompt tokens beside the decode take longer than decode-only steps.
    assert sorted(during)[len(during) // 2] > sorted(before)[len(before) // 2]
