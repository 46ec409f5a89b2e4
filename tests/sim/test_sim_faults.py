"""sim's one-shot fault switches (POST /sim/faults), seen through the official client and raw HTTP."""

from __future__ import annotations

import http.client
import itertools
import json
from typing import Any

import httpx
import ollama
import pytest

from tests.support.sim_process import SimProcess, http_json, truth, truth_by_id

SMALL = "qwen2.5:0.5b"

pytestmark = pytest.mark.sim_args("--hardware", "rtx-3090")


@pytest.fixture()
def client(sim: SimProcess) -> ollama.Client:
    http_json(sim, "DELETE", "/sim/faults")
    return ollama.Client(host=sim.base_url, timeout=30)


def raw_lines(sim: SimProcess, body: dict[str, object]) -> list[bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    try:
        conn.request("POST", "/api/generate", json.dumps(body))
        r = conn.getresponse()
        assert r.status == 200
        return r.read().split(b"\n")
    except http.client.IncompleteRead as e:
        return bytes(e.partial).split(b"\n")
    finally:
        conn.close()


def test_faults_are_validated_and_readable(sim: SimProcess, client: ollama.Client) -> None:
    assert http_json(sim, "POST", "/sim/faults", {"stall_ms": "x"})[0] == 400
    assert http_json(sim, "POST", "/sim/faults", {"explode": 1})[0] == 400
    assert http_json(sim, "GET", "/sim/faults") == (200, {})
    assert http_json(sim, "POST", "/sim/faults", {"cut_after_tokens": 2}) == (200, {"cut_after_tokens": 2})
    assert http_json(sim, "GET", "/sim/faults") == (200, {"cut_after_tokens": 2})


def test_fail_next_load_is_a_500_once(sim: SimProcess, client: ollama.Client) -> None:
    msg = "llama-server process has terminated: exit status 2"
    http_json(sim, "POST", "/sim/faults", {"fail_next_load": msg})
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="llama3.2", prompt="x")
    assert (e.value.status_code, e.value.error) == (500, msg)
    assert client.generate(model="llama3.2", prompt="x", options={"num_predict": 1}).done  # one-shot


def test_error_line_mid_stream_raises_response_error(client: ollama.Client, sim: SimProcess) -> None:
    http_json(sim, "POST", "/sim/faults", {"error_after_tokens": 3})
    got: list[str] = []
    with pytest.raises(ollama.ResponseError) as e:
        for part in client.generate(model=SMALL, prompt="x", stream=True, options={"num_predict": 20}):
            got.append(part.response or "")
    assert e.value.status_code == -1 and "unexpectedly stopped" in e.value.error
    assert len(got) == 3


def test_cut_stream_has_no_final_chunk(sim: SimProcess, client: ollama.Client) -> None:
    http_json(sim, "POST", "/sim/faults", {"cut_after_tokens": 4})
    lines = [ln for ln in raw_lines(sim, {"model": SMALL, "prompt": "x", "options": {"num_predict": 30}}) if ln]
    objs = [json.loads(ln) for ln in lines]
    assert len(objs) == 4 and not any(o["done"] for o in objs)
    with pytest.raises(httpx.HTTPError):
        http_json(sim, "POST", "/sim/faults", {"cut_after_tokens": 1})
        list(client.generate(model=SMALL, prompt="y", stream=True, options={"num_predict": 30}))


def test_cut_inside_a_token_sends_its_text_unfinished(sim: SimProcess) -> None:
    http_json(sim, "POST", "/sim/faults", {"cut_inside_token_after_tokens": 3})
    lines = [ln for ln in raw_lines(sim, {"model": SMALL, "prompt": "x", "options": {"num_predict": 30}}) if ln]
    assert len(lines) == 4 and not any(json.loads(ln)["done"] for ln in lines[:3])
    assert b'"response":"' in lines[3] and not lines[3].endswith(b"}")  # the text went out, the line never ended
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[3])


def test_malformed_line(sim: SimProcess, client: ollama.Client) -> None:
    http_json(sim, "POST", "/sim/faults", {"malformed_after_tokens": 2})
    lines = [ln for ln in raw_lines(sim, {"model": SMALL, "prompt": "x", "options": {"num_predict": 30}}) if ln]
    assert len(lines) == 3
    json.loads(lines[0])
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[2])


