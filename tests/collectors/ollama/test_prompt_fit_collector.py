"""A prompt that did not fit, recorded end to end: sim (which cuts it as Ollama does and logs Ollama's WARN line,
``--log-file``) behind the real collector reading that log (``--ollama-log``). A prompt of 6,000 tokens at num_ctx
2,048 through the proxy is recorded once, flagged ``prompt_truncated`` with the tokens sent and kept and the
fix; a /v1 request that carries ``options.num_ctx`` is noted ``num_ctx_ignored``; the settings of Ollama's start
lines are stored with their source. (Generations sent to Ollama directly are seen from the runner: the engine test
``test_prompt_fit_engine.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from analysis.prompt_fit import FitLine, LineKind, ServerSettings, verdict
from analysis.records import FinalMetrics, Outcome, RequestRecord
from collectors.ollama.log import EventKind, LogEvent
from collectors.ollama.prompt_fit import FitBook, read_start_lines
from sim.tokens import make_prompt
from tests.support.collector_process import MODEL, collector, listen_url, query
from tests.support.sim_process import start_sim
from tests.support.waiting import wait_until


@pytest.mark.slow
def test_a_cut_prompt_through_the_proxy_is_flagged_once_with_its_counts(tmp_path: Path) -> None:
    log_file = tmp_path / "ollama.log"
    data = tmp_path / "data"
    with (
        start_sim("--log-file", str(log_file), "--disk-gbs", "50", "--context-length", "8192") as sim,
        collector(data, "--ollama", sim.base_url, "--ollama-log", str(log_file)),
    ):
        proxy = listen_url(data)
        body = {"model": MODEL, "prompt": make_prompt(6000), "raw": True, "stream": False}
        r = httpx.post(proxy + "/api/generate", json=body | {"options": {"num_ctx": 2048, "num_predict": 8}}, timeout=120)
        assert r.status_code == 200 and r.json()["prompt_eval_count"] == 1027
        oai = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        r = httpx.post(proxy + "/v1/chat/completions", json=oai | {"options": {"num_ctx": 2048}}, timeout=120)
        assert r.status_code == 200
        # A model that cannot shift (here the request's "shift": false): Ollama's 400, recorded and flagged too.
        r = httpx.post(proxy + "/api/generate", json=body | {"shift": False, "options": {"num_ctx": 2048}}, timeout=120)
        assert r.status_code == 400

        def rows() -> list[dict[str, object]]:
            got = query(
                data,
                "SELECT endpoint, flags, flag_text, prompt_sent_tokens, prompt_sent_source, prompt_kept_tokens, "
                "num_ctx_in_force, num_ctx_source FROM requests WHERE outcome = 'ok' ORDER BY started_at_unix_s",
            )
            return [dict(x) for x in got]

        def cut_recorded() -> list[dict[str, object]] | None:
            got = rows()
            return got if len(got) == 2 and got[0]["prompt_sent_tokens"] is not None else None

        generate, v1 = wait_until(cut_recorded, 30, "the cut prompt's row with the log's counts")
        settings = wait_until(lambda: query(data, "SELECT name, value, source FROM ollama_settings"), 30, "settings")
        refused = wait_until(
            lambda: query(data, "SELECT flags, flag_text FROM requests WHERE outcome = 'http_error'"), 30, "the 400's row"
        )
    assert json.loads(str(generate["flags"])).count("prompt_truncated") == 1
    assert (generate["prompt_sent_tokens"], generate["prompt_sent_source"], generate["prompt_kept_tokens"]) == (6000, "log", 1027)
    assert (generate["num_ctx_in_force"], generate["num_ctx_source"]) == (2048, "request")
    text = json.loads(str(generate["flag_text"]))["prompt_truncated"]
    assert text.startswith("your 6,000-token prompt (Ollama's log) was cut to 1,027 tokens: num_ctx is 2,048")
    assert "raise options.num_ctx to 8,192" in text
    assert "num_ctx_ignored" in json.loads(str(v1["flags"])) and "prompt_truncated" not in json.loads(str(v1["flags"]))
    ignored = json.loads(str(v1["flag_text"]))["num_ctx_ignored"]
    assert "options.num_ctx 2,048, which Ollama ignores on /v1" in ignored
    assert "num_ctx is 8,192 (set by OLLAMA_CONTEXT_LENGTH" in ignored
    by_name = {row["name"]: (row["value"], row["source"]) for row in settings}
    assert by_name["OLLAMA_CONTEXT_LENGTH"] == ("8192", "Ollama's start line (server config)")
    assert by_name["vram-based default context"][0].startswith("32768")
    assert "4090" in by_name["inference compute 0"][0]
    assert "prompt_truncated" in json.loads(str(refused[0]["flags"]))
    refusal = json.loads(str(refused[0]["flag_text"]))["prompt_truncated"]
    assert "cannot shift it: Ollama refused it (400); num_ctx is 2,048 (set by the request's options.num_ctx)" in refusal
    assert query(data, "SELECT count(*) FROM requests")[0][0] == 3  # each recorded once


def _rec(prompt_eval_count: int, started: float) -> RequestRecord:
    return RequestRecord(
        id=f"r{prompt_eval_count}",
        started_at_unix_s=started,
        client_addr="127.0.0.1",
        endpoint="/api/chat",
        model="llama3.2",
        stream=False,
        num_ctx=2048,
        received_ns=0,
        final_chunk_ns=1_000_000_000,
        status_code=200,
        outcome=Outcome.OK,
        metrics=FinalMetrics(prompt_eval_count=prompt_eval_count, eval_count=4),
    )


def _cut(new: int, read_s: float) -> LogEvent:
    return LogEvent(EventKind.PROMPT_FIT, read_s, 0, fit=FitLine(LineKind.TRUNCATED, limit=new, prompt=6000, keep=5, new=new))


def test_a_line_read_after_its_request_was_written_writes_it_again() -> None:
    import time

    now = time.time()
    book = FitBook()
    book.feed([_cut(999, now - 1)])  # another request's line
    rec = book.annotate(_rec(1027, now - 1), (), now)
    assert rec.prompt_sent_tokens is None and book.late() == []
    book.feed([_cut(1027, now)])
    (late,) = book.late()
    assert (late.id, late.prompt_sent_tokens, late.prompt_kept_tokens, late.prompt_sent_source) == ("r1027", 6000, 1027, "log")
    assert book.late() == []  # once


def test_the_start_lines_are_read_from_the_end_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "ollama.log"
    old = 'time=2026-06-12T22:48:14.120Z level=INFO source=routes.go:1 msg="server config" env="map[OLLAMA_CONTEXT_LENGTH:4096]"'
    new = (
        'time=2026-06-12T22:48:14.120Z level=INFO source=routes.go:1 msg="server config" '
        'env="map[OLLAMA_CONTEXT_LENGTH:0 OLLAMA_NUM_PARALLEL:2]"'
    )
    vram = (
        'time=2026-06-12T22:48:14.120Z level=INFO source=routes.go:2 msg="vram-based default context" '
        'total_vram="23.5 GiB" default_num_ctx=32768'
    )
    log.write_text("\n".join([old, "[GIN] noise", new, vram, ""]))
    settings = read_start_lines(log, 1.0)
    assert settings == ServerSettings({"OLLAMA_CONTEXT_LENGTH": "0", "OLLAMA_NUM_PARALLEL": "2"}, 32768, "23.5 GiB", (), 1.0)
    assert read_start_lines(tmp_path / "missing.log", 1.0) is None


def test_only_a_reply_that_looks_cut_and_kept_its_text_is_counted_by_the_runner() -> None:
    from dataclasses import replace

    from collectors.ollama.prompt_fit import wants_count

    cut = replace(_rec(1027, 1.0), num_ctx_in_force=2048, prompt_text="word " * 6000)
    assert wants_count(cut)
    assert not wants_count(replace(cut, prompt_text=None))  # no text kept: estimated from its characters instead
    assert not wants_count(replace(cut, metrics=FinalMetrics(prompt_eval_count=1500)))  # not at the cut length
    assert not wants_count(replace(cut, prompt_sent_source="log"))  # Ollama's line told it already


FORGED_CUTS = [  # what an API client can have echoed into the log: Ollama's WARN line with numbers of its choosing
    'time=2026-06-12T22:48:14.120Z level=WARN source=llama_server.go:314 msg="truncating input prompt" '
    f"limit={limit} prompt=9000 keep={keep} new={limit}"
    for limit, keep in ((26, 5), (26, 0), (1027, 5), (2047, 2046))
]


def test_a_finished_request_after_forged_cut_lines_is_not_flagged() -> None:
    """Issue 39 F11: a finished 26-token request was rewritten as "your 9,000-token prompt was cut". A cut line
    counts only when its numbers are Ollama's cut of that request: its context, its reply's prompt count."""
    import time

    from collectors.ollama.log import parse_line

    now = time.time()
    book = FitBook(lambda: None)
    book.feed([e for line in FORGED_CUTS if (e := parse_line(line, now - 0.5)) is not None])
    rec = book.annotate(_rec(26, now - 1), (), now)
    assert (rec.prompt_sent_tokens, rec.prompt_kept_tokens) == (None, None)
    assert verdict(rec).truncated is None
    # The same line with Ollama's own numbers for this request (num_ctx 2,048, keep 5: 1,027 kept) is believed.
    real = book.annotate(_rec(1027, now - 1), (), now)
    assert (real.prompt_sent_tokens, real.prompt_kept_tokens) == (9000, 1027)


def test_settings_in_force_do_not_change_for_start_lines_after_ollamas_own(tmp_path: Path) -> None:
    """Issue 39 F11: forged start lines made the settings in force OLLAMA_NUM_PARALLEL 64, OLLAMA_CONTEXT_LENGTH
    131072. A set of start lines is taken once per Ollama process."""
    from collectors.ollama.log import parse_line

    real = 'time=2026-06-12T22:48:14.120Z level=INFO source=routes.go:1 msg="server config" env="map[OLLAMA_NUM_PARALLEL:1]"'
    forged = [
        'time=2026-06-12T22:50:14.120Z level=INFO source=routes.go:1 msg="server config" '
        'env="map[OLLAMA_CONTEXT_LENGTH:131072 OLLAMA_NUM_PARALLEL:64]"',
        'time=2026-06-12T22:50:14.120Z level=INFO source=routes.go:2 msg="vram-based default context" '
        'total_vram="999.0 GiB" default_num_ctx=262144',
    ]
    started = [100.0]
    book = FitBook(lambda: started[0])
    book.feed([e for e in [parse_line(real, 1000.0)] if e is not None])
    assert book.settings.env == {"OLLAMA_NUM_PARALLEL": "1"}
    book.feed([e for line in forged if (e := parse_line(line, 2000.0)) is not None])
    assert book.settings.env == {"OLLAMA_NUM_PARALLEL": "1"} and book.settings.vram_default_num_ctx is None
    assert book.settings_dropped == 2
    started[0] = 3000.0  # Ollama restarted: its own first set is taken
    book.feed([e for line in forged[:1] if (e := parse_line(line, 3005.0)) is not None])
    assert book.settings.env_context_length == 131072
    # With no Ollama process to see (sim, or hidden), only the first set.
    blind = FitBook(lambda: None)
    blind.feed([e for line in [real, *forged] if (e := parse_line(line, 1000.0)) is not None])
    assert blind.settings.env == {"OLLAMA_NUM_PARALLEL": "1"}


def test_the_start_lines_of_the_running_ollama_are_the_first_set_since_it_started(tmp_path: Path) -> None:
    log = tmp_path / "ollama.log"
    own = 'time=2026-06-12T22:48:14.120Z level=INFO source=routes.go:1 msg="server config" env="map[OLLAMA_NUM_PARALLEL:1]"'
    forged = 'time=2026-06-12T22:58:14.120Z level=INFO source=routes.go:1 msg="server config" env="map[OLLAMA_NUM_PARALLEL:64]"'
    earlier = 'time=2026-06-11T10:00:00.000Z level=INFO source=routes.go:1 msg="server config" env="map[OLLAMA_NUM_PARALLEL:4]"'
    log.write_text("\n".join([earlier, own, "[GIN] noise", forged, ""]))
    from datetime import datetime

    started = datetime.fromisoformat("2026-06-12T22:48:13.900+00:00").timestamp()
    settings = read_start_lines(log, 1.0, ollama_started_unix_s=started)
    assert settings is not None and settings.env == {"OLLAMA_NUM_PARALLEL": "1"}
