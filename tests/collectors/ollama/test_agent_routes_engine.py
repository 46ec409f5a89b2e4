"""The coding agents' routes with the real runner: ``python -m sim --engine llama-server --log-file F`` (sim writes
Ollama's log as Ollama does), one collector process reading that log, its proxy in front.

Through the proxy, the official ``anthropic`` SDK (``/v1/messages``, streamed and not) and ``openai`` SDK
(``responses.create``, streamed and not): each recorded once, as the proxy's, with its route, a time to first
token when streamed, and prompt and output tokens equal to llama-server's own (its ``timings``); none of them
also recorded as direct. One ``/v1/messages`` sent straight to Ollama: recorded once as direct, its route known
from Ollama's access line.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from store.schema import db_path
from tests.support.collector_process import collector, listen_url
from tests.support.engine_process import MODEL, engine_log, start_server_engine, words_prompt
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]

NUM_PREDICT = 48
RECORD_WAIT_S = 90.0  # a direct generation is decided a grace period after it ends; a loaded machine's margin


def rows(data: Path, since_unix_s: float) -> list[sqlite3.Row]:
    path = db_path(data)
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        sql = "SELECT * FROM requests WHERE outcome <> 'in_flight' AND started_at_unix_s >= ? ORDER BY started_at_unix_s"
        return list(conn.execute(sql, (since_unix_s - 1,)))
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def messages_streamed(base_url: str, words: int) -> None:
    client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    msgs: Any = [{"role": "user", "content": words_prompt(words, words)}]
    with client.messages.stream(model=MODEL, max_tokens=NUM_PREDICT, messages=msgs) as stream:
        for _ in stream:
            pass


def messages_whole(base_url: str, words: int) -> None:
    client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    msgs: Any = [{"role": "user", "content": words_prompt(words, words)}]
    client.messages.create(model=MODEL, max_tokens=NUM_PREDICT, messages=msgs)


def responses_streamed(base_url: str, words: int) -> None:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    for _ in client.responses.create(model=MODEL, input=words_prompt(words, words), max_output_tokens=NUM_PREDICT, stream=True):
        pass


def responses_whole(base_url: str, words: int) -> None:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    client.responses.create(model=MODEL, input=words_prompt(words, words), max_output_tokens=NUM_PREDICT)


PROXIED: list[tuple[str, bool, Callable[[str, int], None]]] = [
    ("/v1/messages", True, messages_streamed),
    ("/v1/messages", False, messages_whole),
    ("/v1/responses", True, responses_streamed),
    ("/v1/responses", False, responses_whole),
]


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    folder = tmp_path_factory.mktemp("agents")
    log_file = folder / "ollama.log"
    data = folder / "data"
    with (
        start_server_engine("--log-file", str(log_file)) as sim,
        collector(data, "--ollama", sim.base_url, "--ollama-log", str(log_file)),
    ):
        ollama.Client(host=sim.base_url).generate(model=MODEL, prompt="", keep_alive="10m")  # loaded: its own record
        time.sleep(3.0)  # the collector sees the runner and its model
        yield sim, data


def test_agent_routes_through_the_proxy_once_each_and_a_direct_one_with_its_route(watched: tuple[Any, Path]) -> None:
    sim, data = watched
    since, since_ns = time.time(), time.monotonic_ns()
    proxy_url = listen_url(data)
    for i, (_route, _stream, send) in enumerate(PROXIED):
        send(proxy_url, 40 + 9 * i)  # each prompt its own size: the runner's account of each is told apart by it
    messages_whole(sim.base_url, 90)  # straight to Ollama

    engine = {r["prompt_tokens"]: r for r in engine_log(sim).values() if r["sent_ns"] >= since_ns and r["timings"]}
    assert len(engine) == len(PROXIED) + 1
    wait_until(lambda: [r for r in rows(data, since) if r["seen_from"] == "runner"], RECORD_WAIT_S, "the direct one recorded")
    time.sleep(2.0)  # nothing more comes later: each once
    got = rows(data, since)
    proxied = [r for r in got if r["seen_from"] == "proxy"]
    direct = [r for r in got if r["seen_from"] == "runner"]
    assert len(proxied) == len(PROXIED) and len(direct) == 1, [dict(r) for r in got]
    for row, (route, stream, _) in zip(proxied, PROXIED, strict=True):
        t = engine[row["prompt_tokens"]]["timings"]
        print(route, stream, row["prompt_tokens"], row["output_tokens"], t["predicted_n"], row["ttft_s"])
        assert (row["endpoint"], bool(row["stream"]), row["outcome"]) == (route, stream, "ok"), dict(row)
        assert row["prompt_tokens"] == t["cache_n"] + t["prompt_n"] and row["prompt_tokens_source"] == "usage"
        assert row["output_tokens"] == t["predicted_n"] and row["output_tokens_source"] == "usage", dict(row)
        if stream:
            assert row["ttft_s"] is not None and 0 < row["ttft_s"] < row["client_s"], dict(row)
        else:
            assert row["ttft_s"] is None
    (row,) = direct
    t = engine[row["prompt_tokens"]]["timings"]
    assert row["endpoint"] == "/v1/messages" and row["runner_source"] == "log", dict(row)
    assert row["output_tokens"] == t["predicted_n"]
