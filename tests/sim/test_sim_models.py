"""The model store on a real sim: pull, push, create, copy, delete, and OpenAI's /v1/models, via the official clients."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from sim.catalog import BY_NAME
from tests.support.sim_process import SimProcess, http_json

pytestmark = pytest.mark.sim_args("--hardware", "rtx-4090", "--disk-gbs", "60")


@pytest.fixture()
def client(sim: SimProcess) -> ollama.Client:
    return ollama.Client(host=sim.base_url, timeout=30)


def _names(client: ollama.Client) -> list[str]:
    return [m.model or "" for m in client.list().models]


def test_pull_streams_progress(client: ollama.Client, sim: SimProcess) -> None:
    parts = list(client.pull("llama3.2", stream=True))
    statuses = [p.status for p in parts]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    layer = [p for p in parts if p.digest]
    assert layer and all(p.digest and p.digest.startswith("sha256:") and p.total for p in layer)
    weights = [p for p in layer if p.total == BY_NAME["llama3.2:latest"].size_bytes]
    assert weights[-1].completed == weights[-1].total
    assert [p.completed or 0 for p in weights] == sorted(p.completed or 0 for p in weights)
    assert weights[0].status == "pulling " + weights[0].digest[7:19]  # type: ignore[index]
    assert client.pull("llama3.2").status == "success"  # stream=False: the last status only


def test_pull_unknown_model(client: ollama.Client, sim: SimProcess) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("no-such-model")
    assert e.value.status_code == 500 and e.value.error == "pull model manifest: file does not exist"
    with httpx.stream("POST", sim.base_url + "/api/pull", json={"model": "no-such-model"}) as r:
        assert r.status_code == 200
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines == [{"status": "pulling manifest"}, {"error": "pull model manifest: file does not exist"}]
    assert http_json(sim, "POST", "/api/pull", {"model": ""}) == (400, {"error": "invalid model name"})


def test_copy_create_delete(client: ollama.Client, sim: SimProcess) -> None:
    assert client.copy("qwen2.5:0.5b", "my-copy").status == "success"
    assert "my-copy:latest" in _names(client)
    # A copy is the same model under another name: it runs.
    r = client.generate(model="my-copy", prompt="hi", options={"num_predict": 3})
    assert r.eval_count == 3
    with pytest.raises(ollama.ResponseError) as e:
        client.copy("nope", "x")
    assert e.value.status_code == 404 and e.value.error == 'model "nope" not found'
    assert http_json(sim, "POST", "/api/copy", {"source": "qwen2.5:0.5b", "destination": ""}) == (
        400,
        {"error": 'destination "" is invalid'},
    )

    parts = list(client.create(model="my-model", from_="llama3.2", system="Be brief.", stream=True))
    assert parts[-1].status == "success" and parts[-2].status == "writing manifest"
    assert any((p.status or "").startswith("using existing layer sha256:") for p in parts)
    assert any((p.status or "").startswith("creating new layer sha256:") for p in parts)
    assert "my-model:latest" in _names(client)
    assert client.show("my-model").details.family == "llama"  # type: ignore[union-attr]
    assert http_json(sim, "POST", "/api/create", {"model": "x", "stream": False}) == (
        400,
        {"error": "neither 'from' or 'files' was specified"},
    )
    assert http_json(sim, "POST", "/api/create", {"model": "x", "from": "nope", "stream": False}) == (
        500,
        {"error": "pull model manifest: file does not exist"},
    )
    assert http_json(sim, "POST", "/api/create", {"model": "x", "from": "llama3.2", "quantize": "q4_K_M", "stream": False}) == (
        500,
        {"error": "quantization is only supported for F16 and F32 models"},
    )

    assert client.delete("my-copy").status == "success"
    assert client.delete("my-model").status == "success"
    assert "my-copy:latest" not in _names(client) and "my-model:latest" not in _names(client)
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("my-copy")
    assert e.value.status_code == 404 and e.value.error == "model 'my-copy' not found"
    # Deleting a library model hides it until it is pulled again.
    assert client.delete("llama3.1:70b").status == "success"
    assert "llama3.1:70b" not in _names(client)
    assert http_json(sim, "POST", "/api/generate", {"model": "llama3.1:70b", "prompt": "x"})[0] == 404
    client.pull("llama3.1:70b")
    assert "llama3.1:70b" in _names(client)


def test_push(client: ollama.Client, sim: SimProcess) -> None:
    parts = list(client.push("qwen2.5:0.5b", stream=True))
    assert parts[0].status == "retrieving manifest" and parts[-1].status == "success"
    assert any((p.status or "").startswith("pushing ") and p.digest for p in parts)
    with pytest.raises(ollama.ResponseError) as e:
        client.push("nope")
    assert e.value.status_code == 404


def test_openai_models(sim: SimProcess) -> None:
    body = httpx.get(sim.base_url + "/v1/models").json()
    assert body["object"] == "list"
    ids = [m["id"] for m in body["data"]]
    assert "llama3.2:latest" in ids and "qwen3:0.6b" in ids
    assert all(m["object"] == "model" and m["owned_by"] == "library" and isinstance(m["created"], int) for m in body["data"])
    one = httpx.get(sim.base_url + "/v1/models/llama3.2:latest")
    assert one.status_code == 200 and one.json()["id"] == "llama3.2:latest" and one.json()["object"] == "model"
    missing = httpx.get(sim.base_url + "/v1/models/nope")
    assert missing.status_code == 404
    err = {"message": "model 'nope' not found", "type": "not_found_error", "param": None, "code": None}
    assert missing.json() == {"error": err}


def test_load_and_unload_requests_carry_the_load_time(sim: SimProcess) -> None:
    http_json(sim, "POST", "/api/generate", {"model": "qwen2.5:0.5b", "keep_alive": 0})
    for _ in range(100):
        if all(m["name"] != "qwen2.5:0.5b" for m in http_json(sim, "GET", "/api/ps")[1]["models"]):
            break
    r = httpx.post(sim.base_url + "/api/generate", json={"model": "qwen2.5:0.5b"}, timeout=30)
    assert r.json()["done_reason"] == "load"
    rec = http_json(sim, "GET", "/sim/truth?id=" + r.headers["X-Sim-Request-Id"])[1]["requests"][0]
    assert rec["kind"] == "load"
    size, disk_bytes_s = BY_NAME["qwen2.5:0.5b"].size_bytes, 60e9
    assert rec["load_end_ns"] - rec["load_start_ns"] >= size / disk_bytes_s * 1e9 * 0.99
    assert rec["received_ns"] <= rec["load_start_ns"] < rec["load_end_ns"] <= rec["done_ns"]
    warm = httpx.post(sim.base_url + "/api/chat", json={"model": "qwen2.5:0.5b"}, timeout=30)
    warm_rec = http_json(sim, "GET", "/sim/truth?id=" + warm.headers["X-Sim-Request-Id"])[1]["requests"][0]
    assert warm_rec["kind"] == "load" and warm_rec["load_start_ns"] is None
    off = httpx.post(sim.base_url + "/api/generate", json={"model": "qwen2.5:0.5b", "keep_alive": 0}, timeout=30)
    assert off.json()["done_reason"] == "unload"
    off_rec = http_json(sim, "GET", "/sim/truth?id=" + off.headers["X-Sim-Request-Id"])[1]["requests"][0]
    assert off_rec["kind"] == "unload" and off_rec["load_start_ns"] is None