def test_stall_delays_the_chosen_token_and_is_reported(sim: SimProcess, client: ollama.Client) -> None:
    http_json(sim, "POST", "/sim/faults", {"stall_ms": 400, "stall_after_tokens": 3})
    r = client.generate(model=SMALL, prompt="stall me", options={"num_predict": 6})
    assert r.eval_duration is not None and r.eval_duration >= 400_000_000
    rec = [x for x in truth(sim) if x["reported"].get("eval_count") == 6][-1]
    t = rec["token_sampled_ns"]
    gaps = [b - a for a, b in itertools.pairwise(t)]
    assert gaps.index(max(gaps)) == 1  # between token 2 and token 3
    assert max(gaps) >= 400_000_000
    assert http_json(sim, "GET", "/sim/faults") == (200, {})


def post_stream(sim: SimProcess, path: str, body: dict[str, object]) -> tuple[int, str, bytes]:
    """(status, X-Sim-Request-Id, whole body) of one raw POST."""
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.getheader("X-Sim-Request-Id") or "", r.read()
    finally:
        conn.close()


RUNNER_STOPPED_TEXT = "model runner has unexpectedly stopped"
# The same request on each route: what the client reads as content, and what ends the stream.
ROUTES: dict[str, tuple[str, dict[str, object]]] = {
    "native": ("/api/generate", {"model": SMALL, "prompt": "x", "options": {"num_predict": 20}}),
    "openai": ("/v1/completions", {"model": SMALL, "prompt": "x", "max_tokens": 20, "stream": True}),
}


def stream_items(route: str, raw: bytes) -> tuple[list[str], dict[str, Any]]:
    """(content texts, the last object) of an NDJSON or SSE body."""
    if route == "native":
        objs = [json.loads(ln) for ln in raw.split(b"\n") if ln]
        return [o["response"] for o in objs[:-1]], objs[-1]
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    objs = [json.loads(e) for e in events if e != b"[DONE]"]
    return [o["choices"][0]["text"] for o in objs[:-1]], objs[-1]


@pytest.mark.parametrize("route", list(ROUTES))
def test_engine_bug_mid_stream_ends_every_route_like_a_crashed_runner(sim: SimProcess, route: str) -> None:
    path, body = ROUTES[route]
    http_json(sim, "DELETE", "/sim/faults")
    http_json(sim, "POST", "/sim/faults", {"raise_after_tokens": 3})
    status, rid, raw = post_stream(sim, path, body)
    texts, last = stream_items(route, raw)
    assert status == 200 and len(texts) == 3
    error = last["error"]
    message = error if isinstance(error, str) else error["message"]
    assert RUNNER_STOPPED_TEXT in message
    if route == "openai":
        assert not raw.endswith(b"data: [DONE]\n\n")
    rec = truth_by_id(sim, rid)
    assert rec["status"] == 200 and rec["done_ns"] is not None and not rec["cancelled"]
    assert "RuntimeError: fault: engine bug after 3 tokens" in rec["error"]
    assert len(rec["token_written_ns"]) == 3
    assert "Traceback" in sim.log() and "fault: engine bug" in sim.log()
    # The slot was freed: the next request on the same route completes.
    status, _, raw = post_stream(sim, path, body)
    texts, last = stream_items(route, raw)
    assert status == 200 and "error" not in last and len(texts) >= 1


@pytest.mark.parametrize("route", list(ROUTES))
def test_engine_bug_before_the_first_token_is_a_500(sim: SimProcess, route: str) -> None:
    path, body = ROUTES[route]
    http_json(sim, "POST", "/sim/faults", {"raise_after_tokens": 0})
    status, rid, raw = post_stream(sim, path, body)
    error = json.loads(raw)["error"]
    assert status == 500
    assert RUNNER_STOPPED_TEXT in (error if route == "native" else error["message"])
    if route == "openai":
        assert error["type"] == "api_error"
    rec = truth_by_id(sim, rid)
    assert rec["status"] == 500 and rec["done_ns"] is not None


def test_stream_faults_apply_to_the_openai_route(sim: SimProcess) -> None:
    path, body = ROUTES["openai"]
    http_json(sim, "POST", "/sim/faults", {"error_after_tokens": 2})
    status, _, raw = post_stream(sim, path, body)
    texts, last = stream_items("openai", raw)
    assert status == 200 and len(texts) == 2
    assert RUNNER_STOPPED_TEXT in last["error"]["message"]
