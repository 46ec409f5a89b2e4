"""Issue 45, the MLX runner under the whole collector: ``python -m sim --engine mlx --log-file F`` and ``python -m
collectors --ollama-log F``, both real processes. A generation sent to sim directly is recorded once, as direct, with
its prompt and cached tokens and its time, its output tokens unknown (NULL, never 0); one sent through the
collector's proxy is recorded once, as proxied, with the output tokens of Ollama's reply, and never again as direct.
Its prompt was read on Live: progress rows from the log while it ran."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.collector_process import collector, listen_url, query
from tests.support.sim_process import start_sim
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(300)]

MODEL = "qwen3:0.6b"
PROMPT_WORDS = 16_000  # read in about 2.5 s on the m3-max profile: over several of the reader's log reads


def _generate(base_url: str, words: int, num_predict: int) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": " ".join(["tok"] * words), "stream": False, "options": {"num_predict": num_predict}}
    req = urllib.request.Request(base_url + "/api/generate", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        out: dict[str, Any] = json.load(r)
        return out


def test_direct_and_proxied_mlx_generations_are_each_recorded_once(tmp_path: Path) -> None:
    log_file = tmp_path / "ollama.log"
    with (
        start_sim("--engine", "mlx", "--model-name", MODEL, "--log-file", str(log_file)) as sim,
        collector(data := tmp_path / "data", "--ollama", sim.base_url, "--ollama-log", str(log_file)),
    ):

        def rows(sql: str, *args: object) -> list[sqlite3.Row]:
            try:
                return query(data, sql, *args)
            except sqlite3.OperationalError:
                return []  # the store is not created yet

        _generate(sim.base_url, 0, 1)  # a preload: Ollama starts its runner; the collector finds it and asks /v1/status
        time.sleep(3.0)
        since = time.time()
        direct = _generate(sim.base_url, PROMPT_WORDS, 8)
        sql = "SELECT * FROM requests WHERE seen_from = 'runner' AND outcome <> 'in_flight' AND started_at_unix_s >= ?"
        (row,) = wait_until(lambda: rows(sql, since - 1), 60, "the direct record")
        assert row["prompt_tokens"] == direct["prompt_eval_count"] == PROMPT_WORDS
        assert row["cached_tokens"] == direct["prompt_eval_cached_count"]
        assert row["output_tokens"] is None and row["eval_count"] is None  # no MLX line says it: unknown, not 0
        assert 0 < row["total_duration_ns"] <= direct["total_duration"]
        progress = rows("SELECT * FROM progress_samples WHERE request_id = ? AND source = 'log'", row["id"])
        assert len(progress) >= 2, "Live saw its prompt being read"

        since = time.time()
        proxied = _generate(listen_url(data), 2000, 6)
        time.sleep(5.0)  # past the reader's ticks: anything it would write as direct is written by now
        assert rows(sql, since - 1) == [], "the proxied generation was recorded again as direct"
        (prow,) = rows("SELECT * FROM requests WHERE seen_from = 'proxy' AND started_at_unix_s >= ?", since - 1)
        assert prow["eval_count"] == proxied["eval_count"] == 6 and prow["prompt_eval_count"] == 2000
