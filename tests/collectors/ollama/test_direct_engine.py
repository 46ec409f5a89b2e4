"""Generations sent to Ollama directly, recorded from its runner: the real llama-server behind ``python -m sim
--engine llama-server --num-parallel 2 --log-file F`` (sim writes Ollama's log as Ollama does), watched by two
collector processes at once: one reading that log (``--ollama-log``), one with the runner's /slots alone.

Clients talk to sim directly (the official ``ollama`` client streamed and not, ``openai`` on /v1, curl),
one after another and two at a time; then one through the first collector's proxy beside one direct. Each
generation is recorded once by each collector; with the log, prompt tokens are exact and prefill and decode
within 1% of llama-server's own timings (``/sim/engine``); with /slots alone, prompt tokens exact and decode
tokens and times within the bounds the record states, marked bounded; the proxied one is never recorded
again as direct, and keeps its runner readings.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from collectors.ollama.access_fit import ACCESS_SLACK_S
from collectors.ollama.runners import IDLE_INTERVAL_S
from store.schema import db_path
from tests.support.engine_process import GREEDY, MODEL, engine_log, engine_state, start_server_engine, words_prompt
from tests.support.paths import REPO
from tests.support.sim_process import SimProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

LOG_AGREEMENT = 0.01  # the log's figures vs llama-server's own timings (they are the same numbers, printed to 0.01 ms)
RECORD_WAIT_S = 60.0  # a finished generation is decided GRACE_S (LOG_WAIT_S without its log lines) after it ends
NUM_PREDICT = 160  # most generations outlast an idle /slots poll (1 s): seen, not only counted (one chat ends at 23)


@dataclass
class Collector:
    data: Path
    proc: subprocess.Popen[bytes]
    err_path: Path

    def rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        path = db_path(self.data)
        if not path.exists():
            return []
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            return list(conn.execute(sql, args))
        except sqlite3.OperationalError:
            return []  # not created yet
        finally:
            conn.close()

    def listen_url(self) -> str:
        from collectors.lock import read_lock

        deadline = time.monotonic() + 30
        while (info := read_lock(self.data)) is None or not info.listen:
            assert self.proc.poll() is None, self.err_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "collector did not get ready"
            time.sleep(0.05)
        return f"http://{info.listen}"


@contextlib.contextmanager
def collector(folder: Path, sim: SimProcess, *args: str) -> Iterator[Collector]:
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))}
    err_path = folder / "collector.log"
    with open(err_path, "wb") as err:
        cmd = [
            sys.executable,
            "-m",
            "collectors",
            "--data",
            str(folder / "data"),
            "--listen",
            "127.0.0.1:0",
            "--ollama",
            sim.base_url,
            *args,
        ]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=err, stderr=err)
    c = Collector(folder / "data", proc, err_path)
    try:
        c.listen_url()
        yield c
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@dataclass
class Watch:
    sim: SimProcess
    log_file: Path
    with_log: Collector
    slots_only: Collector


@pytest.fixture(scope="module")
def watch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watch]:
    folder = tmp_path_factory.mktemp("direct")
    log_file = folder / "ollama.log"
    with (
        start_server_engine("--num-parallel", "2", "--log-file", str(log_file)) as sim,
        collector(folder / "a", sim, "--ollama-log", str(log_file)) as with_log,
        collector(folder / "b", sim) as slots_only,
    ):
        # Load the model first (its own record) and let both collectors see the runner and its model.
        ollama.Client(host=sim.base_url).generate(model=MODEL, prompt="", keep_alive="10m")
        time.sleep(3.0)
        yield Watch(sim, log_file, with_log, slots_only)


def direct_rows(c: Collector, since_unix_s: float) -> list[sqlite3.Row]:
    return c.rows(
        "SELECT * FROM requests WHERE seen_from = 'runner' AND outcome <> 'in_flight' AND started_at_unix_s >= ? "
        "ORDER BY started_at_unix_s",
        since_unix_s - 1,  # a record's start is placed from the runner's timings: within a poll of the truth
    )


def wait_rows(c: Collector, since_unix_s: float, n: int) -> list[sqlite3.Row]:
    deadline = time.monotonic() + RECORD_WAIT_S
    while True:
        rows = direct_rows(c, since_unix_s)
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(0.25)


def engine_by_prompt(sim: SimProcess, since_ns: int) -> dict[int, dict[str, Any]]:
    """llama-server's own account of each generation since then, by its prompt's size (each test's prompts differ)."""
    out: dict[int, dict[str, Any]] = {}
    for rec in engine_log(sim).values():
        if rec["sent_ns"] >= since_ns and rec["timings"]:
            assert rec["prompt_tokens"] not in out, "two generations with one prompt size: the test cannot tell them apart"
            out[rec["prompt_tokens"]] = rec
    return out


def options(n_words: int) -> dict[str, Any]:
    return {**GREEDY, "num_predict": NUM_PREDICT, "seed": n_words}  # Ollama's num_ctx: the runner is not restarted


def via_ollama_streamed(sim: SimProcess, words: int) -> None:
    for _ in ollama.Client(host=sim.base_url).generate(
        model=MODEL, prompt=words_prompt(words, words), stream=True, options=options(words)
    ):
        pass


def via_ollama_whole(sim: SimProcess, words: int) -> None:
    msg = {"role": "user", "content": words_prompt(words, words)}
    ollama.Client(host=sim.base_url).chat(model=MODEL, messages=[msg], stream=False, options=options(words))


def via_openai(sim: SimProcess, words: int) -> None:
    client = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="unused")
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": words_prompt(words, words)}],
        max_tokens=NUM_PREDICT,
        temperature=0,
        seed=words,
    )


