"""Issue 41, must show: an ``/api/embed`` call with many inputs sent to Ollama directly is ONE embedding record, no
generation. The real llama-server behind ``python -m sim --engine llama-server`` serving an embedding GGUF (Gemma's
with ``<arch>.pooling_type`` added: its runner started with ``--embedding``, as Ollama starts one), sim writing
Ollama's log; a collector process reading that log and the runner's /slots; the official ``ollama`` client.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import ollama
import pytest

from store.schema import db_path
from tests.support.collector_process import collector, listen_url
from tests.support.engine_process import engine_state, words_prompt
from tests.support.sim_process import start_sim
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = "embedgemma:270m"
INPUTS = 40  # a RAG upload's chunks: more tasks than /slots polls while they run (each a fraction of a second)
RECORD_WAIT_S = 90.0  # the call is written once its inputs' waits (a few seconds after its access line) are over


def rows(data: Path, sql: str) -> list[dict[str, Any]]:
    path = db_path(data)
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql)]
    except sqlite3.OperationalError:
        return []  # not created yet
    finally:
        conn.close()


def test_a_direct_embed_call_of_many_inputs_is_one_embedding_record(embed_gguf: Path, tmp_path: Path) -> None:
    log_file = tmp_path / "ollama.log"
    sim_args = ("--engine", "llama-server", "--gguf", str(embed_gguf), "--model-name", MODEL, "--threads", "2")
    with (
        start_sim(*sim_args, "--log-file", str(log_file)) as sim,
        collector(tmp_path / "data", "--ollama", sim.base_url, "--ollama-log", str(log_file)),
    ):
        client = ollama.Client(host=sim.base_url)
        client.embed(model=MODEL, input="warm up", keep_alive="10m")  # the load, and the collector finds the runner
        time.sleep(3.0)
        since_ns = time.monotonic_ns()
        started = time.time()
        texts = [words_prompt(8 + i % 23, seed=i) for i in range(INPUTS)]
        reply = client.embed(model=MODEL, input=texts)
        assert len(reply.embeddings) == INPUTS
        runner_inputs = [r for r in engine_state(sim)["requests"] if r["embedding"] and r["sent_ns"] >= since_ns]
        assert len(runner_inputs) == INPUTS  # one runner task per input, as Ollama sends them

        sql = (
            f"SELECT * FROM requests WHERE seen_from = 'runner' AND outcome <> 'in_flight' AND started_at_unix_s >= {started - 2}"
        )
        wait_until(
            lambda: any(r["kind"] == "embed" for r in rows(tmp_path / "data", sql)),
            timeout_s=RECORD_WAIT_S,
            what="the embedding record",
        )
        time.sleep(8.0)  # anything else it would write about these tasks is written by now
        recs = rows(tmp_path / "data", sql)
        assert [r["kind"] for r in recs] == ["embed"], [(r["kind"], r["runner_task_id"], r["batch_size"]) for r in recs]
        (rec,) = recs
        assert rec["batch_size"] == INPUTS and rec["endpoint"] == "/api/embed" and rec["status_code"] == 200
        assert rec["prompt_eval_count"] == sum(r["prompt_tokens"] for r in runner_inputs) == reply.prompt_eval_count
        assert rec["total_duration_ns"] is not None and rec["total_duration_ns"] > 0
        generations = rows(
            tmp_path / "data", f"SELECT id FROM requests WHERE kind = 'generate' AND started_at_unix_s >= {started - 2}"
        )
        assert generations == []

        # The same call through the collector's proxy: the proxy's record, and no direct one beside it.
        since = time.time()
        proxied = ollama.Client(host=listen_url(tmp_path / "data")).embed(model=MODEL, input=texts[:20])
        assert len(proxied.embeddings) == 20
        every = f"SELECT * FROM requests WHERE outcome <> 'in_flight' AND started_at_unix_s >= {since - 2}"
        wait_until(lambda: rows(tmp_path / "data", every), timeout_s=RECORD_WAIT_S, what="the proxied record")
        time.sleep(12.0)  # past the inputs' waits and the call's: a direct record would be written by now
        recs = rows(tmp_path / "data", every)
        assert [(r["seen_from"], r["kind"], r["batch_size"]) for r in recs] == [("proxy", "embed", 20)], recs
