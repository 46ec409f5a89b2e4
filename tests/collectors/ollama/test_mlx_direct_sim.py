"""Issue 45, the MLX runner: sim plays it (a real child process, ``ollama runner --mlx-engine --model NAME --port N``,
found through psutil as discovery finds the real one), its lines in Ollama's log become one direct record per
generation, written once to a real SQLite store, and Live shows its prompt being read from its progress lines."""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from analysis.records import FinalMetrics, Outcome, RequestRecord, SeenFrom
from collectors.ollama.discovery import MLX_RUNNER, Runner, runner_from_argv
from collectors.ollama.mlx_direct import MlxDirect
from pages.live.view import build_cards
from sim.llama_server_engine import free_loopback_port
from sim.mlx_runner import start_mlx_runner
from sim.tokens import make_prompt
from store import queries
from store.ops import PutProgress, PutRequest
from store.schema import db_path
from store.writer import StoreWriter

MODEL = "qwen3:0.6b"
PROMPT_TOKENS = 3000  # a dozen progress lines, a few tens of ms apart


class _Log:
    """Ollama's log as the runner's copied lines land in it, read from where the last read stopped."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._read = 0
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        with self._lock:
            self._lines.append(text)

    def read_new(self) -> list[str]:
        with self._lock:
            new, self._read = self._lines[self._read :], len(self._lines)
        return new


def _get(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return int(r.status)


def _complete(port: int, prompt: str, out: dict[str, Any]) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": 8}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        out.update(json.load(r))


def _discovered(pid: int) -> Runner:
    proc = psutil.Process(pid)
    runner = runner_from_argv(pid, proc.name(), proc.cmdline())
    assert runner is not None and runner.kind == MLX_RUNNER and runner.model_path == MODEL
    return runner


def test_an_mlx_generation_is_recorded_once_and_live_shows_its_prompt_read(tmp_path: Path) -> None:
    log, port = _Log(), free_loopback_port()
    child = start_mlx_runner(MODEL, port, log.write)
    db = db_path(tmp_path)
    writer = StoreWriter(db)
    try:
        for _ in range(200):
            try:
                assert _get(port, "/v1/status") == 200
                break
            except OSError:
                time.sleep(0.05)
        runner = _discovered(child.pid)
        direct = MlxDirect(read_tick_s=0.02)
        direct.runners_seen([runner])
        reply: dict[str, Any] = {}
        sender = threading.Thread(target=_complete, args=(port, make_prompt(PROMPT_TOKENS), reply))
        sender.start()
        records: list[RequestRecord] = []
        live_seen: list[tuple[float, int]] = []  # (processed, prompt to read) Live showed while the prompt was read
        while sender.is_alive() or not records:
            records += direct.lines(log.read_new())
            sample, running = direct.progress(), direct.in_flight()
            if sample is not None and running is not None:
                writer.write(PutRequest(running))
                writer.write(PutProgress([sample]))
                model = build_cards(db, time.time(), 60.0)
                assert model is not None
                card = next(c for c in model.cards if c.request_id == running.id)
                assert card.phase == "prefill" and card.direct and card.prefill is not None
                live_seen.append((card.prefill.processed_tokens, card.prefill.prompt_tokens or -1))
            time.sleep(0.02)
        sender.join()
        records += direct.lines(log.read_new())
        (rec,) = records  # once
        writer.write(PutRequest(rec))

        # Live showed the prompt being read, moving, never past what was left after the cache.
        assert len(live_seen) >= 3 and live_seen[0][0] < live_seen[-1][0] < PROMPT_TOKENS
        assert all(total == PROMPT_TOKENS for _, total in live_seen)

        assert rec.seen_from is SeenFrom.RUNNER and rec.outcome is Outcome.OK and rec.model == MODEL
        assert rec.runner_port == port and rec.metrics is not None
        assert rec.metrics.prompt_eval_count == reply["usage"]["prompt_tokens"] == PROMPT_TOKENS
        assert rec.metrics.prompt_eval_cached_count == 0
        assert rec.metrics.eval_count is None  # no MLX line carries it: unknown, not 0
        assert rec.metrics.total_duration_ns is not None and rec.metrics.total_duration_ns > 0

        # The same prompt again: served from the runner's cache, recorded as its own, second generation.
        again: dict[str, Any] = {}
        _complete(port, make_prompt(PROMPT_TOKENS), again)
        time.sleep(0.2)
        (second,) = direct.lines(log.read_new())
        assert second.id != rec.id and second.metrics is not None
        assert second.metrics.prompt_eval_cached_count == PROMPT_TOKENS - 1
        writer.write(PutRequest(second))
    finally:
        writer.close()
        child.terminate()
        child.wait(timeout=10)
    with queries.open_reader(db) as conn:
        assert conn is not None
        stored = [s.record for s in queries.stored_requests(conn)]
    assert sorted(r.id for r in stored) == sorted([rec.id, second.id])
    first = next(r for r in stored if r.id == rec.id)
    assert first.metrics is not None and first.metrics.eval_count is None and first.metrics.prompt_eval_count == PROMPT_TOKENS


def test_lines_with_no_one_mlx_runner_confirmed_are_dropped_not_recorded() -> None:
    """Which runner wrote a line is not in it: with none (or two) MLX runners confirmed, nothing is recorded."""
    t = "time=2026-06-12T22:48:14.120+02:00 level=INFO"
    lines = [
        f'{t} source=prefix_cache.go:126 msg="cache miss" total=10 matched=0 cached=0 left=10',
        f"{t} source=server.go:225 msg=ServeHTTP method=POST path=/v1/completions took=1.5s status=200",
    ]
    direct = MlxDirect(read_tick_s=1.0)
    assert direct.lines(lines) == [] and direct.dropped == 2
    two = [Runner(pid=p, port=p, model_path="m", kind=MLX_RUNNER) for p in (1, 2)]
    direct.runners_seen(two)
    assert direct.lines(lines) == [] and direct.dropped == 4
    direct.runners_seen(two[:1])
    (rec,) = direct.lines(lines)
    assert rec.metrics is not None and rec.metrics.total_duration_ns == 1_500_000_000 and rec.metrics.eval_count is None


def test_a_generation_a_just_finished_proxied_request_accounts_for_is_the_proxys() -> None:
    """The proxy's request can end before the log read that holds its runner lines: its model and prompt size, ending
    with it, make it the proxy's (recorded there with Ollama's output count); another prompt size does not."""
    t = "time=2026-06-12T22:48:14.120+02:00 level=INFO"

    def lines(total: int) -> list[str]:
        return [
            f'{t} source=prefix_cache.go:126 msg="cache miss" total={total} matched=0 cached=0 left={total}',
            f"{t} source=server.go:225 msg=ServeHTTP method=POST path=/v1/completions took=0.5s status=200",
        ]

    direct = MlxDirect(read_tick_s=1.0)
    direct.runners_seen([Runner(pid=7, port=7, model_path=MODEL, kind=MLX_RUNNER)])
    proxied = RequestRecord(
        id="p", started_at_unix_s=time.time(), client_addr=None, endpoint="/api/generate", model=MODEL, stream=False
    )
    proxied.metrics = FinalMetrics(prompt_eval_count=10, eval_count=4)
    direct.proxied_finished(proxied)
    assert direct.lines(lines(12)) != [], "another prompt size: not the proxy's"
    assert direct.lines(lines(10)) == [] and direct.proxied == 1
    assert direct.lines(lines(10)) != [], "the proxied request accounts for one generation only"


def test_a_restarted_reader_never_reuses_a_records_id() -> None:
    """Ids are what the store upserts on: a collector restarted beside the same runner counts from 1 again, and its
    first record must not replace the one the last collector wrote."""
    t = "time=2026-06-12T22:48:14.120+02:00 level=INFO"
    lines = [
        f'{t} source=prefix_cache.go:126 msg="cache miss" total=10 matched=0 cached=0 left=10',
        f"{t} source=server.go:225 msg=ServeHTTP method=POST path=/v1/completions took=0.5s status=200",
    ]
    runner = Runner(pid=7, port=7, model_path=MODEL, kind=MLX_RUNNER)
    ids = []
    for now in (1000.0, 2000.0):  # two collectors' lives
        reader = MlxDirect(read_tick_s=1.0, clock=itertools.repeat(now).__next__)  # a clock standing at that moment
        reader.runners_seen([runner])
        (rec,) = reader.lines(lines)
        ids.append(rec.id)
    assert ids[0] != ids[1]