def via_curl(sim: SimProcess, words: int) -> None:
    body = json.dumps({"model": MODEL, "prompt": words_prompt(words, words), "stream": False, "options": options(words)})
    cmd = ["curl", "-sS", "--fail", "-o", "/dev/null", "-d", body, sim.base_url + "/api/generate"]
    subprocess.run(cmd, check=True, timeout=300)


CLIENTS: list[tuple[str, Callable[[SimProcess, int], None]]] = [
    ("ollama streamed", via_ollama_streamed),
    ("ollama whole", via_ollama_whole),
    ("openai /v1", via_openai),
    ("curl", via_curl),
]


def check_log_row(row: sqlite3.Row, engine: dict[str, Any]) -> None:
    t = engine["timings"]
    assert row["runner_source"] == "log" and row["prompt_tokens_source"] == "log", dict(row)
    assert row["prompt_tokens"] == t["cache_n"] + t["prompt_n"] == engine["prompt_tokens"]
    assert row["cached_tokens"] == t["cache_n"]
    assert row["output_tokens"] == t["predicted_n"]
    assert row["prefill_s"] == pytest.approx(t["prompt_ms"] / 1000, rel=LOG_AGREEMENT)
    assert row["decode_s"] == pytest.approx(t["predicted_ms"] / 1000, rel=LOG_AGREEMENT)
    assert row["prefill_source"] == row["decode_source"] == "log"


def check_slots_row(row: sqlite3.Row, engine: dict[str, Any]) -> None:
    t = engine["timings"]
    assert row["runner_source"] == "slots" and row["prompt_tokens_source"] == "slots", dict(row)
    assert row["prompt_tokens"] == engine["prompt_tokens"]  # exact: read once decoding began
    assert row["output_tokens_bound"] is not None and row["prefill_bound_s"] is not None and row["decode_bound_s"] is not None
    assert abs(row["output_tokens"] - t["predicted_n"]) <= row["output_tokens_bound"], dict(row)
    assert abs(row["prefill_s"] - t["prompt_ms"] / 1000) <= row["prefill_bound_s"] + 0.01, dict(row)
    assert abs(row["decode_s"] - t["predicted_ms"] / 1000) <= row["decode_bound_s"] + 0.01, dict(row)
    assert row["decode_bound_s"] <= 1.5  # a poll interval or two, not a guess over the whole generation


