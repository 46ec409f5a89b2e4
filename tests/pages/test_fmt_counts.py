"""Counts on every page go through one function, ``pages.shared.fmt.count`` ("974,910", "—" when unknown): Live once
showed "Requests in window" as ``974910`` (issue 48). Checked in the page code (no count formatted by hand) and on the
Live page itself, over a store with more than a thousand requests in the window."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from bench.pages_fixture import make_request
from pages.requests.usage import usage_display
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

# A thousands separator written by hand in an f-string ("{n:,}"); Plotly's own templates ("%{x:,}") are not Python's.
HAND_COUNT = re.compile(r"(?<![%{])\{[^{}]+?:,\}")
N_REQUESTS = 1_234


def test_no_page_formats_a_count_by_hand() -> None:
    found = [
        f"{path.relative_to(REPO)}:{i}: {line.strip()}"
        for path in sorted((REPO / "pages").rglob("*.py"))
        if path.name != "fmt.py"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if HAND_COUNT.search(line)
    ]
    assert not found, "format counts with pages.shared.fmt.count:\n" + "\n".join(found)


def test_live_shows_requests_in_window_with_a_separator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    monkeypatch.delenv("PHASEWATCH_DEMO", raising=False)
    now = time.time()
    w = StoreWriter(db_path(tmp_path))
    try:  # all in the sidebar's default window (5 min)
        w.apply([PutRequest(make_request(now - 200 + i * 0.1, now - 300)) for i in range(N_REQUESTS)])
    finally:
        w.close()
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests in window"] == "1,234"


def test_the_usage_table_shows_its_counts_with_a_separator() -> None:
    frame = pd.DataFrame(
        [
            {
                "model": "m",
                "requests": 3200,
                "of which embeddings": 1200,
                "prompt tokens": 5e6,
                "prompt tokens: records without": 1500,
            }
        ]
    )
    shown = usage_display(frame).iloc[0]
    assert (shown["requests"], shown["of which embeddings"], shown["prompt tokens: records without"]) == (
        "3,200",
        "1,200",
        "1,500",
    )
    assert shown["prompt tokens"] == "5,000,000"
