"""/slots from whatever answers on a runner's port (issue 29, findings 3 and 5): 20,000 busy slots with new task
ids on every answer, a redirect to another address, JSON nested past the parser's depth. Real child processes
named ``llama-server`` on loopback, read by the real reader: each answer is refused whole, said once, and costs
no rows, no traceback and little CPU or memory."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from collectors.ollama.runner_slots import classify_slots_answer, read_once
from collectors.ollama.slots import MAX_SLOTS, SlotsFormatError, parse_slots, slots_cap
from tests.support.reader_run import in_flight_record, loaded, run_reader
from tests.support.runner_process import OllamaStandIn, ps_entry, start_bad_runner

MODEL = "gemma3:270m"
DIGEST = "cd" * 32
PARALLEL = 4  # the runner's -np
READ_S = 5.0
# The fixed reader skips such an answer unparsed and reads it again every RETRY_INTERVAL_S: a few tens of ms of
# CPU in all. The old one parsed and joined 20,000 slots 4 times a second (issue 29: 29.6 s of CPU in 25 s).
MAX_CPU_S = 1.5
MAX_RSS_GROWTH_BYTES = 60 << 20  # the old reader: 66 → 831 MB in 25 s


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / f"sha256-{DIGEST}"
    path.write_bytes(b"GGUF")
    return path


@pytest.mark.slow
def test_twenty_thousand_slots_are_refused_whole_and_cheaply(model_file: Path) -> None:
    request = in_flight_record("r1", MODEL)
    me = psutil.Process()
    with (
        OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama,
        start_bad_runner("many", model_file, "-np", str(PARALLEL)) as child,
    ):
        rss_before, cpu_before = me.memory_info().rss, sum(me.cpu_times()[:2])
        run = asyncio.run(run_reader(ollama.base_url, in_flight=lambda: [request], models=loaded(ollama.models), seconds=READ_S))
        cpu_s, rss_growth = sum(me.cpu_times()[:2]) - cpu_before, me.memory_info().rss - rss_before
        direct, deleted = run.reader.drain_direct()
    assert not run.task_done_early and run.reader.errors == 0
    assert run.samples == [] and direct == [] and deleted == [], "no row from a forged list"
    [state] = run.reader.runners.values()
    assert state.runner.pid == child.proc.pid and state.slots == []
    assert f"more than the runner's {PARALLEL} slots" in (state.problem or "")
    assert run.reader.polls >= 2, "it kept reading"
    assert cpu_s < MAX_CPU_S, f"{cpu_s:.2f} s of CPU in {READ_S:g} s"
    assert rss_growth < MAX_RSS_GROWTH_BYTES, f"RSS grew {rss_growth >> 20} MB"


class _Target:
    """Where a runner's redirect points: any address the answer names. It answers good slots and counts visits."""

    def __init__(self) -> None:
        self.hits = 0
        target = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                target.hits += 1
                body = b'[{"id": 0, "is_processing": true, "id_task": 7, "n_prompt_tokens_processed": 99}]'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/slots"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def target() -> Iterator[_Target]:
    t = _Target()
    yield t
    t.server.shutdown()
    t.server.server_close()


def test_a_redirect_from_slots_is_not_followed(model_file: Path, target: _Target) -> None:
    request = in_flight_record("r1", MODEL)
    with (
        OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama,
        start_bad_runner("redirect", model_file, "--location", target.url),
    ):
        run = asyncio.run(run_reader(ollama.base_url, in_flight=lambda: [request], models=loaded(ollama.models), seconds=3.0))
        printed = read_once(ollama.base_url)  # python -m collectors.ollama
    assert target.hits == 0, "the redirect was followed"
    assert run.samples == [] and run.reader.errors == 0 and run.reader.polls >= 1
    [state] = run.reader.runners.values()
    assert "/slots answered HTTP 302" in (state.problem or "")
    [runner] = printed["runners"]
    assert runner["slots"] == [] and "/slots answered HTTP 302" in runner["problem"]


@pytest.mark.slow
def test_deeply_nested_slots_json_is_said_once_never_a_traceback(model_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    request = in_flight_record("r1", MODEL)
    with (
        caplog.at_level(logging.INFO),
        OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama,
        start_bad_runner("nested", model_file),
    ):
        run = asyncio.run(run_reader(ollama.base_url, in_flight=lambda: [request], models=loaded(ollama.models), seconds=READ_S))
        printed = read_once(ollama.base_url)
    assert run.reader.errors == 0 and run.reader.polls >= 2 and run.samples == []
    [state] = run.reader.runners.values()
    assert "nested too deeply" in (state.problem or "")
    assert [r.getMessage() for r in caplog.records if r.exc_info] == [], "no traceback"
    assert len([r for r in caplog.records if "nested too deeply" in r.getMessage()]) == 1, "said once, not per poll"
    assert "nested too deeply" in printed["runners"][0]["problem"]


def _slot(slot_id: int) -> dict[str, object]:
    return {"id": slot_id, "is_processing": False, "id_task": slot_id}


def test_a_slots_answer_is_bounded_by_the_runners_parallel_slots() -> None:
    assert [s.slot_id for s in parse_slots([_slot(0), _slot(1)], max_slots=2)] == [0, 1]
    for body in ([_slot(0), _slot(1), _slot(2)], [_slot(0), _slot(0)], [_slot(5)]):
        with pytest.raises(SlotsFormatError):
            parse_slots(body, max_slots=2)
    assert slots_cap(4) == 4 and slots_cap(None) == MAX_SLOTS and slots_cap(10**6) == MAX_SLOTS
    readings, problem = classify_slots_answer(200, json.dumps([_slot(i) for i in range(3)]).encode(), max_slots=2)
    assert readings is None and problem is not None and "more than the runner's 2 slots" in problem
