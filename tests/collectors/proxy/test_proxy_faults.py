"""Faults through the proxy: Ollama down, streams cut, error lines, garbage, clients leaving, stopping."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import ollama
import pytest

from analysis.records import Outcome, RequestRecord
from collectors.proxy.recording import RECORD_ID_HEADER
from tests.support.ports import free_port
from tests.support.proxy_thread import ProxyThread, run_proxy, sim_truth
from tests.support.sim_process import SimFactory, SimProcess
from tests.support.waiting import wait_until

SMALL = "qwen2.5:0.5b"


@pytest.fixture(scope="module")
def sim(start_sims: SimFactory) -> SimProcess:
    # One slot, so a test can see a request queue behind another and the slot come free.
    s = start_sims("--hardware", "rtx-3060", "--num-parallel", "1")
    ollama.Client(host=s.base_url, timeout=30).generate(model=SMALL, prompt="warm up", options={"num_predict": 1})
    return s


def fault(sim: SimProcess, **switches: Any) -> None:
    httpx.post(sim.base_url + "/sim/faults", json=switches, timeout=10).raise_for_status()


def stream_lines(
    base: str, body: dict[str, Any], path: str = "/api/generate"
) -> tuple[dict[str, str], list[bytes], Exception | None]:
    """Read a stream to its end or its failure: headers, raw reads, the exception if it broke."""
    reads: list[bytes] = []
    with httpx.stream("POST", base + path, json=body, timeout=30) as r:
        try:
            for data in r.iter_raw():
                reads.append(data)
        except httpx.HTTPError as exc:
            return dict(r.headers), reads, exc
        return dict(r.headers), reads, None


def test_ollama_down_gives_a_clear_502_and_is_recorded() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with run_proxy(dead) as proxy:
        client = ollama.Client(host=proxy.base_url, timeout=10)
        with pytest.raises(ollama.ResponseError) as err:
            client.generate(model=SMALL, prompt="hi")
        assert err.value.status_code == 502
        assert f"Ollama is not reachable at {dead}" in err.value.error and "OLLAMA_HOST" in err.value.error
        with pytest.raises(ollama.ResponseError) as err:
            list(client.chat(model=SMALL, messages=[{"role": "user", "content": "hi"}], stream=True))
        assert err.value.status_code == 502
        tags = httpx.get(proxy.base_url + "/api/tags", timeout=10)  # unrecorded routes get the same answer
        assert tags.status_code == 502 and tags.headers["content-type"].startswith("application/json")
        assert "not reachable" in tags.json()["error"]
        records = proxy.wait_records(2)
        time.sleep(0.1)
        assert len(proxy.records) == 2
    for rec in records:
        assert rec.outcome is Outcome.UPSTREAM_FAILED and rec.status_code == 502
        assert rec.error is not None and "not reachable" in rec.error
        assert rec.forwarded_ns is not None and rec.first_byte_ns is None and rec.token_chunk_ns == []
    assert {r.endpoint for r in records} == {"/api/generate", "/api/chat"}


def test_stream_cut_midway_reaches_the_client_as_a_cut(sim: SimProcess, proxy: ProxyThread) -> None:
    body = {"model": SMALL, "prompt": "cut me", "options": {"num_predict": 50}}
    fault(sim, cut_after_tokens=3)
    _, direct_reads, direct_exc = stream_lines(sim.base_url, body)
    fault(sim, cut_after_tokens=3)
    headers, reads, exc = stream_lines(proxy.base_url, body)
    # The client sees what it would see from Ollama: three lines, then a broken transfer.
    assert direct_exc is not None and exc is not None and type(exc) is type(direct_exc)
    assert b"".join(reads).count(b"\n") == b"".join(direct_reads).count(b"\n") == 3
    rec = proxy.wait_record(headers[RECORD_ID_HEADER.lower()])
    assert rec.outcome is Outcome.UPSTREAM_FAILED
    assert rec.error is not None and "cut" in rec.error
    assert len(rec.token_chunk_ns) == 3 and rec.final_chunk_ns is None


def test_final_error_line_is_passed_on_and_recorded(sim: SimProcess, proxy: ProxyThread) -> None:
    seen = []
    before = len(proxy.records)
    for host in (sim.base_url, proxy.base_url):
        fault(sim, error_after_tokens=2)
        with pytest.raises(ollama.ResponseError) as err:
            list(ollama.Client(host=host, timeout=30).generate(model=SMALL, prompt="fail later", stream=True))
        seen.append((err.value.status_code, err.value.error))
    assert seen[0] == seen[1] and seen[0][0] == -1
    rec = proxy.wait_records(before + 1)[-1]
    assert rec.outcome is Outcome.UPSTREAM_FAILED and rec.status_code == 200
    assert rec.error is not None and seen[0][1] in rec.error
    assert len(rec.token_chunk_ns) == 2


def test_malformed_line_is_passed_on_untouched_and_recorded(sim: SimProcess, proxy: ProxyThread) -> None:
    body = {"model": SMALL, "prompt": "garble", "options": {"num_predict": 20}}
    fault(sim, malformed_after_tokens=2)
    _, direct_reads, _ = stream_lines(sim.base_url, body)
    fault(sim, malformed_after_tokens=2)
    headers, reads, exc = stream_lines(proxy.base_url, body)
    assert exc is None
    proxied = b"".join(reads)
    assert proxied.endswith(b'{"model":"' + SMALL.encode() + b'","created_at":\n')
    assert proxied.count(b"\n") == b"".join(direct_reads).count(b"\n") == 3
    rec = proxy.wait_record(headers[RECORD_ID_HEADER.lower()])
    assert rec.outcome is Outcome.UPSTREAM_FAILED  # the stream ended without its final chunk
    assert rec.error is not None and "1 malformed upstream chunk" in rec.error and "not JSON" in rec.error
    assert "created_at" not in rec.error  # the chunk's excerpt is kept only with text recording on
    assert len(rec.token_chunk_ns) == 2


def test_load_failure_is_an_http_error_with_its_body(sim: SimProcess, proxy: ProxyThread) -> None:
    before = len(proxy.records)
    fault(sim, fail_next_load="llama-server process has terminated: exit status 2")
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=proxy.base_url, timeout=30).generate(model="llama3.2", prompt="hi", options={"num_predict": 1})
    assert err.value.status_code == 500 and "exit status 2" in err.value.error
    rec = proxy.wait_records(before + 1)[-1]
    assert rec.outcome is Outcome.HTTP_ERROR and rec.status_code == 500 and rec.model == "llama3.2"
    assert rec.error == f"upstream HTTP 500: {err.value.error}"  # the raw body only with text recording on


def test_client_leaving_midstream_cancels_upstream_and_frees_the_slot(sim: SimProcess, proxy: ProxyThread) -> None:
    body = {"model": SMALL, "prompt": "a very long answer", "options": {"num_predict": 3000}}
    with httpx.stream("POST", proxy.base_url + "/api/generate", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        sim_id, record_id = r.headers["x-sim-request-id"], r.headers[RECORD_ID_HEADER]
    left_ns = time.monotonic_ns()
    rec = proxy.wait_record(record_id)
    assert rec.outcome is Outcome.CANCELLED and rec.error == "client disconnected"
    assert 3 <= len(rec.token_chunk_ns) < 3000
    wait_until(lambda: sim_truth(sim.base_url, sim_id)["cancelled"])
    truth = sim_truth(sim.base_url, sim_id)
    assert len(truth["token_written_ns"]) < 3000
    assert truth["done_ns"] - left_ns < 1_000_000_000  # sim stopped within a second of the client leaving
    # The only slot is free again: the next request does not wait for it.
    r2 = httpx.post(proxy.base_url + "/api/generate", json={"model": SMALL, "prompt": "next", "stream": False}, timeout=30)
    nxt = sim_truth(sim.base_url, r2.headers["x-sim-request-id"])
    assert nxt["slot_acquired_ns"] - nxt["received_ns"] < 1_000_000_000  # the cancelled one had seconds left


def test_client_leaving_while_queued_cancels_upstream(sim: SimProcess, proxy: ProxyThread) -> None:
    long_body = {"model": SMALL, "prompt": "hold the slot", "options": {"num_predict": 3000}}
    with httpx.stream("POST", proxy.base_url + "/api/generate", json=long_body, timeout=30) as holder:
        holder_lines = holder.iter_lines()  # keep a reference: a dropped iterator closes the stream
        next(holder_lines)  # the only slot is now busy
        queued_at = time.monotonic_ns()
        with pytest.raises(httpx.ReadTimeout):  # no response starts while queued; the client gives up
            httpx.post(
                proxy.base_url + "/api/generate", json={"model": SMALL, "prompt": "queued"}, timeout=httpx.Timeout(30, read=0.5)
            )
    wait_until(lambda: any(r.received_ns >= queued_at for r in proxy.records))
    queued = next(r for r in proxy.records if r.received_ns >= queued_at)
    assert queued.outcome is Outcome.CANCELLED and queued.first_byte_ns is None
    assert queued.error == "client disconnected before the response began"
    truths = httpx.get(sim.base_url + "/sim/truth", timeout=10).json()["requests"]
    mine = [t for t in truths if t["received_ns"] >= queued_at and t["prompt_tokens"] and not t["token_written_ns"]]
    assert mine and all(t["cancelled"] for t in mine)


def test_a_failing_receiver_never_breaks_the_stream(sim: SimProcess) -> None:
    def explode(_: RequestRecord) -> None:
        raise RuntimeError("store is broken")

    with run_proxy(sim.base_url, on_record=explode) as proxy:
        for _ in range(2):
            r = httpx.post(
                proxy.base_url + "/api/generate", json={"model": SMALL, "prompt": "x", "options": {"num_predict": 5}}, timeout=30
            )
            assert r.status_code == 200 and json.loads(r.text.splitlines()[-1])["done"] is True
        assert len(proxy.wait_records(2)) == 2


def test_stop_lets_short_streams_finish_and_cancels_long_ones(sim: SimProcess) -> None:
    proxy = ProxyThread(sim.base_url)
    proxy.start()
    proxy.proxy.STOP_GRACE_S = 0.5
    stopped = False
    try:
        with httpx.stream(
            "POST",
            proxy.base_url + "/api/generate",
            json={"model": SMALL, "prompt": "endless", "options": {"num_predict": 3000}},
            timeout=30,
        ) as r:
            lines = r.iter_lines()
            next(lines)
            sim_id = r.headers["x-sim-request-id"]
            stopper = threading.Thread(target=proxy.stop)
            stopper.start()
            with pytest.raises(httpx.HTTPError):
                for _ in lines:
                    pass
            stopper.join(timeout=20)
            stopped = True
        rec = proxy.records[-1]
        assert rec.outcome is Outcome.CANCELLED and rec.error == "proxy stopped"
        wait_until(lambda: sim_truth(sim.base_url, sim_id)["cancelled"])
        with pytest.raises(httpx.ConnectError):
            httpx.get(proxy.base_url + "/api/tags", timeout=5)
    finally:
        if not stopped:
            proxy.stop()
