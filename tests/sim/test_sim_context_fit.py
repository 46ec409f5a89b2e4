"""sim does what Ollama does with a prompt longer than the context: cuts it as Ollama's runner cuts it and logs
Ollama's WARN line, the reply's ``prompt_eval_count`` at the cut length; a model that cannot shift answers 400;
and at start it writes Ollama's start lines with the settings it runs with (sim/context_fit.py)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from analysis.prompt_fit import FitLine, LineKind, is_too_long_error, parse_fit_line
from sim.tokens import make_prompt
from tests.support.sim_process import start_sim

MODEL = "qwen2.5:0.5b"


def _fit_lines(log_file: Path, kind: LineKind, count: int = 1) -> list[FitLine]:
    deadline = time.monotonic() + 15
    while True:
        text = log_file.read_text() if log_file.exists() else ""
        found = [x for line in text.splitlines() if (x := parse_fit_line(line)) is not None and x.kind is kind]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_long_prompt_is_cut_logged_and_counted_as_ollama_does(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    with start_sim("--log-file", str(log_file), "--disk-gbs", "50", "--context-length", "8192") as sim:
        # The start lines: the settings, the GPU, the VRAM-based default.
        config = _fit_lines(log_file, LineKind.SERVER_CONFIG)
        assert config and config[0].env["OLLAMA_CONTEXT_LENGTH"] == "8192" and config[0].env["OLLAMA_NUM_PARALLEL"] == "1"
        compute = _fit_lines(log_file, LineKind.COMPUTE)
        assert compute and "4090" in compute[0].attrs["description"]
        vram = _fit_lines(log_file, LineKind.VRAM_DEFAULT)
        assert vram and vram[0].default_num_ctx == 32768
        # A 6,000-token prompt at num_ctx 2,048: 200, cut to 1,027 tokens (Ollama's num_keep 4 + BOS, then the end).
        body = {"model": MODEL, "prompt": make_prompt(6000), "raw": True, "stream": False}
        r = httpx.post(sim.base_url + "/api/generate", json=body | {"options": {"num_ctx": 2048, "num_predict": 4}}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["prompt_eval_count"] == 1027
        (warn,) = _fit_lines(log_file, LineKind.TRUNCATED)
        assert (warn.limit, warn.prompt, warn.keep, warn.new) == (1027, 6000, 5, 1027)  # raw: no template, no BOS
        # /v1 ignores options: the server's context (OLLAMA_CONTEXT_LENGTH 8,192) holds, nothing is cut.
        oai = {"model": MODEL, "messages": [{"role": "user", "content": make_prompt(6000)}], "max_tokens": 4}
        r = httpx.post(sim.base_url + "/v1/chat/completions", json=oai | {"options": {"num_ctx": 2048}}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 6000
        # "shift": false (a model that cannot shift): Ollama's 400.
        r = httpx.post(sim.base_url + "/api/generate", json=body | {"shift": False, "options": {"num_ctx": 2048}}, timeout=120)
        assert r.status_code == 400 and is_too_long_error(r.json()["error"])
    assert len(_fit_lines(log_file, LineKind.TRUNCATED)) == 1  # the refused one is not cut


def test_a_model_that_cannot_shift_answers_400(tmp_path: Path) -> None:
    with start_sim("--no-context-shift", "--disk-gbs", "50") as sim:
        body = {"model": MODEL, "messages": [{"role": "user", "content": make_prompt(3000)}], "stream": False}
        r = httpx.post(sim.base_url + "/api/chat", json=body | {"options": {"num_ctx": 2048}}, timeout=120)
        assert r.status_code == 400 and is_too_long_error(r.json()["error"])
        r = httpx.post(sim.base_url + "/api/chat", json=body | {"options": {"num_ctx": 4096, "num_predict": 2}}, timeout=120)
        assert r.status_code == 200  # it fits