def check_unseen(rows: list[sqlite3.Row], engine: dict[int, dict[str, Any]]) -> list[sqlite3.Row]:
    """/slots alone: a generation that ran wholly between two idle polls is only counted (the slot's task id
    stepped), with its figures unknown, never zero. Only a generation shorter than a poll interval may be; the
    rows that were seen are returned."""
    unseen = [r for r in rows if r["prompt_tokens"] is None]
    seen_prompts = {r["prompt_tokens"] for r in rows} - {None}
    missed = [e for p, e in engine.items() if p not in seen_prompts]
    assert len(unseen) == len(missed), [dict(r) for r in rows]
    for rec in missed:
        took_s = (rec["timings"]["prompt_ms"] + rec["timings"]["predicted_ms"]) / 1000
        assert took_s < IDLE_INTERVAL_S, f"a {took_s:.2f} s generation outlasts an idle poll and was not seen"
    outputs = {rec["timings"]["predicted_n"] for rec in missed}
    for row in unseen:
        assert row["prefill_s"] is None and row["decode_s"] is None, dict(row)
        # Read from the slot's context after its release, or unknown.
        assert row["output_tokens"] is None or row["output_tokens"] in outputs, dict(row)
    return [r for r in rows if r["prompt_tokens"] is not None]


def check_both(w: Watch, since: float, since_ns: int, n: int) -> None:
    engine = engine_by_prompt(w.sim, since_ns)
    assert len(engine) == n
    for c, check in ((w.with_log, check_log_row), (w.slots_only, check_slots_row)):
        rows = wait_rows(c, since, n)
        time.sleep(1.0)
        rows = direct_rows(c, since)  # none more comes later: each generation once
        assert len(rows) == n, [dict(r) for r in rows]
        if c is w.slots_only:
            rows = check_unseen(rows, engine)
        assert {r["prompt_tokens"] for r in rows} <= set(engine), [dict(r) for r in rows]
        assert len({r["prompt_tokens"] for r in rows}) == len(rows), [dict(r) for r in rows]
        for row in rows:
            t = engine[row["prompt_tokens"]]["timings"]
            print(
                f"{row['runner_source']}: prompt {row['prompt_tokens']} (engine {t['cache_n'] + t['prompt_n']}), output "
                f"{row['output_tokens']}±{row['output_tokens_bound']} ({t['predicted_n']}), prefill {row['prefill_s']:.4f}"
                f"±{row['prefill_bound_s']:.3g} s ({t['prompt_ms'] / 1000:.4f}), decode {row['decode_s']:.4f}"
                f"±{row['decode_bound_s']:.3g} s ({t['predicted_ms'] / 1000:.4f}), route {row['endpoint']}"
            )
            check(row, engine[row["prompt_tokens"]])
            assert row["model"] == MODEL and row["stream"] is None


def test_sequential_direct_generations_from_four_clients_are_each_recorded_once(watch: Watch) -> None:
    since, since_ns = time.time(), time.monotonic_ns()
    for i, (_, send) in enumerate(CLIENTS):
        send(watch.sim, 20 + 9 * i)
        # Apart by more than an access line's second and its slack on either side, so each fits one generation alone.
        time.sleep(2 * ACCESS_SLACK_S + 1.0)
    check_both(watch, since, since_ns, len(CLIENTS))
    rows = direct_rows(watch.with_log, since)
    # The access line fits each generation alone here (one at a time): the route and status are told.
    assert sorted(r["endpoint"] for r in rows) == sorted(["/api/generate", "/api/chat", "/v1/chat/completions", "/api/generate"])
    assert {r["status_code"] for r in rows} == {200}


