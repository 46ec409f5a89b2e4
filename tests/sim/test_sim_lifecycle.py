"""Model lifecycle in sim: keep-alive, offload, the virtual GPU, clients that go away."""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any

import ollama
import pytest

from sim.catalog import BY_NAME
from sim.engine import GRAPH_BYTES
from sim.profiles import PROFILES
from tests.support.sim_process import SimProcess, http_json, start_sim, truth, truth_by_id
from tests.support.waiting import wait_until

SMALL = "qwen2.5:0.5b"


def ps_names(sim: SimProcess) -> list[str]:
    return [m["name"] for m in http_json(sim, "GET", "/api/ps")[1]["models"]]


@pytest.mark.slow
def test_keep_alive_expiry_and_request_override() -> None:
    # 2 s: the check right after the first request must come before the expiry, even on a busy machine.
    with start_sim("--keep-alive", "2s") as sim:
        client = ollama.Client(host=sim.base_url, timeout=30)
        client.generate(model=SMALL, prompt="hi", options={"num_predict": 2})
        assert ps_names(sim) == [SMALL]
        wait_until(lambda: ps_names(sim) == [], 20)  # server default 2 s
        # A request's keep_alive sticks to the runner: -1 = forever, later requests without it keep it.
        client.generate(model=SMALL, prompt="hi", keep_alive=-1, options={"num_predict": 1})
        client.generate(model=SMALL, prompt="again", options={"num_predict": 1})
        time.sleep(3)  # past the server's default
        rows = client.ps().models
        assert [m.model for m in rows] == [SMALL]
        assert rows[0].expires_at is not None and rows[0].expires_at.year > 2200
        client.generate(model=SMALL, prompt="", keep_alive="300ms")
        wait_until(lambda: ps_names(sim) == [], 20)


def test_big_model_is_partly_offloaded_and_slower() -> None:
    with start_sim("--hardware", "rtx-3090", "--disk-gbs", "100") as sim:
        client = ollama.Client(host=sim.base_url, timeout=60)
        client.generate(model="llama3.1:8b", prompt="", keep_alive="10m")
        client.generate(model="llama3.1:70b", prompt="")
        rows = {m.model: m for m in client.ps().models}
        big = rows["llama3.1:70b"]
        assert big.size is not None and big.size_vram is not None
        assert 0 < big.size_vram < big.size  # does not fit in 24 GB: partial CPU offload
        # The idle 8B was evicted to make room, as Ollama's scheduler does.
        assert "llama3.1:8b" not in rows
        assert big.size_vram <= PROFILES["rtx-3090"].vram_bytes
        r = client.generate(model="llama3.1:70b", prompt="one", options={"num_predict": 3})
        assert r.eval_duration is not None and r.eval_count == 3
        decode_tok_s = 2 / (r.eval_duration / 1e9)
        full_vram_ceiling = PROFILES["rtx-3090"].spec.bandwidth_bytes_s / BY_NAME["llama3.1:70b"].size_bytes
        assert decode_tok_s < full_vram_ceiling / 3  # offloaded layers stream from system RAM


@pytest.mark.slow
def test_virtual_gpu_moves_with_work() -> None:
    with start_sim("--hardware", "rtx-4090", "--disk-gbs", "50") as sim:
        idle = http_json(sim, "GET", "/sim/gpu")[1]
        assert idle["simulated"] is True
        g0 = idle["gpus"][0]
        assert g0["name"] == "Simulated NVIDIA GeForce RTX 4090" and g0["simulated"] is True
        assert g0["util_gpu_pct"] == 0 and g0["mem_clock_max_mhz"] == 10501 and g0["mem_bus_width_bits"] == 384
        # Theoretical bandwidth from the reported clock and bus width matches the spec (docs/physics.md §8).
        assert abs(2 * g0["mem_clock_max_mhz"] * 1e6 * g0["mem_bus_width_bits"] / 8 - 1008e9) < 1e9
        client = ollama.Client(host=sim.base_url, timeout=30)
        # Read while it still generates: utilization covers the last second, which a busy machine can let
        # pass between the end of a short generation and the next request.
        busy: dict[str, Any] = {}
        for i, _ in enumerate(client.generate(model="llama3.1:8b", prompt="work", stream=True, options={"num_predict": 200})):
            if i == 100:
                busy = http_json(sim, "GET", "/sim/gpu")[1]["gpus"][0]
        assert busy["util_gpu_pct"] > 20
        assert busy["power_w"] > g0["power_w"] + 50
        assert busy["mem_used_bytes"] > g0["mem_used_bytes"] + BY_NAME["llama3.1:8b"].size_bytes
        assert busy["sm_clock_mhz"] > g0["sm_clock_mhz"] and busy["pstate"] < g0["pstate"]
        assert busy["total_energy_mj"] > g0["total_energy_mj"]
        assert busy["power_w"] <= busy["power_limit_w"]
    with start_sim("--hardware", "cpu") as sim:
        assert http_json(sim, "GET", "/sim/gpu")[1] == {"simulated": True, "gpus": []}


