"""Why says when a prompt was cut (its sizes, the context, who set it, the fix), notes a /v1 request's ignored
options.num_ctx, and shows the settings Ollama's start lines gave, each with its source (analysis.prompt_fit)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from pages.why.report import build_report
from store.ops import PutOllamaSettings, PutRequest
from store.schema import db_path
from store.tables import OllamaSettingRow
from store.writer import StoreWriter
from tests.support.why_page import MODEL, build_store, diagnoses, open_why, page_text

START = "Ollama's start line (server config)"


def test_why_tells_the_cut_prompt_and_the_settings_in_force_with_their_source(data_dir: Path) -> None:
    now = time.time()
    recs = build_store(data_dir, now)  # the model is loaded at 8,192 (/api/ps)
    mine = [r for r in recs if r.model == MODEL and r.metrics is not None]
    cut = replace(
        mine[-1],
        id="cut-1",
        started_at_unix_s=now - 5,
        num_ctx=None,
        prompt_sent_tokens=20_000,
        prompt_sent_source="log",
        prompt_kept_tokens=4_101,
        num_ctx_in_force=8192,
        num_ctx_source="env",
    )
    v1 = replace(mine[-2], id="v1-1", started_at_unix_s=now - 4, endpoint="/v1/chat/completions", num_ctx=2048)
    w = StoreWriter(db_path(data_dir))
    try:
        w.write(PutRequest(cut))
        w.write(PutRequest(v1))
        w.write(
            PutOllamaSettings(
                [
                    OllamaSettingRow(now - 600, "OLLAMA_CONTEXT_LENGTH", "8192", START),
                    OllamaSettingRow(now - 600, "OLLAMA_NUM_PARALLEL", "1", START),
                    OllamaSettingRow(
                        now - 600,
                        "vram-based default context",
                        "32768 (total VRAM 24.0 GiB)",
                        "Ollama's start line (vram-based default context)",
                    ),
                ]
            )
        )
    finally:
        w.close()
    at = open_why()
    found = diagnoses(at)
    what = "the prompt was longer than the context: Ollama cut it, and the model did not read all of it"
    assert what in found, found.keys()
    assert found[what][1].startswith(
        "Your 20,000-token prompt (Ollama's log) was cut to 4,101 tokens: num_ctx is 8,192 (set by OLLAMA_CONTEXT_LENGTH"
    )
    assert "OLLAMA_CONTEXT_LENGTH=32768" in found[what][1]  # the fix, for a native route without options.num_ctx
    ignored = found["options.num_ctx was sent on a /v1 route, where Ollama ignores it"][1]
    assert ignored.startswith("The request carried options.num_ctx 2,048, which Ollama ignores on /v1 routes")
    table = at.table[0].value  # the settings in force
    rows = {name: (table.loc[name, "value"], table.loc[name, "from"]) for name in table.index}
    assert rows["num_ctx"][0] == "8,192" and "set by OLLAMA_CONTEXT_LENGTH" in rows["num_ctx"][1]
    assert rows["OLLAMA_CONTEXT_LENGTH"] == ("8192", START)
    assert rows["vram-based default context"][0].startswith("32768")
    assert "Settings in force" in page_text(at)
    # The report to paste says the same: the settings with their source, the flag with its fix.
    report = build_report(data_dir, now)
    assert report is not None
    assert f"  OLLAMA_CONTEXT_LENGTH: 8192 ({START})" in report
    assert "  prompt_truncated × 1: the prompt was longer than the context" in report
    assert "Fix: a larger num_ctx for that client" in report
    assert "  num_ctx_ignored × 1" in report
