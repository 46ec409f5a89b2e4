"""``analysis.prompt_fit``: Ollama's lines about a cut prompt and its start settings, the cut it makes, and the
``prompt_truncated`` / ``num_ctx_ignored`` flags ``split_record`` sets from a record."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysis.log_grammar import MAX_LINE_CHARS
from analysis.phases import Flag, split_record
from analysis.prompt_fit import (
    TOO_LONG_MESSAGE,
    CtxSource,
    LineKind,
    ServerSettings,
    num_ctx_in_force,
    parse_fit_line,
    truncate,
    truncation_limit,
)
from analysis.records import FinalMetrics, Outcome, RequestRecord

# As Ollama writes them (llm/llama_server.go, server/routes.go, discover/types.go).
WARN = (
    'time=2026-10-01T14:50:47.067+02:00 level=WARN source=llama_server.go:318 msg="truncating input prompt" '
    "limit=2051 prompt=4398 keep=5 new=2051"
)
CONFIG = (
    'time=2026-03-11T12:00:16.009Z level=INFO source=routes.go:1741 msg="server config" env="map[CUDA_VISIBLE_DEVICES: '
    "OLLAMA_CONTEXT_LENGTH:0 OLLAMA_DEBUG:INFO OLLAMA_FLASH_ATTENTION:false OLLAMA_HOST:http://0.0.0.0:11434 "
    "OLLAMA_KEEP_ALIVE:5m0s OLLAMA_KV_CACHE_TYPE: OLLAMA_MAX_LOADED_MODELS:0 OLLAMA_MAX_QUEUE:512 "
    "OLLAMA_MODELS:/root/.ollama/models OLLAMA_NUM_PARALLEL:1 OLLAMA_ORIGINS:[http://localhost https://localhost "
    'http://127.0.0.1:*] ROCR_VISIBLE_DEVICES:]"'
)
COMPUTE = (
    'time=2026-05-18T04:48:31.927Z level=INFO source=types.go:42 msg="inference compute" id=GPU-b274baec library=CUDA '
    'compute=8.6 name=CUDA0 description="NVIDIA GeForce RTX 3070 Laptop GPU" libdirs=ollama,cuda_v12 driver=12.3 '
    'pci_id=0000:01:00.0 type=discrete total="8.0 GiB" available="7.8 GiB"'
)
VRAM = (
    'time=2026-05-18T04:48:31.927Z level=INFO source=routes.go:1914 msg="vram-based default context" '
    'total_vram="8.0 GiB" default_num_ctx=4096'
)


def test_the_truncating_line_gives_its_four_numbers() -> None:
    line = parse_fit_line(WARN)
    assert line is not None and line.kind is LineKind.TRUNCATED
    assert (line.limit, line.prompt, line.keep, line.new) == (2051, 4398, 5, 2051)


def test_the_start_lines_give_the_settings() -> None:
    config, compute, vram = (parse_fit_line(x) for x in (CONFIG, COMPUTE, VRAM))
    assert config is not None and config.env["OLLAMA_CONTEXT_LENGTH"] == "0"
    assert config.env["OLLAMA_ORIGINS"] == "[http://localhost https://localhost http://127.0.0.1:*]"
    assert config.env["OLLAMA_NUM_PARALLEL"] == "1" and config.env["OLLAMA_KV_CACHE_TYPE"] == ""
    assert compute is not None and compute.attrs["description"] == "NVIDIA GeForce RTX 3070 Laptop GPU"
    assert compute.attrs["total"] == "8.0 GiB" and compute.attrs["library"] == "CUDA"
    assert vram is not None and vram.default_num_ctx == 4096 and vram.total_vram == "8.0 GiB"
    settings = ServerSettings()
    for line in (config, compute, vram):
        settings = settings.fold(line, 1.0)
    assert settings.env_context_length is None  # 0: unset, the VRAM-based default holds
    assert settings.vram_default_num_ctx == 4096 and len(settings.compute) == 1


@pytest.mark.parametrize(
    "line",
    [
        WARN.replace("limit=2051", "limit=x"),
        WARN + " " + "x" * MAX_LINE_CHARS,  # too long to be one
        'msg="truncating input prompt" limit=1 prompt=2 keep=3 new=4',  # no level: not slog's line
        '[GIN] 2026/06/12 - 22:48:16 | 200 |     36.33s |       127.0.0.1 | POST     "/api/chat"',
        VRAM.replace("default_num_ctx=4096", "default_num_ctx=4096 extra=1"),
    ],
)
def test_other_lines_are_not_read(line: str) -> None:
    assert parse_fit_line(line) is None


@given(st.text(max_size=300))
def test_any_text_parses_or_is_refused(text: str) -> None:
    parse_fit_line(text)  # never raises


def test_the_cut_is_ollamas() -> None:
    # Ollama's own figures: num_ctx 4096 with num_keep 4 + BOS keeps 2051 (the WARN line above).
    assert truncation_limit(4096) == 2051
    assert truncation_limit(2048) == 1027
    kept, line = truncate(list(range(6000)), 2048)
    assert line is not None and (line.limit, line.prompt, line.keep, line.new) == (1027, 6000, 5, 1027)
    assert kept[:5] == [0, 1, 2, 3, 4] and kept[-1] == 5999 and len(kept) == 1027
    assert truncate(list(range(2047)), 2048) == (list(range(2047)), None)


def test_num_ctx_and_who_set_it() -> None:
    s = ServerSettings(env={"OLLAMA_CONTEXT_LENGTH": "8192"}, vram_default_num_ctx=4096)
    assert num_ctx_in_force("/api/chat", 2048, 2048, s) == (2048, CtxSource.REQUEST)
    assert num_ctx_in_force("/v1/chat/completions", 2048, 8192, s) == (8192, CtxSource.ENV)  # /v1 drops options
    assert num_ctx_in_force("/api/chat", None, 4096, ServerSettings(vram_default_num_ctx=4096)) == (4096, CtxSource.VRAM_DEFAULT)
    assert num_ctx_in_force("/api/chat", None, 3000, s) == (8192, CtxSource.ENV)  # /api/ps may be a previous load's
    assert num_ctx_in_force("/api/chat", None, 3000, ServerSettings()) == (3000, CtxSource.LOADED)
    assert num_ctx_in_force("/api/chat", None, None, None) == (None, None)


def _rec(**kw: object) -> RequestRecord:
    rec = RequestRecord(
        id="r1",
        started_at_unix_s=1.0,
        client_addr="127.0.0.1",
        endpoint="/api/chat",
        model="llama3.2",
        stream=False,
        received_ns=0,
        forwarded_ns=1,
        final_chunk_ns=2_000_000_000,
        closed_ns=2_000_000_000,
        status_code=200,
        outcome=Outcome.OK,
        metrics=FinalMetrics(1_900_000_000, 1_000, 1027, 0, 900_000_000, 20, 900_000_000, "stop"),
    )
    return replace(rec, **kw)  # type: ignore[arg-type]


def test_a_cut_told_by_ollamas_line_is_flagged_with_its_numbers_and_fix() -> None:
    rec = _rec(
        num_ctx=2048,
        prompt_sent_tokens=6000,
        prompt_sent_source="log",
        prompt_kept_tokens=1027,
        num_ctx_in_force=2048,
        num_ctx_source=CtxSource.REQUEST,
    )
    ph = split_record(rec)
    assert Flag.PROMPT_TRUNCATED in ph.flags
    text = ph.flag_text[Flag.PROMPT_TRUNCATED]
    assert text.startswith(
        "your 6,000-token prompt (Ollama's log) was cut to 1,027 tokens: num_ctx is 2,048 (set by the request's options.num_ctx)"
    )
    assert "raise options.num_ctx to 8,192" in text


def test_a_v1_cut_says_the_option_is_ignored_there() -> None:
    rec = _rec(
        endpoint="/v1/chat/completions",
        num_ctx=8192,
        prompt_sent_tokens=6000,
        prompt_sent_source="log",
        prompt_kept_tokens=1027,
        num_ctx_in_force=2048,
        num_ctx_source=CtxSource.ENV,
    )
    ph = split_record(rec)
    assert "/v1 routes ignore options.num_ctx" in ph.flag_text[Flag.PROMPT_TRUNCATED]
    assert "OLLAMA_CONTEXT_LENGTH=8192" in ph.flag_text[Flag.PROMPT_TRUNCATED]
    assert Flag.NUM_CTX_IGNORED in ph.flags
    assert "options.num_ctx 8,192, which Ollama ignores on /v1" in ph.flag_text[Flag.NUM_CTX_IGNORED]


def test_the_reply_signature_without_ollamas_line_is_an_estimate_and_says_so() -> None:
    # 24,000 characters ≈ 6,000 tokens; the reply read 1,027 = the cut length at num_ctx 2,048.
    rec = _rec(num_ctx=2048, prompt_chars=24_000, num_ctx_in_force=2048, num_ctx_source=CtxSource.REQUEST)
    ph = split_record(rec)
    assert "your 6,000-token prompt (estimated from its characters) was cut to 1,027" in ph.flag_text[Flag.PROMPT_TRUNCATED]
    # A prompt read whole (not at the cut length) is not flagged, whatever the estimate says.
    whole = _rec(num_ctx=2048, prompt_chars=24_000, num_ctx_in_force=2048, metrics=FinalMetrics(prompt_eval_count=1500))
    assert Flag.PROMPT_TRUNCATED not in split_record(whole).flags
    # Nor one whose estimate is barely over the context (an estimate is not a count).
    near = _rec(num_ctx=2048, prompt_chars=4 * 2200, num_ctx_in_force=2048)
    assert Flag.PROMPT_TRUNCATED not in split_record(near).flags


def test_the_400_of_a_model_that_cannot_shift_is_flagged() -> None:
    rec = _rec(
        status_code=400,
        outcome=Outcome.HTTP_ERROR,
        error=TOO_LONG_MESSAGE,
        metrics=None,
        prompt_chars=24_000,
        num_ctx_in_force=2048,
        num_ctx_source=CtxSource.REQUEST,
    )
    text = split_record(rec).flag_text[Flag.PROMPT_TRUNCATED]
    assert "refused it (400)" in text and "num_ctx is 2,048" in text


def test_a_prompt_that_fit_is_not_flagged() -> None:
    ph = split_record(_rec(num_ctx=2048, prompt_chars=400, num_ctx_in_force=2048))
    assert Flag.PROMPT_TRUNCATED not in ph.flags and Flag.NUM_CTX_IGNORED not in ph.flags
