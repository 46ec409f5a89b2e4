"""A prompt of about 6,000 tokens at num_ctx 2,048 on the real runner (``python -m sim --engine llama-server``: the
prompt tokenized by llama-server itself, cut as Ollama cuts it, Ollama's WARN line in ``--log-file``), watched by
the real collector reading that log: sent directly to Ollama (seen from the runner) and through the proxy, each is
recorded once, flagged ``prompt_truncated`` with the tokens sent and kept that Ollama's line gives."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from analysis.prompt_fit import LineKind, parse_fit_line
from tests.support.collector_process import collector, listen_url, query
from tests.support.engine_process import MODEL, start_server_engine, words_prompt
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]


def _cut_lines(log_file: Path) -> list[tuple[int, int]]:
    lines = [parse_fit_line(x) for x in log_file.read_text().splitlines()]
    return [(x.prompt or 0, x.new or 0) for x in lines if x is not None and x.kind is LineKind.TRUNCATED]


def test_a_cut_prompt_direct_and_proxied_is_recorded_once_each_with_its_counts(tmp_path: Path) -> None:
    log_file = tmp_path / "ollama.log"
    data = tmp_path / "data"
    with (
        start_server_engine("--log-file", str(log_file)) as sim,
        collector(data, "--ollama", sim.base_url, "--ollama-log", str(log_file)),
    ):
        opts = {"num_ctx": 2048, "num_predict": 4, "temperature": 0}
        r = httpx.post(sim.base_url + "/api/generate", json={"model": MODEL, "prompt": "", "options": opts}, timeout=300)
        assert r.status_code == 200  # loaded at 2,048: the collector finds the runner before the long prompts
        time.sleep(3.0)
        since = time.time()
        body = {"model": MODEL, "prompt": words_prompt(6000, 1), "stream": False, "options": opts}
        direct = httpx.post(sim.base_url + "/api/generate", json=body, timeout=300).json()
        time.sleep(2.0)  # one after the other: each its own runner task
        proxied = httpx.post(listen_url(data) + "/api/generate", json=body, timeout=300).json()
        cuts = wait_until(lambda: (c := _cut_lines(log_file)) and len(c) == 2 and c, 30, "two cut lines")

        def rows() -> list[dict[str, object]] | None:
            got = query(
                data,
                "SELECT seen_from, flags, flag_text, prompt_sent_tokens, prompt_kept_tokens, prompt_sent_source "
                "FROM requests WHERE outcome <> 'in_flight' AND started_at_unix_s >= ? ORDER BY started_at_unix_s",
                since - 1,
            )
            out = [dict(x) for x in got]
            return out if len(out) == 2 and all(x["prompt_sent_tokens"] is not None for x in out) else None

        recorded = wait_until(rows, 90, "both generations recorded with Ollama's counts")
    assert direct["prompt_eval_count"] == proxied["prompt_eval_count"] == cuts[0][1] == 1027  # 2,048 - (2,048 - 5) // 2
    assert cuts[0][0] > 5000  # Gemma's tokens for 6,000 words
    assert sorted(str(x["seen_from"]) for x in recorded) == ["proxy", "runner"]
    for row, (sent, kept) in zip(recorded, cuts, strict=True):
        assert (row["prompt_sent_tokens"], row["prompt_kept_tokens"], row["prompt_sent_source"]) == (sent, kept, "log")
        assert json.loads(str(row["flags"])).count("prompt_truncated") == 1
        text = json.loads(str(row["flag_text"]))["prompt_truncated"]
        assert f"your {sent:,}-token prompt (Ollama's log) was cut to {kept:,} tokens: num_ctx is 2,048" in text


def test_without_the_log_a_cut_prompt_is_counted_by_the_runners_tokenize(tmp_path: Path) -> None:
    """No log read: the reply's signature (prompt_eval_count at the cut length for num_ctx 2,048), the prompt's text
    kept (--record-text) and counted by the runner's own /tokenize."""
    data = tmp_path / "data"
    with start_server_engine() as sim, collector(data, "--ollama", sim.base_url, "--record-text"):
        proxy = listen_url(data)
        opts = {"num_ctx": 2048, "num_predict": 4, "temperature": 0}
        r = httpx.post(proxy + "/api/generate", json={"model": MODEL, "prompt": "", "options": opts}, timeout=300)
        assert r.status_code == 200
        time.sleep(3.0)  # the collector finds the runner and its model
        body = {"model": MODEL, "prompt": words_prompt(6000, 2), "stream": False, "options": opts}
        reply = httpx.post(proxy + "/api/generate", json=body, timeout=300).json()

        def row() -> dict[str, object] | None:
            got = query(
                data,
                "SELECT flags, flag_text, prompt_sent_tokens, prompt_sent_source FROM requests "
                "WHERE prompt_eval_count = ? AND outcome = 'ok'",
                reply["prompt_eval_count"],
            )
            return dict(got[0]) if got and got[0]["prompt_sent_source"] == "tokenize" else None

        found = wait_until(row, 60, "the prompt counted by the runner")
    assert reply["prompt_eval_count"] == 1027
    sent = int(str(found["prompt_sent_tokens"]))
    assert sent > 5000
    text = json.loads(str(found["flag_text"]))["prompt_truncated"]
    assert text.startswith(f"your {sent:,}-token prompt (counted by the runner's /tokenize) was cut to 1,027 tokens")