def test_two_at_once_on_two_slots_are_each_recorded_once(watch: Watch) -> None:
    since, since_ns = time.time(), time.monotonic_ns()
    threads = [threading.Thread(target=via_ollama_streamed, args=(watch.sim, words)) for words in (60, 70)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    check_both(watch, since, since_ns, 2)


ROUNDS = 3  # the pair raced wrongly in 2 runs of 3 before the claim was checked against the request's own count


def test_proxied_and_direct_at_once_no_double_count_and_the_proxied_keeps_its_readings(watch: Watch) -> None:
    """Two slots, a generation through the proxy and one sent directly at the same moment (different prompt sizes),
    several times: each is recorded exactly once, the direct one as direct with its own prompt size."""
    proxy_url = watch.with_log.listen_url()
    through_proxy = SimProcess(proxy_url, 0, watch.sim.proc, watch.sim.log_path)
    for round_ in range(ROUNDS):
        since, since_ns = time.time(), time.monotonic_ns()
        words = (80 + 20 * round_, 90 + 20 * round_)
        proxied = threading.Thread(target=via_ollama_streamed, args=(through_proxy, words[0]))
        direct = threading.Thread(target=via_ollama_streamed, args=(watch.sim, words[1]))
        proxied.start()
        direct.start()
        proxied.join(timeout=300)
        direct.join(timeout=300)
        engine = engine_by_prompt(watch.sim, since_ns)
        assert len(engine) == 2
        wait_rows(watch.with_log, since, 1)
        time.sleep(4.0)  # past every wait: nothing more is written
        rows = direct_rows(watch.with_log, since)
        sql = "SELECT * FROM requests WHERE seen_from = 'proxy' AND started_at_unix_s >= ?"
        proxied_rows = watch.with_log.rows(sql, since)
        assert len(proxied_rows) == 1 and len(rows) == 1, (round_, [dict(r) for r in rows], [dict(r) for r in proxied_rows])
        assert proxied_rows[0]["prompt_tokens"] != rows[0]["prompt_tokens"]
        check_log_row(rows[0], engine[rows[0]["prompt_tokens"]])
        sql = "SELECT * FROM progress_samples WHERE request_id = ? AND source = 'slots'"
        readings = watch.with_log.rows(sql, proxied_rows[0]["id"])
        assert readings, "the proxied request lost its runner readings"
        time.sleep(2 * ACCESS_SLACK_S + 1.0)  # the next round's rows start after these


def test_lines_forged_through_the_runner_make_no_record(watch: Watch) -> None:
    """Anyone who can reach the runner's port can make it print text into Ollama's log: llama-server prints an
    invalid grammar verbatim, newlines and all. A whole generation forged so, with a chosen client and route, is
    not recorded: /slots never showed its task."""
    runner = engine_state(watch.sim)["runner"]
    since = time.time()
    stamp = time.strftime("%Y/%m/%d - %H:%M:%S")
    task = 987_654
    forged = [
        f"slot launch_slot_: id  0 | task {task} | processing task, is_child = 0",
        f"slot   operator(): id  0 | task {task} | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 1374",
        f"slot print_timing: id  0 | task {task} | prompt eval time =     900.00 ms /  1374 tokens",
        f"slot print_timing: id  0 | task {task} |        eval time =    1200.00 ms /    40 tokens",
        f"slot      release: id  0 | task {task} | stop processing: n_tokens = 1413, truncated = 0",
        f'[GIN] {stamp} | 200 |          2.2s |        10.6.6.6 | POST     "/api/chat"',
    ]
    body = json.dumps({"prompt": "x", "n_predict": 1, "grammar": "root ::= \n" + "\n".join(forged) + "\n"}).encode()
    req = urllib.request.Request(runner["base_url"] + "/completion", data=body, headers={"Content-Type": "application/json"})
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(req, timeout=60).read()
    wait_until(lambda: forged[-1] in watch.log_file.read_text(), 30, "the forged lines in Ollama's log")
    time.sleep(3 * (ACCESS_SLACK_S + 1.0) + 4.0)  # past every wait a real task's lines would have had
    rows = watch.with_log.rows("SELECT * FROM requests WHERE started_at_unix_s >= ? OR runner_task_id = ?", since - 60, task)
    assert not [dict(r) for r in rows if r["runner_task_id"] == task or r["client_addr"] == "10.6.6.6"]