def test_client_disconnect_frees_the_slot_at_once() -> None:
    with start_sim("--hardware", "rtx-3090", "--num-parallel", "1", "--disk-gbs", "50") as sim:
        client = ollama.Client(host=sim.base_url, timeout=30)
        client.generate(model="llama3.1:8b", prompt="")
        # A long answer (~10 s at ~120 tok/s); read three lines, then hang up.
        sock = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
        body = json.dumps({"model": "llama3.1:8b", "prompt": "long one", "options": {"num_predict": 1200}}).encode()
        sock.sendall(
            b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        buf = b""
        while buf.count(b"\n") < 12:  # headers plus a few chunk lines
            buf += sock.recv(4096)
        sock.close()
        t_closed = time.monotonic_ns()
        r = client.generate(model="llama3.1:8b", prompt="next", options={"num_predict": 3})
        assert r.total_duration is not None and r.total_duration < 1_000_000_000
        recs = [x for x in truth(sim) if x["endpoint"] == "/api/generate" and x["prompt_tokens"]]
        gone = next(x for x in recs if x["cancelled"])
        assert gone["done_ns"] is not None and gone["done_ns"] - t_closed < 1_000_000_000
        assert len(gone["token_sampled_ns"]) < 200


@pytest.mark.slow
def test_slot_waiter_that_leaves_is_not_served() -> None:
    with start_sim("--hardware", "rtx-3090", "--num-parallel", "1", "--disk-gbs", "50") as sim:
        client = ollama.Client(host=sim.base_url, timeout=30)
        client.generate(model="llama3.1:8b", prompt="")
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
        conn.request("POST", "/api/generate", json.dumps({"model": "llama3.1:8b", "prompt": "a", "options": {"num_predict": 80}}))
        time.sleep(0.1)
        waiter = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
        body = json.dumps({"model": "llama3.1:8b", "prompt": "b", "options": {"num_predict": 500}}).encode()
        waiter.sendall(
            b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        time.sleep(0.1)
        waiter.close()  # leaves while waiting for the slot
        resp = conn.getresponse()
        assert resp.status == 200
        assert json.loads(resp.read().splitlines()[-1])["eval_count"] == 80
        conn.close()
        r = client.generate(model="llama3.1:8b", prompt="c", options={"num_predict": 2})
        # c did not have to wait for b's 500 tokens.
        assert r.total_duration is not None and r.total_duration < 1_500_000_000
        cancelled = [x for x in truth(sim) if x["cancelled"]]
        assert len(cancelled) == 1
        assert cancelled[0]["token_sampled_ns"] == [] and cancelled[0]["slot_acquired_ns"] is None


def test_load_goes_on_when_the_client_leaves() -> None:
    with start_sim("--hardware", "rtx-3090", "--disk-gbs", "5") as sim:  # 8B: ~1 s to load
        sock = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
        body = json.dumps({"model": "llama3.1:8b", "prompt": "hi"}).encode()
        sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.2)
        sock.close()
        wait_until(lambda: ps_names(sim) == ["llama3.1:8b"], 10)
        rec = truth(sim)[0]
        assert rec["cancelled"] and rec["load_end_ns"] - rec["load_start_ns"] > 800_000_000


def test_num_gpu_zero_runs_on_the_cpu_and_reloads() -> None:
    with start_sim("--hardware", "rtx-4090", "--disk-gbs", "50") as sim:
        client = ollama.Client(host=sim.base_url, timeout=60)
        gpu = client.generate(model="llama3.2", prompt="hi", options={"num_predict": 6})
        assert client.ps().models[0].size_vram == client.ps().models[0].size
        cpu = client.generate(model="llama3.2", prompt="hi", options={"num_predict": 6, "num_gpu": 0})
        assert cpu.load_duration is not None and cpu.load_duration > 30_000_000  # reloaded: ~40 ms from a 50 GB/s disk
        row = client.ps().models[0]
        assert row.size_vram == 0 and row.size is not None and row.size > 0
        assert cpu.eval_duration is not None and gpu.eval_duration is not None
        assert cpu.eval_duration > 5 * gpu.eval_duration  # system RAM is far slower than GDDR6X
        half = client.generate(model="llama3.2", prompt="hi", options={"num_predict": 2, "num_gpu": 14})
        assert half.done
        row = client.ps().models[0]
        assert row.size is not None and row.size_vram is not None
        # 14 of 28 whole layers, plus the compute buffers, which go to the GPU first (as in Ollama).
        per_layer = (row.size - GRAPH_BYTES) / 28
        assert row.size_vram == pytest.approx(GRAPH_BYTES + 14 * per_layer, rel=0.001)


def test_truth_query_by_id_and_time() -> None:
    with start_sim() as sim:
        client = ollama.Client(host=sim.base_url, timeout=30)
        client.generate(model=SMALL, prompt="one", options={"num_predict": 1})
        mid = time.monotonic_ns()
        client.generate(model=SMALL, prompt="two", options={"num_predict": 1})
        later = http_json(sim, "GET", f"/sim/truth?after_ns={mid}")[1]["requests"]
        assert len(later) == 1 and later[0]["received_ns"] > mid
        assert truth_by_id(sim, later[0]["id"]) == later[0]
        assert http_json(sim, "GET", "/sim/truth?id=nope")[0] == 404
        assert http_json(sim, "GET", "/sim/truth?after_ns=x")[0] == 400
        assert http_json(sim, "DELETE", "/sim/truth")[0] == 200 and truth(sim) == []
