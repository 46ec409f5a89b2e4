"""sim plays a cloud model as Ollama serves one (issue 41, docs/ollama-api.md §15): listed with ``remote_model`` and
``remote_host``, never in ``/api/ps``; a chat or generate is answered as ollama.com answers (the remote model's name,
a final chunk with the total and the counts, no duration of a local phase), with no load and no runner, and Ollama's
log has the access line only. The official ``ollama`` client reads every reply."""

from __future__ import annotations

import json
from typing import Any

import httpx
import ollama
import openai
import pytest

from sim.cloud import remote_name
from tests.support.sim_process import SimProcess, start_sim, truth_by_id

CLOUD = "gpt-oss:120b-cloud"
COLON_CLOUD = "glm-4.6:cloud"
LOCAL = "qwen2.5:0.5b"

pytestmark = pytest.mark.sim_args("--disk-gbs", "60", "--cloud-model", CLOUD, "--cloud-model", COLON_CLOUD)

LOCAL_DURATIONS = ("load_duration", "prompt_eval_duration", "eval_duration")


def test_remote_name_takes_the_suffix_off() -> None:
    assert remote_name("gpt-oss:120b-cloud") == "gpt-oss:120b"
    assert remote_name("glm-4.6:cloud") == "glm-4.6"
    assert remote_name("GLM-4.6:CLOUD") == "GLM-4.6"


def test_listed_with_where_it_runs_and_never_loaded(sim: SimProcess) -> None:
    rows = {m["name"]: m for m in httpx.get(sim.base_url + "/api/tags", timeout=10).json()["models"]}
    assert rows[CLOUD]["remote_model"] == "gpt-oss:120b" and rows[CLOUD]["remote_host"] == "https://ollama.com:443"
    assert rows[COLON_CLOUD]["remote_model"] == "glm-4.6"
    assert rows[CLOUD]["size"] < 4096  # a manifest, no weights here
    assert "remote_host" not in rows[LOCAL]
    assert rows[CLOUD]["details"]["family"] == ""  # no library model of that name in sim's catalog
    show = httpx.post(sim.base_url + "/api/show", json={"model": CLOUD}, timeout=10).json()
    assert show["remote_model"] == "gpt-oss:120b" and show["remote_host"] == "https://ollama.com:443"
    ollama.Client(sim.base_url).chat(CLOUD, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
    assert httpx.get(sim.base_url + "/api/ps", timeout=10).json() == {"models": []}


def test_streamed_chat_as_ollama_passes_it_on(sim: SimProcess) -> None:
    body = {"model": CLOUD, "messages": [{"role": "user", "content": "tell me about rivers"}], "options": {"num_predict": 12}}
    with httpx.stream("POST", sim.base_url + "/api/chat", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
        rid = r.headers["X-Sim-Request-Id"]
    *chunks, final = lines
    assert len(chunks) == 12 and all(c["model"] == "gpt-oss:120b" and c["message"]["content"] for c in chunks)
    assert final["done"] is True and final["done_reason"] == "length" and final["eval_count"] == 12
    assert final["prompt_eval_count"] > 0 and final["total_duration"] > 0
    assert not any(k in final for k in LOCAL_DURATIONS)
    truth = truth_by_id(sim, rid)
    assert truth["kind"] == "cloud" and truth["load_start_ns"] is None and truth["prefill_start_ns"] is None
    assert len(truth["token_written_ns"]) == 12 and truth["reported"]["eval_count"] == 12
    # A round trip and ollama.com's queue before the first token, then one token per decode step.
    first = truth["token_written_ns"][0] - truth["received_ns"]
    gaps = [b - a for a, b in zip(truth["token_written_ns"], truth["token_written_ns"][1:], strict=False)]
    assert first > 200_000_000 and min(gaps) > 5_000_000


def test_whole_generate_and_the_ollama_client(sim: SimProcess) -> None:
    client = ollama.Client(sim.base_url)
    whole = client.generate(CLOUD, "why is the sky blue?", stream=False, options={"num_predict": 5})
    assert whole.done and whole.eval_count == 5 and whole.model == "gpt-oss:120b" and len((whole.response or "").split()) == 5
    assert whole.load_duration is None and whole.eval_duration is None and whole.total_duration
    parts = list(client.chat(COLON_CLOUD, messages=[{"role": "user", "content": "hi"}], stream=True))
    assert parts[-1].done and parts[-1].model == "glm-4.6" and parts[-1].eval_count == len(parts) - 1


def test_no_runner_only_the_access_line(sim: SimProcess) -> None:
    before = len(sim.log().splitlines())
    r = httpx.post(
        sim.base_url + "/api/chat",
        json={"model": CLOUD, "messages": [{"role": "user", "content": "hi"}], "stream": False, "options": {"num_predict": 3}},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["eval_count"] == 3
    new = sim.log().splitlines()[before:]
    mine = [line for line in new if '"/api/chat"' in line]
    assert len(mine) == 1 and mine[0].startswith("[GIN]") and "| 200 |" in mine[0]
    assert not any("llama-server" in line or "load" in line.lower() for line in new)


def test_only_cloud_names_are_cloud_models() -> None:
    from sim.__main__ import parse_args

    assert parse_args(["--cloud-model", CLOUD]).cloud_model == [CLOUD]
    with pytest.raises(SystemExit):
        parse_args(["--cloud-model", "qwen2.5:0.5b"])


def test_a_cloud_model_of_a_library_model_shows_its_architecture() -> None:
    with start_sim("--cloud-model", "qwen2.5:0.5b-cloud") as sim:
        show = httpx.post(sim.base_url + "/api/show", json={"model": "qwen2.5:0.5b-cloud"}, timeout=10).json()
        local = httpx.post(sim.base_url + "/api/show", json={"model": LOCAL}, timeout=10).json()
    assert show["model_info"] == local["model_info"] and show["details"]["family"] == local["details"]["family"]
    assert show["remote_model"] == LOCAL


def test_an_unknown_cloud_model_is_not_found(sim: SimProcess) -> None:
    r = httpx.post(sim.base_url + "/api/chat", json={"model": "nope:cloud", "messages": []}, timeout=10)
    assert r.status_code == 404


def test_openai_chat_to_a_cloud_model_as_ollama_passes_it_on(sim: SimProcess) -> None:
    client = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="ollama", timeout=60, max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    chunks = list(
        client.chat.completions.create(
            model=CLOUD, messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
    )
    assert all(c.model == "gpt-oss:120b" for c in chunks)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 6
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 6 and usage.prompt_tokens > 0
    whole = client.chat.completions.create(model=CLOUD, messages=messages, max_tokens=4)
    assert whole.usage is not None and whole.usage.completion_tokens == 4 and whole.model == "gpt-oss:120b"
    assert httpx.get(sim.base_url + "/api/ps", timeout=10).json() == {"models": []}
